"""NSQ's TCP protocol V2, so NSQ's own clients and tools work unchanged.

The wire (``wire.py``): the client sends the magic ``"  V2"``, then
newline-terminated commands, some followed by a size-prefixed body; the broker
answers with frames ``[size][type][data]``.

Supported: IDENTIFY (with ``feature_negotiation``; heartbeats, ``msg_timeout``,
output buffer settings), SUB, PUB, MPUB, DPUB, RDY, FIN, REQ, TOUCH, CLS, NOP.
With a certificate configured, IDENTIFY with ``tls_v1`` upgrades the connection
to TLS, as nsqd does; with auth servers configured, ``auth_required`` is set,
AUTH asks them, and PUB/MPUB/DPUB/SUB are checked (``broker/security``).
Declined in the IDENTIFY reply: snappy and deflate. Without auth servers AUTH
answers ``E_AUTH_DISABLED``. Errors are nsqd's, checked in nsqd's order; fatal ones
(all but FIN/REQ/TOUCH failures) are sent and the connection is closed. When a
client closes its side mid-command, it gets the error nsqd gives for the
truncation.

Output is written once per event-loop pass, or at once when it fills the
client's ``output_buffer_size`` (as nsqd's buffered writer does) or hands a
consumer all its RDY allows (as nsqd flushes a client whose RDY is used up). The channel
hands a consumer its messages in batches of up to ``BATCH_BYTES`` of bodies (or
the output buffer size, if larger), framed together and written at once. Backpressure:
a consumer whose socket stops taking data (its unsent output passes
``output_buffer_size``) gets nothing more until it drains; one stuck that way
longer than its message timeout is disconnected, and what it held goes back to
the channel.

FIN lines that follow one another in what the socket delivered are read at once
and finished as one batch (``Channel.finish_many``): the channel refills the
consumer once for them, not once per FIN.

A connection is always in one ``State`` (as nsqd's ``stateInit``,
``stateSubscribed``, ``stateClosing``), which names the commands it accepts and
whether the client's input is read. Each transition says what happens to input
already read: the TLS upgrade discards it (it came in plain text, before the
handshake), AUTH keeps it and runs it after the auth server's answer, a close
drops it. While the broker waits (TLS handshake, auth server) it reads nothing,
and a reply queued while the socket does not take the connection's output stops
the reading until it drains, so a client cannot make the broker hold more than
the bounds of ``limits.py``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import time
from typing import Callable

from .. import __version__
from ..consumer import Consumer
from ..core import Broker
from ..errors import (AuthDisabled, BodyTooBig, BrokerError, Invalid, InvalidBody,
                      InvalidRequest, LimitReached)
from ..message import Message
from ..names import check_topic_name
from ..options import split_listen_address
from . import wire
from ..security.guard import Security
from ..security.printable import printable
from ..stats import ClientIdentity, host_port
from .admission import Listener, Ticket, gate_for, serve_accepted, spawn
from .limits import MAX_UNSENT_BYTES, TLS_HANDSHAKE_TIMEOUT
from .wire import (FRAME_RESPONSE, MAGIC_V2, Incomplete, LineTooLong, base10, error_frame,
                   frame, message_id)

log = logging.getLogger("pynsqd")

DEFAULT_HEARTBEAT_MS = 30_000
MAX_HEARTBEAT_MS = 60_000
DEFAULT_OUTPUT_BUFFER = 16 * 1024
MAX_OUTPUT_BUFFER = 64 * 1024
MIN_OUTPUT_BUFFER_TIMEOUT_MS, MAX_OUTPUT_BUFFER_TIMEOUT_MS = 25, 30_000
# Message bodies handed to a connection at once (a batch, framed and written together):
# fewer, larger socket writes, while a client that stops reading holds little more.
BATCH_BYTES = 64 * 1024
# Seconds a connection closed for a fatal error still reads (and drops) what its client
# sends, so the client sees the error rather than a reset (see _hang_up).
LINGER = 2.0

OK = frame(FRAME_RESPONSE, b"OK")
HEARTBEAT = frame(FRAME_RESPONSE, b"_heartbeat_")
CLOSE_WAIT = frame(FRAME_RESPONSE, b"CLOSE_WAIT")


def _json_int(data: dict, key: str) -> int:
    value = data.get(key, 0)
    if value is None:
        return 0
    if type(value) is not int:
        raise InvalidBody(f"IDENTIFY failed to decode JSON body: {key} is not an integer")
    return value


class State:
    """A state of a V2 connection: the commands it runs and whether input is read."""

    __slots__ = ("name", "commands", "reads", "runs", "fins")

    def __init__(self, name: str, commands: tuple[bytes, ...], *, reads: bool = True) -> None:
        self.name = name
        self.commands = frozenset(commands)
        self.reads = reads                   # the socket is read in this state
        self.runs = bool(commands)           # commands read are run in this state
        self.fins = b"FIN" in self.commands  # FIN lines take the batched path

    def __repr__(self) -> str:
        return f"<State {self.name}>"


_PUBLISH = (b"PUB", b"MPUB", b"DPUB", b"NOP")
#: Before the magic "  V2": only the magic.
MAGIC = State("magic", ())
#: nsqd's stateInit: identify, authenticate, publish, subscribe.
INIT = State("init", (b"IDENTIFY", b"AUTH", b"SUB") + _PUBLISH)
#: IDENTIFY asked for TLS: nothing is read until the handshake is done, and what was
#: read with the IDENTIFY (plain text) is discarded; then INIT again.
UPGRADING = State("upgrading TLS", (), reads=False)
#: Waiting on the auth server (AUTH, or a PUB/SUB whose authorisation expired):
#: nothing is read; what was read is run after the answer, in the state before.
AUTHENTICATING = State("authenticating", (), reads=False)
#: nsqd's stateSubscribed.
SUBSCRIBED = State("subscribed", (b"RDY", b"FIN", b"REQ", b"TOUCH", b"CLS") + _PUBLISH)
#: nsqd's stateClosing, after CLS: RDY is ignored, held messages are still answered.
CLOSING = State("closing", (b"RDY", b"FIN", b"REQ", b"TOUCH") + _PUBLISH)
#: Hung up (a fatal error, EOF, eviction): what the client still sends is dropped.
CLOSED = State("closed", ())


class _Wait(Exception):
    """A command needs the loop (TLS handshake, asking the auth server): the
    connection enters ``state`` (which reads nothing) until ``work`` is done, then
    resumes at ``resume`` (None: run the command again)."""

    def __init__(self, work, state: State, resume: int | None = None) -> None:
        self.work = work
        self.state = state
        self.resume = resume


class V2Connection(asyncio.Protocol):
    def __init__(self, broker: Broker, server: "TcpServer", ticket: Ticket | None = None
                 ) -> None:
        self.broker = broker
        self.server = server
        self.ticket = ticket          # its place under the connection caps (admission.py)
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.state = MAGIC
        self.out: list[bytes] = []
        self.out_bytes = 0
        self.flush_scheduled = False
        self.write_paused = False
        # A reply is waiting while the socket does not take the output: input is not
        # read (nor run) until it drains.
        self.output_held = False
        self.reading = True                  # the transport is reading (not paused)
        self.consumer: Consumer | None = None
        # The client's name in every log line of its life: the address it connected from,
        # fixed at connect (IDENTIFY's client_id is said once, and is /stats' own).
        self.name = ""
        # What IDENTIFY said of the client (client_id, hostname, user_agent), for /stats.
        self.identified: dict[str, str] = {}
        self.msg_timeout_ms = 0
        self.output_buffer_size = DEFAULT_OUTPUT_BUFFER
        self.heartbeat_ms = DEFAULT_HEARTBEAT_MS
        self.last_read = time.monotonic()
        self._heartbeat: asyncio.TimerHandle | None = None
        self._stuck: asyncio.TimerHandle | None = None
        self._linger: asyncio.TimerHandle | None = None
        self._eof_sent = False
        self.loop = asyncio.get_running_loop()
        # -- security: TLS after IDENTIFY, NSQ's auth --
        self.tls = False
        self.auth = None
        self._waiting: asyncio.Future | None = None
        self._state_after_wait = INIT

    @property
    def closing(self) -> bool:
        return self.state is CLOSED

    def _enter(self, state: State) -> None:
        self.state = state
        self._update_reading()

    def _update_reading(self) -> None:
        """Read the socket when the state reads and no reply waits on a full socket."""
        want = self.state.reads and not self.output_held
        transport = self.transport
        if want is self.reading or transport is None or transport.is_closing():
            return
        self.reading = want
        if want:
            transport.resume_reading()
        else:
            transport.pause_reading()

    # -- asyncio ----------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._set_buffer_limits()
        peer = transport.get_extra_info("peername")
        self.name = f"{peer[0]}:{peer[1]}" if peer else "tcp"
        log.info("TCP: new client(%s)", self.name)
        if self.server.security is not None:
            self.auth = self.server.security.client_auth(peer[0] if peer else "")
        self.server.connections.add(self)
        self._schedule_heartbeat()

    def connection_lost(self, exc: Exception | None) -> None:
        log.info("TCP: client(%s) gone%s", self.name, f" ({exc})" if exc else "")
        self.state = CLOSED
        self.server.connections.discard(self)
        if self.ticket is not None:
            self.ticket.release()
        for timer in (self._heartbeat, self._stuck, self._linger):
            if timer is not None:
                timer.cancel()
        if self._waiting is not None:
            self._waiting.cancel()
        self._detach()

    def _detach(self) -> None:
        if self.consumer is not None:
            self.consumer.detach()
        self.consumer = None

    def data_received(self, data: bytes) -> None:
        if self.state is CLOSED:
            return   # hung up: what the client still sends is dropped
        self.last_read = time.monotonic()
        if self.state.fins and not self.buf and not self.output_held:
            # A consumer's usual read, FIN lines only and all whole: finished from what
            # was read, without the buffer (as ``_process`` would).
            ids, end = wire.read_fins(data, 0)
            if end == len(data):
                # (``_fin_many``, inline: a consumer's every read)
                consumer = self.consumer
                failures = consumer.channel.finish_many(consumer, ids)
                if failures:
                    self._fin_failed(failures)
                return
        self.buf += data
        self._process(final=False)

    def eof_received(self) -> bool:
        if self.state is CLOSED:
            return False
        self._process(final=True)
        self._close()
        return False

    def pause_writing(self) -> None:
        self.write_paused = True
        if self.consumer is not None:
            self.consumer.block()
        if self._stuck is None:
            self._stuck = self.loop.call_later(self._stuck_after(), self._stuck_out)

    def resume_writing(self) -> None:
        self.write_paused = False
        if self._stuck is not None:
            self._stuck.cancel()
            self._stuck = None
        if self.consumer is not None and self.out_bytes < self.output_buffer_size:
            self.consumer.unblock()
        if self.output_held:
            self.output_held = False
            self._update_reading()
            self.loop.call_soon(self._process, False)   # what was read and not yet run

    # -- output -----------------------------------------------------------
    def send(self, data: bytes) -> None:
        """Queue a reply. One queued while the socket does not take the output stops
        the reading (as nsqd's blocked writer does): see ``_hold_output``."""
        self.out.append(data)
        self.out_bytes += len(data)
        if self.write_paused:
            self._hold_output()
        self._queued()

    def _queued(self) -> None:
        """Output was queued: written at once when it fills the client's output
        buffer, else when this pass of the event loop ends."""
        if self.out_bytes >= self.output_buffer_size:
            self._write_out()
        elif not self.flush_scheduled:
            self.flush_scheduled = True
            self.server.flush_soon(self)

    def _hold_output(self) -> None:
        """Stop reading until the socket drains; a client whose unsent output passes
        the budget anyway is disconnected."""
        if not self.output_held:
            self.output_held = True
            self._update_reading()
        transport = self.transport
        unsent = self.out_bytes + (transport.get_write_buffer_size() if transport else 0)
        if unsent > MAX_UNSENT_BYTES + self.broker.options.max_msg_size \
                and self.state is not CLOSED:
            log.warning("TCP client %s: %d bytes unsent, over the connection's budget; "
                        "disconnecting", self.name, unsent)
            self.state = CLOSED
            self.out.clear()
            self.out_bytes = 0
            if transport is not None:
                transport.abort()

    def _flush(self) -> None:
        self.flush_scheduled = False
        self._write_out()
        consumer = self.consumer
        if consumer is not None and consumer.blocked and not self.write_paused:
            consumer.unblock()

    def _write_out(self) -> None:
        """Hand what is queued to the transport (which calls ``pause_writing`` if
        the socket does not take it)."""
        out = self.out
        if not out:
            return
        data = b"".join(out)
        out.clear()
        self.out_bytes = 0
        if self.transport is not None and not self.transport.is_closing() \
                and not self._eof_sent:
            self.transport.write(data)

    def _on_message(self, msg: Message) -> None:
        self._on_messages((msg,))

    def _on_messages(self, msgs: "list[Message] | tuple[Message, ...]") -> None:
        # The frames' parts go out as they are: joined once per write, not per message.
        self.out_bytes += wire.add_message_frames(self.out, msgs)
        # Written at once, too, when the consumer has all its RDY allows (as nsqd flushes
        # a client whose RDY is used up): nothing more can come to it before it answers,
        # so waiting for the pass to end would only add a callback's work to each write
        # (a thousand consumers at RDY 2: one for every two messages).
        consumer = self.consumer
        # (``_queued`` and ``flush_soon``, inline: a consumer is handed messages once per
        # event of its own)
        if self.out_bytes >= self.output_buffer_size \
                or consumer.rdy <= len(consumer.in_flight):
            self._write_out()
        elif not self.flush_scheduled:
            self.flush_scheduled = True
            unflushed = self.server.unflushed
            if not unflushed:
                self.loop.call_soon(self.server.flush_all)
            unflushed.append(self)

    def _set_buffer_limits(self) -> None:
        if self.transport is not None:
            self.transport.set_write_buffer_limits(high=self.output_buffer_size)

    def _stuck_after(self) -> float:
        return self.msg_timeout_ms / 1000 if self.msg_timeout_ms else \
            self.broker.options.msg_timeout / 1000

    def _stuck_out(self) -> None:
        self._stuck = None
        log.warning("TCP client %s: has not read its output for %.1fs; disconnecting",
                    self.name, self._stuck_after())
        self.state = CLOSED
        if self.transport is not None:
            self.transport.abort()

    def _error(self, err: BrokerError) -> None:
        err.__traceback__ = err.__context__ = None  # the frames of the refused request go now
        self.send(error_frame(err))
        if err.fatal:
            log.info("TCP client %s: %s %s", self.name, err.code,
                     printable(err.message, 512))   # names the client sent among it
            self._hang_up()

    def _close(self) -> None:
        self._flush()
        self.state = CLOSED
        self.buf.clear()
        if self.transport is not None:
            self.transport.close()

    def _hang_up(self) -> None:
        """Close after a fatal error so that the client reads the error. Closing at
        once, as nsqd does, resets the connection when the client is still sending (a
        body over the limit, a pipeline of commands), and the reset can drop the error
        unread from the client's receive buffer. So: send what is queued and a FIN, stop
        delivering, then drop what comes in until the client closes or LINGER seconds
        pass. TLS connections cannot half-close and are closed at once."""
        transport = self.transport
        if self.closing or transport is None or transport.is_closing() \
                or not transport.can_write_eof():
            self._close()
            return
        self._flush()
        self.state = CLOSED
        self.buf.clear()
        self._detach()
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            self._heartbeat = None
        transport.write_eof()
        self._eof_sent = True
        self._linger = self.loop.call_later(LINGER, transport.close)

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
        # A client held for its unread output is the stuck timer's (pause_writing).
        if not self.output_held and \
                time.monotonic() - self.last_read > 2 * self.heartbeat_ms / 1000:
            log.info("TCP client %s: no heartbeat reply; closing", self.name)
            self._close()
            return
        self.send(HEARTBEAT)
        self._schedule_heartbeat()

    # -- parsing ----------------------------------------------------------
    def _process(self, final: bool) -> None:
        """Run every whole command in the buffer. ``final``: the client closed its
        side, so a command cut short gets nsqd's error for what is missing."""
        buf = self.buf
        if self.state is MAGIC:
            if len(buf) < 4:
                return
            if bytes(buf[:4]) != MAGIC_V2:
                self.send(frame(wire.FRAME_ERROR, b"E_BAD_PROTOCOL"))
                self._hang_up()
                return
            del buf[:4]
            self._enter(INIT)
        pos = 0
        try:
            # Most reads end on a command; a state that runs nothing (waiting, closed)
            # or a reply that cannot be sent stops the loop, the rest kept for later.
            while pos < len(buf) and self.state.runs and not self.output_held:
                if self.state.fins:
                    ids, end = wire.read_fins(buf, pos)
                    if ids:
                        pos = end
                        self._fin_many(ids)
                        continue
                params, line_end = wire.read_line(buf, pos)
                try:
                    pos = self._command(params, line_end)
                except BrokerError as err:
                    self._error(err)
                    pos = line_end   # only FIN/REQ/TOUCH failures go on; they have no body
                except _Wait as wait:
                    pos = pos if wait.resume is None else wait.resume
                    if wait.state is UPGRADING:
                        pos = len(buf)   # read in plain text before the handshake: dropped
                    self._state_after_wait = self.state
                    self._enter(wait.state)
                    self._waiting = asyncio.ensure_future(self._wait_then_go_on(wait.work))
                    break
                except (Incomplete, LineTooLong):
                    raise                  # the command is not all here: see below
                except Exception as err:   # a fault of the broker's, not the client's
                    log.error("TCP client %s: %s failed: %r; closing", self.name,
                              params[0].decode(errors="replace")[:32], err)
                    log.debug("the failure", exc_info=True)
                    self.send(frame(wire.FRAME_ERROR, b"E_INVALID internal error"))
                    self._hang_up()
                    return
        except Incomplete as short:
            if final and short.error is not None:
                self._error(short.error)
            elif len(buf) - pos > self.server.max_pending:
                self._error(BodyTooBig(f"request over max-body-size "
                                       f"{self.broker.options.max_body_size}"))
        except LineTooLong:
            log.info("TCP client %s: command line over %d bytes; closing", self.name,
                     wire.MAX_LINE)
            self._hang_up()
        finally:
            del buf[:pos]

    async def _wait_then_go_on(self, work) -> None:
        try:
            await work
        except asyncio.CancelledError:
            raise
        except BrokerError as err:   # the auth server's refusal (AuthError) among them
            self._waiting = None
            self._error(err)
            return
        except Exception as err:
            log.info("TCP client %s: %s; closing", self.name, printable(err, 512))
            self._waiting = None
            self._hang_up()
            return
        self._waiting = None
        if self.state is not CLOSED:
            self._enter(self._state_after_wait)
            self._process(final=False)

    def _command(self, params: list[bytes], pos: int) -> int:
        """Run one command; return where the next one starts."""
        name = params[0]
        self._tls_policy(name)
        handler = _COMMANDS.get(name)
        if handler is None:
            raise InvalidRequest(f"invalid command {name.decode(errors='replace')}")
        if name not in self.state.commands:
            raise InvalidRequest(f"cannot {name.decode()} in current state")
        return handler(self, params, pos)

    # -- commands ---------------------------------------------------------
    def _identify(self, params: list[bytes], pos: int) -> int:
        opts = self.broker.options
        body, pos = wire.read_body(self.buf, pos, "IDENTIFY", max_size=opts.max_body_size)
        try:
            data = json.loads(body)
        except ValueError as err:
            raise InvalidBody(f"IDENTIFY failed to decode JSON body: {err}") from None
        except RecursionError:
            raise InvalidBody("IDENTIFY failed to decode JSON body: nested too deeply") from None
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise InvalidBody("IDENTIFY failed to decode JSON body: not an object")
        heartbeat = _json_int(data, "heartbeat_interval")
        buffer_size = _json_int(data, "output_buffer_size")
        buffer_timeout = _json_int(data, "output_buffer_timeout")
        sample_rate = _json_int(data, "sample_rate")
        msg_timeout = _json_int(data, "msg_timeout")
        if heartbeat not in (-1, 0) and not 1000 <= heartbeat <= MAX_HEARTBEAT_MS:
            raise InvalidBody(f"IDENTIFY heartbeat interval ({heartbeat}) is invalid")
        if buffer_timeout not in (-1, 0) and not (
                MIN_OUTPUT_BUFFER_TIMEOUT_MS <= buffer_timeout <= MAX_OUTPUT_BUFFER_TIMEOUT_MS):
            raise InvalidBody(f"IDENTIFY output buffer timeout ({buffer_timeout}) is invalid")
        if buffer_size not in (-1, 0) and not 64 <= buffer_size <= MAX_OUTPUT_BUFFER:
            raise InvalidBody(f"IDENTIFY output buffer size ({buffer_size}) is invalid")
        if not 0 <= sample_rate <= 99:
            raise InvalidBody(f"IDENTIFY sample rate ({sample_rate}) is invalid")
        if msg_timeout and not 1000 <= msg_timeout <= opts.max_msg_timeout:
            raise InvalidBody(f"IDENTIFY msg timeout ({msg_timeout}) is invalid")
        # Escaped here, once: these strings reach the log and /stats text as they are.
        self.identified = {key: printable(data.get(key) or "")
                           for key in ("client_id", "hostname", "user_agent")}
        if self.identified["client_id"]:
            log.info("TCP: client(%s): identified as client_id %s", self.name,
                     self.identified["client_id"])
        if heartbeat:
            self.heartbeat_ms = 0 if heartbeat == -1 else heartbeat
        if buffer_size:
            # -1 asks nsqd not to buffer (for latency); as a memory bound, keep the default.
            self.output_buffer_size = DEFAULT_OUTPUT_BUFFER if buffer_size == -1 else buffer_size
            self._set_buffer_limits()
        self.msg_timeout_ms = msg_timeout
        self._schedule_heartbeat()
        if not data.get("feature_negotiation"):
            self.send(OK)
            return pos
        security = self.server.security
        tls_v1 = bool(data.get("tls_v1")) and security is not None \
            and security.tls_context is not None and not self.tls
        self.send(frame(FRAME_RESPONSE, json.dumps({
            "max_rdy_count": opts.max_rdy_count, "version": __version__,
            "max_msg_timeout": opts.max_msg_timeout,
            "msg_timeout": msg_timeout or opts.msg_timeout,
            "tls_v1": tls_v1, "deflate": False, "deflate_level": 0, "max_deflate_level": 0,
            "snappy": False, "sample_rate": 0,
            "auth_required": security is not None and security.auth_required,
            "output_buffer_size": self.output_buffer_size,
            # nsqd's answer: -1 (off) is 0, and 0 (none asked) its default of 250 ms
            "output_buffer_timeout": 0 if buffer_timeout == -1 else buffer_timeout or 250,
        }).encode()))
        if tls_v1:   # the next command comes after the handshake
            raise _Wait(self._upgrade_tls(), UPGRADING, resume=pos)
        return pos

    def _sub(self, params: list[bytes], pos: int) -> int:
        if self.heartbeat_ms <= 0:
            raise InvalidRequest("cannot SUB with heartbeats disabled")
        if len(params) < 3:
            raise InvalidRequest("SUB insufficient number of parameters")
        topic, channel = params[1].decode(errors="replace"), params[2].decode(errors="replace")
        self._check_auth("SUB", topic, channel)
        try:
            self.consumer = Consumer.attach(self.broker, topic, channel, self._on_message,
                                            identity=self._identity(),
                                            msg_timeout_ms=self.msg_timeout_ms,
                                            on_evicted=self._evicted,
                                            on_messages=self._on_messages,
                                            batch_bytes=max(self.output_buffer_size,
                                                            BATCH_BYTES))
        except Invalid as err:
            err.message = f"SUB {err.message}"
            raise
        if self.write_paused:        # its socket is already full (it RDYs before reading)
            self.consumer.block()
        self.state = SUBSCRIBED
        self.send(OK)
        return pos

    def _rdy(self, params: list[bytes], pos: int) -> int:
        consumer = self.consumer
        if self.state is CLOSING:
            return pos                       # nsqd ignores RDY after CLS
        if consumer is None or consumer.channel is None:
            raise InvalidRequest("cannot RDY in current state")
        count = 1
        if len(params) > 1:
            try:
                count = base10(params[1])
            except ValueError:
                raise InvalidRequest(f"RDY could not parse count "
                                     f"{params[1].decode(errors='replace')}") from None
        consumer.channel.set_rdy(consumer, count)
        return pos

    def _held(self, name: str, params: list[bytes], nparams: int) -> tuple[Consumer, str]:
        if self.consumer is None or self.consumer.channel is None:
            raise InvalidRequest(f"cannot {name} in current state")
        if len(params) < nparams:
            raise InvalidRequest(f"{name} insufficient number of params")
        try:
            return self.consumer, message_id(params[1])
        except ValueError as err:
            raise InvalidRequest(str(err)) from None

    def _fin(self, params: list[bytes], pos: int) -> int:
        consumer, msg_id = self._held("FIN", params, 2)
        consumer.channel.finish(consumer, msg_id)
        return pos

    def _fin_many(self, ids: list[str]) -> None:
        """FIN lines read at once (see ``wire.read_fins``): each failure gets its
        error, in order, as the same FINs read one by one would."""
        consumer = self.consumer   # a subscribed state's: it has a channel
        self._fin_failed(consumer.channel.finish_many(consumer, ids))

    def _fin_failed(self, failures: list[BrokerError]) -> None:
        for err in failures:
            self._error(err)

    def _req(self, params: list[bytes], pos: int) -> int:
        consumer, msg_id = self._held("REQ", params, 3)
        try:
            delay_ms = base10(params[2])
        except ValueError:
            raise InvalidRequest(f"REQ could not parse timeout "
                                 f"{params[2].decode(errors='replace')}") from None
        consumer.channel.requeue(consumer, msg_id, self.broker.clamp_delay(delay_ms) / 1000)
        return pos

    def _touch(self, params: list[bytes], pos: int) -> int:
        consumer, msg_id = self._held("TOUCH", params, 2)
        consumer.channel.touch(consumer, msg_id)
        return pos

    def _topic(self, name: str, params: list[bytes], nparams: int) -> str:
        if len(params) < nparams:
            raise InvalidRequest(f"{name} insufficient number of parameters")
        topic = params[1].decode(errors="replace")
        try:
            return check_topic_name(topic)
        except Invalid as err:
            err.message = f"{name} {err.message}"
            raise

    def _pub(self, params: list[bytes], pos: int) -> int:
        topic = self._topic("PUB", params, 2)
        body, pos = wire.read_message(self.buf, pos, "PUB",
                                      max_msg_size=self.broker.options.max_msg_size)
        self._check_auth("PUB", topic)
        self._publish("PUB", topic, [body], 0)
        return pos

    def _mpub(self, params: list[bytes], pos: int) -> int:
        topic = self._topic("MPUB", params, 2)
        self._check_auth("MPUB", topic)           # as nsqd: before the topic is made
        self.broker.get_or_create_topic(topic)   # as nsqd: the topic exists from here on
        opts = self.broker.options
        size, pos = wire.read_size(self.buf, pos, InvalidBody("MPUB failed to read body size"))
        if size <= 0:
            raise InvalidBody(f"MPUB invalid body size {size}")
        if size > opts.max_body_size:
            raise BodyTooBig(f"MPUB body too big {size} > {opts.max_body_size}")
        # As nsqd: the messages are read from the stream, the size only bounds the request.
        bodies, pos = wire.read_mpub(self.buf, pos, max_msg_size=opts.max_msg_size,
                                     max_body_size=opts.max_body_size)
        self._publish("MPUB", topic, bodies, 0)
        return pos

    def _dpub(self, params: list[bytes], pos: int) -> int:
        topic = self._topic("DPUB", params, 3)
        try:
            defer_ms = base10(params[2])
        except ValueError:
            raise InvalidRequest(f"DPUB could not parse timeout "
                                 f"{params[2].decode(errors='replace')}") from None
        self.broker.check_delay(defer_ms, "DPUB timeout")
        body, pos = wire.read_message(self.buf, pos, "DPUB",
                                      max_msg_size=self.broker.options.max_msg_size)
        self._check_auth("DPUB", topic)
        self._publish("DPUB", topic, [body], defer_ms)
        return pos

    def _publish(self, name: str, topic: str, bodies: list[bytes], defer_ms: int) -> None:
        try:
            self.broker.multi_publish(topic, bodies, defer_ms=[defer_ms] * len(bodies)
                                      if defer_ms else ())
        except (Invalid, LimitReached):    # its own code: E_TOO_MANY_TOPICS names the limit
            raise
        except BrokerError as err:   # the broker is exiting: nsqd's E_PUB_FAILED and kin
            failed = BrokerError(f"{name} failed {err.message}")
            failed.code = f"E_{name}_FAILED"
        else:
            self.send(OK)
            return
        try:
            raise failed  # raised outside the handler, the refusal's frames are not its context
        finally:
            del failed    # nor does this frame keep it: no cycle holds the request

    def _nop(self, params: list[bytes], pos: int) -> int:
        return pos

    def _cls(self, params: list[bytes], pos: int) -> int:
        self.consumer.closing = True
        self.state = CLOSING
        self.send(CLOSE_WAIT)
        return pos

    def _auth(self, params: list[bytes], pos: int) -> int:
        if len(params) != 1:
            raise InvalidRequest("AUTH invalid number of parameters")
        body, pos = wire.read_body(self.buf, pos, "AUTH",
                                   max_size=self.broker.options.max_body_size)
        auth = self.auth
        if auth is not None and auth.secret is not None:
            raise InvalidRequest("AUTH already set")
        if auth is None:
            raise AuthDisabled("AUTH disabled")

        async def ask() -> None:
            await auth.auth(body.decode(errors="replace"))
            self.send(frame(FRAME_RESPONSE, auth.reply()))

        raise _Wait(ask(), AUTHENTICATING, resume=pos)

    def _identity(self) -> ClientIdentity:
        """Who this client is, as nsqd's /stats shows it: IDENTIFY's names (the peer's
        host where it gave none), the peer's address, its TLS and its auth."""
        transport = self.transport
        peer = transport.get_extra_info("peername") if transport is not None else None
        host = str(peer[0]) if peer else ""
        given = self.identified
        tls = transport.get_extra_info("ssl_object") if self.tls and transport else None
        cipher = tls.cipher() if tls is not None else None
        state = self.auth.state if self.auth is not None else None
        return ClientIdentity(
            client_id=given.get("client_id") or host, hostname=given.get("hostname") or host,
            remote_address=host_port(host, peer[1]) if peer else "", version="V2",
            user_agent=given.get("user_agent", ""), tls=self.tls,
            tls_version=(tls.version() or "").replace("TLSv", "TLS") if tls else "",
            tls_cipher_suite=cipher[0] if cipher else "",
            authed=state is not None, auth_identity=state.identity if state else "",
            auth_identity_url=state.identity_url if state else "")

    # -- security (broker/security): TLS policy and upgrade, one check per PUB/SUB --
    def _tls_policy(self, name: bytes) -> None:
        security = self.server.security
        if name and name != b"IDENTIFY" and security is not None \
                and security.tcp_tls_required() and not self.tls:
            raise InvalidRequest(f"cannot {name.decode(errors='replace')} in current state "
                                 f"(TLS required)")

    async def _upgrade_tls(self) -> None:
        self._flush()  # the IDENTIFY answer goes out in plain text, then the handshake
        transport = await self.loop.start_tls(self.transport, self,
                                              self.server.security.tls_context,
                                              server_side=True,
                                              ssl_handshake_timeout=TLS_HANDSHAKE_TIMEOUT)
        self.transport = transport
        self.reading = True        # the TLS transport reads from the start
        self.tls = True
        self._set_buffer_limits()
        if self.auth is not None:
            from ..security.tls import peer_common_name
            self.auth.tls = True
            self.auth.common_name = peer_common_name(transport.get_extra_info("ssl_object"))
        self.send(OK)

    def _check_auth(self, command: str, topic: str, channel: str = "") -> None:
        """Raises the auth server's refusal (an ``AuthError``: E_AUTH_FIRST,
        E_UNAUTHORIZED), or waits for it to be asked again when the ttl has run out."""
        if self.auth is None:
            return
        if self.auth.needs_query():
            raise _Wait(self.auth.refresh(), AUTHENTICATING)  # ask, then run the command again
        self.auth.check(command, topic, channel)


_COMMANDS: dict[bytes, Callable[[V2Connection, list[bytes], int], int]] = {
    b"IDENTIFY": V2Connection._identify, b"SUB": V2Connection._sub,
    b"RDY": V2Connection._rdy, b"FIN": V2Connection._fin, b"REQ": V2Connection._req,
    b"TOUCH": V2Connection._touch, b"PUB": V2Connection._pub, b"MPUB": V2Connection._mpub,
    b"DPUB": V2Connection._dpub, b"NOP": V2Connection._nop, b"CLS": V2Connection._cls,
    b"AUTH": V2Connection._auth,
}


class TcpServer:
    """Accepts V2 connections on an address; ``close`` stops it."""

    def __init__(self, broker: Broker, security: Security | None = None) -> None:
        self.broker = broker
        self.security = security   # TLS and auth (broker/security), or None
        self.connections: set[V2Connection] = set()
        self.listener: Listener | None = None
        # Most a client may have buffered in one unfinished command.
        self.max_pending = broker.options.max_body_size + wire.MAX_LINE + 8
        # Connections whose output waits for this pass of the event loop to end: one
        # callback writes them all (a thousand consumers, each FINed and refilled in one
        # pass, are a thousand writes, not a thousand callbacks as well).
        self.unflushed: list[V2Connection] = []

    def flush_soon(self, conn: V2Connection) -> None:
        """Write ``conn``'s output once this pass of the event loop ends."""
        if not self.unflushed:
            conn.loop.call_soon(self.flush_all)
        self.unflushed.append(conn)

    def flush_all(self) -> None:
        conns, self.unflushed = self.unflushed, []
        for conn in conns:
            if conn.flush_scheduled:   # (not written meanwhile, by a close say)
                try:
                    conn._flush()
                except Exception as err:  # one connection's fault: the others are written
                    conn.loop.call_exception_handler({
                        "message": f"TCP client {conn.name}: writing failed", "exception": err,
                        "protocol": conn})

    async def start(self, address: str, reuse_port: bool = False) -> str:
        """Listen on ``address``; with ``reuse_port``, beside other processes listening
        there the same way (``pynsqd --workers``: the kernel spreads connections).
        Connections are admitted by the broker's ``ConnectionGate`` (admission.py)."""
        host, port = split_listen_address(address, "tcp-address")

        def serve(sock: socket.socket, ticket: Ticket) -> None:
            spawn(serve_accepted(sock, ticket, lambda: V2Connection(self.broker, self, ticket)))

        try:
            self.listener = await Listener.start(host or None, port, gate_for(self.broker),
                                                 "TCP", serve, reuse_port=reuse_port)
        except OSError as err:
            raise OSError(f"cannot listen on {address} (TCP): {err.strerror}") from None
        return host_port(host, self.listener.address()[1])

    async def close(self) -> None:
        if self.listener is not None:
            await self.listener.close()
            for conn in list(self.connections):
                conn._close()
            self.listener = None
