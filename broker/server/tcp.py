"""NSQ's TCP protocol V2, so NSQ's own clients and tools work unchanged.

The wire, as nsqd speaks it: the client sends the magic ``"  V2"``, then
newline-terminated commands, some followed by a size-prefixed body; the broker
answers with frames ``[size][type][data]`` (big-endian; type 0 response,
1 error, 2 message), a message being ``[int64 ns timestamp][uint16 attempts]
[16-byte hex id][body]``.

Supported: IDENTIFY (with ``feature_negotiation``; heartbeats, ``msg_timeout``,
output buffer settings), SUB, PUB, MPUB, DPUB, RDY, FIN, REQ, TOUCH, CLS, NOP.
Declined in the IDENTIFY reply: TLS, snappy and deflate. AUTH answers
``E_AUTH_DISABLED``. As in nsqd, FIN/REQ/TOUCH failures are reported and the
connection stays open; other errors are sent and the connection is closed.
Output is written once per event-loop pass, however many frames are pending.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import struct
import time

from .. import __version__
from ..consumer import Consumer
from ..core import Broker
from ..errors import BrokerError, InvalidChannel, InvalidTopic, MessageTooBig, NotInFlight
from ..message import Message

log = logging.getLogger("pynsqd")

MAGIC_V2 = b"  V2"
FRAME_RESPONSE, FRAME_ERROR, FRAME_MESSAGE = 0, 1, 2
FRAME_HEAD = struct.Struct(">ii")
MESSAGE_HEAD = struct.Struct(">iiqH")   # size, type, timestamp, attempts
SIZE = struct.Struct(">i")
DEFAULT_HEARTBEAT_MS = 30_000
MAX_HEARTBEAT_MS = 60_000
MAX_LINE = 1024


def frame(kind: int, data: bytes) -> bytes:
    return FRAME_HEAD.pack(len(data) + 4, kind) + data


OK = frame(FRAME_RESPONSE, b"OK")
HEARTBEAT = frame(FRAME_RESPONSE, b"_heartbeat_")
CLOSE_WAIT = frame(FRAME_RESPONSE, b"CLOSE_WAIT")


class ProtocolError(Exception):
    """An nsqd error: ``code`` and text; ``fatal`` ones close the connection."""

    def __init__(self, code: str, text: str, fatal: bool = True) -> None:
        super().__init__(f"{code} {text}")
        self.code = code
        self.fatal = fatal


class _NeedMore(Exception):
    """The buffer ends inside a command."""


class V2Connection(asyncio.Protocol):
    def __init__(self, broker: Broker, server: "TcpServer") -> None:
        self.broker = broker
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.magic_seen = False
        self.out: list[bytes] = []
        self.flush_scheduled = False
        self.closing = False
        self.consumer: Consumer | None = None
        self.channel = None
        self.client_id = ""
        self.msg_timeout_ms = 0
        self.heartbeat_ms = DEFAULT_HEARTBEAT_MS
        self.last_read = time.monotonic()
        self._heartbeat: asyncio.TimerHandle | None = None
        self.loop = asyncio.get_running_loop()

    # -- asyncio ----------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        peer = transport.get_extra_info("peername")
        self.client_id = f"{peer[0]}:{peer[1]}" if peer else "tcp"
        self.server.connections.add(self)
        self._schedule_heartbeat()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        self.server.connections.discard(self)
        if self._heartbeat is not None:
            self._heartbeat.cancel()
        if self.consumer is not None and self.channel is not None and not self.channel.deleted:
            self.channel.remove_consumer(self.consumer)
        self.consumer = None

    def data_received(self, data: bytes) -> None:
        self.last_read = time.monotonic()
        self.buf += data
        try:
            self._process()
        except ProtocolError as err:
            self._error(err)

    # -- output -----------------------------------------------------------
    def send(self, data: bytes) -> None:
        self.out.append(data)
        if not self.flush_scheduled:
            self.flush_scheduled = True
            self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self.flush_scheduled = False
        if self.out and self.transport is not None and not self.transport.is_closing():
            self.transport.write(b"".join(self.out))
        self.out.clear()

    def _on_message(self, msg: Message) -> None:
        body = msg.body
        self.send(MESSAGE_HEAD.pack(len(body) + 30, FRAME_MESSAGE, msg.timestamp, msg.attempts)
                  + msg.id.encode() + body)

    def _error(self, err: ProtocolError) -> None:
        self.send(frame(FRAME_ERROR, str(err).encode()))
        if err.fatal:
            self._close()

    def _close(self) -> None:
        self._flush()
        self.closing = True
        if self.transport is not None:
            self.transport.close()

    def _evicted(self) -> None:
        self._close()

    # -- heartbeats -------------------------------------------------------
    def _schedule_heartbeat(self) -> None:
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            self._heartbeat = None
        if self.heartbeat_ms > 0 and not self.closing:
            self._heartbeat = self.loop.call_later(self.heartbeat_ms / 1000, self._beat)

    def _beat(self) -> None:
        if time.monotonic() - self.last_read > 2 * self.heartbeat_ms / 1000:
            log.info("TCP client %s: no heartbeat reply; closing", self.client_id)
            self._close()
            return
        self.send(HEARTBEAT)
        self._schedule_heartbeat()

    # -- parsing ----------------------------------------------------------
    def _process(self) -> None:
        buf = self.buf
        if not self.magic_seen:
            if len(buf) < 4:
                return
            if bytes(buf[:4]) != MAGIC_V2:
                self.send(frame(FRAME_ERROR, b"E_BAD_PROTOCOL"))
                self._close()
                return
            del buf[:4]
            self.magic_seen = True
        pos = 0
        try:
            while not self.closing:
                end = buf.find(b"\n", pos)
                if end < 0:
                    if len(buf) - pos > MAX_LINE:
                        raise ProtocolError("E_INVALID", "command line too long")
                    break
                line = bytes(buf[pos:end]).rstrip(b"\r")
                try:
                    pos = self._command(line, end + 1)
                except ProtocolError as err:
                    if err.fatal:
                        raise
                    self._error(err)  # FIN/REQ/TOUCH of a message not held: go on
                    pos = end + 1
        except _NeedMore:
            pass
        finally:
            del buf[:pos]

    def _body(self, start: int) -> tuple[bytes, int]:
        """The size-prefixed body at ``start``; raises _NeedMore until it is all here."""
        buf = self.buf
        if len(buf) < start + 4:
            raise _NeedMore
        (size,) = SIZE.unpack_from(buf, start)
        if size < 0 or size > self.server.max_body_size:
            raise ProtocolError("E_BAD_BODY", f"body size {size} is invalid")
        if len(buf) < start + 4 + size:
            raise _NeedMore
        return bytes(buf[start + 4:start + 4 + size]), start + 4 + size

    def _command(self, line: bytes, after: int) -> int:
        """Run one command; return where the next one starts."""
        parts = line.split(b" ")
        name = parts[0]
        args = [p.decode(errors="replace") for p in parts[1:]]
        if name == b"FIN":
            self._fin(args)
        elif name == b"RDY":
            self._rdy(args)
        elif name == b"PUB":
            body, after = self._body(after)
            self._pub(args, [body], 0, "PUB")
        elif name == b"MPUB":
            body, after = self._body(after)
            self._pub(args, self._split_mpub(body), 0, "MPUB")
        elif name == b"DPUB":
            body, after = self._body(after)
            self._dpub(args, body)
        elif name == b"REQ":
            self._req(args)
        elif name == b"TOUCH":
            self._touch(args)
        elif name == b"NOP":
            pass
        elif name == b"SUB":
            self._sub(args)
        elif name == b"IDENTIFY":
            body, after = self._body(after)
            self._identify(body)
        elif name == b"CLS":
            if self.consumer is None:
                raise ProtocolError("E_INVALID", "cannot CLS in current state")
            self.consumer.closing = True
            self.send(CLOSE_WAIT)
        elif name == b"AUTH":
            body, after = self._body(after)
            raise ProtocolError("E_AUTH_DISABLED", "AUTH disabled")
        elif not name:
            pass
        else:
            raise ProtocolError("E_INVALID", f"invalid command {name.decode(errors='replace')}")
        return after

    # -- commands ---------------------------------------------------------
    def _identify(self, body: bytes) -> None:
        try:
            data = json.loads(body)
            if not isinstance(data, dict):
                raise ValueError("not an object")
        except ValueError as err:
            raise ProtocolError("E_BAD_BODY", f"IDENTIFY failed to decode JSON body: {err}")
        opts = self.broker.options
        self.client_id = str(data.get("client_id") or self.client_id)
        try:
            heartbeat = int(data.get("heartbeat_interval", 0) or 0)
            msg_timeout = int(data.get("msg_timeout", 0) or 0)
            buffer_size = int(data.get("output_buffer_size", 16384) or 16384)
            buffer_timeout = int(data.get("output_buffer_timeout", 250) or 250)
        except (TypeError, ValueError) as err:
            raise ProtocolError("E_BAD_BODY", f"IDENTIFY has a field that is not a number: {err}")
        if heartbeat == -1:
            self.heartbeat_ms = 0
        elif heartbeat:
            if not 1000 <= heartbeat <= MAX_HEARTBEAT_MS:
                raise ProtocolError("E_BAD_BODY", f"IDENTIFY heartbeat interval ({heartbeat}) "
                                    f"is invalid")
            self.heartbeat_ms = heartbeat
        if msg_timeout and not 1000 <= msg_timeout <= opts.max_msg_timeout:
            raise ProtocolError("E_BAD_BODY", f"IDENTIFY msg timeout ({msg_timeout}) is invalid")
        self.msg_timeout_ms = msg_timeout
        self._schedule_heartbeat()
        if not data.get("feature_negotiation"):
            self.send(OK)
            return
        self.send(frame(FRAME_RESPONSE, json.dumps({
            "max_rdy_count": opts.max_rdy_count, "version": __version__,
            "max_msg_timeout": opts.max_msg_timeout,
            "msg_timeout": msg_timeout or opts.msg_timeout,
            "tls_v1": False, "deflate": False, "deflate_level": 0, "max_deflate_level": 0,
            "snappy": False, "sample_rate": 0, "auth_required": False,
            "output_buffer_size": buffer_size, "output_buffer_timeout": buffer_timeout,
        }).encode()))

    def _sub(self, args: list[str]) -> None:
        if self.consumer is not None:
            raise ProtocolError("E_INVALID", "cannot SUB in current state")
        if len(args) < 2:
            raise ProtocolError("E_INVALID", "SUB insufficient number of parameters")
        topic, channel = args[0], args[1]
        consumer = Consumer(self._on_message, client_id=self.client_id,
                            msg_timeout=self.broker.msg_timeout(self.msg_timeout_ms))
        consumer.on_evicted = self._evicted
        try:
            self.channel = self.broker.subscribe(consumer, topic, channel)
        except InvalidTopic:
            raise ProtocolError("E_BAD_TOPIC", f"SUB topic name {topic!r} is not valid")
        except InvalidChannel:
            raise ProtocolError("E_BAD_CHANNEL", f"SUB channel name {channel!r} is not valid")
        self.consumer = consumer
        self.send(OK)

    def _rdy(self, args: list[str]) -> None:
        if self.consumer is None or self.channel is None:
            raise ProtocolError("E_INVALID", "cannot RDY in current state")
        try:
            count = int(args[0]) if args else 1
        except ValueError:
            raise ProtocolError("E_INVALID", f"RDY could not parse count {args[0]}")
        limit = self.broker.options.max_rdy_count
        if not 0 <= count <= limit:
            raise ProtocolError("E_INVALID", f"RDY count {count} out of range 0-{limit}")
        self.channel.set_rdy(self.consumer, count)

    def _held_command(self, name: str, args: list[str], nargs: int) -> str:
        if self.consumer is None or self.channel is None:
            raise ProtocolError("E_INVALID", f"cannot {name} in current state")
        if len(args) < nargs:
            raise ProtocolError("E_INVALID", f"{name} insufficient number of params")
        if len(args[0]) != 16:
            raise ProtocolError("E_INVALID", f"{name} invalid message id {args[0]!r}")
        return args[0]

    def _fin(self, args: list[str]) -> None:
        msg_id = self._held_command("FIN", args, 1)
        try:
            self.channel.finish(self.consumer, msg_id)
        except NotInFlight as err:
            raise ProtocolError("E_FIN_FAILED", f"FIN {msg_id} failed {err}", fatal=False)

    def _req(self, args: list[str]) -> None:
        msg_id = self._held_command("REQ", args, 2)
        try:
            delay_ms = int(args[1])
        except ValueError:
            raise ProtocolError("E_INVALID", f"REQ could not parse timeout {args[1]}")
        limit = self.broker.options.max_req_timeout
        if not 0 <= delay_ms <= limit:
            raise ProtocolError("E_INVALID", f"REQ timeout {delay_ms} out of range 0-{limit}")
        try:
            self.channel.requeue(self.consumer, msg_id, delay_ms / 1000)
        except NotInFlight as err:
            raise ProtocolError("E_REQ_FAILED", f"REQ {msg_id} failed {err}", fatal=False)

    def _touch(self, args: list[str]) -> None:
        msg_id = self._held_command("TOUCH", args, 1)
        try:
            self.channel.touch(self.consumer, msg_id)
        except NotInFlight as err:
            raise ProtocolError("E_TOUCH_FAILED", f"TOUCH {msg_id} failed {err}", fatal=False)

    def _split_mpub(self, body: bytes) -> list[bytes]:
        if len(body) < 4:
            raise ProtocolError("E_BAD_BODY", "MPUB invalid body size")
        (count,) = SIZE.unpack_from(body, 0)
        if count <= 0:
            raise ProtocolError("E_BAD_BODY", f"MPUB invalid message count {count}")
        msgs, pos = [], 4
        for _ in range(count):
            if pos + 4 > len(body):
                raise ProtocolError("E_BAD_BODY", "MPUB failed to read message body size")
            (size,) = SIZE.unpack_from(body, pos)
            if size <= 0 or pos + 4 + size > len(body):
                raise ProtocolError("E_BAD_MESSAGE", f"MPUB invalid message body size {size}")
            msgs.append(body[pos + 4:pos + 4 + size])
            pos += 4 + size
        return msgs

    def _dpub(self, args: list[str], body: bytes) -> None:
        if len(args) < 2:
            raise ProtocolError("E_INVALID", "DPUB insufficient number of parameters")
        try:
            defer = int(args[1])
        except ValueError:
            raise ProtocolError("E_INVALID", f"DPUB could not parse timeout {args[1]}")
        limit = self.broker.options.max_req_timeout
        if not 0 <= defer <= limit:
            raise ProtocolError("E_INVALID", f"DPUB timeout {defer} out of range 0-{limit}")
        self._pub(args, [body], defer, "DPUB")

    def _pub(self, args: list[str], bodies: list[bytes], defer_ms: int, name: str) -> None:
        if not args:
            raise ProtocolError("E_INVALID", f"{name} insufficient number of parameters")
        topic = args[0]
        try:
            self.broker.multi_publish(topic, bodies, defer_ms=[defer_ms] * len(bodies)
                                      if defer_ms else ())
        except InvalidTopic:
            raise ProtocolError("E_BAD_TOPIC", f"{name} topic name {topic!r} is not valid")
        except MessageTooBig as err:
            raise ProtocolError("E_BAD_MESSAGE", f"{name} message too big: {err}")
        except BrokerError as err:
            code = "E_BAD_MESSAGE" if err.code == "E_BAD_MESSAGE" else f"E_{name}_FAILED"
            raise ProtocolError(code, f"{name} failed: {err}")
        self.send(OK)


class TcpServer:
    """Accepts V2 connections on an address; ``close`` stops it."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.connections: set[V2Connection] = set()
        self.server: asyncio.AbstractServer | None = None
        # An MPUB may carry many messages; bound it as nsqd's --max-body-size does.
        self.max_body_size = max(5 * 1024 * 1024, broker.options.max_msg_size * 5)

    async def start(self, address: str) -> str:
        host, _, port = address.rpartition(":")
        loop = asyncio.get_running_loop()
        try:
            self.server = await loop.create_server(lambda: V2Connection(self.broker, self),
                                                   host, int(port), reuse_address=True)
        except OSError as err:
            raise OSError(f"cannot listen on {address} (TCP): {err.strerror}") from None
        bound = self.server.sockets[0].getsockname()
        return f"{host}:{bound[1]}"

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
            for conn in list(self.connections):
                conn._close()
            await self.server.wait_closed()
            self.server = None
