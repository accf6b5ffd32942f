"""The stream reader of the ``pynsq`` source: at-least-once, FIN after commit.

    spark.readStream.format("pynsq")
         .option("address", "127.0.0.1:4170")       # one or more host:port, or:
         # .option("lookupdHttpAddress", "127.0.0.1:4161")  # the fleet nsqlookupd lists
         .option("topic", "events").option("channel", "spark")  # topic: one, or a list
         .option("maxMessagesPerTrigger", 10000)    # default 1000000 (or maxOffsetsPerTrigger)
         .option("maxBytesPerTrigger", 1 << 20)     # bodies per batch, default 128 MiB
         .load()

How a micro-batch holds its messages. Only the holder of an NSQ message may
FIN it, yet Spark plans on the driver and reads in executors. So the driver
*leases* each batch: ``latestOffset`` reserves up to the read limit from the
channel into a lease owned by the driver's lease session (a stream kept open
to each broker); executors fetch their slice of the lease by id; the driver
FINs the lease once Spark has committed the batch, and touches it while the
batch runs so it outlives ``msgTimeoutMs``. If the session's stream drops, the
broker keeps its leases for ``msgTimeoutMs`` so the driver can resume it; if
the driver is gone for longer, or hangs, the leases are requeued or time out.
Either way the messages are read again: at least once. A task whose lease is
gone fails (Spark retries it, then fails the query) rather than reading nothing.

When Spark lets us know a batch is done: ``commit(end)`` (only when the next
batch has data), and ``latestOffset(start, ...)``, which Spark calls only once
every batch ending at or before ``start`` is in the commit log — so both FIN
everything up to their offset. After a ``once`` trigger, or a query stopped
right after a batch, neither comes: the next start's first ``latestOffset``
FINs the last committed batch's leases, whether still held or requeued since
(the broker remembers requeued and timed-out leases by their messages' ids).

Offsets are JSON dicts::

    {"batch": 7,                                  # micro-batch counter of this source
     "leases": {"0": {"address": "127.0.0.1:4170", "lease": "9f0c...", "count": 500,
                      "broker": "5d1e...",         # the broker instance that made it
                      "identity": "n412-7c2a...",  # the broker, wherever it answers now
                      "topic": "events"}}}

``leases`` names the leases that batch ``batch`` reads (one per broker and topic
that had messages); ``{"batch": 0, "leases": {}}`` is the initial offset. A
lease's broker is found by its identity (kept in its data path), not its
address: a checkpoint reused after the broker moved to another address (given
now in ``address``, or listed by nsqlookupd) FINs and replays there. A batch
replayed from the checkpoint (Spark calls ``partitions`` for a batch this
reader did not plan) first *adopts* its leases: a live lease changes hands, and
a lease requeued when the old driver went away takes back those of its messages
still waiting in the channel. So the replay reads what the failed run read, and
a writer that de-duplicates by (query, writer, batch, partition) publishes
nothing twice. A lease made by a broker instance that has since restarted is
gone: its messages are back in that broker's channel and a later batch reads them.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from dataclasses import dataclass
from typing import Iterator

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (ReadAllAvailable, ReadLimit, ReadMaxBytes,
                                              ReadMaxRows, SupportsTriggerAvailableNow)

from broker.security.client import ClientSecurity

from .options import ReaderOptions
from .session import BrokerUnreachable, LeaseKeeper

log = logging.getLogger("pynsq.spark")

INITIAL_OFFSET = {"batch": 0, "leases": {}}


def _stop_on_sigterm() -> None:
    """Spark ends the driver's source worker with SIGTERM when the query stops or fails.
    Python's default dies on the spot, before the worker's ``finally`` calls ``stop()``,
    and the batch's leases would stay held for the grace period. Exit instead, once."""
    if threading.current_thread() is not threading.main_thread() \
            or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return  # not a worker of ours to shape

    def exit_once(signum: int, frame) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second one must not cut stop() short
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, exit_once)


@dataclass(frozen=True)
class LeaseSlice(InputPartition):
    """One task's share of one lease: messages ``partition::num_partitions``."""

    address: str
    lease_id: str
    partition: int
    num_partitions: int
    topic: str
    channel: str
    timeout_s: float
    broker_id: str = ""              # the broker instance that made the lease
    fail_on_data_loss: bool = True   # a lease gone fails the task, else reads nothing
    security: ClientSecurity | None = None  # TLS files, auth secret (never shown)
    reconnect_timeout_s: float = 0.0  # how long a fetch waits for a silent broker


class PynsqStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options) -> None:
        self.options = ReaderOptions.parse(options)
        # Driver side only, made on first use: one keeper per topic, in the options' order.
        self._keepers: dict[str, LeaseKeeper] | None = None
        # When the last batch was planned (minMessagesPerTrigger waits from there).
        self._last_batch_at = time.monotonic()

    def __getstate__(self) -> dict:
        # read() runs in executors from a pickled reader: ship the options only.
        return {"options": self.options, "_keepers": None}

    @property
    def keepers(self) -> dict[str, LeaseKeeper]:
        if self._keepers is None:
            _stop_on_sigterm()
            keepers: dict[str, LeaseKeeper] = {}
            try:
                for topic in self.options.topics:
                    keepers[topic] = LeaseKeeper(self.options.for_topic(topic))
            except BaseException:
                for keeper in keepers.values():
                    keeper.close()
                raise
            self._keepers = keepers
        return self._keepers

    @property
    def keeper(self) -> LeaseKeeper:
        """The first topic's keeper (a one-topic source's only one)."""
        return next(iter(self.keepers.values()))

    def _by_topic(self, leases: dict[str, dict]) -> dict[str, dict[str, dict]]:
        """An offset's leases by topic (one written before offsets named it: the first)."""
        out: dict[str, dict[str, dict]] = {t: {} for t in self.options.topics}
        for key, lease in leases.items():
            out.setdefault(lease.get("topic") or self.options.topic, {})[key] = lease
        return out

    def _finish_through(self, batch: int, leases: dict[str, dict]) -> None:
        for topic, own in self._by_topic(leases).items():
            if topic in self.keepers:
                self.keepers[topic].finish_through(batch, own)
            else:
                log.warning("pynsq source: batch %d read %d lease(s) of topic %s, which option "
                            "topic no longer names: they are not FINed here (their messages "
                            "are read again if that topic is read again)", batch, len(own), topic)

    # -- driver ------------------------------------------------------------
    def initialOffset(self) -> dict:
        for keeper in self.keepers.values():
            keeper.ensure_channel()
        return dict(INITIAL_OFFSET)

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.options.max_messages_per_trigger)

    def prepareForTriggerAvailableNow(self) -> None:
        for keeper in self.keepers.values():
            keeper.target = keeper.depths()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        batch = int(start.get("batch", 0))
        # Spark has committed ``start``: FIN it, and only then reserve. A lease of ``start``
        # that was requeued since (it timed out, its broker restarted) has its messages
        # waiting in the channel, and the FIN must take them back before a reserve can
        # lease them to the next batch (they would be read twice). Each broker gets both
        # in one call, which FINs first and then reserves.
        planned = self._planned(batch + 1)
        if planned is not None:
            self._finish_through(batch, start.get("leases", {}))
            return planned
        if self._holds_back(limit):
            self._finish_through(batch, start.get("leases", {}))
            return start
        # Every batch is bounded: Spark's limit if it gives one, else the options'. Several
        # topics share it equally (what one leaves is the next batch's).
        o = self.options
        wanted = limit.max_rows if isinstance(limit, ReadMaxRows) else o.max_messages_per_trigger
        max_bytes = (limit.max_bytes if isinstance(limit, ReadMaxBytes)
                     else o.max_bytes_per_trigger)
        n = len(self.keepers)
        committed = self._by_topic(start.get("leases", {}))
        leases: dict[str, dict] = {}
        for topic, keeper in self.keepers.items():
            got = keeper.reserve(batch + 1, -(-wanted // n), -(-max_bytes // n),
                                 finish_through=(batch, committed.get(topic, {})))
            for _, lease in sorted(got.items(), key=lambda kv: int(kv[0])):
                leases[str(len(leases))] = {**lease, "topic": topic}
        if not leases:
            return start
        self._last_batch_at = time.monotonic()
        return {"batch": batch + 1, "leases": leases}

    def _planned(self, batch: int) -> dict | None:
        """The offset of ``batch`` if this reader reserved it and it is not finished yet."""
        leases: dict[str, dict] = {}
        for topic, keeper in self.keepers.items():
            own = keeper.planned(batch)
            for _, lease in sorted((own or {}).get("leases", {}).items(),
                                   key=lambda kv: int(kv[0])):
                leases[str(len(leases))] = {**lease, "topic": topic}
        return {"batch": batch, "leases": leases} if leases else None

    def _holds_back(self, limit: ReadLimit) -> bool:
        """minMessagesPerTrigger (Kafka's minOffsetsPerTrigger): fewer messages ready than
        that makes no batch, until maxTriggerDelay has passed since the last one. Not with
        availableNow, nor when Spark asks for all that is available."""
        o = self.options
        if not o.min_messages_per_trigger or self.keeper.target is not None \
                or isinstance(limit, ReadAllAvailable):
            return False
        waited = time.monotonic() - self._last_batch_at
        if waited >= o.max_trigger_delay_ms / 1000:
            return False
        ready = sum(d for k in self.keepers.values() for d in k.latest_depths().values())
        if ready >= o.min_messages_per_trigger:
            return False
        log.info("pynsq source: %d message(s) ready, fewer than minMessagesPerTrigger (%d): no "
                 "batch yet (%.0f s of maxTriggerDelay %d ms waited)", ready,
                 o.min_messages_per_trigger, waited, o.max_trigger_delay_ms)
        return True

    def reportLatestOffset(self) -> dict | None:
        # Spark shows this in each progress as the source's ``latestOffset`` (PySpark has
        # no source metrics for Python sources): the closest to Kafka's avgOffsetsBehindLatest.
        try:
            each = {topic: keeper.progress() for topic, keeper in self.keepers.items()}
        except BrokerUnreachable:
            return None
        if len(each) == 1:
            return next(iter(each.values()))
        return {"source": f"pynsq topics {','.join(each)} channel {self.options.channel}",
                "depth": sum(p["depth"] for p in each.values()),
                "lag": sum(p["lag"] for p in each.values()),
                "brokersDown": max(p["brokersDown"] for p in each.values()),
                "topics": {topic: {k: v for k, v in p.items() if k != "source"}
                           for topic, p in each.items()}}

    def partitions(self, start: dict, end: dict) -> list[LeaseSlice]:
        if start == end:
            return []
        # Spark runs a batch once the one before is in its commit log, so ``start`` is
        # committed. ``latestOffset`` FINed it, unless its broker did not answer then: the
        # FIN is sent again here, and a replay sends it (the driver that planned this batch
        # may have died before it got through), so the batch's lease is not requeued later.
        self._finish_through(int(start.get("batch", 0)), start.get("leases", {}))
        # A batch this reader did not plan is a replay from the checkpoint.
        batch, gone = int(end.get("batch", 0)), set()
        for topic, own in self._by_topic(end.get("leases", {})).items():
            if own:
                gone |= self.keepers[topic].adopt(batch, own)
        o = self.options
        n = o.num_partitions
        slices = []
        for _, lease in sorted(end.get("leases", {}).items(), key=lambda kv: int(kv[0])):
            if lease["lease"] in gone:
                continue
            topic = lease.get("topic") or o.topic
            address = self.keepers[topic].where(lease) or lease["address"]
            slices += [LeaseSlice(address, lease["lease"], p, n, topic, o.channel,
                                  o.timeout_ms / 1000, lease.get("broker", ""),
                                  o.fail_on_data_loss, o.security, o.reconnect_timeout_ms / 1000)
                       for p in range(n)]
        return slices

    def commit(self, end: dict) -> None:
        self._finish_through(int(end.get("batch", 0)), end.get("leases", {}))

    def stop(self) -> None:
        if self._keepers is not None:
            # Batches not known committed go back now; if one was committed after all,
            # the next start FINs it (the broker remembers requeued leases).
            for keeper in self._keepers.values():
                keeper.requeue_open()
                keeper.close()
            self._keepers = None

    # -- executors ---------------------------------------------------------
    def read(self, partition: LeaseSlice) -> Iterator:
        from .fetch import fetch_slice

        yield from fetch_slice(partition)

