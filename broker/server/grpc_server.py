"""The gRPC API (``protos/pynsq/v1/broker.proto``) over the core.

Every handler runs on the event loop that owns the core, so core calls need no
locks. A ``BrokerError`` becomes a gRPC status whose message names what was
wrong; on a consumer stream, FIN/REQ/TOUCH failures come back as ``Error``
frames and the stream stays open, as in nsqd.
"""

from __future__ import annotations

import asyncio
import logging
from typing import AsyncIterator

import grpc

from .. import __version__, columns
from ..api import broker_pb2 as pb
from ..api import broker_pb2_grpc as pb_grpc
from ..consumer import Consumer
from ..core import Broker
from ..errors import (BrokerError, ChannelNotFound, Exiting, InvalidRequest, LeaseNotFound,
                      NotInFlight, StorageFailed, TopicNotFound)
from ..message import Message

log = logging.getLogger("pynsqd")

# A delivery frame carries at most this many messages / body bytes.
MAX_FRAME_MESSAGES = 2500
MAX_FRAME_BYTES = 1 << 20
# gRPC's own limit on a request or response (MPUB of many messages).
MAX_GRPC_MESSAGE = 256 << 20
LEASE_HEARTBEAT_SECONDS = 5.0


def status_of(err: BrokerError) -> grpc.StatusCode:
    if isinstance(err, (TopicNotFound, ChannelNotFound, LeaseNotFound)):
        return grpc.StatusCode.NOT_FOUND
    if isinstance(err, NotInFlight):
        return grpc.StatusCode.FAILED_PRECONDITION
    if isinstance(err, Exiting):
        return grpc.StatusCode.UNAVAILABLE
    if isinstance(err, StorageFailed):
        return grpc.StatusCode.RESOURCE_EXHAUSTED
    return grpc.StatusCode.INVALID_ARGUMENT


def to_pb(msg: Message) -> pb.Message:
    return pb.Message(id=msg.id, body=msg.body, timestamp=msg.timestamp, attempts=msg.attempts)


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


def frames_of(msgs: list[Message]) -> list[pb.Messages]:
    return [pb.Messages(messages=[to_pb(m) for m in chunk]) for chunk in chunks(msgs)]


def columns_of(msgs: list[Message]) -> list[pb.MessageColumns]:
    return [columns.encode(chunk) for chunk in chunks(msgs)]


class _Fatal(Exception):
    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class BrokerService(pb_grpc.BrokerServicer):
    def __init__(self, broker: Broker, address: str = "") -> None:
        self.broker = broker
        self.address = address
        self._streams: set[asyncio.Task] = set()

    # -- publishing -------------------------------------------------------
    async def Publish(self, request: pb.PublishRequest, context) -> pb.PublishResponse:
        try:
            ids = [self.broker.publish(request.topic, request.body, defer_ms=request.defer_ms,
                                       producer_id=request.producer_id,
                                       sequence=request.sequence, ttl_ms=request.ttl_ms)]
        except BrokerError as err:
            await context.abort(status_of(err), str(err))
        return pb.PublishResponse(ids=ids)

    async def MultiPublish(self, request: pb.MultiPublishRequest, context) -> pb.PublishResponse:
        try:
            ids = self.broker.multi_publish(request.topic, request.bodies,
                                            defer_ms=request.defer_ms,
                                            producer_id=request.producer_id,
                                            sequence=request.sequence,
                                            ttl_ms=request.ttl_ms)
        except BrokerError as err:
            await context.abort(status_of(err), str(err))
        return pb.PublishResponse(ids=ids)

    # -- the consumer stream ---------------------------------------------
    async def Subscribe(self, request_iterator, context) -> AsyncIterator[pb.ServerFrame]:
        outbox: list[Message] = []
        replies: list[pb.ServerFrame] = []
        wake = asyncio.Event()
        state: dict = {"fatal": None, "done": False}

        def on_message(msg: Message) -> None:
            outbox.append(msg)
            wake.set()

        first = await context.read()
        if first is grpc.aio.EOF:
            return
        if first.WhichOneof("command") != "sub":
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"the first frame must be SUB, got {first.WhichOneof('command')}")
        sub = first.sub
        try:
            consumer = Consumer(on_message, client_id=sub.client_id or context.peer(),
                                msg_timeout=self.broker.msg_timeout(sub.msg_timeout_ms))
            channel = self.broker.subscribe(consumer, sub.topic, sub.channel)
        except BrokerError as err:
            await context.abort(status_of(err), f"SUB: {err}")

        def evicted() -> None:
            state["fatal"] = _Fatal(grpc.StatusCode.NOT_FOUND,
                                    f"channel {sub.topic}/{sub.channel} was deleted")
            wake.set()

        consumer.on_evicted = evicted

        async def read_commands() -> None:
            try:
                while True:
                    frame = await context.read()
                    if frame is grpc.aio.EOF:
                        break
                    self._command(channel, consumer, frame, replies)
                    if replies:
                        wake.set()
            except _Fatal as fatal:
                state["fatal"] = fatal
            except asyncio.CancelledError:
                raise
            except Exception as err:  # a broken client stream
                log.debug("consumer %s: read failed: %s", consumer.client_id, err)
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
                if replies:
                    pending, replies[:] = list(replies), []
                    for frame in pending:
                        yield frame
                if outbox:
                    msgs, outbox[:] = list(outbox), []
                    for frame in frames_of(msgs):
                        yield pb.ServerFrame(messages=frame)
                if state["fatal"] is not None:
                    fatal = state["fatal"]
                    await context.abort(fatal.code, fatal.message)
                if state["done"]:
                    return
        finally:
            reader.cancel()
            if not channel.deleted:
                channel.remove_consumer(consumer)

    def _command(self, channel, consumer: Consumer, frame: pb.ClientFrame,
                 replies: list[pb.ServerFrame]) -> None:
        kind = frame.WhichOneof("command")
        try:
            if kind == "rdy":
                channel.set_rdy(consumer, frame.rdy.count)
            elif kind == "fin":
                for err in channel.finish_many(consumer, frame.fin.ids):
                    replies.append(self._error_frame(err, err.msg_id))
            elif kind == "req":
                self._soft(lambda c, i: channel.requeue(c, i, frame.req.delay_ms / 1000),
                           consumer, frame.req.id, replies)
            elif kind == "touch":
                for msg_id in frame.touch.ids:
                    self._soft(channel.touch, consumer, msg_id, replies)
            elif kind == "cls":
                consumer.closing = True
                replies.append(pb.ServerFrame(close_wait=pb.CloseWait()))
            elif kind == "nop":
                pass
            elif kind == "sub":
                raise _Fatal(grpc.StatusCode.FAILED_PRECONDITION,
                             "SUB: this stream is already subscribed")
            else:
                raise _Fatal(grpc.StatusCode.INVALID_ARGUMENT, "empty command frame")
        except BrokerError as err:
            raise _Fatal(status_of(err), str(err)) from None

    @classmethod
    def _soft(cls, action, consumer: Consumer, msg_id: str,
              replies: list[pb.ServerFrame]) -> None:
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
            await context.abort(status_of(err), str(err))
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
            await context.abort(status_of(err), str(err))
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
                               max_req_timeout_ms=o.max_req_timeout)

    # -- leases -----------------------------------------------------------
    async def OpenLeaseSession(self, request, context):
        session = self.broker.open_lease_session(request.client_id or context.peer())
        try:
            yield pb.LeaseSessionEvent(session_id=session.session_id)
            while True:
                await asyncio.sleep(LEASE_HEARTBEAT_SECONDS)
                yield pb.LeaseSessionEvent(heartbeat=pb.Heartbeat())
        finally:
            self.broker.close_lease_session(session.session_id)

    async def Reserve(self, request: pb.ReserveRequest, context) -> pb.ReserveResponse:
        try:
            lease, depth = self.broker.reserve(request.session_id, request.topic, request.channel,
                                               request.max_messages, request.msg_timeout_ms)
        except BrokerError as err:
            await context.abort(status_of(err), str(err))
        if lease is None:
            return pb.ReserveResponse(depth=depth)
        return pb.ReserveResponse(lease_id=lease.lease_id, count=len(lease.order), depth=depth)

    async def FetchLease(self, request: pb.FetchLeaseRequest, context):
        n = request.num_partitions or 1
        if request.partition >= n:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"partition {request.partition} out of range for "
                                f"{n} partition(s)")
        try:
            msgs = self.broker.lease(request.lease_id).slice(request.partition, n)
        except BrokerError as err:
            await context.abort(status_of(err), str(err))
        for frame in columns_of(msgs):
            yield frame

    async def _leases(self, context, action, request: pb.LeaseRequest) -> pb.LeaseResponse:
        try:
            count, missing = action(request.lease_ids)
        except BrokerError as err:
            await context.abort(status_of(err), str(err))
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
        e2e_processing_latency=_percentiles(t.e2e_processing_latency),
        channels=[pb.ChannelStats(
            name=c.name, depth=c.depth, in_flight_count=c.in_flight_count,
            deferred_count=c.deferred_count, message_count=c.message_count,
            requeue_count=c.requeue_count, timeout_count=c.timeout_count,
            finish_count=c.finish_count, paused=c.paused,
            dead_letter_count=c.dead_letter_count, expired_count=c.expired_count,
            e2e_processing_latency=_percentiles(c.e2e_processing_latency),
            clients=[pb.ClientStats(client_id=k.client_id, ready_count=k.ready_count,
                                    in_flight_count=k.in_flight_count,
                                    message_count=k.message_count,
                                    finish_count=k.finish_count,
                                    requeue_count=k.requeue_count) for k in c.clients])
            for c in t.channels])


async def start_grpc_server(broker: Broker, address: str) -> tuple[grpc.aio.Server, str]:
    """Serve ``broker`` on ``address`` (port 0 picks a free one); return the bound address."""
    host, _, port = address.rpartition(":")
    server = grpc.aio.server(options=[
        ("grpc.so_reuseport", 0),
        ("grpc.max_receive_message_length", MAX_GRPC_MESSAGE),
        ("grpc.max_send_message_length", MAX_GRPC_MESSAGE),
    ])
    try:
        bound_port = server.add_insecure_port(f"{host}:{port}")
    except RuntimeError:
        bound_port = 0
    if bound_port == 0:
        raise OSError(f"cannot listen on {address} (gRPC): address in use or not available")
    bound = f"{host}:{bound_port}"
    service = BrokerService(broker, bound)
    pb_grpc.add_BrokerServicer_to_server(service, server)
    await server.start()
    return server, bound
