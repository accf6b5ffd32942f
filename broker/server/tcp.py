"""NSQ's TCP protocol V2, so NSQ's own clients and tools work unchanged.

The wire, as nsqd speaks it: the client sends the magic ``"  V2"``, then
newline-terminated commands, some followed by a size-prefixed body; the broker
answers with frames ``[size][type][data]`` (big-endian; type 0 response,
1 error, 2 message), a message being ``[int64 ns timestamp][uint16 attempts]
[16-byte hex id][body]``.

Supported: IDENTIFY (with ``feature_negotiation``; heartbeats, ``msg_timeout``,
output buffer settings), SUB, PUB, MPUB, DPUB, RDY, FIN, REQ, TOUCH, CLS, NOP.
With a certificate configured, IDENTIFY with ``tls_v1`` upgrades the connection
to TLS, as nsqd does; with auth servers configured, ``auth_required`` is set,
AUTH asks them, and PUB/MPUB/DPUB/SUB are checked (``broker/security``).
Declined in the IDENTIFY reply: snappy and deflate. Without auth servers AUTH
answers ``E_AUTH_DISABLED``. As in nsqd, FIN/REQ/TOUCH failures are reported and the
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
from ..security.auth import AuthError
from ..security.guard import Security

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


class _Wait(Exception):
    """A command needs the loop (TLS handshake, asking the auth server): reading stops
    until ``work`` is done, then resumes at ``resume`` (None: run the command again)."""

    def __init__(self, work, resume: int | None = None) -> None:
        self.work = work
        self.resume = resume


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
        # -- security: TLS after IDENTIFY, NSQ's auth --
        self.tls = False
        self.auth = None
        self._waiting: asyncio.Future | None = None

    # -- asyncio ----------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        peer = transport.get_extra_info("peername")
        self.client_id = f"{peer[0]}:{peer[1]}" if peer else "tcp"
        if self.server.security is not None:
            self.auth = self.server.security.client_auth(peer[0] if peer else "")
        self.server.connections.add(self)
        self._schedule_heartbeat()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        self.server.connections.discard(self)
        if self._heartbeat is not None:
            self._heartbeat.cancel()
        if self._waiting is not None:
            self._waiting.cancel()
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
        if self._waiting is not None:
            return  # the rest is read when the command waiting on the loop is done
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
                except _Wait as wait:
                    pos = pos if wait.resume is None else wait.resume
                    self._waiting = asyncio.ensure_future(self._wait_then_go_on(wait.work))
                    break
        except _NeedMore:
            pass
        finally:
            del buf[:pos]

    async def _wait_then_go_on(self, work) -> None:
        try:
            await work
        except AuthError as err:
            self._waiting = None
            self._error(ProtocolError(err.code, str(err)))
            return
        except ProtocolError as err:
            self._waiting = None
            self._error(err)
            return
        except asyncio.CancelledError:
            raise
        except Exception as err:
            log.info("TCP client %s: %s; closing", self.client_id, err)
            self._waiting = None
            self._close()
            return
        self._waiting = None
        if not self.closing:
            try:
                self._process()
            except ProtocolError as err:
                self._error(err)

    # -- security (broker/security): TLS upgrade, AUTH, one check per PUB/SUB --
    def _tls_policy(self, name: bytes) -> None:
        security = self.server.security
        if name != b"IDENTIFY" and security is not None and security.tcp_tls_required() \
                and not self.tls:
            raise ProtocolError("E_INVALID", f"cannot {name.decode(errors='replace')} in "
                                f"current state (TLS required)")

    async def _upgrade_tls(self) -> None:
        self._flush()  # the IDENTIFY answer goes out in plain text, then the handshake
        transport = await self.loop.start_tls(self.transport, self,
                                              self.server.security.tls_context,
                                              server_side=True, ssl_handshake_timeout=5)
        self.transport = transport
        self.tls = True
        if self.auth is not None:
            from ..security.tls import peer_common_name
            self.auth.tls = True
            self.auth.common_name = peer_common_name(transport.get_extra_info("ssl_object"))
        self.send(OK)

    def _auth(self, body: bytes) -> None:
        if self.consumer is not None:
            raise ProtocolError("E_INVALID", "cannot AUTH in current state")
        if not body:
            raise ProtocolError("E_BAD_BODY", "AUTH invalid body size 0")
        if self.auth is not None and self.auth.secret is not None:
            raise ProtocolError("E_INVALID", "AUTH already set")
        if self.auth is None:
            raise ProtocolError("E_AUTH_DISABLED", "AUTH disabled")

        async def auth() -> None:
            await self.auth.auth(body.decode(errors="replace"))
            self.send(frame(FRAME_RESPONSE, self.auth.reply()))

        raise _Wait(auth())

    def _check_auth(self, command: str, topic: str, channel: str = "") -> None:
        if self.auth is None:
            return
        if self.auth.needs_query():
            raise _Wait(self.auth.refresh())  # the ttl ran out: ask again, then run it again
        try:
            self.auth.check(command, topic, channel)
        except AuthError as err:
            raise ProtocolError(err.code, str(err))

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
        if name:
            self._tls_policy(name)
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
            try:
                self._identify(body)
            except _Wait as wait:  # the TLS upgrade: the next command comes after it
                wait.resume = after
                raise
        elif name == b"CLS":
            if self.consumer is None:
                raise ProtocolError("E_INVALID", "cannot CLS in current state")
            self.consumer.closing = True
            self.send(CLOSE_WAIT)
        elif name == b"AUTH":
            body, after = self._body(after)
            try:
                self._auth(body)
            except _Wait as wait:
                wait.resume = after
                raise
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
        security = self.server.security
        tls_v1 = bool(data.get("tls_v1")) and security is not None \
            and security.tls_context is not None and not self.tls
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
            "tls_v1": tls_v1, "deflate": False, "deflate_level": 0, "max_deflate_level": 0,
            "snappy": False, "sample_rate": 0,
            "auth_required": security is not None and security.auth_required,
            "output_buffer_size": buffer_size, "output_buffer_timeout": buffer_timeout,
        }).encode()))
        if tls_v1:
            raise _Wait(self._upgrade_tls())

    def _sub(self, args: list[str]) -> None:
        if self.consumer is not None:
            raise ProtocolError("E_INVALID", "cannot SUB in current state")
        if len(args) < 2:
            raise ProtocolError("E_INVALID", "SUB insufficient number of parameters")
        topic, channel = args[0], args[1]
        self._check_auth("SUB", topic, channel)
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
        self._check_auth(name, topic)
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

    def __init__(self, broker: Broker, security: Security | None = None) -> None:
        self.broker = broker
        self.security = security
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
