"""An auth server speaking nsqd's ``/auth`` protocol over real HTTP (aiohttp), on a
free loopback port in its own thread, for the tests.

    with AuthServer({"s3cret": reply(publish="^events$")}) as auth:
        EmbeddedBroker(auth_http_addresses=[auth.address])

A secret it does not know is answered 403, as a real auth server refuses one. A
secret whose answer is an int is answered with that status and a body that is not
JSON (an auth server failing); one whose answer is bytes gets them as a 200's body.
``HOLD`` is answered only after ``release()`` (a slow auth server), ``Huge(n)`` with a
200 whose JSON body of ``n`` bytes is streamed (a garbage-answering one),
``Redirect(url)`` with a 307 to ``url``.
Every query is recorded in ``queries`` (the form the broker sent).
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import Future
from typing import Any

from aiohttp import web


def reply(*, publish: str | None = None, subscribe: str | None = None,
          channels: tuple[str, ...] = (".*",), ttl: int = 3600,
          identity: str = "tester") -> dict:
    """nsqd's answer: one authorisation per permission given, on a topic regex."""
    auths = []
    if publish is not None:
        auths.append({"topic": publish, "channels": list(channels), "permissions": ["publish"]})
    if subscribe is not None:
        auths.append({"topic": subscribe, "channels": list(channels),
                      "permissions": ["subscribe"]})
    return {"ttl": ttl, "identity": identity, "identity_url": "", "authorizations": auths}


HOLD = object()


class Redirect:
    """A 307 to ``location`` (where the asking client's query would go next)."""

    def __init__(self, location: str) -> None:
        self.location = location


class Huge:
    """A 200 answer of ``size`` bytes: a valid answer whose identity is that long."""

    def __init__(self, size: int) -> None:
        self.size = size


class AuthServer:
    def __init__(self, secrets: dict[str, Any]) -> None:
        self.secrets = secrets
        self.queries: list[dict[str, str]] = []
        self.address = ""
        self._loop = asyncio.new_event_loop()
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._released: asyncio.Event | None = None
        self.sent = 0          # bytes of Huge answers sent

    async def _auth(self, request: web.Request) -> web.Response:
        form = dict(request.query) if request.method == "GET" else dict(await request.post())
        form["method"] = request.method
        self.queries.append(form)
        answer = self.secrets.get(form.get("secret", ""))
        if answer is None:
            return web.json_response({"message": "NOT_AUTHORIZED"}, status=403)
        if answer is HOLD:
            assert self._released is not None
            await self._released.wait()
            return web.json_response(reply(publish=".*"))
        if isinstance(answer, Redirect):
            return web.Response(status=307, headers={"Location": answer.location})
        if isinstance(answer, Huge):
            return await self._huge(request, answer.size)
        if isinstance(answer, int):
            return web.Response(status=answer, text="<html>internal error</html>")
        if isinstance(answer, bytes):
            return web.Response(body=answer, content_type="application/json")
        return web.json_response(answer)

    async def _huge(self, request: web.Request, size: int) -> web.StreamResponse:
        head, tail = b'{"ttl": 3600, "identity": "', b'", "authorizations": []}'
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.content_length = size
        await response.prepare(request)
        chunk = b"x" * (1 << 20)
        await response.write(head)
        left = size - len(head) - len(tail)
        try:
            while left > 0:
                piece = chunk[:left]
                await response.write(piece)
                self.sent += len(piece)
                left -= len(piece)
            await response.write(tail)
        except (ConnectionError, RuntimeError):
            pass                   # the broker stopped reading: what a bound does
        return response

    def release(self) -> None:
        """Answer every HOLD query, those waiting and those to come."""
        self._loop.call_soon_threadsafe(lambda: self._released and self._released.set())

    def start(self) -> "AuthServer":
        started: Future = Future()

        async def serve() -> None:
            self._released = asyncio.Event()
            app = web.Application()
            app.router.add_route("*", "/auth", self._auth)
            self._runner = web.AppRunner(app, access_log=None)
            await self._runner.setup()
            site = web.TCPSite(self._runner, "127.0.0.1", 0)
            await site.start()
            port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            self.address = f"127.0.0.1:{port}"

        def run() -> None:
            asyncio.set_event_loop(self._loop)
            try:
                self._loop.run_until_complete(serve())
            except BaseException as err:
                started.set_exception(err)
                return
            started.set_result(None)
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, daemon=True, name="auth-server")
        self._thread.start()
        started.result(timeout=30)
        return self

    def stop(self) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(30)
            self._runner = None
        self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=30)
        self._loop.close()

    def __enter__(self) -> "AuthServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
