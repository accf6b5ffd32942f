"""nsqd's HTTP API (on aiohttp), so curl, nsqadmin-style tools and HTTP
publishers work unchanged: /ping, /info, /pub, /mpub, /stats, and topic and
channel create/delete/empty/pause/unpause, with nsqd's status codes and error
strings (``{"message": "MISSING_ARG_TOPIC"}``)."""

from __future__ import annotations

import json
import socket
import struct
import time

from aiohttp import web

from .. import __version__
from ..core import Broker
from ..errors import (ChannelNotFound, InvalidChannel, InvalidMessage, InvalidRequest,
                      InvalidTopic, MessageTooBig, StorageFailed, TopicNotFound)
from ..names import is_valid_name
from ..options import parse_duration_ms

SIZE = struct.Struct(">i")


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"message": message}, status=status)


class HttpApi:
    def __init__(self, broker: Broker, addresses: dict[str, str]) -> None:
        self.broker = broker
        self.addresses = addresses  # filled in as servers bind: grpc, tcp, http
        self.app = web.Application(client_max_size=max(5 << 20, broker.options.max_msg_size * 5))
        r = self.app.router
        r.add_get("/ping", self.ping)
        r.add_get("/info", self.info)
        r.add_post("/pub", self.pub)
        r.add_put("/pub", self.pub)
        r.add_post("/mpub", self.mpub)
        r.add_put("/mpub", self.mpub)
        r.add_get("/stats", self.stats)
        for action in ("create", "delete", "empty", "pause", "unpause"):
            r.add_post(f"/topic/{action}", self._topic_action(action))
            r.add_post(f"/channel/{action}", self._channel_action(action))
        self.runner: web.AppRunner | None = None

    # -- arguments --------------------------------------------------------
    @staticmethod
    def _name(request: web.Request, key: str) -> str:
        """A topic or channel argument, or nsqd's 400: MISSING_ARG_X / INVALID_X."""
        value = request.query.get(key)
        problem = ("MISSING_ARG_" if not value else
                   "INVALID_" if not is_valid_name(value) else None)
        if problem:
            raise web.HTTPBadRequest(text=json.dumps({"message": problem + key.upper()}),
                                     content_type="application/json")
        return value

    def _topic(self, request: web.Request) -> str:
        return self._name(request, "topic")

    def _channel(self, request: web.Request) -> str:
        return self._name(request, "channel")

    # -- handlers ---------------------------------------------------------
    async def ping(self, request: web.Request) -> web.Response:
        return web.Response(text="OK")

    async def info(self, request: web.Request) -> web.Response:
        tcp, http = self.addresses.get("tcp", ""), self.addresses.get("http", "")
        return web.json_response({
            "version": __version__, "broadcast_address": socket.gethostname(),
            "hostname": socket.gethostname(),
            "tcp_port": int(tcp.rpartition(":")[2] or 0),
            "http_port": int(http.rpartition(":")[2] or 0),
            "grpc_address": self.addresses.get("grpc", ""),
            "start_time": self.broker.start_time})

    async def pub(self, request: web.Request) -> web.Response:
        topic = self._topic(request)
        body = await request.read()
        defer = request.query.get("defer")
        defer_ms = 0
        if defer is not None:
            try:
                defer_ms = int(defer)
            except ValueError:
                return _error(400, "INVALID_DEFER")
            if not 0 <= defer_ms <= self.broker.options.max_req_timeout:
                return _error(400, "INVALID_DEFER")
        return self._publish(topic, [body], defer_ms)

    async def mpub(self, request: web.Request) -> web.Response:
        topic = self._topic(request)
        body = await request.read()
        if request.query.get("binary") in ("true", "1"):
            bodies = _binary_bodies(body)
            if bodies is None:
                return _error(400, "INVALID_BODY")
        else:
            bodies = [line for line in body.split(b"\n") if line]
        if not bodies:
            return _error(400, "MSG_EMPTY")
        return self._publish(topic, bodies, 0)

    def _publish(self, topic: str, bodies: list[bytes], defer_ms: int) -> web.Response:
        try:
            self.broker.multi_publish(topic, bodies, defer_ms=[defer_ms] * len(bodies)
                                      if defer_ms else ())
        except MessageTooBig:
            return _error(413, "MSG_TOO_BIG")
        except InvalidMessage:
            return _error(400, "MSG_EMPTY")
        except InvalidTopic:
            return _error(400, "INVALID_TOPIC")
        except StorageFailed:
            return _error(500, "PUB_FAILED")
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
        if request.query.get("format") == "text":
            return web.Response(text=_stats_text(data))
        return web.json_response(data)

    def _topic_action(self, action: str):
        async def handle(request: web.Request) -> web.Response:
            name = self._topic(request)
            try:
                if action == "create":
                    ttl = _settings(request, {"ttl": _ttl_ms})
                    self.broker.create_topic(name, ttl_ms=ttl.get("ttl"))
                elif action == "delete":
                    self.broker.delete_topic(name)
                else:
                    getattr(self.broker.topic(name), action)()
            except TopicNotFound:
                return _error(404, "TOPIC_NOT_FOUND")
            except InvalidRequest as err:
                return _error(400, _bad_setting(err))
            return web.Response(text="")
        return handle

    def _channel_action(self, action: str):
        async def handle(request: web.Request) -> web.Response:
            topic, channel = self._topic(request), self._channel(request)
            try:
                if action == "create":
                    settings = _settings(request, {"max_attempts": int,
                                                   "dead_letter_topic": str})
                    self.broker.create_channel(
                        topic, channel, max_attempts=settings.get("max_attempts"),
                        dead_letter_topic=settings.get("dead_letter_topic", ""))
                elif action == "delete":
                    self.broker.delete_channel(topic, channel)
                else:
                    getattr(self.broker.channel(topic, channel), action)()
            except TopicNotFound:
                return _error(404, "TOPIC_NOT_FOUND")
            except ChannelNotFound:
                return _error(404, "CHANNEL_NOT_FOUND")
            except InvalidChannel:
                return _error(400, "INVALID_CHANNEL")
            except InvalidTopic:
                return _error(400, "INVALID_DEAD_LETTER_TOPIC")
            except InvalidRequest as err:
                return _error(400, _bad_setting(err))
            return web.Response(text="")
        return handle

    # -- serving ----------------------------------------------------------
    async def start(self, address: str) -> str:
        host, _, port = address.rpartition(":")
        self.runner = web.AppRunner(self.app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, host, int(port), reuse_address=True)
        try:
            await site.start()
        except OSError as err:
            await self.runner.cleanup()
            raise OSError(f"cannot listen on {address} (HTTP): {err.strerror}") from None
        bound = site._server.sockets[0].getsockname()  # type: ignore[union-attr]
        return f"{host}:{bound[1]}"

    async def close(self) -> None:
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
            raise web.HTTPBadRequest(text=json.dumps({"message": f"INVALID_{key.upper()}"}),
                                     content_type="application/json") from None
    return out


def _bad_setting(err: InvalidRequest) -> str:
    text = str(err)
    for key in ("max_attempts", "dead_letter_topic", "ttl"):
        if text.startswith(key):
            return f"INVALID_{key.upper()}"
    return "INVALID_REQUEST"


def _binary_bodies(body: bytes) -> list[bytes] | None:
    if len(body) < 4:
        return None
    (count,) = SIZE.unpack_from(body, 0)
    bodies, pos = [], 4
    for _ in range(count):
        if pos + 4 > len(body):
            return None
        (size,) = SIZE.unpack_from(body, pos)
        if size < 0 or pos + 4 + size > len(body):
            return None
        bodies.append(body[pos + 4:pos + 4 + size])
        pos += 4 + size
    return bodies


def _latency(values: list[tuple[float, float]], count: int) -> dict:
    return {"count": count, "percentiles": [{"quantile": q, "value": int(v * 1e6)}
                                            for q, v in values]}


def _topic_json(t) -> dict:
    return {
        "topic_name": t.name, "depth": t.depth, "backend_depth": 0,
        "message_count": t.message_count, "message_bytes": t.message_bytes, "paused": t.paused,
        "e2e_processing_latency": _latency(t.e2e_processing_latency, t.message_count),
        "channels": [{
            "channel_name": c.name, "depth": c.depth, "backend_depth": 0,
            "in_flight_count": c.in_flight_count, "deferred_count": c.deferred_count,
            "message_count": c.message_count, "requeue_count": c.requeue_count,
            "timeout_count": c.timeout_count, "client_count": len(c.clients), "paused": c.paused,
            "dead_letter_count": c.dead_letter_count, "expired_count": c.expired_count,
            "e2e_processing_latency": _latency(c.e2e_processing_latency, c.finish_count),
            "clients": [{"client_id": k.client_id, "hostname": k.client_id,
                         "ready_count": k.ready_count, "in_flight_count": k.in_flight_count,
                         "message_count": k.message_count, "finish_count": k.finish_count,
                         "requeue_count": k.requeue_count} for k in c.clients],
        } for c in t.channels]}


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
    return "\n".join(lines) + "\n"
