"""The gRPC API (``protos/pynsq/v1/broker.proto``) over the core.

Every handler runs on the event loop that owns the core, so core calls need no
locks. A ``BrokerError`` becomes a gRPC status whose message names what was
wrong; on a consumer stream, FIN/REQ/TOUCH failures come back as ``Error``
frames and the stream stays open, as in nsqd.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import AsyncIterator

import grpc

from .. import __version__, columns
from ..api import broker_pb2 as pb
from ..api import broker_pb2_grpc as pb_grpc
from ..consumer import Consumer
from ..core import Broker
from ..errors import (ERROR_CODE_METADATA, BrokerError, ChannelNotFound, Conflict, InvalidBody,
                      InvalidRequest, LimitReached, NotFound, NotInFlight, StorageFailed,
                      Unavailable)
from ..message import Message
from ..security.auth import AuthError, Unauthorized
from ..options import split_listen_address
from ..security import rules
from ..security.grpc_auth import principal_of, remote_ip
from ..security.printable import printable
from ..stats import ClientIdentity, host_port
from .admission import max_grpc_connections
from .limits import STREAM_REPLIES

log = logging.getLogger("pynsqd")

# A delivery frame carries at most this many messages / body bytes.
MAX_FRAME_MESSAGES = 2500
MAX_FRAME_BYTES = 1 << 20
# A consumer stream stops taking messages while this much waits to be sent (its
# replies are bounded apart: limits.STREAM_REPLIES).
STREAM_BUFFER_BYTES = 2 * MAX_FRAME_BYTES
LEASE_HEARTBEAT_SECONDS = 5.0
# A lease fetch frame (packed columns, no per-message framing) carries more:
# fewer, larger Arrow batches for the reader; still a few ms of encoding each.
LEASE_FRAME_MESSAGES = 16384
LEASE_FRAME_BYTES = 2 << 20
# Streams (calls) open at once on one HTTP/2 connection (HTTP/2's SETTINGS, so a
# client's further calls wait on its side): with a consumer stream's buffers, what
# one connection holds. HTTP/2 asks for no fewer than 100.
MAX_STREAMS_PER_CONNECTION = 100
# Bytes of a call's metadata (headers): more is refused with RESOURCE_EXHAUSTED.
MAX_METADATA_BYTES = 16 << 10
# Milliseconds a new connection has for its handshake (TLS, HTTP/2's preface and
# settings); past it grpc-core closes it.
HANDSHAKE_TIMEOUT_MS = 10_000


def status_of(err: BrokerError) -> grpc.StatusCode:
    """The one mapping of the broker's error families to gRPC status codes."""
    if isinstance(err, Unauthorized):
        return grpc.StatusCode.PERMISSION_DENIED
    if isinstance(err, AuthError):              # no secret, or a secret refused
        return grpc.StatusCode.UNAUTHENTICATED
    if isinstance(err, NotFound):
        return grpc.StatusCode.NOT_FOUND
    if isinstance(err, (NotInFlight, Conflict)):
        return grpc.StatusCode.FAILED_PRECONDITION
    if isinstance(err, Unavailable):
        return grpc.StatusCode.UNAVAILABLE
    if isinstance(err, (StorageFailed, LimitReached)):
        return grpc.StatusCode.RESOURCE_EXHAUSTED
    return grpc.StatusCode.INVALID_ARGUMENT      # Invalid, and anything else refused


async def abort(context, err: BrokerError, prefix: str = "") -> None:
    """End the call with ``err``: its status, its message, and its code in the
    trailing metadata ``pynsq-error-code`` (``broker.errors.error_for_code``
    rebuilds the exception from it)."""
    err.__traceback__ = err.__context__ = None  # the frames of the refused request go now
    await context.abort(status_of(err), prefix + str(err),
                        trailing_metadata=((ERROR_CODE_METADATA, err.code),))


def chunks(msgs: list[Message]) -> list[list[Message]]:
    """Split messages into frames bounded in count and body bytes."""
    out, batch, size = [], [], 0
    for msg in msgs:
        if batch and (len(batch) >= MAX_FRAME_MESSAGES or size + len(msg.body) > MAX_FRAME_BYTES):
            out.append(batch)
            batch, size = [], 0
        batch.append(msg)
        size += len(msg.body)
    if batch:
        out.append(batch)
    return out


def _varint(n: int) -> bytes:
    """Protobuf's base-128 varint; a negative int64 as its two's complement."""
    n &= 0xFFFF_FFFF_FFFF_FFFF
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


# Varints of small numbers (lengths, attempts), looked up instead of computed: one
# byte below 128, two below 16384 (built directly: a loop per number at import costs).
_SMALL = [bytes((n,)) for n in range(128)] + [bytes(((n & 0x7F) | 0x80, n >> 7))
                                              for n in range(128, 1 << 14)]
_ATTEMPTS = [b"\x20" + v for v in _SMALL]    # the attempts field, tag and value


def encode_delivery(msgs: list[Message]) -> bytes:
    """``ServerFrame(messages=Messages(messages=[...]))`` serialized, byte for byte
    what protobuf writes (fields in order, zero values left out), without building a
    protobuf object per message, which had been a consumer stream's largest cost per
    message (1.1 us; 0.44 us now). The publish time is encoded once per run of equal
    ones (an MPUB's messages share it)."""
    parts: list[bytes] = []
    last_ts, ts_field = 0, b""
    small, limit, varint = _SMALL, len(_SMALL), _varint
    for msg in msgs:
        ts = msg.timestamp
        if ts != last_ts:
            last_ts, ts_field = ts, (b"\x18" + varint(ts)) if ts else b""
        msg_id = msg.id.encode()
        body = msg.body
        n, k = len(body), len(msg_id)
        head = b"\x0a" + (small[k] if k < limit else varint(k)) + msg_id if k else b""
        if n:
            head += b"\x12" + (small[n] if n < limit else varint(n))
        a = msg.attempts
        tail = ts_field + (_ATTEMPTS[a] if a < limit else b"\x20" + varint(a)) if a else ts_field
        size = len(head) + n + len(tail)
        parts += (b"\x0a", small[size] if size < limit else varint(size), head, body, tail)
    encoded = b"".join(parts)
    return b"\x12" + varint(len(encoded)) + encoded


def delivery_frames(msgs: list[Message]) -> list[bytes]:
    """Delivery frames of ``msgs``, encoded, each bounded as ``chunks`` bounds it."""
    return [encode_delivery(chunk) for chunk in chunks(msgs)]


def _encoded_or_frame(frame: "pb.ServerFrame | bytes") -> bytes:
    return frame if type(frame) is bytes else frame.SerializeToString()


def _taking_encoded(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    """Subscribe's handler, its responses either ``ServerFrame`` or already encoded."""
    return grpc.stream_stream_rpc_method_handler(
        handler.stream_stream, request_deserializer=handler.request_deserializer,
        response_serializer=_encoded_or_frame)


SUBSCRIBE = "/pynsq.v1.Broker/Subscribe"


class _Registrar:
    """Passes the generated handlers on to the server, Subscribe's ``_taking_encoded``
    (the generated code knows only protobuf's serializer)."""

    def __init__(self, server: grpc.aio.Server) -> None:
        self.server = server

    def add_generic_rpc_handlers(self, handlers) -> None:
        self.server.add_generic_rpc_handlers(tuple(_SubscribeEncoded(h) for h in handlers))

    def add_registered_method_handlers(self, service: str, handlers: dict) -> None:
        handlers = dict(handlers)
        if "Subscribe" in handlers:
            handlers["Subscribe"] = _taking_encoded(handlers["Subscribe"])
        self.server.add_registered_method_handlers(service, handlers)

    def __getattr__(self, name: str):
        return getattr(self.server, name)   # anything else newer generated code calls


class _SubscribeEncoded(grpc.GenericRpcHandler):
    def __init__(self, inner: grpc.GenericRpcHandler) -> None:
        self.inner = inner

    def service(self, handler_call_details):
        handler = self.inner.service(handler_call_details)
        if handler is not None and handler_call_details.method == SUBSCRIBE:
            return _taking_encoded(handler)
        return handler


class _Undecodable:
    """A request whose bytes do not parse as its message."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def error(self) -> InvalidBody:
        return InvalidBody(f"request could not be decoded: {self.reason}")


def _lenient(deserialize):
    def parse(data: bytes):
        try:
            return deserialize(data)
        except Exception as err:     # protobuf's DecodeError and kin
            return _Undecodable(str(err) or type(err).__name__)
    return parse


class _DecodedReads:
    """A stream's call context whose ``read()`` raises ``InvalidBody`` for a frame
    that does not parse."""

    def __init__(self, context) -> None:
        self._context = context

    async def read(self):
        frame = await self._context.read()
        if type(frame) is _Undecodable:
            raise frame.error()
        return frame

    def __getattr__(self, name: str):
        return getattr(self._context, name)


class BadRequestGuard(grpc.aio.ServerInterceptor):
    """The outermost interceptor: a request that does not parse is refused with
    INVALID_ARGUMENT and nsqd's ``E_BAD_BODY`` before anything else sees it (gRPC
    itself answers UNKNOWN and logs a traceback)."""

    def __init__(self) -> None:
        self._guarded: dict[str, tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]] = {}

    async def intercept_service(self, continuation, details):
        handler = await continuation(details)
        if handler is None:
            return None
        cached = self._guarded.get(details.method)
        if cached is not None and cached[0] is handler:
            return cached[1]          # the same handler as before: no work per call
        guarded = _guard(handler)
        self._guarded[details.method] = (handler, guarded)
        return guarded


def _guard(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    parse = _lenient(handler.request_deserializer) if handler.request_deserializer \
        else None
    serialize = handler.response_serializer
    if handler.request_streaming and handler.response_streaming:
        behaviour = handler.stream_stream

        async def stream_stream(request_iterator, context):
            async for reply in behaviour(request_iterator, _DecodedReads(context)):
                yield reply
        return grpc.stream_stream_rpc_method_handler(
            stream_stream, request_deserializer=parse, response_serializer=serialize)
    if handler.response_streaming:
        behaviour = handler.unary_stream

        async def unary_stream(request, context):
            if type(request) is _Undecodable:
                await abort(context, request.error())
            async for reply in behaviour(request, context):
                yield reply
        return grpc.unary_stream_rpc_method_handler(
            unary_stream, request_deserializer=parse, response_serializer=serialize)
    if handler.request_streaming:
        return handler                # no such call in the API
    behaviour = handler.unary_unary

    async def unary_unary(request, context):
        if type(request) is _Undecodable:
            await abort(context, request.error())
        return await behaviour(request, context)
    return grpc.unary_unary_rpc_method_handler(
        unary_unary, request_deserializer=parse, response_serializer=serialize)


class _Fatal(Exception):
    """Ends a consumer stream with ``error``."""

    def __init__(self, error: BrokerError) -> None:
        super().__init__(str(error))
        self.error = error


async def deliveries_first() -> None:
    """One pass of the event loop before a publish is answered. The core hands a
    message to a waiting consumer within the publish call; a stream consumer's task,
    woken by it, then hands its delivery frame to gRPC in this pass, before the
    publisher's answer is encoded and sent, rather than after it. Measured at 1,000
    publishes a second: from the publish handled to its frame handed to gRPC, median
    0.3-0.4 ms before, 0.13-0.2 ms after; one more loop pass per publish call."""
    await asyncio.sleep(0)


class BrokerService(pb_grpc.BrokerServicer):
    def __init__(self, broker: Broker, address: str = "") -> None:
        self.broker = broker
        self.address = address
        self._streams: set[asyncio.Task] = set()

    # -- publishing -------------------------------------------------------
    async def Publish(self, request: pb.PublishRequest, context) -> pb.PublishResponse:
        try:
            ids = [self.broker.publish(request.topic, request.body, defer_ms=request.defer_ms,
                                       producer_id=rules.producer_id(principal_of(context),
                                                                     request.producer_id),
                                       sequence=request.sequence, ttl_ms=request.ttl_ms)]
        except BrokerError as err:
            await abort(context, err)
        await deliveries_first()
        return pb.PublishResponse(ids=ids)

    async def MultiPublish(self, request: pb.MultiPublishRequest, context) -> pb.PublishResponse:
        try:
            ids = self.broker.multi_publish(request.topic, request.bodies,
                                            defer_ms=request.defer_ms,
                                            producer_id=rules.producer_id(
                                                principal_of(context), request.producer_id),
                                            sequence=request.sequence,
                                            ttl_ms=request.ttl_ms)
        except BrokerError as err:
            await abort(context, err)
        await deliveries_first()
        return pb.PublishResponse(ids=ids)

    # -- the consumer stream ---------------------------------------------
    def _identity(self, context, client_id: str) -> ClientIdentity:
        """Who a subscriber is, for /stats: its SUB's client_id (else the peer's host),
        the call's peer, user agent and transport. With auth servers configured, the
        SUB got here only once authorised."""
        peer = context.peer()                          # "ipv4:127.0.0.1:5000"
        address, host = peer.partition(":")[2], remote_ip(peer)
        metadata = dict(context.invocation_metadata() or ())
        tls = (context.auth_context() or {}).get("transport_security_type") == [b"ssl"]
        # The client's strings escaped once, here: they reach the log and /stats text.
        return ClientIdentity(client_id=printable(client_id) or host, hostname=host,
                              remote_address=address, version="grpc",
                              user_agent=printable(metadata.get("user-agent", "")), tls=tls,
                              authed=bool(self.broker.options.auth_http_addresses))

    async def Subscribe(self, request_iterator, context
                        ) -> AsyncIterator["pb.ServerFrame | bytes"]:
        outbox: list[Message] = []
        # Replies not yet sent; while STREAM_REPLIES wait, no request is read.
        replies: deque[pb.ServerFrame] = deque()
        wake, drained = asyncio.Event(), asyncio.Event()
        state: dict = {"fatal": None, "done": False, "bytes": 0, "consumer": None,
                       "stuck": None}
        loop = asyncio.get_running_loop()
        stream_task = asyncio.current_task()

        def stuck_out() -> None:
            consumer = state["consumer"]
            log.warning("consumer %s: has not read its stream for %.1fs; disconnecting",
                        consumer.client_id, consumer.msg_timeout)
            stream_task.cancel()        # the finally below requeues what it held

        def on_message(msg: Message) -> None:
            on_messages((msg,))

        def on_messages(msgs: "list[Message] | tuple[Message, ...]") -> None:
            outbox.extend(msgs)
            state["bytes"] += sum([len(msg.body) for msg in msgs])
            # Backpressure: a client that does not read gets nothing more until
            # what waits for it has been handed to gRPC; stuck past its message
            # timeout, it is disconnected.
            if state["bytes"] >= STREAM_BUFFER_BYTES or len(outbox) >= MAX_FRAME_MESSAGES:
                consumer = state["consumer"]
                consumer.block()
                if state["stuck"] is None:
                    state["stuck"] = loop.call_later(consumer.msg_timeout, stuck_out)
            wake.set()

        try:
            first = await context.read()
        except BrokerError as err:      # a frame that does not parse
            await abort(context, err)
        if first is grpc.aio.EOF:
            return
        if first.WhichOneof("command") != "sub":
            await abort(context, InvalidRequest(
                f"the first frame must be SUB, got {first.WhichOneof('command')}"))
        sub = first.sub

        def evicted() -> None:
            state["fatal"] = _Fatal(ChannelNotFound(
                f"channel {sub.topic}/{sub.channel} was deleted"))
            wake.set()

        try:
            consumer = Consumer.attach(self.broker, sub.topic, sub.channel, on_message,
                                       identity=self._identity(context, sub.client_id),
                                       msg_timeout_ms=sub.msg_timeout_ms, on_evicted=evicted,
                                       on_messages=on_messages, batch_bytes=STREAM_BUFFER_BYTES)
        except BrokerError as err:
            await abort(context, err, "SUB: ")
        state["consumer"] = consumer
        channel = consumer.channel

        async def room_for_replies() -> None:
            """Back-pressure: wait until the replies waiting fall under the bound; a
            client that reads none of them for its message timeout is disconnected."""
            if replies:
                wake.set()
            if len(replies) < STREAM_REPLIES:
                return
            stuck = loop.call_later(consumer.msg_timeout, stuck_out)
            try:
                while len(replies) >= STREAM_REPLIES:
                    drained.clear()
                    await drained.wait()
            finally:
                stuck.cancel()

        async def read_commands() -> None:
            try:
                while True:
                    frame = await context.read()
                    if frame is grpc.aio.EOF:
                        break
                    kind = frame.WhichOneof("command")
                    if kind in ("fin", "touch"):
                        # A frame may name many ids: each slice's errors are sent
                        # before the next slice is run.
                        ids = getattr(frame, kind).ids
                        for start in range(0, len(ids), STREAM_REPLIES):
                            self._ids(kind, channel, consumer,
                                      ids[start:start + STREAM_REPLIES], replies)
                            await room_for_replies()
                    else:
                        self._command(channel, consumer, frame, replies)
                        await room_for_replies()
            except _Fatal as fatal:
                state["fatal"] = fatal
            except BrokerError as err:   # a frame that does not parse
                state["fatal"] = _Fatal(err)
            except asyncio.CancelledError:
                raise
            except Exception as err:  # a broken client stream
                log.debug("consumer %s: read failed: %s", consumer.client_id, printable(err))
            state["done"] = True
            wake.set()

        reader = asyncio.create_task(read_commands())
        try:
            yield pb.ServerFrame(subscribed=pb.Subscribed(
                msg_timeout_ms=int(consumer.msg_timeout * 1000),
                max_rdy_count=self.broker.options.max_rdy_count))
            while True:
                await wake.wait()
                wake.clear()
                while replies:
                    yield replies.popleft()
                    drained.set()
                if outbox:
                    msgs, outbox[:] = list(outbox), []
                    state["bytes"] = 0
                    for frame in delivery_frames(msgs):
                        yield frame
                    if state["stuck"] is not None:
                        state["stuck"].cancel()
                        state["stuck"] = None
                    consumer.unblock()
                if state["fatal"] is not None:
                    await abort(context, state["fatal"].error)
                if state["done"]:
                    return
        finally:
            if state["stuck"] is not None:
                state["stuck"].cancel()
            reader.cancel()
            consumer.detach()

    def _ids(self, kind: str, channel, consumer: Consumer, ids: list[str],
             replies: "deque[pb.ServerFrame]") -> None:
        """FIN or TOUCH of ``ids``; a failure is an error frame in ``replies``."""
        try:
            if kind == "fin":
                for err in channel.finish_many(consumer, ids):
                    replies.append(self._error_frame(err, err.msg_id))
            else:
                for msg_id in ids:
                    self._soft(channel.touch, consumer, msg_id, replies)
        except BrokerError as err:
            raise _Fatal(err) from None

    def _command(self, channel, consumer: Consumer, frame: pb.ClientFrame,
                 replies: "deque[pb.ServerFrame]") -> None:
        kind = frame.WhichOneof("command")
        try:
            if kind == "rdy":
                channel.set_rdy(consumer, frame.rdy.count)
            elif kind == "req":
                self._soft(lambda c, i: channel.requeue(c, i, frame.req.delay_ms / 1000),
                           consumer, frame.req.id, replies)
            elif kind == "cls":
                consumer.closing = True
                replies.append(pb.ServerFrame(close_wait=pb.CloseWait()))
            elif kind == "nop":
                pass
            elif kind == "sub":
                raise _Fatal(InvalidRequest("SUB: this stream is already subscribed"))
            else:
                raise _Fatal(InvalidRequest("empty command frame"))
        except BrokerError as err:
            raise _Fatal(err) from None

    @classmethod
    def _soft(cls, action, consumer: Consumer, msg_id: str,
              replies: "deque[pb.ServerFrame]") -> None:
        """REQ/TOUCH: a failure is reported on the stream, which stays open."""
        try:
            action(consumer, msg_id)
        except (NotInFlight, InvalidRequest) as err:
            replies.append(cls._error_frame(err, msg_id))

    @staticmethod
    def _error_frame(err: BrokerError, msg_id: str) -> pb.ServerFrame:
        return pb.ServerFrame(error=pb.Error(status_code=status_of(err).value[0], code=err.code,
                                             message=str(err), id=msg_id))

    # -- admin ------------------------------------------------------------
    async def _admin(self, context, action, *args) -> pb.AdminResponse:
        try:
            action(*args)
        except BrokerError as err:
            await abort(context, err)
        self.broker.storage.flush()  # what is acknowledged is written
        return pb.AdminResponse()

    async def CreateTopic(self, request, context):
        ttl_ms = request.ttl_ms if request.HasField("ttl_ms") else None
        return await self._admin(context, lambda t: self.broker.create_topic(t, ttl_ms=ttl_ms),
                                 request.topic)

    async def DeleteTopic(self, request, context):
        return await self._admin(context, self.broker.delete_topic, request.topic)

    async def EmptyTopic(self, request, context):
        return await self._admin(context, lambda t: self.broker.topic(t).empty(), request.topic)

    async def PauseTopic(self, request, context):
        return await self._admin(context, lambda t: self.broker.topic(t).pause(), request.topic)

    async def UnpauseTopic(self, request, context):
        return await self._admin(context, lambda t: self.broker.topic(t).unpause(), request.topic)

    async def CreateChannel(self, request, context):
        max_attempts = request.max_attempts if request.HasField("max_attempts") else None
        return await self._admin(
            context, lambda t, c: self.broker.create_channel(
                t, c, max_attempts=max_attempts, dead_letter_topic=request.dead_letter_topic),
            request.topic, request.channel)

    async def DeleteChannel(self, request, context):
        return await self._admin(context, self.broker.delete_channel, request.topic,
                                 request.channel)

    async def EmptyChannel(self, request, context):
        return await self._admin(context, lambda t, c: self.broker.channel(t, c).empty(),
                                 request.topic, request.channel)

    async def PauseChannel(self, request, context):
        return await self._admin(context, lambda t, c: self.broker.channel(t, c).pause(),
                                 request.topic, request.channel)

    async def UnpauseChannel(self, request, context):
        return await self._admin(context, lambda t, c: self.broker.channel(t, c).unpause(),
                                 request.topic, request.channel)

    # -- stats, ping, info ------------------------------------------------
    async def Stats(self, request: pb.StatsRequest, context) -> pb.StatsResponse:
        try:
            topics = self.broker.stats(request.topic or None, request.channel or None)
        except BrokerError as err:
            await abort(context, err)
        return pb.StatsResponse(topics=[_topic_stats(t) for t in topics],
                                start_time=self.broker.start_time, version=__version__)

    async def Ping(self, request, context) -> pb.PingResponse:
        return pb.PingResponse(status="OK")

    async def Info(self, request, context) -> pb.InfoResponse:
        o = self.broker.options
        return pb.InfoResponse(version=__version__, grpc_address=self.address,
                               start_time=self.broker.start_time, max_msg_size=o.max_msg_size,
                               max_rdy_count=o.max_rdy_count, msg_timeout_ms=o.msg_timeout,
                               max_msg_timeout_ms=o.max_msg_timeout,
                               max_req_timeout_ms=o.max_req_timeout,
                               durable=bool(o.data_path), reserve_finishes=True,
                               workers=[w["grpc"] for w in self.broker.workers],
                               identity=self.broker.identity,
                               node_id=self.broker.new_id.node_id)

    # -- leases -----------------------------------------------------------
    async def OpenLeaseSession(self, request, context):
        session = self.broker.open_lease_session(printable(request.client_id) or context.peer(),
                                                 request.session_id, request.grace_ms,
                                                 owner=principal_of(context))
        stream = session.stream
        log.info("gRPC: lease session %s %s (%s)", session.client_id,
                 "resumed" if session.resumed else "opened", context.peer())
        try:
            yield pb.LeaseSessionEvent(session_id=session.session_id,
                                       broker_id=self.broker.instance_id,
                                       resumed=session.resumed)
            while True:
                await asyncio.sleep(LEASE_HEARTBEAT_SECONDS)
                yield pb.LeaseSessionEvent(heartbeat=pb.Heartbeat())
        finally:
            # The stream dropped: the session keeps its leases for its grace period.
            self.broker.detach_lease_session(session.session_id, stream)

    async def Reserve(self, request: pb.ReserveRequest, context) -> pb.ReserveResponse:
        try:
            reservation = self.broker.begin_reserve(
                request.session_id, request.topic, request.channel, request.max_messages,
                request.msg_timeout_ms, request.max_bytes, request.finish_lease_ids)
            try:
                # Bounded steps, the loop served between them (a large reserve reads from disk).
                while not reservation.done:
                    await asyncio.sleep(0)
                    self.broker.reserve_step(reservation)
            except asyncio.CancelledError:
                # The caller is gone and never learns the lease id: give its messages back.
                self.broker.requeue_leases([reservation.lease.lease_id])
                raise
            lease, depth = self.broker.reserve_result(reservation)
        except BrokerError as err:
            await abort(context, err)
        finished, missing = reservation.finished
        if lease is None:
            return pb.ReserveResponse(depth=depth, finished=finished, missing=missing)
        return pb.ReserveResponse(lease_id=lease.lease_id, count=len(lease.order), depth=depth,
                                  bytes=reservation.bytes, finished=finished, missing=missing)

    async def FetchLease(self, request: pb.FetchLeaseRequest, context):
        n = request.num_partitions or 1
        if request.partition >= n:
            await abort(context, InvalidRequest(f"partition {request.partition} out of range "
                                                f"for {n} partition(s)"))
        try:
            lease = self.broker.lease(request.lease_id, request.broker_id)
            msgs = lease.slice(request.partition, n)
        except BrokerError as err:
            await abort(context, err)
        # One bounded frame at a time: encoding is on the loop, so yield between frames.
        for frame in columns.frames(msgs, LEASE_FRAME_MESSAGES, LEASE_FRAME_BYTES,
                                    lease.attempts_of(msgs)):
            yield frame

    async def _leases(self, context, action, request: pb.LeaseRequest) -> pb.LeaseResponse:
        try:
            count, missing = action(request.lease_ids)
        except BrokerError as err:
            await abort(context, err)
        return pb.LeaseResponse(count=count, missing=missing)

    async def FinishLeases(self, request, context):
        return await self._leases(context, self.broker.finish_leases, request)

    async def RequeueLeases(self, request, context):
        return await self._leases(context, self.broker.requeue_leases, request)

    async def TouchLeases(self, request, context):
        return await self._leases(context, self.broker.touch_leases, request)

    async def AdoptLeases(self, request, context):
        return await self._leases(
            context, lambda ids: self.broker.adopt_leases(request.session_id, ids), request)


def _percentiles(values: list[tuple[float, float]]) -> list[pb.Percentile]:
    return [pb.Percentile(quantile=q, value_ms=v) for q, v in values]


def _topic_stats(t) -> pb.TopicStats:
    return pb.TopicStats(
        name=t.name, depth=t.depth, message_count=t.message_count,
        message_bytes=t.message_bytes, paused=t.paused,
        on_disk_count=t.on_disk_count, disk_bytes=t.disk_bytes, ttl_ms=t.ttl_ms,
        e2e_processing_latency=_percentiles(t.e2e_processing_latency),
        channels=[pb.ChannelStats(
            name=c.name, depth=c.depth, in_flight_count=c.in_flight_count,
            deferred_count=c.deferred_count, message_count=c.message_count,
            requeue_count=c.requeue_count, timeout_count=c.timeout_count,
            finish_count=c.finish_count, paused=c.paused,
            dead_letter_count=c.dead_letter_count, expired_count=c.expired_count,
            on_disk_count=c.on_disk_count, disk_bytes=c.disk_bytes,
            max_attempts=c.max_attempts, dead_letter_topic=c.dead_letter_topic,
            e2e_processing_latency=_percentiles(c.e2e_processing_latency),
            clients=[pb.ClientStats(client_id=k.client_id, ready_count=k.ready_count,
                                    in_flight_count=k.in_flight_count,
                                    message_count=k.message_count,
                                    finish_count=k.finish_count,
                                    requeue_count=k.requeue_count) for k in c.clients])
            for c in t.channels])


async def start_grpc_server(broker: Broker, address: str, security=None,
                            reuse_port: bool = False) -> tuple[grpc.aio.Server, str]:
    """Serve ``broker`` on ``address`` (port 0 picks a free one); return the bound address.
    With ``reuse_port``, beside other processes listening there the same way
    (``pynsqd --workers``); otherwise a port in use is an error.

    With ``security`` (``broker/security``): TLS when a certificate is configured,
    mutual TLS when client certificates are required, and NSQ's auth on every call.
    """
    from ..security.grpc_auth import interceptors
    host, port = split_listen_address(address, "grpc-address")
    credentials = security.grpc_credentials() if security is not None else None
    server = grpc.aio.server(
        interceptors=[BadRequestGuard(), *interceptors(broker, security)], options=[
            ("grpc.so_reuseport", int(reuse_port)),
            # nsqd's --max-body-size bounds every request; a larger one is refused
            # (RESOURCE_EXHAUSTED) before it is buffered whole.
            ("grpc.max_receive_message_length", broker.options.max_body_size),
            ("grpc.max_concurrent_streams", MAX_STREAMS_PER_CONNECTION),
            ("grpc.max_metadata_size", MAX_METADATA_BYTES),
            ("grpc.absolute_max_metadata_size", MAX_METADATA_BYTES),
            ("grpc.server_handshake_timeout_ms", HANDSHAKE_TIMEOUT_MS),
            # grpc-core's own count: one over it is closed before its handshake.
            ("grpc.max_allowed_incoming_connections", max_grpc_connections(broker.options)),
        ])
    try:
        listen = host_port(host, port)
        bound_port = (server.add_secure_port(listen, credentials) if credentials
                      else server.add_insecure_port(listen))
    except RuntimeError:
        bound_port = 0
    if bound_port == 0:
        raise OSError(f"cannot listen on {address} (gRPC): address in use or not available")
    bound = host_port(host, bound_port)
    service = BrokerService(broker, bound)
    pb_grpc.add_BrokerServicer_to_server(service, _Registrar(server))
    await server.start()
    return server, bound
