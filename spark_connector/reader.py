"""The stream reader of the ``pynsq`` source: at-least-once, FIN after commit.

    spark.readStream.format("pynsq")
         .option("address", "127.0.0.1:4170")       # one or more host:port, or:
         # .option("lookupdHttpAddress", "127.0.0.1:4161")  # the fleet nsqlookupd lists
         .option("topic", "events").option("channel", "spark")
         .option("maxMessagesPerTrigger", 10000)    # default 1000000
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
                      "broker": "5d1e..."}}}      # the broker instance holding it

``leases`` names the leases that batch ``batch`` reads (one per broker that
had messages); ``{"batch": 0, "leases": {}}`` is the initial offset. A batch
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
from dataclasses import dataclass
from typing import Iterator

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition

from broker.security.client import ClientSecurity

from .compat import ReadLimit, ReadMaxBytes, ReadMaxRows, SupportsTriggerAvailableNow
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


class PynsqStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options) -> None:
        self.options = ReaderOptions.parse(options)
        self._keeper: LeaseKeeper | None = None   # driver side only, made on first use

    def __getstate__(self) -> dict:
        # read() runs in executors from a pickled reader: ship the options only.
        return {"options": self.options, "_keeper": None}

    @property
    def keeper(self) -> LeaseKeeper:
        if self._keeper is None:
            _stop_on_sigterm()
            self._keeper = LeaseKeeper(self.options)
        return self._keeper

    # -- driver ------------------------------------------------------------
    def initialOffset(self) -> dict:
        self.keeper.ensure_channel()
        return dict(INITIAL_OFFSET)

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.options.max_messages_per_trigger)

    def prepareForTriggerAvailableNow(self) -> None:
        self.keeper.target = self.keeper.depths()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        keeper = self.keeper
        batch = int(start.get("batch", 0))
        # Spark has committed ``start``: FIN it, and only then reserve. A lease of ``start``
        # that was requeued since (it timed out, its broker restarted) has its messages
        # waiting in the channel, and the FIN must take them back before a reserve can
        # lease them to the next batch (they would be read twice). Each broker gets both
        # in one call, which FINs first and then reserves.
        planned = keeper.planned(batch + 1)
        if planned is not None:
            keeper.finish_through(batch, start.get("leases", {}))
            return planned
        # Every batch is bounded: Spark's limit if it gives one, else the options'.
        o = self.options
        wanted = limit.max_rows if isinstance(limit, ReadMaxRows) else o.max_messages_per_trigger
        max_bytes = (limit.max_bytes if isinstance(limit, ReadMaxBytes)
                     else o.max_bytes_per_trigger)
        leases = keeper.reserve(batch + 1, wanted, max_bytes,
                                finish_through=(batch, start.get("leases", {})))
        if not leases:
            return start
        return {"batch": batch + 1, "leases": leases}

    def reportLatestOffset(self) -> dict | None:
        try:
            return {"depth": sum(self.keeper.latest_depths().values())}
        except BrokerUnreachable:
            return None

    def partitions(self, start: dict, end: dict) -> list[LeaseSlice]:
        if start == end:
            return []
        # Spark runs a batch once the one before is in its commit log, so ``start`` is
        # committed. ``latestOffset`` FINed it, unless its broker did not answer then: the
        # FIN is sent again here, and a replay sends it (the driver that planned this batch
        # may have died before it got through), so the batch's lease is not requeued later.
        self.keeper.finish_through(int(start.get("batch", 0)), start.get("leases", {}))
        # A batch this reader did not plan is a replay from the checkpoint.
        gone = self.keeper.adopt(int(end.get("batch", 0)), end.get("leases", {}))
        o = self.options
        n = o.num_partitions
        return [LeaseSlice(lease["address"], lease["lease"], p, n, o.topic, o.channel,
                           o.timeout_ms / 1000, lease.get("broker", ""), o.fail_on_data_loss,
                           o.security)
                for _, lease in sorted(end.get("leases", {}).items(), key=lambda kv: int(kv[0]))
                if lease["lease"] not in gone
                for p in range(n)]

    def commit(self, end: dict) -> None:
        self.keeper.finish_through(int(end.get("batch", 0)), end.get("leases", {}))

    def stop(self) -> None:
        if self._keeper is not None:
            # Batches not known committed go back now; if one was committed after all,
            # the next start FINs it (the broker remembers requeued leases).
            self._keeper.requeue_open()
            self._keeper.close()
            self._keeper = None

    # -- executors ---------------------------------------------------------
    def read(self, partition: LeaseSlice) -> Iterator:
        from .fetch import fetch_slice

        yield from fetch_slice(partition)

