"""nsqd's HTTP API (on aiohttp), so curl, nsqadmin-style tools and HTTP
publishers work unchanged: /ping, /info, /pub, /mpub, /stats, and topic and
channel create/delete/empty/pause/unpause, with nsqd's status codes and error
bodies (``{"message": "MISSING_ARG_TOPIC"}``), checked in nsqd's order.

Browser safety: a request that changes state (anything but GET, HEAD and
OPTIONS) sent by a browser on behalf of another site is refused with 403
``CROSS_ORIGIN_REQUEST``: ``Sec-Fetch-Site`` other than ``same-origin`` or
``none``, or an ``Origin`` whose host is not the one addressed. Clients that
are not browsers (curl, NSQ's libraries) send neither header and are served.
A request whose ``Host`` the listener does not answer to (DNS rebinding; see
``broker/security/hosts.py``) is refused with 403 ``HOST_NOT_ALLOWED``.
"""

from __future__ import annotations

import asyncio
import logging
import re
import socket
import time
from contextlib import contextmanager
from typing import Any, Awaitable, Callable, Iterator
from urllib.parse import urlsplit

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from .. import __version__
from ..core import Broker
from ..errors import (AdminFailed, BodyTooBig, BrokerError, ChannelNotFound, InvalidBody,
                      InvalidChannel, InvalidMessage, InvalidRequest, InvalidTopic,
                      LimitReached, MessageTooBig, NotFound, StorageFailed, TooManyChannels,
                      TooManyTopics, TopicNotFound, Unavailable)
from ..names import is_valid_name
from ..options import parse_duration_ms, split_listen_address
from ..security import hosts
from ..security.auth import AuthError, AuthFirst, Unauthorized
from ..security.hosts import HostPolicy
from ..security.printable import printable
from ..stats import host_port
from .admission import Listener, Ticket, gate_for, serve_accepted, spawn
from .limits import HTTP_BODY_TIMEOUT, HTTP_IDLE_TIMEOUT, TLS_HANDSHAKE_TIMEOUT
from .wire import parse_mpub

_SAFE_METHODS = ("GET", "HEAD", "OPTIONS")
# What nsqd's strconv.ParseBool reads; /mpub's binary= takes any other value as true.
_BOOL = {**dict.fromkeys(("1", "t", "T", "true", "TRUE", "True"), True),
         **dict.fromkeys(("0", "f", "F", "false", "FALSE", "False"), False)}
_GO_INT = re.compile(r"[+-]?[0-9]+")      # what nsqd's strconv.ParseInt accepts


class HttpError(Exception):
    """An answer other than 200: nsqd's status and message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


# The one mapping of broker errors to nsqd's HTTP status and message: first match wins.
_HTTP_ERRORS: tuple[tuple[type[BrokerError], int, str], ...] = (
    (MessageTooBig, 413, "MSG_TOO_BIG"),
    (BodyTooBig, 413, "BODY_TOO_BIG"),
    (InvalidMessage, 400, "MSG_EMPTY"),
    (InvalidTopic, 400, "INVALID_TOPIC"),
    (InvalidChannel, 400, "INVALID_CHANNEL"),
    (TopicNotFound, 404, "TOPIC_NOT_FOUND"),
    (ChannelNotFound, 404, "CHANNEL_NOT_FOUND"),
    (NotFound, 404, "NOT_FOUND"),
    (Unavailable, 503, "EXITING"),
    (TooManyTopics, 400, "TOO_MANY_TOPICS"),
    (TooManyChannels, 400, "TOO_MANY_CHANNELS"),
    (AdminFailed, 500, "STORAGE_FAILED"),
    (StorageFailed, 500, "PUB_FAILED"),
    (AuthFirst, 401, "E_AUTH_FIRST"),
    (Unauthorized, 403, "E_UNAUTHORIZED"),
    (AuthError, 401, "E_AUTH_FAILED"),
)


def http_error(err: BrokerError) -> HttpError:
    for cls, status, message in _HTTP_ERRORS:
        if isinstance(err, cls):
            return HttpError(status, message)
    return HttpError(400, "INVALID_REQUEST")


def _json_error(status: int, message: str, detail: str | None = None) -> web.Response:
    body = {"message": message} if detail is None else {"message": message, "error": detail}
    response = web.json_response(body, status=status,
                                 headers={"X-NSQ-Content-Type": "nsq; version=1.0"})
    if status in (408, 413):
        response.force_close()   # the rest of the body is not read: end the connection
    return response


def is_cross_site(request: web.Request) -> bool:
    """A browser's request made by another site's page."""
    site = request.headers.get("Sec-Fetch-Site")
    if site is not None:
        return site not in ("same-origin", "none")
    origin = request.headers.get("Origin")
    if origin is None:
        return False
    return origin == "null" or urlsplit(origin).netloc.lower() != request.host.lower()


@web.middleware
async def _nsqd_answers(request: web.Request,
                        handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                        ) -> web.StreamResponse:
    if request.method not in _SAFE_METHODS and is_cross_site(request):
        return _json_error(403, "CROSS_ORIGIN_REQUEST")
    try:
        return await handler(request)
    except HttpError as err:
        return _json_error(err.status, err.message)
    except BrokerError as err:
        mapped = http_error(err)
        # A count the operator set, or the open-file limit refusing a topic: the sentence
        # names the option or the limit (nsqd's message stays a code).
        detail = str(err) if isinstance(err, (LimitReached, AdminFailed)) else None
        return _json_error(mapped.status, mapped.message, detail)
    except web.HTTPMethodNotAllowed:
        return _json_error(405, "METHOD_NOT_ALLOWED")
    except web.HTTPNotFound:
        return _json_error(404, "NOT_FOUND")


async def _read_at_most(request: web.Request, limit: int) -> bytes | None:
    """The body, or None when it is longer than ``limit`` (read no further)."""
    chunks, total = [], 0
    async for chunk in request.content.iter_any():
        total += len(chunk)
        if total > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def _arg(request: web.Request, key: str, missing: str) -> str:
    """A query argument that must be present (it may be empty)."""
    value = request.query.get(key)
    if value is None:
        raise HttpError(400, missing)
    return value


def _topic(request: web.Request) -> str:
    """nsqd's getTopicFromQuery: MISSING_ARG_TOPIC, or INVALID_TOPIC for a bad name."""
    topic = _arg(request, "topic", "MISSING_ARG_TOPIC")
    if not is_valid_name(topic):
        raise HttpError(400, "INVALID_TOPIC")
    return topic


def _topic_and_channel(request: web.Request) -> tuple[str, str]:
    """nsqd's GetTopicChannelArgs, for the /channel endpoints."""
    topic = _arg(request, "topic", "MISSING_ARG_TOPIC")
    if not is_valid_name(topic):
        raise HttpError(400, "INVALID_ARG_TOPIC")
    channel = _arg(request, "channel", "MISSING_ARG_CHANNEL")
    if not is_valid_name(channel):
        raise HttpError(400, "INVALID_ARG_CHANNEL")
    return topic, channel


class _ServerLog:
    """aiohttp's server logger, a client's malformed request said in one line
    (aiohttp logs each with its traceback); the broker's own faults keep theirs."""

    def __init__(self, logger: logging.Logger) -> None:
        self._log = logger

    def exception(self, msg: str, *args: Any, exc_info: Any = None, **kw: Any) -> None:
        if isinstance(exc_info, ConnectionError):
            # The client left mid-request (a slow body it gave up on): its own doing,
            # one debug line, never a traceback per connection.
            self._log.debug("HTTP client %s: gone mid-request (%s)",
                            printable(str(args[0]) if args else "?"), exc_info)
        elif isinstance(exc_info, HttpProcessingError):
            reason = str(exc_info.message).strip().splitlines()[0] if exc_info.message else ""
            self._log.info("HTTP client %s: bad request (%d): %s",
                           printable(args[0] if args else "?"), exc_info.code,
                           printable(reason, 200))
        else:
            self._log.error(msg, *args, exc_info=exc_info or True, **kw)

    def debug(self, msg: str, *args: Any, exc_info: Any = None, **kw: Any) -> None:
        # aiohttp says a bad method in a connection's first request at debug level, with
        # its traceback: one line, as every other bad request.
        if isinstance(exc_info, HttpProcessingError):
            self.exception(msg, *args, exc_info=exc_info, **kw)
        else:
            self._log.debug(msg, *args, exc_info=exc_info, **kw)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._log, name)


class HttpApi:
    #: Seconds to send a request's headers, from connecting or the last answer
    #: (``limits.HTTP_IDLE_TIMEOUT``).
    idle_timeout = HTTP_IDLE_TIMEOUT
    #: Seconds for the rest of a request once its headers are in (``limits``).
    body_timeout = HTTP_BODY_TIMEOUT

    def __init__(self, broker: Broker, addresses: dict[str, str], security=None,
                 tls: bool = False) -> None:
        self.broker = broker
        self.addresses = addresses  # filled in as servers bind: grpc, tcp, http
        self.security, self.tls = security, tls  # broker/security: HTTPS, TLS policy, auth
        self.hosts = HostPolicy()   # the Host names it answers to, set when it listens

        @web.middleware
        async def host_allowed(request: web.Request, handler) -> web.StreamResponse:
            if not self.hosts.allows(request.headers.get("Host")):
                raise HttpError(403, "HOST_NOT_ALLOWED")
            return await handler(request)

        @web.middleware
        async def within_body_timeout(request: web.Request, handler) -> web.StreamResponse:
            # The headers came within idle_timeout; the rest of the request (its body
            # and the broker's work on it) has body_timeout, or 408 and the end of the
            # connection: a body sent a byte at a time holds its descriptor no longer.
            try:
                async with asyncio.timeout(self.body_timeout):
                    return await handler(request)
            except asyncio.TimeoutError:
                raise HttpError(408, "REQUEST_TIMEOUT") from None

        # _nsqd_answers outermost: it maps the errors of all below it.
        middlewares = [_nsqd_answers, within_body_timeout, host_allowed]
        if security is not None:
            from ..security.http_auth import security_middleware
            middlewares.append(security_middleware(
                security, broker, tls=tls,
                https_port=lambda: int(addresses.get("https", ":0").rpartition(":")[2] or 0)))

        @web.middleware
        async def written_first(request: web.Request, handler) -> web.StreamResponse:
            response = await handler(request)
            broker.storage.flush()  # what the answer acknowledges or counts is written
            return response

        middlewares.append(written_first)
        # Bodies are read with their own limits (below), never whole beyond them.
        self.app = web.Application(middlewares=middlewares,
                                   client_max_size=broker.options.max_body_size + 1)
        r = self.app.router
        r.add_get("/ping", self.ping)
        r.add_get("/info", self.info)
        r.add_post("/pub", self.pub)
        r.add_put("/pub", self.pub)
        r.add_post("/mpub", self.mpub)
        r.add_put("/mpub", self.mpub)
        r.add_get("/stats", self.stats)
        r.add_get("/metrics", self.metrics)
        for action in ("create", "delete", "empty", "pause", "unpause"):
            r.add_post(f"/topic/{action}", self._topic_action(action))
            r.add_post(f"/channel/{action}", self._channel_action(action))
        self.runner: web.AppRunner | None = None
        self.listener: Listener | None = None
        self._metrics = None  # built on the first scrape

    # -- handlers ---------------------------------------------------------
    async def ping(self, request: web.Request) -> web.Response:
        return web.Response(text="OK")

    async def info(self, request: web.Request) -> web.Response:
        tcp, http = self.addresses.get("tcp", ""), self.addresses.get("http", "")
        return web.json_response({
            "version": __version__,
            "broadcast_address": self.broker.options.broadcast_address or socket.gethostname(),
            "hostname": socket.gethostname(),
            "tcp_port": int(tcp.rpartition(":")[2] or 0),
            "http_port": int(http.rpartition(":")[2] or 0),
            "grpc_address": self.addresses.get("grpc", ""),
            "start_time": self.broker.start_time,
            # pynsqd --workers: every worker's own addresses (absent for a single broker)
            **({"workers": list(self.broker.workers)} if self.broker.workers else {})})

    async def pub(self, request: web.Request) -> web.Response:
        limit = self.broker.options.max_msg_size
        if (request.content_length or 0) > limit:
            raise HttpError(413, "MSG_TOO_BIG")
        body = await _read_at_most(request, limit)
        if body is None:
            raise HttpError(413, "MSG_TOO_BIG")
        if not body:
            raise HttpError(400, "MSG_EMPTY")
        topic = _topic(request)
        self.broker.get_or_create_topic(topic)   # as nsqd: the topic exists from here on
        defer_ms = 0
        defer = request.query.get("defer")
        if defer is not None:
            if not _GO_INT.fullmatch(defer):
                raise HttpError(400, "INVALID_DEFER")
            defer_ms = int(defer)
            try:
                self.broker.check_delay(defer_ms, "DPUB defer")
            except BrokerError:
                raise HttpError(400, "INVALID_DEFER") from None
        self.broker.publish(topic, body, defer_ms=defer_ms)
        return web.Response(text="OK")

    async def mpub(self, request: web.Request) -> web.Response:
        opts = self.broker.options
        if (request.content_length or 0) > opts.max_body_size:
            raise HttpError(413, "BODY_TOO_BIG")
        topic = _topic(request)
        self.broker.get_or_create_topic(topic)   # as nsqd: the topic exists from here on
        binary = request.query.get("binary")
        body = await _read_at_most(request, opts.max_body_size)
        if body is None:
            raise HttpError(413, "BODY_TOO_BIG")
        if binary is not None and _BOOL.get(binary, True):
            try:
                bodies = parse_mpub(body, max_msg_size=opts.max_msg_size,
                                    max_body_size=opts.max_body_size)
            except (InvalidBody, InvalidMessage) as err:
                # nsqd answers a bad binary body with 413 and the code without "E_".
                raise HttpError(413, err.code[2:]) from None
        else:
            # Empty lines are skipped, as nsqd does.
            bodies = [line for line in body.split(b"\n") if line]
            if any(len(b) > opts.max_msg_size for b in bodies):
                raise HttpError(413, "MSG_TOO_BIG")
        if bodies:   # nsqd answers OK to a body without messages
            self.broker.multi_publish(topic, bodies)
        return web.Response(text="OK")

    async def stats(self, request: web.Request) -> web.Response:
        topic = request.query.get("topic") or None
        channel = request.query.get("channel") or None
        if topic is not None and topic not in self.broker.topics:
            topics = []
        else:
            topics = self.broker.stats(topic, channel)
        data = {"version": __version__, "health": "OK", "start_time": self.broker.start_time,
                "topics": [_topic_json(t) for t in topics], "producers": []}
        if request.query.get("format") != "json":   # nsqd: text unless format=json
            return web.Response(text=_stats_text(data))
        return web.json_response(data)

    async def metrics(self, request: web.Request) -> web.Response:
        """Prometheus' text format (see ``broker.metrics``)."""
        from .. import metrics

        if self._metrics is None:
            self._metrics = metrics.registry_for(self.broker)
        return web.Response(body=metrics.exposition(self._metrics),
                            headers={"Content-Type": metrics.CONTENT_TYPE})

    def _topic_action(self, action: str):
        async def handle(request: web.Request) -> web.Response:
            if action == "create":
                name = _topic(request)
                ttl = _settings(request, {"ttl": _ttl_ms})
                with _bad_settings():
                    self.broker.create_topic(name, ttl_ms=ttl.get("ttl"))
            else:
                name = _arg(request, "topic", "MISSING_ARG_TOPIC")
                if action == "empty" and not is_valid_name(name):
                    raise HttpError(400, "INVALID_TOPIC")
                # nsqd checks no name for delete/pause: a bad one is simply not found.
                topic = self.broker.topics.get(name)
                if topic is None:
                    raise HttpError(404, "TOPIC_NOT_FOUND")
                if action == "delete":
                    self.broker.delete_topic(name)
                else:
                    getattr(topic, action)()
            return web.Response(text="")
        return handle

    def _channel_action(self, action: str):
        async def handle(request: web.Request) -> web.Response:
            topic, channel = _topic_and_channel(request)
            self.broker.topic(topic)   # TOPIC_NOT_FOUND first, as nsqd
            if action == "create":
                settings = _settings(request, {"max_attempts": int, "dead_letter_topic": str})
                with _bad_settings():
                    self.broker.create_channel(
                        topic, channel, max_attempts=settings.get("max_attempts"),
                        dead_letter_topic=settings.get("dead_letter_topic", ""))
            elif action == "delete":
                self.broker.delete_channel(topic, channel)
            else:
                getattr(self.broker.channel(topic, channel), action)()
            return web.Response(text="")
        return handle

    # -- serving ----------------------------------------------------------
    async def start(self, address: str, reuse_port: bool = False) -> str:
        """Listen on ``address``; with ``reuse_port``, beside other processes listening
        there the same way (``pynsqd --workers``)."""
        host, port = split_listen_address(address, "https-address" if self.tls
                                          else "http-address")
        self.hosts = hosts.policy(self.broker.options, address)
        # After an early answer (413), read what the client still sends for 1 s at most.
        # aiohttp's keep-alive timer runs from the connection's start and from each
        # answer, and is not reset by parts of a request: it bounds headers sent slowly
        # (or half) as well as idle connections.
        self.runner = web.AppRunner(self.app, access_log=None, lingering_time=1.0,
                                    keepalive_timeout=self.idle_timeout,
                                    logger=_ServerLog(logging.getLogger("aiohttp.server")))
        await self.runner.setup()
        server = self.runner.server
        assert server is not None
        tickets: dict[Any, Ticket] = {}
        lost = server.connection_lost

        def connection_lost(handler: Any, exc: BaseException | None = None) -> None:
            ticket = tickets.pop(handler, None)
            if ticket is not None:
                ticket.release()
            lost(handler, exc)

        server.connection_lost = connection_lost  # type: ignore[method-assign]
        ssl = self.security.tls_context if self.tls else None

        async def serve_one(sock: socket.socket, ticket: Ticket) -> None:
            made: list[Any] = []

            def handler() -> Any:
                made.append(server())
                tickets[made[-1]] = ticket
                return made[-1]

            await serve_accepted(
                sock, ticket, handler, ssl=ssl,
                **({"ssl_handshake_timeout": TLS_HANDSHAKE_TIMEOUT} if ssl else {}))
            if ticket.released:      # a handshake that failed: its handler never ran
                for h in made:
                    tickets.pop(h, None)

        def serve(sock: socket.socket, ticket: Ticket) -> None:
            spawn(serve_one(sock, ticket))

        try:
            self.listener = await Listener.start(
                host or None, port, gate_for(self.broker), "HTTPS" if self.tls else "HTTP",
                serve, reuse_port=reuse_port)
        except OSError as err:
            await self.runner.cleanup()
            raise OSError(f"cannot listen on {address} (HTTP): {err.strerror}") from None
        return host_port(host, self.listener.address()[1])

    async def close(self) -> None:
        if self.listener is not None:
            await self.listener.close()
            self.listener = None
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None


def _ttl_ms(text: str) -> int:
    return parse_duration_ms(text, name="ttl")


def _settings(request: web.Request, parsers: dict) -> dict:
    """The create settings given in the query, parsed; a bad one is nsqd-style
    400 ``INVALID_<NAME>``."""
    out = {}
    for key, parse in parsers.items():
        text = request.query.get(key)
        if text is None or text == "":
            continue
        try:
            out[key] = parse(text)
        except ValueError:
            raise HttpError(400, f"INVALID_{key.upper()}") from None
    return out


@contextmanager
def _bad_settings() -> Iterator[None]:
    """A create's settings the broker refused: 400 ``INVALID_<SETTING>`` (names are
    checked before, so a bad topic name here is the dead-letter topic's)."""
    try:
        yield
    except InvalidTopic:
        raise HttpError(400, "INVALID_DEAD_LETTER_TOPIC") from None
    except InvalidRequest as err:
        text = str(err)
        for key in ("max_attempts", "dead_letter_topic", "ttl"):
            if text.startswith(key):
                raise HttpError(400, f"INVALID_{key.upper()}") from None
        raise


def _latency(values: list[tuple[float, float]], count: int) -> dict:
    return {"count": count, "percentiles": [{"quantile": q, "value": int(v * 1e6)}
                                            for q, v in values]}


def _topic_json(t) -> dict:
    return {
        "topic_name": t.name, "depth": t.depth, "backend_depth": t.on_disk_count,
        "disk_bytes": t.disk_bytes, "rewritten_bytes": t.rewritten_bytes,
        "disk_read_errors": t.disk_read_errors, "memory_count": t.memory_count,
        "message_count": t.message_count, "message_bytes": t.message_bytes, "paused": t.paused,
        "ttl_ms": t.ttl_ms,
        "e2e_processing_latency": _latency(t.e2e_processing_latency, t.message_count),
        "channels": [{
            "channel_name": c.name, "depth": c.depth, "backend_depth": c.on_disk_count,
            "disk_bytes": c.disk_bytes, "memory_count": c.memory_count,
            "in_flight_count": c.in_flight_count, "deferred_count": c.deferred_count,
            "message_count": c.message_count, "requeue_count": c.requeue_count,
            "timeout_count": c.timeout_count, "client_count": len(c.clients), "paused": c.paused,
            "dead_letter_count": c.dead_letter_count, "expired_count": c.expired_count,
            "max_attempts": c.max_attempts, "dead_letter_topic": c.dead_letter_topic,
            "e2e_processing_latency": _latency(c.e2e_processing_latency, c.finish_count),
            "clients": [_client_json(k) for k in c.clients],
        } for c in t.channels]}


# nsqd's client states (its /stats ``state``): subscribed, closing.
_SUBSCRIBED, _CLOSING = 3, 4


def _client_json(k) -> dict:
    """A client as nsqd's /stats shows one (its field names and order)."""
    who = k.identity
    data = {
        "client_id": k.client_id, "hostname": who.hostname or k.client_id,
        "version": who.version, "remote_address": who.remote_address,
        "state": _CLOSING if k.closing else _SUBSCRIBED,
        "ready_count": k.ready_count, "in_flight_count": k.in_flight_count,
        "message_count": k.message_count, "finish_count": k.finish_count,
        "requeue_count": k.requeue_count, "connect_ts": k.connect_ts,
        # declined by pynsqd (see the IDENTIFY negotiation)
        "sample_rate": 0, "deflate": False, "snappy": False,
        "user_agent": who.user_agent}
    if who.authed:   # nsqd leaves these out for a client that has not authenticated
        data["authed"] = True
        if who.auth_identity:
            data["auth_identity"] = who.auth_identity
        if who.auth_identity_url:
            data["auth_identity_url"] = who.auth_identity_url
    # (nsqd says a negotiated protocol is mutual for every TLS client, ALPN or not)
    data.update({"tls": who.tls, "tls_cipher_suite": who.tls_cipher_suite,
                 "tls_version": who.tls_version, "tls_negotiated_protocol": "",
                 "tls_negotiated_protocol_is_mutual": who.tls})
    return data


def _stats_text(data: dict) -> str:
    lines = [f"pynsqd v{data['version']}", f"start_time {time.ctime(data['start_time'])}",
             f"health: {data['health']}", ""]
    for t in data["topics"]:
        lines.append(f"[{t['topic_name']:<15}] depth: {t['depth']:<5} msgs: {t['message_count']}")
        for c in t["channels"]:
            lines.append(f"    [{c['channel_name']:<25}] depth: {c['depth']:<5} "
                         f"inflt: {c['in_flight_count']:<4} def: {c['deferred_count']:<4} "
                         f"re-q: {c['requeue_count']:<5} timeout: {c['timeout_count']:<5} "
                         f"msgs: {c['message_count']}")
            for k in c["clients"]:
                port = k["remote_address"].rpartition(":")[2]
                who = f"{k['hostname']}:{port} {k['user_agent']}"
                connected = max(0, int(time.time()) - k["connect_ts"])
                lines.append(f"        [{k['version']} {who:<21}] state: {k['state']} "
                             f"inflt: {k['in_flight_count']:<4} rdy: {k['ready_count']:<4} "
                             f"fin: {k['finish_count']:<8} re-q: {k['requeue_count']:<8} "
                             f"msgs: {k['message_count']:<8} connected: {connected}s")
    return "\n".join(lines) + "\n"
