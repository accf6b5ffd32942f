"""Pushing stats to statsd over UDP, as nsqd's ``--statsd-address`` does.

    pynsqd --statsd-address 127.0.0.1:8125 --statsd-interval 10s

Every ``--statsd-interval`` the broker sends nsqd's statsd names, under
``--statsd-prefix`` (default ``nsq.%s``, ``%s`` being the broadcast address and
HTTP port with dots and colons turned into underscores):

- counters (the change since the last push): ``topic.T.message_count``,
  ``topic.T.message_bytes``, ``topic.T.channel.C.message_count``,
  ``.requeue_count``, ``.timeout_count``, and pynsq's own ``.dead_letter_count``
  and ``.expired_count``;
- gauges: ``topic.T.depth``, ``topic.T.backend_depth`` (messages that wait on
  disk only, as in ``/stats``), and per channel
  ``depth``, ``backend_depth``, ``in_flight_count``, ``deferred_count``,
  ``clients``; end-to-end latency percentiles in nanoseconds as
  ``...e2e_processing_latency_50`` (``_95``, ``_99``).

Lines are packed into datagrams of at most ``--statsd-udp-packet-size`` bytes.
The lines and packets are pure functions of stats; sending a datagram does not block.
"""

from __future__ import annotations

import asyncio
import logging
import socket

from .core import Broker
from .options import split_host_port
from .tasks import cancel_and_wait
from .stats import TopicStats

log = logging.getLogger("pynsqd")

Counts = dict[str, int]


def host_key(host_port: str) -> str:
    return host_port.replace(".", "_").replace(":", "_")


def resolve_prefix(template: str, broadcast_address: str, http_address: str) -> str:
    """``"nsq.%s"`` -> ``"nsq.10_0_0_5_4151."``, as nsqd does."""
    if not template:
        return ""
    port = http_address.rpartition(":")[2]
    prefix = template.replace("%s", host_key(f"{broadcast_address}:{port}"), 1)
    return prefix if prefix.endswith(".") else prefix + "."


def statsd_lines(prefix: str, stats: list[TopicStats], last: Counts,
                 exclude_ephemeral: bool = False) -> tuple[list[str], Counts]:
    """The lines to push for ``stats``, and the counters to diff the next push against;
    ``exclude_ephemeral`` leaves ``#ephemeral`` topics and channels out, as nsqd's
    ``--statsd-exclude-ephemeral`` does."""
    lines: list[str] = []
    counts: Counts = {}

    def incr(stat: str, total: int) -> None:
        counts[stat] = total
        lines.append(f"{prefix}{stat}:{max(0, total - last.get(stat, 0))}|c")

    def gauge(stat: str, value: int | float) -> None:
        lines.append(f"{prefix}{stat}:{int(value)}|g")

    def latency(stat: str, percentiles: list[tuple[float, float]]) -> None:
        for quantile, value_ms in percentiles:
            gauge(f"{stat}.e2e_processing_latency_{quantile * 100:.0f}", value_ms * 1e6)

    def kept(name: str) -> bool:
        return not (exclude_ephemeral and name.endswith("#ephemeral"))

    for t in filter(lambda t: kept(t.name), stats):
        base = f"topic.{t.name}"
        incr(f"{base}.message_count", t.message_count)
        incr(f"{base}.message_bytes", t.message_bytes)
        gauge(f"{base}.depth", t.depth)
        gauge(f"{base}.backend_depth", t.on_disk_count)
        latency(base, t.e2e_processing_latency)
        for c in filter(lambda c: kept(c.name), t.channels):
            ch = f"{base}.channel.{c.name}"
            incr(f"{ch}.message_count", c.message_count)
            gauge(f"{ch}.depth", c.depth)
            gauge(f"{ch}.backend_depth", c.on_disk_count)
            gauge(f"{ch}.in_flight_count", c.in_flight_count)
            gauge(f"{ch}.deferred_count", c.deferred_count)
            incr(f"{ch}.requeue_count", c.requeue_count)
            incr(f"{ch}.timeout_count", c.timeout_count)
            incr(f"{ch}.dead_letter_count", c.dead_letter_count)
            incr(f"{ch}.expired_count", c.expired_count)
            gauge(f"{ch}.clients", len(c.clients))
            latency(ch, c.e2e_processing_latency)
    return lines, counts


def packets(lines: list[str], size: int) -> list[bytes]:
    """Newline-terminated lines packed into datagrams of at most ``size`` bytes
    (a longer line goes alone)."""
    out: list[bytes] = []
    current = b""
    for line in lines:
        data = line.encode() + b"\n"
        if current and len(current) + len(data) > size:
            out.append(current)
            current = b""
        current += data
    if current:
        out.append(current)
    return out


class StatsdPusher:
    """Pushes the broker's stats to ``--statsd-address`` every ``--statsd-interval``."""

    def __init__(self, broker: Broker, addresses: dict[str, str]) -> None:
        options = broker.options
        self.broker = broker
        self.host, self.port = split_host_port(options.statsd_address, "statsd-address")
        self.prefix = resolve_prefix(options.statsd_prefix,
                                     options.broadcast_address or socket.gethostname(),
                                     addresses.get("http", ""))
        self.interval = options.statsd_interval / 1000
        self.packet_size = options.statsd_udp_packet_size
        self.exclude_ephemeral = options.statsd_exclude_ephemeral
        self._last: Counts = {}
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="statsd")

    async def close(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait(task)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            transport, _ = await loop.create_datagram_endpoint(
                asyncio.DatagramProtocol, remote_addr=(self.host, self.port))
        except OSError as err:
            log.error("statsd %s:%s: cannot send (%s); no stats will be pushed", self.host,
                      self.port, err)
            return
        try:
            while True:
                await asyncio.sleep(self.interval)
                lines, self._last = statsd_lines(self.prefix, self.broker.stats(), self._last,
                                                self.exclude_ephemeral)
                for packet in packets(lines, self.packet_size):
                    transport.sendto(packet)
        finally:
            transport.close()
