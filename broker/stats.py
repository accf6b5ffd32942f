"""Stats snapshots, and the end-to-end latency sampler behind their percentiles."""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .consumer import Consumer

QUANTILES = (0.5, 0.95, 0.99)
# Upper bounds (ms) of the cumulative latency histogram (Prometheus' ``le``).
HISTOGRAM_BOUNDS_MS = (1, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000,
                       60000)
# The same as floats: a latency (a float) is bisected at every FIN, and a float compares
# with a float faster than with an int.
_BOUNDS_MS = tuple(map(float, HISTOGRAM_BOUNDS_MS))


class LatencySample:
    """The most recent ``size`` publish-to-FIN latencies, in milliseconds, and a
    histogram of all of them since the start (counts per ``HISTOGRAM_BOUNDS_MS``).

    Messages FINed together are kept as their publish times and the FIN time: their
    latencies are worked out when percentiles are asked for (a stats call), not at
    every FIN."""

    def __init__(self, size: int = 4096) -> None:
        self._values: deque[float] = deque(maxlen=size)
        # FINs not in ``_values`` yet, oldest first: (FIN wall ns, publish times), and
        # how many publish times they hold (under ``size`` plus the newest FIN's).
        self._pending: deque[tuple[int, list[int]]] = deque()
        self._pending_count = 0
        self.bucket_counts = [0] * (len(HISTOGRAM_BOUNDS_MS) + 1)  # the last: above all
        self.sum_ms = 0.0

    def _settle(self) -> None:
        """Put the latencies of the FINs pending in ``_values``, in order."""
        values = self._values
        for now_ns, published_ns in self._pending:
            values.extend([(now_ns - t) / 1e6 for t in published_ns])
        self._pending.clear()
        self._pending_count = 0

    def add(self, latency_ms: float) -> None:
        if self._pending:
            self._settle()
        self._values.append(latency_ms)
        self.bucket_counts[bisect_left(_BOUNDS_MS, latency_ms)] += 1
        self.sum_ms += latency_ms

    def add_many(self, latencies_ms: list[float]) -> None:
        """``add`` each; a batch is sorted once and cut at each bound, not bisected one
        by one (a handful is cheaper one by one)."""
        if len(latencies_ms) < len(HISTOGRAM_BOUNDS_MS):
            for latency_ms in latencies_ms:
                self.add(latency_ms)
            return
        if self._pending:
            self._settle()
        self._values.extend(latencies_ms)
        ordered = sorted(latencies_ms)
        counts, below = self.bucket_counts, 0
        for i, bound in enumerate(HISTOGRAM_BOUNDS_MS):
            upto = bisect_right(ordered, bound, below)
            counts[i] += upto - below
            below = upto
        counts[-1] += len(ordered) - below
        self.sum_ms += sum(latencies_ms)

    def add_published(self, now_ns: int, published_ns: list[int]) -> None:
        """``add`` the latency of messages published at ``published_ns`` (a list this
        sample may keep) and FINed at ``now_ns`` (wall clock, ns). A lease FINs a
        million at once: the histogram counts come from the sorted publish times (a
        latency is at most a bound when its message was published no earlier than
        ``now_ns`` less the bound), the sum from their total; only the newest ``size``
        publish times are kept for the percentiles."""
        n = len(published_ns)
        if n < len(HISTOGRAM_BOUNDS_MS):
            # A handful (a consumer at a low RDY FINs the one or two it was handed
            # together): ``add`` of each, inline, one call in all.
            if self._pending:
                self._settle()
            values, counts, sum_ms = self._values, self.bucket_counts, self.sum_ms
            for t in published_ns:
                latency_ms = (now_ns - t) / 1e6
                values.append(latency_ms)
                counts[bisect_left(_BOUNDS_MS, latency_ms)] += 1
                sum_ms += latency_ms
            self.sum_ms = sum_ms
            return
        size = self._values.maxlen
        if size:
            self._keep(now_ns, published_ns if n <= size else published_ns[-size:], size)
        ordered = sorted(published_ns)
        counts, within = self.bucket_counts, 0  # within: latencies at most the bound so far
        for i, bound in enumerate(HISTOGRAM_BOUNDS_MS):
            upto = n - bisect_left(ordered, now_ns - bound * 1_000_000)
            counts[i] += upto - within
            within = upto
        counts[-1] += n - within
        self.sum_ms += (now_ns * n - sum(published_ns)) / 1e6

    def _keep(self, now_ns: int, published_ns: list[int], size: int) -> None:
        """Hold a FIN's publish times until asked for; older FINs that the newer ones
        already push out of the newest ``size`` go at once."""
        pending = self._pending
        pending.append((now_ns, published_ns))
        self._pending_count += len(published_ns)
        while self._pending_count - len(pending[0][1]) >= size:
            self._pending_count -= len(pending.popleft()[1])

    def extend(self, other: "LatencySample") -> None:
        self._settle()
        other._settle()
        self._values.extend(other._values)

    def percentiles(self) -> list[tuple[float, float]]:
        self._settle()
        if not self._values:
            return []
        ordered = sorted(self._values)
        last = len(ordered) - 1
        return [(q, ordered[min(last, int(q * len(ordered)))]) for q in QUANTILES]


@dataclass(frozen=True)
class ClientIdentity:
    """Who a consumer is, as its connection tells: nsqd's client fields in /stats.

    The server that accepted the client fills it in (TCP from IDENTIFY and the
    socket, gRPC from the call's peer and metadata); the core only keeps it.
    """

    client_id: str = ""
    hostname: str = ""
    remote_address: str = ""        # the peer's host:port
    version: str = ""               # its protocol: "V2" (NSQ's TCP) or "grpc"
    user_agent: str = ""
    tls: bool = False
    tls_version: str = ""           # as nsqd names them: "TLS1.3"
    tls_cipher_suite: str = ""
    authed: bool = False
    auth_identity: str = ""
    auth_identity_url: str = ""


def host_port(host: str, port: int) -> str:
    """``host:port``, an IPv6 host in brackets (as Go's net.JoinHostPort)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@dataclass
class ClientStats:
    client_id: str
    ready_count: int
    in_flight_count: int
    message_count: int
    finish_count: int
    requeue_count: int
    connect_ts: int = 0  # Unix seconds
    identity: ClientIdentity = ClientIdentity()
    closing: bool = False  # after CLS, or its connection is going

    @classmethod
    def of(cls, consumer: "Consumer") -> "ClientStats":
        return cls(consumer.client_id, consumer.rdy, len(consumer.in_flight),
                   consumer.message_count, consumer.finish_count, consumer.requeue_count,
                   consumer.connect_ts, consumer.identity, consumer.closing)


@dataclass
class ChannelStats:
    name: str
    depth: int
    in_flight_count: int
    deferred_count: int
    message_count: int
    requeue_count: int
    timeout_count: int
    finish_count: int
    paused: bool
    clients: list[ClientStats] = field(default_factory=list)
    e2e_processing_latency: list[tuple[float, float]] = field(default_factory=list)
    on_disk_count: int = 0          # ready and deferred messages that wait on disk only
    disk_bytes: int = 0             # bytes of the topic's files this channel keeps
    memory_count: int = 0           # ready and deferred messages whose body is in memory
    dead_letter_count: int = 0      # moved to the dead-letter topic
    expired_count: int = 0          # past their ttl (dead-lettered or dropped)
    max_attempts: int = 0           # in force: the channel's, else --max-attempts (0: off)
    dead_letter_topic: str = ""     # in force: where dead letters go ("" with max_attempts 0)


@dataclass
class TopicStats:
    name: str
    depth: int
    message_count: int
    message_bytes: int
    paused: bool
    channels: list[ChannelStats] = field(default_factory=list)
    e2e_processing_latency: list[tuple[float, float]] = field(default_factory=list)
    on_disk_count: int = 0          # held messages that wait on disk only
    memory_count: int = 0           # held messages whose body is in memory
    disk_bytes: int = 0             # bytes of the topic's files
    rewritten_bytes: int = 0        # pending messages' bytes copied to the log's end
    disk_read_errors: int = 0       # failed reads of its messages on disk (retried)
    ttl_ms: int = 0                 # default ttl of its messages (0: none)
