"""Spark read throughput: pynsq -> noop sink, against the ceiling of any Python source.

    python benchmarks/spark_source.py [--messages 1000000] [--partitions 2] [--rounds 1]

All runs happen in one Spark session: the pynsq source reading a channel of N
messages of 100 bytes from a ``pynsqd`` subprocess with ``availableNow`` (at the
default read limit; in one micro-batch; in batches of 100,000), and an in-memory
Python streaming source that yields the same number of rows of the same schema as
Arrow batches (no broker, no network), in one micro-batch and in batches of
100,000, each run before and after the pynsq reads. The ratio to the memory
source's mean rate, read in the same batches, is the figure. Each source first
reads a few rows untimed, so that neither pays for starting the executors' Python
workers (the run that comes first would otherwise). Each run also reports
Spark's own per-batch phases (``durationMs``, summed over its batches, and per
batch for the runs in batches of 100,000), and the time before its first trigger
and after its last batch.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from datetime import datetime

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

import pyarrow as pa  # noqa: E402
from pyspark.sql import SparkSession  # noqa: E402
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition  # noqa: E402
from pyspark.sql.streaming.datasource import ReadMaxRows, SupportsTriggerAvailableNow  # noqa: E402

from broker import Client  # noqa: E402
from spark_connector.datasource import SCHEMA  # noqa: E402
from spark_connector.fetch import ARROW_SCHEMA  # noqa: E402

try:
    from .common import start_pynsqd, stop
except ImportError:  # run as a script
    from common import start_pynsqd, stop

BODY = b"x" * 100


class MemorySource(DataSource):
    """A streaming source of N rows made in the executors: the ceiling."""

    @classmethod
    def name(cls) -> str:
        return "pynsq_bench_memory"

    def schema(self):
        return SCHEMA

    def streamReader(self, schema):
        return MemoryReader(int(self.options["rows"]), int(self.options["partitions"]),
                            int(self.options.get("batch", 0)))


class MemoryReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Rows ``[start, end)`` of ``rows``, at most ``batch`` per micro-batch (option
    ``batch``; default all in one), split evenly over ``partitions`` tasks."""

    def __init__(self, rows: int, partitions: int, batch: int = 0) -> None:
        self.rows, self.parts, self.batch = rows, partitions, batch or rows

    def initialOffset(self):
        return {"rows": 0}

    def getDefaultReadLimit(self):
        return ReadMaxRows(self.batch)

    def prepareForTriggerAvailableNow(self) -> None:
        pass

    def latestOffset(self, start, limit):
        wanted = limit.max_rows if isinstance(limit, ReadMaxRows) else self.batch
        return {"rows": min(self.rows, start["rows"] + wanted)}

    def partitions(self, start, end):
        first, last = start["rows"], end["rows"]
        if first >= last:
            return []
        share = -(-(last - first) // self.parts)
        return [InputPartition((b, min(last, b + share))) for b in range(first, last, share)]

    def read(self, partition):
        first, last = partition.value
        now = time.time_ns() // 1000
        for begin in range(first, last, 2500):
            n = min(2500, last - begin)
            yield pa.RecordBatch.from_arrays([
                pa.array([f"{begin + i:016x}" for i in range(n)], pa.string()),
                pa.array([BODY] * n, pa.binary()),
                pa.array([now] * n, pa.timestamp("us", tz="UTC")),
                pa.array([1] * n, pa.int32()),
                pa.array(["bench"] * n, pa.string()),
                pa.array(["spark"] * n, pa.string()),
            ], schema=ARROW_SCHEMA)


def timed_available_now(df, phases: dict | None = None) -> tuple[float, int]:
    """Seconds and rows of an ``availableNow`` read into the noop sink; ``phases``, if
    given, gets Spark's own per-batch durations (``durationMs``), summed over batches,
    and ``batches``."""
    with tempfile.TemporaryDirectory() as checkpoint:
        started, started_at = time.perf_counter(), time.time()
        query = (df.writeStream.format("noop").option("checkpointLocation", checkpoint)
                 .trigger(availableNow=True).start())
        query.awaitTermination()
        elapsed = time.perf_counter() - started
        everything = query.recentProgress
        progress = [p for p in everything if p["numInputRows"]]
        rows = sum(p["numInputRows"] for p in progress)
    if phases is not None:
        phases["batches"] = len(progress)
        # Before the first trigger (query start, the source's initialOffset) and after
        # the batches (triggers without data, the source's stop, the query's end).
        first = _epoch(everything[0]["timestamp"]) if everything else started_at
        last = _epoch(progress[-1]["timestamp"]) + progress[-1]["durationMs"][
            "triggerExecution"] / 1000 if progress else first
        phases["beforeFirstTrigger"] = round((first - started_at) * 1000)
        phases["afterLastBatch"] = round((started_at + elapsed - last) * 1000)
        for p in progress:
            for phase, ms in p["durationMs"].items():
                phases[phase] = phases.get(phase, 0) + ms
    return elapsed, rows


def _epoch(timestamp: str) -> float:
    """Seconds since the epoch of a progress report's ``timestamp`` (UTC, ISO 8601)."""
    return datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()


WARM_UP_ROWS = 2000


def per_batch(phases: dict) -> dict:
    """Spark's phases of a run (``durationMs`` summed over its batches), per batch."""
    n = max(1, phases.get("batches", 0))
    return {phase: round(ms / n) for phase, ms in phases.items()
            if phase not in ("batches", "beforeFirstTrigger", "afterLastBatch")}


SMALL_BATCH = 100_000


def run(spark, messages: int, partitions: int, memory_after: bool = True, warm_up: bool = True,
        small_batches: int = 10) -> dict:
    """pynsq against the in-memory source: each memory read runs before the pynsq reads
    and, with ``memory_after``, again after them; "batches of" reads in ``small_batches``
    micro-batches (at most 100,000 each)."""
    spark.dataSource.register(MemorySource)

    def memory(rows: int, batch: int = 0):
        return (spark.readStream.format("pynsq_bench_memory").option("rows", rows)
                .option("partitions", partitions).option("batch", batch).load())

    proc, address = start_pynsqd("--msg-timeout", "15m",
                                 "--mem-queue-size", str(2 * messages))
    small = min(SMALL_BATCH, max(1, messages // small_batches))
    try:
        client = Client(address)

        def pynsq(topic: str, count: int, **options):
            client.admin("channel", "create", topic, "spark")
            for start in range(0, count, 5000):
                client.multi_publish(topic, [BODY] * min(5000, count - start))
            return (spark.readStream.format("pynsq").option("address", address)
                    .option("topic", topic).option("channel", "spark")
                    .option("numPartitions", partitions).options(**options).load())

        if warm_up:
            timed_available_now(pynsq("warmup", WARM_UP_ROWS))
            timed_available_now(memory(WARM_UP_ROWS))
        # Each memory source runs before and after the pynsq reads; its ceiling is the mean
        # of the two, so that a machine whose load changes meanwhile tilts the ratio less.
        memory_phases: dict = {}
        memory_runs = [timed_available_now(memory(messages), memory_phases)]
        memory_small_phases: dict = {}
        memory_small_runs = [timed_available_now(memory(messages, small), memory_small_phases)]
        phases: dict = {}
        pynsq_s, pynsq_rows = timed_available_now(pynsq("bench", messages), phases)
        # The same read in one micro-batch, as the memory source does: what the
        # default read limit's batches cost.
        one_phases: dict = {}
        one_s, one_rows = timed_available_now(pynsq(
            "bench1", messages, maxMessagesPerTrigger=messages, maxBytesPerTrigger=1 << 30),
            one_phases)
        # In batches of 100,000, against the memory source in the same batches: what
        # each micro-batch costs pynsq beyond what it costs any Python source.
        small_phases: dict = {}
        small_s, small_rows = timed_available_now(pynsq(
            "bench100k", messages, maxMessagesPerTrigger=small), small_phases)
        client.close()
    finally:
        stop(proc)
    if memory_after:
        memory_small_runs.append(timed_available_now(memory(messages, small)))
        memory_runs.append(timed_available_now(memory(messages)))
    memory_rate = sum(rows / s for s, rows in memory_runs) / len(memory_runs)
    memory_small_rate = sum(rows / s for s, rows in memory_small_runs) / len(memory_small_runs)
    memory_rows = memory_runs[0][1]
    pynsq_rate = pynsq_rows / pynsq_s
    return {"messages": messages, "pynsq_rows": pynsq_rows, "pynsq_rows_per_s": round(pynsq_rate),
            "one_batch_rows": one_rows, "one_batch_rows_per_s": round(one_rows / one_s),
            "small_batch": small, "batches_of_100k_rows": small_rows,
            "batches_of_100k_rows_per_s": round(small_rows / small_s),
            "memory_rows": memory_rows, "memory_rows_per_s": round(memory_rate),
            "memory_batches_of_100k_rows": memory_small_runs[0][1],
            "memory_batches_of_100k_rows_per_s": round(memory_small_rate),
            "ratio": round(pynsq_rate / memory_rate, 3),
            "one_batch_ratio": round(one_rows / one_s / memory_rate, 3),
            "batches_of_100k_ratio": round(small_rows / small_s / memory_small_rate, 3),
            "phases_ms": phases, "one_batch_phases_ms": one_phases,
            "batches_of_100k_phases_ms": small_phases, "memory_phases_ms": memory_phases,
            "memory_batches_of_100k_phases_ms": memory_small_phases,
            "batches_of_100k_per_batch_ms": per_batch(small_phases),
            "memory_batches_of_100k_per_batch_ms": per_batch(memory_small_phases)}


def rate_micro_batch(spark, rows: int) -> float:
    """Spark's own ``rate-micro-batch`` source, one batch of ``rows``, for reference."""
    df = (spark.readStream.format("rate-micro-batch").option("rowsPerBatch", rows)
          .option("numPartitions", 2).load())
    with tempfile.TemporaryDirectory() as checkpoint:
        started = time.perf_counter()
        query = (df.writeStream.format("noop").option("checkpointLocation", checkpoint)
                 .trigger(once=True).start())
        query.awaitTermination()
        elapsed = time.perf_counter() - started
    return round(rows / elapsed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=1, help="repetitions in one session")
    args = parser.parse_args()
    spark = (SparkSession.builder.master("local[2]").appName("pynsq-bench")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    for _ in range(args.rounds):
        print(json.dumps(run(spark, args.messages, args.partitions)), flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
