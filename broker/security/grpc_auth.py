"""NSQ's authorisations on every gRPC call: one server interceptor.

The client sends its secret in call metadata, ``authorization: Bearer <secret>``
(``broker.Client(auth_secret=...)`` does). The broker asks the auth servers
(cached for the answer's ``ttl``) with the caller's IP, whether the channel is
TLS, and the common name of its client certificate, then:

=========================================== ==========================================
call                                        needs
=========================================== ==========================================
Ping                                        nothing (health checks)
Publish, MultiPublish                       ``publish`` on the topic
Subscribe (its SUB frame), Reserve          ``subscribe`` on the topic and channel
CreateTopic ... UnpauseTopic                ``publish`` on the topic
CreateChannel ... UnpauseChannel            ``subscribe`` on the topic and channel
FetchLease, Finish/Requeue/Touch/AdoptLeases ``subscribe`` on each lease's topic and channel
Stats, Info, OpenLeaseSession               a secret the auth servers accept
=========================================== ==========================================

Refusals carry nsqd's code first in the status message: ``UNAUTHENTICATED``
with ``E_AUTH_FIRST`` (no secret) or ``E_AUTH_FAILED`` (secret refused),
``PERMISSION_DENIED`` with ``E_UNAUTHORIZED``.
"""

from __future__ import annotations

from typing import Any, Callable

import grpc

from .auth import AuthError, AuthFirst, Authenticator, ClientAuth

METADATA_KEY = "authorization"
SCHEME = "Bearer "

PUBLISH_CALLS = ("Publish", "MultiPublish", "CreateTopic", "DeleteTopic", "EmptyTopic",
                 "PauseTopic", "UnpauseTopic")
SUBSCRIBE_CALLS = ("Reserve", "CreateChannel", "DeleteChannel", "EmptyChannel",
                   "PauseChannel", "UnpauseChannel")
LEASE_CALLS = ("FetchLease", "FinishLeases", "RequeueLeases", "TouchLeases", "AdoptLeases")
OPEN_CALLS = ("Ping",)


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

    def __init__(self, authenticator: Authenticator, *, tls: bool,
                 lease_scope: Callable[[str], tuple[str, str] | None]) -> None:
        self.authenticator = authenticator
        self.tls = tls
        self.lease_scope = lease_scope    # lease id -> (topic, channel), None if unknown

    async def authorize(self, context: Any, method: str, request: Any) -> None:
        """Abort the call with nsqd's code unless it is allowed."""
        try:
            await self._check(context, method, request)
        except AuthError as err:
            from ..server.grpc_server import abort  # (clients import this module, not the server)
            await abort(context, err, prefix=f"{err.code} ")  # the server's one mapping

    async def _check(self, context: Any, method: str, request: Any) -> None:
        secret = secret_of(context.invocation_metadata())
        if secret is None:
            raise AuthFirst(f"AUTH required before {method}: send the secret in call "
                            f"metadata '{METADATA_KEY}: Bearer <secret>'")
        client = ClientAuth(self.authenticator, remote_ip(context.peer()), tls=self.tls,
                            common_name=_common_name(context) if self.tls else "",
                            secret=secret)
        await client.refresh()
        if method in PUBLISH_CALLS:
            client.check(method, request.topic)
        elif method in SUBSCRIBE_CALLS:
            client.check(method, request.topic, request.channel)
        elif method == "SUB":
            client.check("SUB", request.topic, request.channel)
        elif method in LEASE_CALLS:
            ids = [request.lease_id] if method == "FetchLease" else list(request.lease_ids)
            for lease_id in ids:
                scope = self.lease_scope(lease_id)
                if scope is not None:  # an unknown lease fails in the handler, as without auth
                    client.check(method, *scope)
        else:
            client.check(method, None)

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
        return grpc.unary_unary_rpc_method_handler(
            self._unary_unary(handler.unary_unary, method),
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer)

    def _unary_unary(self, behaviour, method: str):
        async def call(request, context):
            await self.authorize(context, method, request)
            return await behaviour(request, context)
        return call

    def _unary_stream(self, behaviour, method: str):
        async def call(request, context):
            await self.authorize(context, method, request)
            async for reply in behaviour(request, context):
                yield reply
        return call

    def _stream_stream(self, behaviour):
        """The consumer stream: its first frame, SUB, is checked when the handler reads it."""
        async def call(request_iterator, context):
            async for reply in behaviour(request_iterator, _SubChecked(context, self)):
                yield reply
        return call


class _SubChecked:
    """A call context whose first ``read()`` (the SUB frame) is authorised."""

    def __init__(self, context: Any, interceptor: AuthInterceptor) -> None:
        self._context = context
        self._interceptor = interceptor
        self._first = True

    async def read(self):
        frame = await self._context.read()
        if self._first:
            self._first = False
            if frame is not grpc.aio.EOF and frame.WhichOneof("command") == "sub":
                await self._interceptor.authorize(self._context, "SUB", frame.sub)
            elif frame is not grpc.aio.EOF:
                await self._interceptor.authorize(self._context, "Subscribe", None)
        return frame

    def __getattr__(self, name: str) -> Any:
        return getattr(self._context, name)


def lease_scope_of(broker: Any) -> Callable[[str], tuple[str, str] | None]:
    """lease id -> (topic, channel) of a live lease on ``broker``, else None."""
    def scope(lease_id: str) -> tuple[str, str] | None:
        try:
            channel = broker.lease(lease_id).channel
        except Exception:
            return None
        return (channel.topic.name, channel.name) if channel is not None else None
    return scope


def interceptors(broker: Any, security: Any) -> list[grpc.aio.ServerInterceptor]:
    """The gRPC server's interceptors for ``security`` (none without auth servers)."""
    if security is None or security.authenticator is None:
        return []
    return [AuthInterceptor(security.authenticator, tls=security.tls_context is not None,
                            lease_scope=lease_scope_of(broker))]
