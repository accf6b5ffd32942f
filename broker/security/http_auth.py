"""TLS policy and NSQ's authorisations on nsqd's HTTP API: one aiohttp middleware.

nsqd (1.3) does not check its HTTP API against the auth servers at all: anyone
who reaches the port may publish, empty or delete. pynsqd does what an operator
who turned auth on expects, with the same rules as TCP and gRPC. The secret
comes in the header ``Authorization: Bearer <secret>``; then:

- ``/ping``: open (health checks);
- ``/pub``, ``/mpub``, ``/topic/*``: ``publish`` on the ``topic``;
- ``/channel/*``: ``subscribe`` on the ``topic`` and ``channel``;
- anything else (``/stats``, ``/info``): a secret the auth servers accept.

Refusals are raised (``AuthError``) and answered by the HTTP API's one error
mapping, as JSON like nsqd's other errors: 401 ``{"message": "E_AUTH_FIRST"}``
(no secret), 401 ``E_AUTH_FAILED`` (secret refused), 403 ``E_UNAUTHORIZED``.
With ``--tls-required true`` the plain listener answers every request with
nsqd's 403 ``{"message": "TLS_REQUIRED", "https_port": N}``.
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from .auth import AuthFirst, ClientAuth
from .tls import peer_common_name

OPEN_PATHS = ("/ping",)


def _refuse(status: int, payload: dict) -> web.Response:
    return web.Response(status=status, text=json.dumps(payload),
                        content_type="application/json")


def security_middleware(security: Any, *, tls: bool, https_port: Any) -> Any:
    """The middleware for one listener (``tls``: the HTTPS one); ``https_port()`` -> int."""

    @web.middleware
    async def check(request: web.Request, handler: Any) -> web.StreamResponse:
        if not tls and security.http_tls_required():
            return _refuse(403, {"message": "TLS_REQUIRED", "https_port": https_port()})
        if security.authenticator is None or request.path in OPEN_PATHS:
            return await handler(request)
        header = request.headers.get("Authorization", "")
        secret = header[len("Bearer "):] if header.startswith("Bearer ") else None
        transport = request.transport if tls else None
        ssl_object = transport.get_extra_info("ssl_object") if transport is not None else None
        client = ClientAuth(security.authenticator, request.remote or "", tls=tls,
                            common_name=peer_common_name(ssl_object), secret=secret)
        if secret is None:
            raise AuthFirst(f"AUTH required before {request.path}")
        await client.refresh()
        topic = request.query.get("topic")
        path = request.path
        if path in ("/pub", "/mpub") or path.startswith("/topic/"):
            client.check(path, topic or None)
        elif path.startswith("/channel/") and topic:
            client.check(path, topic, request.query.get("channel") or "")
        else:
            client.check(path, None)
        return await handler(request)

    return check
