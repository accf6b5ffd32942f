"""TLS policy and NSQ's authorisations on nsqd's HTTP API: one aiohttp middleware.

nsqd (1.3) does not check its HTTP API against the auth servers at all: anyone
who reaches the port may publish, empty or delete. pynsqd does what an operator
who turned auth on expects, with the same rules as TCP and gRPC (``rules``). The
secret comes in the header ``Authorization: Bearer <secret>``; the answer is kept
for the connection for its ``ttl`` (a new connection asks again); then:

- ``/ping``: open (health checks);
- ``/pub``, ``/mpub``, ``/topic/*``: ``publish`` on the ``topic``;
- ``/channel/create``: ``subscribe`` on the ``topic`` and ``channel``, ``publish`` on
  the dead-letter topic its settings name or imply, and when it changes an existing
  channel's settings, ``publish`` on the topic too;
- ``/channel/*``: ``subscribe`` on the ``topic`` and ``channel``;
- ``/info``, ``/stats``, ``/metrics``: a secret the auth servers accept.

A route this table does not name is refused.
Refusals are raised (``AuthError``) and answered by the HTTP API's one error
mapping, as JSON like nsqd's other errors: 401 ``{"message": "E_AUTH_FIRST"}``
(no secret), 401 ``E_AUTH_FAILED`` (secret refused), 403 ``E_UNAUTHORIZED``.
With ``--tls-required true`` the plain listener answers every request with
nsqd's 403 ``{"message": "TLS_REQUIRED", "https_port": N}``.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from typing import Any, Callable

from aiohttp import web

from . import rules
from .auth import AuthFirst, ClientAuth, Unauthorized
from .grpc_auth import MAX_CONNECTIONS_KEPT
from .tls import peer_common_name

OPEN_PATHS = ("/ping",)


def _topic(request: web.Request) -> list[rules.Need]:
    topic = request.query.get("topic")
    return rules.publish(topic) if topic else []     # none: the handler's 400


def _channel(request: web.Request) -> list[rules.Need]:
    topic, channel = request.query.get("topic"), request.query.get("channel")
    return rules.subscribe(topic, channel) if topic and channel else []


def _channel_create(broker: Any, request: web.Request) -> list[rules.Need]:
    topic, channel = request.query.get("topic"), request.query.get("channel")
    if not (topic and channel):
        return []
    try:
        max_attempts = int(request.query["max_attempts"])
    except (KeyError, ValueError):
        max_attempts = None      # absent, or refused by the handler
    return rules.create_channel(broker, topic, channel, max_attempts,
                                request.query.get("dead_letter_topic", ""))


# path -> what a request needs: (broker, request) -> [Need]; may raise Unauthorized.
RULES: dict[str, Callable[[Any, web.Request], list[rules.Need]]] = {
    "/info": lambda broker, r: [], "/stats": lambda broker, r: [],
    "/metrics": lambda broker, r: [],
    "/pub": lambda broker, r: _topic(r), "/mpub": lambda broker, r: _topic(r),
    **{f"/topic/{action}": (lambda broker, r: _topic(r))
       for action in ("create", "delete", "empty", "pause", "unpause")},
    "/channel/create": _channel_create,
    **{f"/channel/{action}": (lambda broker, r: _channel(r))
       for action in ("delete", "empty", "pause", "unpause")},
}


def _refuse(status: int, payload: dict) -> web.Response:
    return web.Response(status=status, text=json.dumps(payload),
                        content_type="application/json")


def security_middleware(security: Any, broker: Any, *, tls: bool, https_port: Any) -> Any:
    """The middleware for one listener (``tls``: the HTTPS one); ``https_port()`` -> int."""
    connections: OrderedDict[tuple[Any, str, str], ClientAuth] = OrderedDict()

    async def client_of(request: web.Request, secret: str) -> ClientAuth:
        transport = request.transport
        ssl_object = transport.get_extra_info("ssl_object") if transport and tls else None
        common_name = peer_common_name(ssl_object)
        key = (transport.get_extra_info("peername") if transport else None, secret,
               common_name)
        client = connections.get(key)
        if client is None or client.needs_query():
            client = ClientAuth(security.authenticator, request.remote or "", tls=tls,
                                common_name=common_name, secret=secret)
            connections.pop(key, None)
            await client.refresh()
            connections[key] = client
            while len(connections) > MAX_CONNECTIONS_KEPT:
                connections.popitem(last=False)
        return client

    @web.middleware
    async def check(request: web.Request, handler: Any) -> web.StreamResponse:
        if not tls and security.http_tls_required():
            return _refuse(403, {"message": "TLS_REQUIRED", "https_port": https_port()})
        if security.authenticator is None or request.path in OPEN_PATHS:
            return await handler(request)
        header = request.headers.get("Authorization", "")
        secret = header[len("Bearer "):] if header.startswith("Bearer ") else None
        if secret is None:
            raise AuthFirst(f"AUTH required before {request.path}")
        client = await client_of(request, secret)
        rule = RULES.get(request.path)
        if rule is None:
            if request.match_info.http_exception is not None:
                client.check(request.path, None)      # no such route: the router's 404
                return await handler(request)
            raise Unauthorized(f"AUTH failed for {request.path}: no authorisation rule")
        client.require(request.path, rule(broker, request))
        return await handler(request)

    return check
