"""A small synchronous client of the gRPC API, for the CLI, scripts and tests.

    client = Client("127.0.0.1:4170")
    client.publish("events", b"hello")
    with client.subscribe("events", "archive", rdy=100) as sub:
        for msg in sub:                     # pb Message: id, body, timestamp, attempts
            sub.fin(msg.id)

Failures raise ``ClientError`` (the broker said no; ``.status`` is the gRPC
status) or ``BrokerUnavailable`` (nothing answered at the address). When the
broker names its error's code, the exception is also an instance of the
matching ``broker.errors`` class (``LeaseNotFound``, ``ProducerConflict``, ...),
so callers catch by meaning.

Leases (see ``broker/lease.py``) are methods too: ``open_lease_session``,
``reserve``, ``fetch_lease``, ``finish_leases``, ``requeue_leases``,
``touch_leases``, ``adopt_leases``.
"""

from __future__ import annotations

import queue
import threading
from typing import Iterable, Iterator

import grpc

from .api import broker_pb2 as pb
from .api import broker_pb2_grpc as pb_grpc
from .errors import ERROR_CODE_METADATA, BrokerError, error_for_code
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


_client_kinds: dict[type, type] = {}


def _client_kind(kind: type[BrokerError]) -> type[ClientError]:
    """``kind`` that is also a ``ClientError``, so old and new ``except`` clauses both match."""
    if issubclass(kind, ClientError):
        return kind
    cls = _client_kinds.get(kind)
    if cls is None:
        cls = type(kind.__name__, (kind, ClientError), {"__init__": ClientError.__init__,
                                                        "__module__": kind.__module__})
        _client_kinds[kind] = cls
    return cls


def check_address(address: str) -> str:
    """``address`` if it is ``host:port``; a ``ValueError`` saying what to write
    otherwise (gRPC would try port 443 for a bare host)."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or host.endswith(":") or not port.isdigit() \
            or not 0 < int(port) < 65536:
        raise ValueError(f"address {address!r}: expected host:port of pynsqd's gRPC API "
                         f"(its default port is 4170, e.g. {address.rstrip(':') or 'localhost'}"
                         f":4170)")
    return address


# What gRPC says when the port speaks another protocol (nsqd's TCP or HTTP, say).
_PROTOCOL_MISMATCH = ("Failed parsing HTTP/2", "Trying to connect an http1.x server",
                      "Connection reset by peer", "Socket closed")


def _translate(err: grpc.RpcError, address: str) -> ClientError:
    status = err.code()
    if status in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        details = err.details() or status.name
        hint = ""
        if any(sign in details for sign in _PROTOCOL_MISMATCH):
            hint = (" (is this pynsqd's gRPC port? pynsqd serves gRPC on 4170 by default; "
                    "4150 is NSQ's TCP protocol and 4151 its HTTP API)")
        return BrokerUnavailable(status, f"cannot reach the broker at {address}: {details}{hint}")
    message = err.details() or status.name
    metadata = getattr(err, "trailing_metadata", lambda: None)() or ()
    code = next((v for k, v in metadata if k == ERROR_CODE_METADATA), "")
    if not code:
        return ClientError(status, message)
    out = _client_kind(type(error_for_code(code, message)))(status, message)
    out.code = code
    return out


def open_channel(address: str, **security: str | None) -> grpc.Channel:
    """``security``: tls_ca, tls_cert, tls_key, auth_secret (``broker/security/client.py``)."""
    from .security.client import client_channel
    return client_channel(address, [
        ("grpc.max_receive_message_length", MAX_GRPC_MESSAGE),
        ("grpc.max_send_message_length", MAX_GRPC_MESSAGE),
        ("grpc.enable_retries", 0),
        # A broker that restarts is found again within a second, not after gRPC's
        # default back-off of up to two minutes.
        ("grpc.initial_reconnect_backoff_ms", 100),
        ("grpc.max_reconnect_backoff_ms", 1000),
    ], **security)


class Client:
    def __init__(self, address: str = DEFAULT_GRPC_ADDRESS, *, timeout: float = 30.0,
                 tls_ca: str | None = None, tls_cert: str | None = None,
                 tls_key: str | None = None, auth_secret: str | None = None) -> None:
        """TLS when ``tls_ca`` (the CA that signed the broker's certificate) is given;
        ``tls_cert``/``tls_key`` for mutual TLS; ``auth_secret`` for NSQ's auth."""
        self.address = check_address(address)
        self.timeout = timeout
        self._channel = open_channel(address, tls_ca=tls_ca, tls_cert=tls_cert,
                                     tls_key=tls_key, auth_secret=auth_secret)
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

    # -- leases -----------------------------------------------------------
    def open_lease_session(self, client_id: str = "", *, session_id: str = "",
                           grace_ms: int = 0) -> "LeaseSession":
        """Open a lease session, or resume ``session_id`` if it is within its grace
        period (``.resumed`` says which). ``grace_ms``: how long the broker keeps the
        session's leases once its stream drops (0: the broker's msg-timeout)."""
        return LeaseSession(self, client_id, session_id, grace_ms)

    def reserve(self, session_id: str, topic: str, channel: str, max_messages: int, *,
                max_bytes: int = 0, msg_timeout_ms: int = 0,
                finish: Iterable[str] = ()) -> pb.ReserveResponse:
        """Lease up to ``max_messages`` (and ``max_bytes`` of bodies, if given) ready messages.

        The reply's ``lease_id`` is empty when nothing was ready. ``finish``: leases to FIN
        first, in the same call (the reply's ``finished`` and ``missing``); a broker whose
        Info does not say ``reserve_finishes`` ignores it.
        """
        return self._call(self.stub.Reserve, pb.ReserveRequest(
            session_id=session_id, topic=topic, channel=channel, max_messages=max_messages,
            max_bytes=max_bytes, msg_timeout_ms=msg_timeout_ms, finish_lease_ids=list(finish)))

    def fetch_lease(self, lease_id: str, partition: int = 0, num_partitions: int = 1, *,
                    broker_id: str = "", timeout: float | None = None
                    ) -> Iterator[pb.MessageColumns]:
        """The frames of one slice of a lease. ``broker_id``: fail unless the broker
        answering is that instance (``LeaseNotFound`` subclass ``WrongBroker``)."""
        request = pb.FetchLeaseRequest(lease_id=lease_id, partition=partition,
                                       num_partitions=num_partitions, broker_id=broker_id)
        try:
            yield from self.stub.FetchLease(request, timeout=timeout or self.timeout)
        except grpc.RpcError as err:
            raise _translate(err, self.address) from None

    def finish_leases(self, lease_ids: Iterable[str]) -> pb.LeaseResponse:
        return self._call(self.stub.FinishLeases, pb.LeaseRequest(lease_ids=list(lease_ids)))

    def requeue_leases(self, lease_ids: Iterable[str]) -> pb.LeaseResponse:
        return self._call(self.stub.RequeueLeases, pb.LeaseRequest(lease_ids=list(lease_ids)))

    def touch_leases(self, lease_ids: Iterable[str]) -> pb.LeaseResponse:
        return self._call(self.stub.TouchLeases, pb.LeaseRequest(lease_ids=list(lease_ids)))

    def adopt_leases(self, session_id: str, lease_ids: Iterable[str]) -> pb.LeaseResponse:
        return self._call(self.stub.AdoptLeases, pb.AdoptLeasesRequest(
            session_id=session_id, lease_ids=list(lease_ids)))

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


class LeaseSession:
    """A lease session stream: the broker holds its leases while it is open.

    ``session_id`` names it for ``reserve`` and ``adopt_leases``; ``broker_id``
    is the broker instance that holds it. ``alive`` turns False when the stream
    ends (the broker then keeps the session for a grace period, for
    ``open_lease_session(session_id=...)`` to resume).
    """

    def __init__(self, client: Client, client_id: str, session_id: str, grace_ms: int) -> None:
        self._stream = client.stub.OpenLeaseSession(pb.LeaseSessionRequest(
            client_id=client_id, session_id=session_id, grace_ms=grace_ms))
        try:
            first = next(self._stream)
        except grpc.RpcError as err:
            raise _translate(err, client.address) from None
        self.session_id = first.session_id
        self.broker_id = first.broker_id
        self.resumed = first.resumed
        self.ended = threading.Event()
        threading.Thread(target=self._drain, daemon=True, name="pynsq-lease-session").start()

    @property
    def alive(self) -> bool:
        return not self.ended.is_set()

    def _drain(self) -> None:
        try:
            for _ in self._stream:
                pass
        except grpc.RpcError:
            pass
        finally:
            self.ended.set()

    def close(self) -> None:
        """End the stream: the broker requeues its leases once the grace period passes."""
        self._stream.cancel()
