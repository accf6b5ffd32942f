"""NSQ's authorisations on every gRPC call: one server interceptor.

The client sends its secret in call metadata, ``authorization: Bearer <secret>``
(``broker.Client(auth_secret=...)`` does). The broker asks the auth servers with
the caller's IP, whether the channel is TLS, and the common name of its client
certificate; the answer is kept for the connection (its peer address) for its
``ttl``, as nsqd keeps it for a TCP connection: a new connection asks again. Then
each call needs what ``rules`` says of every name it takes:

=========================================== ==========================================
call                                        needs
=========================================== ==========================================
Ping                                        nothing (health checks)
Publish, MultiPublish                       ``publish`` on the topic
Subscribe (its SUB frame)                   ``subscribe`` on the topic and channel
CreateTopic ... UnpauseTopic                ``publish`` on the topic
CreateChannel                               ``subscribe`` on the channel; ``publish`` on the
                                            dead-letter topic its settings name or imply;
                                            changing an existing channel: also ``publish``
                                            on its topic
DeleteChannel ... UnpauseChannel            ``subscribe`` on the topic and channel
OpenLeaseSession                            resuming: the principal that opened it
Reserve                                     the session's principal, ``subscribe``; the
                                            leases it FINs first (``finish_lease_ids``): as
                                            FinishLeases
FetchLease, Finish/Requeue/Touch/AdoptLeases each lease's principal (live or remembered)
                                            and ``subscribe`` on its topic and channel
                                            (AdoptLeases: the session's principal too)
Stats, Info                                 a secret the auth servers accept
=========================================== ==========================================

A call this table does not name is refused. Refusals carry nsqd's code first in the
status message: ``UNAUTHENTICATED`` with ``E_AUTH_FIRST`` (no secret) or
``E_AUTH_FAILED`` (secret refused), ``PERMISSION_DENIED`` with ``E_UNAUTHORIZED``.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Callable

import grpc

from . import rules
from .auth import AuthError, AuthFirst, Authenticator, ClientAuth, Unauthorized

METADATA_KEY = "authorization"
SCHEME = "Bearer "

OPEN_CALLS = ("Ping",)
# Answers kept per connection, at most this many (the oldest forgotten first).
MAX_CONNECTIONS_KEPT = 10_000


def _channel_settings(broker: Any, r: Any, principal: str) -> list[rules.Need]:
    max_attempts = r.max_attempts if r.HasField("max_attempts") else None
    return rules.create_channel(broker, r.topic, r.channel, max_attempts, r.dead_letter_topic)


def _leases(broker: Any, ids: Any, principal: str) -> list[rules.Need]:
    return [need for lease_id in ids for need in rules.lease(broker, lease_id, principal)]


def _reserve(broker: Any, r: Any, principal: str) -> list[rules.Need]:
    rules.session(broker, r.session_id, principal)
    # The leases it FINs first need what FinishLeases needs of them.
    return rules.subscribe(r.topic, r.channel) + _leases(broker, r.finish_lease_ids, principal)


def _resume(broker: Any, r: Any, principal: str) -> list[rules.Need]:
    rules.session(broker, r.session_id, principal)
    return []


def _adopt(broker: Any, r: Any, principal: str) -> list[rules.Need]:
    rules.session(broker, r.session_id, principal)
    return _leases(broker, r.lease_ids, principal)


_topic = lambda broker, r, principal: rules.publish(r.topic)                  # noqa: E731
_channel = lambda broker, r, principal: rules.subscribe(r.topic, r.channel)   # noqa: E731
_nothing = lambda broker, r, principal: []                                    # noqa: E731

# method -> what it needs: (broker, request, principal) -> [Need]; may raise Unauthorized.
# "SUB" is the Subscribe stream's first frame.
RULES: dict[str, Callable[[Any, Any, str], list[rules.Need]]] = {
    "Publish": _topic, "MultiPublish": _topic, "SUB": _channel, "Subscribe": _nothing,
    "CreateTopic": _topic, "DeleteTopic": _topic, "EmptyTopic": _topic, "PauseTopic": _topic,
    "UnpauseTopic": _topic,
    "CreateChannel": _channel_settings, "DeleteChannel": _channel, "EmptyChannel": _channel,
    "PauseChannel": _channel, "UnpauseChannel": _channel,
    "Stats": _nothing, "Info": _nothing,
    "OpenLeaseSession": _resume, "Reserve": _reserve,
    "FetchLease": lambda broker, r, principal: _leases(broker, [r.lease_id], principal),
    "FinishLeases": lambda broker, r, principal: _leases(broker, r.lease_ids, principal),
    "RequeueLeases": lambda broker, r, principal: _leases(broker, r.lease_ids, principal),
    "TouchLeases": lambda broker, r, principal: _leases(broker, r.lease_ids, principal),
    "AdoptLeases": _adopt,
}


def secret_of(metadata: Any) -> str | None:
    for key, value in metadata or ():
        if key == METADATA_KEY and isinstance(value, str) and value.startswith(SCHEME):
            return value[len(SCHEME):]
    return None


def remote_ip(peer: str) -> str:
    """``ipv4:127.0.0.1:5000`` -> ``127.0.0.1``; ``ipv6:[::1]:5000`` -> ``::1``."""
    _, _, rest = peer.partition(":")
    return rest.rpartition(":")[0].strip("[]") or rest


def _common_name(context: Any) -> str:
    names = (context.auth_context() or {}).get("x509_common_name") or [b""]
    value = names[0]
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


class AuthInterceptor(grpc.aio.ServerInterceptor):
    """Checks every call against the auth servers' answer before the handler runs."""

    def __init__(self, authenticator: Authenticator, broker: Any, *, tls: bool) -> None:
        self.authenticator = authenticator
        self.broker = broker
        self.tls = tls
        self._connections: OrderedDict[tuple[str, str, str], ClientAuth] = OrderedDict()

    async def authorize(self, context: Any, method: str, request: Any) -> str:
        """The caller's principal; the call is aborted with nsqd's code unless allowed."""
        try:
            return await self._check(context, method, request)
        except AuthError as err:
            from ..server.grpc_server import abort  # (clients import this module, not the server)
            await abort(context, err, prefix=f"{err.code} ")  # the server's one mapping
            raise   # (abort raises)

    async def _client(self, context: Any, method: str) -> ClientAuth:
        """The connection's standing: kept for its ttl, else asked now."""
        secret = secret_of(context.invocation_metadata())
        if secret is None:
            raise AuthFirst(f"AUTH required before {method}: send the secret in call "
                            f"metadata '{METADATA_KEY}: Bearer <secret>'")
        peer = context.peer()
        common_name = _common_name(context) if self.tls else ""
        key = (peer, secret, common_name)
        client = self._connections.get(key)
        if client is None or client.needs_query():
            # A new one, so that calls in flight keep the answer they hold meanwhile.
            client = ClientAuth(self.authenticator, remote_ip(peer), tls=self.tls,
                                common_name=common_name, secret=secret)
            self._connections.pop(key, None)
            await client.refresh()
            self._connections[key] = client
            while len(self._connections) > MAX_CONNECTIONS_KEPT:
                self._connections.popitem(last=False)
        return client

    async def _check(self, context: Any, method: str, request: Any) -> str:
        client = await self._client(context, method)
        rule = RULES.get(method)
        if rule is None:
            raise Unauthorized(f"AUTH failed for {method}: no authorisation rule names it")
        principal = client.principal
        client.require(method, rule(self.broker, request, principal))
        return principal

    async def intercept_service(self, continuation, details):
        handler = await continuation(details)
        method = details.method.rpartition("/")[2]
        if handler is None or method in OPEN_CALLS:
            return handler
        if handler.request_streaming and handler.response_streaming:
            return grpc.stream_stream_rpc_method_handler(
                self._stream_stream(handler.stream_stream),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer)
        if handler.response_streaming:
            return grpc.unary_stream_rpc_method_handler(
                self._unary_stream(handler.unary_stream, method),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer)
        if handler.request_streaming:
            raise RuntimeError(f"{method}: a client-streaming call has no authorisation")
        return grpc.unary_unary_rpc_method_handler(
            self._unary_unary(handler.unary_unary, method),
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer)

    def _unary_unary(self, behaviour, method: str):
        async def call(request, context):
            principal = await self.authorize(context, method, request)
            return await behaviour(request, _Authorised(context, principal))
        return call

    def _unary_stream(self, behaviour, method: str):
        async def call(request, context):
            principal = await self.authorize(context, method, request)
            async for reply in behaviour(request, _Authorised(context, principal)):
                yield reply
        return call

    def _stream_stream(self, behaviour):
        """The consumer stream: its first frame, SUB, is checked when the handler reads it."""
        async def call(request_iterator, context):
            async for reply in behaviour(request_iterator, _Authorised(context, "", self)):
                yield reply
        return call


class _Authorised:
    """A call context that carries the caller's ``principal``; on a consumer stream, its
    first ``read()`` (the SUB frame) is authorised."""

    def __init__(self, context: Any, principal: str,
                 interceptor: AuthInterceptor | None = None) -> None:
        self._context = context
        self.pynsq_principal = principal
        self._interceptor = interceptor

    async def read(self):
        frame = await self._context.read()
        if self._interceptor is not None:
            interceptor, self._interceptor = self._interceptor, None
            if frame is not grpc.aio.EOF and frame.WhichOneof("command") == "sub":
                self.pynsq_principal = await interceptor.authorize(self._context, "SUB", frame.sub)
            elif frame is not grpc.aio.EOF:
                self.pynsq_principal = await interceptor.authorize(self._context, "Subscribe", None)
        return frame

    def __getattr__(self, name: str) -> Any:
        return getattr(self._context, name)


def principal_of(context: Any) -> str:
    """Who is calling, as the auth servers name them; "" without auth."""
    return getattr(context, "pynsq_principal", "")


def interceptors(broker: Any, security: Any) -> list[grpc.aio.ServerInterceptor]:
    """The gRPC server's interceptors for ``security`` (none without auth servers)."""
    if security is None or security.authenticator is None:
        return []
    return [AuthInterceptor(security.authenticator, broker,
                            tls=security.tls_context is not None)]
