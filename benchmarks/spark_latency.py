"""Spark end-to-end latency: publish -> row committed in a sink, at a steady rate.

    python benchmarks/spark_latency.py [--rate 1000] [--seconds 20] [--warm-up 5]
                                       [--segments 4] [--rounds 1]

Two streams run one after the other in one Spark session (``local[2]``), each
with ``trigger(processingTime="0 seconds")`` (the next micro-batch starts as soon
as the last one ends) into the same sink:

- the ``pynsq`` source reading a channel that a thread of this process publishes
  to at ``--rate`` messages/s (an MPUB every 10 ms), each body the time it was
  published;
- an in-memory Python source whose row ``i`` becomes available at ``start + i /
  rate``, the body that time: no broker, no network, what any Python source pays.

The sink's ``commit`` (on the driver, once the batch's tasks have all written)
records, for every row of the batch, the time now minus the time in its body.
Rows published in the first ``--warm-up`` seconds of a stream are not counted. The
figures are p50 and p99 of those latencies, in milliseconds.

The two sources take turns, ``--segments`` times each (default 4), in the order
pynsq, memory, memory, pynsq, ...: each segment a new query measured for
``--seconds / --segments`` after its warm-up, the latencies of a source's segments
pooled. On a shared machine the load swings within half a minute (a batch's cycle
doubling, Spark's own log writes included); measured one after the other, one source
would get the quiet spell and the other the busy one, and the ratio would say more
about the machine than the source. Taking turns often, both see the same swings (and
neither alone gets the JVM still cold).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from array import array
from pathlib import Path

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

import pyarrow as pa  # noqa: E402
import pyarrow.compute as pc  # noqa: E402
from pyspark.sql import SparkSession  # noqa: E402
from pyspark.sql.datasource import (DataSource, DataSourceStreamArrowWriter,  # noqa: E402
                                    DataSourceStreamReader, InputPartition,
                                    WriterCommitMessage)

from broker import Client  # noqa: E402
from spark_connector.datasource import SCHEMA  # noqa: E402
from spark_connector.fetch import ARROW_SCHEMA  # noqa: E402

try:
    from .common import start_pynsqd, stop
except ImportError:  # run as a script
    from common import start_pynsqd, stop

PUBLISH_EVERY_S = 0.01


# -- the sink: latency of each row at its batch's commit ----------------------------
class LatencySink(DataSource):
    @classmethod
    def name(cls) -> str:
        return "pynsq_bench_latency"

    def streamWriter(self, schema, overwrite: bool):
        return LatencyWriter(self.options["path"])


class PublishTimes(WriterCommitMessage):
    def __init__(self, times: bytes) -> None:
        self.times = times  # float64 seconds since the epoch, packed


class LatencyWriter(DataSourceStreamArrowWriter):
    def __init__(self, path: str) -> None:
        self.path = path

    def write(self, iterator) -> PublishTimes:
        times = [pc.cast(pc.cast(batch.column("body"), pa.string()), pa.float64())
                 for batch in iterator]
        return PublishTimes(b"".join(t.buffers()[1].to_pybytes()[:8 * len(t)]
                                     for t in times if len(t)))

    def commit(self, messages, batchId: int) -> None:
        now = time.time()
        published = array("d")
        for m in messages:
            if m is not None:
                published.frombytes(m.times)
        if published:
            # (publish time, now) per row, packed as float64.
            pairs = array("d")
            for t in published:
                pairs.append(t)
                pairs.append(now)
            with open(self.path, "ab") as f:
                f.write(pairs.tobytes())

    def abort(self, messages, batchId: int) -> None:
        pass


def read_latencies(path: Path, since: float, until: float) -> list[float]:
    """Latencies in ms, sorted, of the rows published in ``[since, until)``."""
    data = array("d")
    if path.exists():
        data.frombytes(path.read_bytes())
    return sorted((data[i + 1] - data[i]) * 1000 for i in range(0, len(data), 2)
                  if since <= data[i] < until)


# -- the in-memory source: row i available at start + i / rate --------------------
class PacedSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "pynsq_bench_paced"

    def schema(self):
        return SCHEMA

    def streamReader(self, schema):
        o = self.options
        return PacedReader(float(o["start"]), float(o["rate"]), int(o["partitions"]))


class PacedReader(DataSourceStreamReader):
    def __init__(self, start: float, rate: float, partitions: int) -> None:
        self.start, self.rate, self.parts = start, rate, partitions

    def initialOffset(self):
        return {"rows": 0}

    def latestOffset(self):
        return {"rows": max(0, int((time.time() - self.start) * self.rate))}

    def partitions(self, start, end):
        first, last = start["rows"], end["rows"]
        if first >= last:
            return []
        share = -(-(last - first) // self.parts)
        return [InputPartition((b, min(last, b + share))) for b in range(first, last, share)]

    def read(self, partition):
        first, last = partition.value
        n = last - first
        if n <= 0:
            return
        now = time.time_ns() // 1000
        yield pa.RecordBatch.from_arrays([
            pa.array([f"{first + i:016x}" for i in range(n)], pa.string()),
            pa.array([repr(self.start + (first + i) / self.rate).encode() for i in range(n)],
                     pa.binary()),
            pa.array([now] * n, pa.timestamp("us", tz="UTC")),
            pa.array([1] * n, pa.int32()),
            pa.array(["bench"] * n, pa.string()),
            pa.array(["spark"] * n, pa.string()),
        ], schema=ARROW_SCHEMA)


# -- the runs -----------------------------------------------------------------------
def percentiles(latencies: list[float]) -> dict:
    if not latencies:
        return {"rows": 0, "p50_ms": None, "p99_ms": None}
    at = lambda q: latencies[min(len(latencies) - 1, int(q * len(latencies)))]  # noqa: E731
    return {"rows": len(latencies), "p50_ms": round(at(0.50), 1), "p99_ms": round(at(0.99), 1),
            "max_ms": round(latencies[-1], 1)}


def measure(df, seconds: float, warm_up: float) -> tuple[list[float], list[dict]]:
    """Run ``df`` into the latency sink: the latencies (ms, sorted) of the rows
    published in the ``seconds`` after a warm-up (counted from the first batch with
    rows), and Spark's progress reports of the batches of those seconds."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "latencies"
        query = (df.writeStream.format("pynsq_bench_latency").option("path", str(path))
                 .option("checkpointLocation", str(Path(tmp) / "checkpoint"))
                 .trigger(processingTime="0 seconds").start())
        try:
            wait_for(lambda: any(p["numInputRows"] for p in query.recentProgress), 120)
            since = time.time() + warm_up
            until = since + seconds
            time.sleep(warm_up + seconds)
            # Every row published before ``until`` is in a batch that started after it.
            wait_for(lambda: any(_epoch(p["timestamp"]) > until for p in query.recentProgress),
                     60)
        finally:
            # With a 0 s trigger a batch is always running, and stopping it logs its
            # abort as errors with stack traces: nothing went wrong, so say nothing.
            context = df.sparkSession.sparkContext
            context.setLogLevel("OFF")
            try:
                query.stop()
            finally:
                context.setLogLevel("ERROR")
        progress = [p for p in query.recentProgress
                    if p["numInputRows"] and since <= _epoch(p["timestamp"]) < until]
        return read_latencies(path, since, until), progress


def per_batch(progress: list[dict]) -> dict:
    """Spark's phases per batch (means, ms) and rows per batch."""
    phases: dict = {}
    for p in progress:
        for phase, ms in p["durationMs"].items():
            phases[phase] = phases.get(phase, 0) + ms
    means = {k: round(v / max(1, len(progress))) for k, v in phases.items()}
    means["rows"] = round(sum(p["numInputRows"] for p in progress) / max(1, len(progress)))
    return means


def wait_for(condition, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("the stream made no progress")
        time.sleep(0.1)


def _epoch(timestamp: str) -> float:
    from datetime import datetime
    return datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()


class Publisher(threading.Thread):
    """Publishes ``rate`` messages/s to ``topic``, each body the time of its MPUB."""

    def __init__(self, address: str, topic: str, rate: float) -> None:
        super().__init__(daemon=True, name="latency-publisher")
        self.client = Client(address)
        self.topic, self.rate = topic, rate
        self.stopped = threading.Event()

    def run(self) -> None:
        started, sent = time.monotonic(), 0
        while not self.stopped.is_set():
            due = int((time.monotonic() - started) * self.rate) - sent
            if due > 0:
                body = repr(time.time()).encode()
                self.client.multi_publish(self.topic, [body] * due)
                sent += due
            self.stopped.wait(PUBLISH_EVERY_S)

    def stop(self) -> None:
        self.stopped.set()
        self.join()
        self.client.close()


def run(spark, seconds: float, warm_up: float, rate: float = 1000, partitions: int = 2,
        segments: int = 4) -> dict:
    """Both sources, taking turns ``segments`` times each (pynsq, memory, memory, pynsq,
    ...), each segment measured for ``seconds / segments`` after its warm-up."""
    spark.dataSource.register(LatencySink)
    spark.dataSource.register(PacedSource)
    segments = max(1, segments)
    share = seconds / segments
    found: dict[str, list[float]] = {"pynsq": [], "memory": []}
    progress: dict[str, list[dict]] = {"pynsq": [], "memory": []}
    proc, address = start_pynsqd("--msg-timeout", "60s")
    try:
        with Client(address) as client:
            client.admin("channel", "create", "latency", "spark")
        for turn in range(2 * segments):
            source = "pynsq" if turn % 4 in (0, 3) else "memory"
            if source == "pynsq":
                latencies, batches = _pynsq_segment(spark, address, share, warm_up, rate,
                                                    partitions)
            else:
                memory_df = (spark.readStream.format("pynsq_bench_paced")
                             .option("start", time.time()).option("rate", rate)
                             .option("partitions", partitions).load())
                latencies, batches = measure(memory_df, share, warm_up)
            found[source] += latencies
            progress[source] += batches
    finally:
        stop(proc)
    return {"rate": rate, "seconds": seconds, "segments": segments,
            "pynsq": percentiles(sorted(found["pynsq"])),
            "memory": percentiles(sorted(found["memory"])),
            "pynsq_per_batch_ms": per_batch(progress["pynsq"]),
            "memory_per_batch_ms": per_batch(progress["memory"])}


def _pynsq_segment(spark, address: str, seconds: float, warm_up: float, rate: float,
                   partitions: int) -> tuple[list[float], list[dict]]:
    # Published only while this segment's query runs: no backlog waits for the next one.
    publisher = Publisher(address, "latency", rate)
    publisher.start()
    try:
        df = (spark.readStream.format("pynsq").option("address", address)
              .option("topic", "latency").option("channel", "spark")
              .option("numPartitions", partitions).load())
        return measure(df, seconds, warm_up)
    finally:
        publisher.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=1000)
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--warm-up", type=float, default=5)
    parser.add_argument("--segments", type=int, default=4,
                        help="turns each source takes (pynsq, memory, memory, pynsq, ...)")
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    spark = (SparkSession.builder.master("local[2]").appName("pynsq-bench-latency")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    for _ in range(args.rounds):
        result = run(spark, args.seconds, args.warm_up, args.rate, segments=args.segments)
        result["load1"] = round(os.getloadavg()[0], 2)
        print(json.dumps(result), flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
