"""A small synchronous client of the gRPC API, for the CLI, scripts and tests.

    client = Client("127.0.0.1:4170")
    client.publish("events", b"hello")
    with client.subscribe("events", "archive", rdy=100) as sub:
        for msg in sub:                     # pb Message: id, body, timestamp, attempts
            sub.fin(msg.id)

Failures raise ``ClientError`` (the broker said no; ``.status`` is the gRPC
status) or ``BrokerUnavailable`` (nothing answered at the address).
"""

from __future__ import annotations

import queue
import threading
from typing import Iterable, Iterator

import grpc

from .api import broker_pb2 as pb
from .api import broker_pb2_grpc as pb_grpc
from .errors import BrokerError
from .options import DEFAULT_GRPC_ADDRESS

MAX_GRPC_MESSAGE = 256 << 20


class ClientError(BrokerError):
    """The broker refused a request; ``status`` is the gRPC status code."""

    def __init__(self, status: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = status.name


class BrokerUnavailable(ClientError):
    """No broker answered at the address."""


def _translate(err: grpc.RpcError, address: str) -> ClientError:
    status = err.code()
    if status in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        return BrokerUnavailable(status, f"cannot reach the broker at {address}: {err.details()}")
    return ClientError(status, err.details() or status.name)


def open_channel(address: str) -> grpc.Channel:
    return grpc.insecure_channel(address, options=[
        ("grpc.max_receive_message_length", MAX_GRPC_MESSAGE),
        ("grpc.max_send_message_length", MAX_GRPC_MESSAGE),
        ("grpc.enable_retries", 0),
    ])


class Client:
    def __init__(self, address: str = DEFAULT_GRPC_ADDRESS, *, timeout: float = 30.0) -> None:
        self.address = address
        self.timeout = timeout
        self._channel = open_channel(address)
        self.stub = pb_grpc.BrokerStub(self._channel)

    def _call(self, method, request, timeout: float | None = None):
        try:
            return method(request, timeout=timeout or self.timeout)
        except grpc.RpcError as err:
            raise _translate(err, self.address) from None

    # -- publishing -------------------------------------------------------
    def publish(self, topic: str, body: bytes | str, *, defer_ms: int = 0,
                producer_id: str = "", sequence: int = 0, ttl_ms: int = 0) -> str:
        if isinstance(body, str):
            body = body.encode()
        request = pb.PublishRequest(topic=topic, body=body, defer_ms=defer_ms,
                                    producer_id=producer_id, sequence=sequence, ttl_ms=ttl_ms)
        return self._call(self.stub.Publish, request).ids[0]

    def multi_publish(self, topic: str, bodies: Iterable[bytes | str], *,
                      defer_ms: Iterable[int] = (), producer_id: str = "",
                      sequence: int = 0, ttl_ms: Iterable[int] = ()) -> list[str]:
        """MPUB. With ``producer_id``, a replayed (producer_id, sequence) publishes nothing.
        ``defer_ms`` and ``ttl_ms``: empty, or one per body."""
        data = [b.encode() if isinstance(b, str) else b for b in bodies]
        request = pb.MultiPublishRequest(topic=topic, bodies=data, defer_ms=list(defer_ms),
                                         producer_id=producer_id, sequence=sequence,
                                         ttl_ms=list(ttl_ms))
        return list(self._call(self.stub.MultiPublish, request).ids)

    # -- admin ------------------------------------------------------------
    def admin(self, kind: str, action: str, topic: str, channel: str = "") -> None:
        """``admin("topic", "pause", "events")``; kind is topic or channel."""
        method = getattr(self.stub, f"{action.capitalize()}{kind.capitalize()}")
        request = (pb.TopicRequest(topic=topic) if kind == "topic"
                   else pb.ChannelRequest(topic=topic, channel=channel))
        self._call(method, request)

    def create_topic(self, topic: str, *, ttl_ms: int | None = None) -> None:
        """Create ``topic``; ``ttl_ms`` sets the default ttl of its messages."""
        self._call(self.stub.CreateTopic, pb.TopicRequest(topic=topic, ttl_ms=ttl_ms))

    def create_channel(self, topic: str, channel: str, *, max_attempts: int | None = None,
                       dead_letter_topic: str = "") -> None:
        """Create ``channel``; past ``max_attempts`` deliveries a message goes to
        ``dead_letter_topic`` (empty: TOPIC.dead)."""
        self._call(self.stub.CreateChannel, pb.ChannelRequest(
            topic=topic, channel=channel, max_attempts=max_attempts,
            dead_letter_topic=dead_letter_topic))

    def stats(self, topic: str = "", channel: str = "") -> pb.StatsResponse:
        return self._call(self.stub.Stats, pb.StatsRequest(topic=topic, channel=channel))

    def ping(self, timeout: float | None = None) -> str:
        return self._call(self.stub.Ping, pb.PingRequest(), timeout).status

    def info(self) -> pb.InfoResponse:
        return self._call(self.stub.Info, pb.InfoRequest())

    # -- consuming --------------------------------------------------------
    def subscribe(self, topic: str, channel: str, *, rdy: int = 1, msg_timeout_ms: int = 0,
                  client_id: str = "") -> "Subscription":
        return Subscription(self, topic, channel, rdy=rdy, msg_timeout_ms=msg_timeout_ms,
                            client_id=client_id)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_END = object()


class Subscription:
    """One consumer stream. Iterate for messages; ``fin``/``req``/``touch`` them.

    FIN/REQ/TOUCH failures do not end the stream; they arrive in ``errors()``.
    A fatal error (bad RDY, channel deleted) ends iteration by raising
    ``ClientError``.
    """

    def __init__(self, client: Client, topic: str, channel: str, *, rdy: int,
                 msg_timeout_ms: int, client_id: str) -> None:
        self._client = client
        self._requests: queue.Queue = queue.Queue()
        self._messages: queue.Queue = queue.Queue()
        self._errors: queue.Queue = queue.Queue()
        self.close_wait = threading.Event()
        self._requests.put(pb.ClientFrame(sub=pb.Sub(topic=topic, channel=channel,
                                                      msg_timeout_ms=msg_timeout_ms,
                                                      client_id=client_id)))
        self._responses = client.stub.Subscribe(iter(self._requests.get, _END))
        try:
            first = next(self._responses)
        except grpc.RpcError as err:
            self._requests.put(_END)
            raise _translate(err, client.address) from None
        self.msg_timeout_ms = first.subscribed.msg_timeout_ms
        self._reader = threading.Thread(target=self._read, daemon=True, name="pynsq-sub")
        self._reader.start()
        if rdy:
            self.rdy(rdy)

    def _read(self) -> None:
        try:
            for frame in self._responses:
                kind = frame.WhichOneof("frame")
                if kind == "messages":
                    for msg in frame.messages.messages:
                        self._messages.put(msg)
                elif kind == "error":
                    self._errors.put(frame.error)
                elif kind == "close_wait":
                    self.close_wait.set()
            self._messages.put(_END)
        except grpc.RpcError as err:
            if err.code() == grpc.StatusCode.CANCELLED:
                self._messages.put(_END)
            else:
                self._messages.put(_translate(err, self._client.address))

    def get(self, timeout: float | None = None) -> pb.Message | None:
        """The next message, or None at the end of the stream or after ``timeout``."""
        try:
            item = self._messages.get(timeout=timeout)
        except queue.Empty:
            return None
        if item is _END:
            self._messages.put(_END)
            return None
        if isinstance(item, ClientError):
            self._messages.put(item)
            raise item
        return item

    def __iter__(self) -> Iterator[pb.Message]:
        while True:
            msg = self.get()
            if msg is None:
                return
            yield msg

    def error(self, timeout: float | None = None) -> pb.Error | None:
        """The next non-fatal error the broker reported, or None after ``timeout``."""
        try:
            return self._errors.get(timeout=timeout)
        except queue.Empty:
            return None

    def rdy(self, count: int) -> None:
        self._requests.put(pb.ClientFrame(rdy=pb.Rdy(count=count)))

    def fin(self, *ids: str) -> None:
        self._requests.put(pb.ClientFrame(fin=pb.Fin(ids=ids)))

    def req(self, msg_id: str, delay_ms: int = 0) -> None:
        self._requests.put(pb.ClientFrame(req=pb.Req(id=msg_id, delay_ms=delay_ms)))

    def touch(self, *ids: str) -> None:
        self._requests.put(pb.ClientFrame(touch=pb.Touch(ids=ids)))

    def nop(self) -> None:
        self._requests.put(pb.ClientFrame(nop=pb.Nop()))

    def cls(self) -> None:
        """Ask for no more messages; the broker answers with CloseWait."""
        self._requests.put(pb.ClientFrame(cls=pb.Cls()))

    def close(self, timeout: float = 10.0) -> None:
        """End the stream after the commands already sent are processed.

        Whatever is still in flight then goes back to the channel.
        """
        self._requests.put(_END)
        self._reader.join(timeout=timeout)
        if self._reader.is_alive():
            self._responses.cancel()
            self._reader.join(timeout=timeout)

    def __enter__(self) -> "Subscription":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
