"""Spark write throughput: rows/s published by pub_to_topic and by the native sink.

    python benchmarks/writers.py [--rows 1000000]

N cached rows of 100-byte bodies are published to a topic of a ``pynsqd``
subprocess by the function ``pub_to_topic`` hands to ``foreachBatch`` (called
as Spark would, with the DataFrame and a batch id) and by the writer behind
``format("pynsq")`` (through ``df.write``; the stream sink is the same
writer), next to the same DataFrame written to Spark's ``noop`` sink in the
same session: the ceiling. With NSQ's binaries at hand (``nsq_bench.nsq_bin``), NSQ's
``bench_writer`` (MPUB of 200 × 100 B, one connection per core) then writes into the same
broker for ``--runfor``: the broker's own speed, which the writers are measured against.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from pyspark.sql import SparkSession, functions as F  # noqa: E402

from broker import Client  # noqa: E402
from spark_connector import pub_to_topic  # noqa: E402

try:
    from .common import free_port, start_pynsqd, stop
    from .nsq_bench import bench, nsq_bin
except ImportError:  # run as a script
    from common import free_port, start_pynsqd, stop
    from nsq_bench import bench, nsq_bin


def timed(fn) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def run(spark, rows: int, partitions: int, runfor: str = "5s") -> dict:
    """Rows/s of Spark's noop sink, ``pub_to_topic`` and the native sink, then (when NSQ's
    binaries are there) ``bench_writer``'s msgs/s for ``runfor`` into the same broker."""
    df = (spark.range(rows, numPartitions=partitions)
          .select(F.lpad(F.col("id").cast("string"), 100, "x").alias("body")).cache())
    df.count()
    tcp = free_port()
    proc, address = start_pynsqd("--tcp-address", f"127.0.0.1:{tcp}")
    client = Client(address)
    folder = nsq_bin()
    try:
        noop_s = timed(lambda: df.write.format("noop").mode("overwrite").save())
        fb_s = timed(lambda: pub_to_topic(address, "bench-fb")(df, 0))
        client.admin("topic", "delete", "bench-fb")
        sink_s = timed(lambda: df.write.format("pynsq").option("address", address)
                       .option("topic", "bench-sink").mode("append").save())
        depth = client.stats("bench-sink").topics[0].depth
        client.admin("topic", "delete", "bench-sink")
        tool = (bench(folder / "bench_writer", tcp, runfor, "bench-tool", proc.pid)[0]
                if folder is not None else None)
    finally:
        client.close()
        stop(proc)
        df.unpersist()
    rate = lambda s: round(rows / s)  # noqa: E731
    return {"rows": rows, "noop_rows_per_s": rate(noop_s),
            "pub_to_topic_rows_per_s": rate(fb_s),
            "native_sink_rows_per_s": rate(sink_s), "sink_depth": depth,
            "pub_to_topic_vs_noop": round(noop_s / fb_s, 3),
            "native_sink_vs_noop": round(noop_s / sink_s, 3),
            "bench_writer_msgs_per_s": round(tool) if tool else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--runfor", default="5s", help="how long bench_writer runs")
    args = parser.parse_args()
    spark = (SparkSession.builder.master("local[2]").appName("pynsq-bench-writers")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    print(json.dumps(run(spark, args.rows, args.partitions, args.runfor), indent=2))
    spark.stop()


if __name__ == "__main__":
    main()
