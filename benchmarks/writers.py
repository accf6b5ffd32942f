"""Spark write throughput: rows/s published by pub_to_topic and by the native sink.

    python benchmarks/writers.py [--rows 1000000] [--rounds 3]

N cached rows of 100-byte bodies are published to a topic of a ``pynsqd``
subprocess by the function ``pub_to_topic`` hands to ``foreachBatch`` (called
as Spark would, with the DataFrame and a batch id) and by the writer behind
``format("pynsq")`` (through ``df.write``; the stream sink is the same
writer), next to the same DataFrame written to Spark's ``noop`` sink in the
same session: the ceiling. With NSQ's binaries at hand (``nsq_bench.nsq_bin``), NSQ's
``bench_writer`` (MPUB of 200 × 100 B, one connection per core) then writes into the same
broker for ``--runfor``: the broker's own speed, which the writers are measured against.

Each writer is called once first, timed apart (``first_write_s``): that call starts the
Python workers it runs in (a fresh worker compiles PySpark from its zip and imports
PyArrow, gRPC and the connector, seconds of CPU), which a streaming query pays at its
first batch, not at every one. Then ``--rounds`` rounds, each writer and ``bench_writer``
once per round, alternating, so a load on the machine falls on all of them alike. Rates
are medians over the rounds; the ratios are each round's writer ÷ that round's
``bench_writer``, their median and their worst. Beside each rate, CPU per row of each
process (from ``/proc``): Spark's JVM, its Python workers, the broker, the driver, and
``bench_writer``'s own; steadier than rows/s on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from pyspark.sql import SparkSession, functions as F  # noqa: E402

from broker import Client  # noqa: E402
from spark_connector import pub_to_topic  # noqa: E402

try:
    from .common import cpu_seconds, free_port, start_pynsqd, stop
    from .nsq_bench import bench, nsq_bin, seconds
except ImportError:  # run as a script
    from common import cpu_seconds, free_port, start_pynsqd, stop
    from nsq_bench import bench, nsq_bin, seconds

WRITERS = ("noop", "pub_to_topic", "native_sink")


def descendants(root: int) -> list[int]:
    """The pids under ``root`` (its children, theirs, ...), from /proc."""
    parent: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                parent[int(name)] = int(open(f"/proc/{name}/stat").read().rsplit(")", 1)[1]
                                        .split()[1])
            except (OSError, ValueError, IndexError):
                continue
    found, frontier = [], [root]
    while frontier:
        children = [pid for pid, ppid in parent.items() if ppid in frontier]
        found += children
        frontier = children
    return found


class Processes:
    """CPU seconds of the processes a write runs in: Spark's JVM, the Python workers it
    started (each by its pid: one that ends mid-write counts what it used up to the last
    look, so it under-counts, never less than nothing), the broker and this driver."""

    def __init__(self, spark, broker_pid: int) -> None:
        self.jvm = int(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())
        self.broker = broker_pid

    def cpu(self) -> dict:
        workers: dict[int, float] = {}
        for pid in descendants(self.jvm):
            try:
                workers[pid] = cpu_seconds(pid)
            except OSError:
                continue
        return {"jvm": cpu_seconds(self.jvm), "python_workers": workers,
                "broker": cpu_seconds(self.broker), "driver": sum(os.times()[:2])}


def spent(before: dict, after: dict) -> dict[str, float]:
    """CPU seconds each kind of process spent between two ``Processes.cpu`` looks: the
    Python workers' summed over the pids seen at the second, each from its first look
    (0 for one started since)."""
    workers = sum(max(0.0, secs - before["python_workers"].get(pid, 0.0))
                  for pid, secs in after["python_workers"].items())
    return {k: workers if k == "python_workers" else after[k] - before[k] for k in before}


def measure(processes: Processes, rows: int, write) -> dict:
    """rows/s of ``write()`` and each process's CPU µs per row while it ran."""
    before = processes.cpu()
    started = time.perf_counter()
    write()
    took = time.perf_counter() - started
    used = spent(before, processes.cpu())
    return {"rows_per_s": round(rows / took),
            "cpu_us_per_row": {k: round(secs / rows * 1e6, 2) for k, secs in used.items()}}


def bench_writer(folder, tcp: int, runfor: str, pid: int) -> dict:
    """``bench_writer`` into the broker ``pid``: msgs/s, broker and tool CPU µs per msg."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    rate, broker_us = bench(folder / "bench_writer", tcp, runfor, "bench-tool", pid)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    tool_s = (after.ru_utime + after.ru_stime) - (children.ru_utime + children.ru_stime)
    return {"msgs_per_s": round(rate),
            "cpu_us_per_msg": {"broker": round(broker_us, 2),
                               "bench_writer": round(tool_s / (rate * seconds(runfor)) * 1e6, 2)
                               if rate else 0.0}}


def run(spark, rows: int, partitions: int, runfor: str = "5s", rounds: int = 3) -> dict:
    """Rows/s of Spark's noop sink, ``pub_to_topic`` and the native sink (medians of
    ``rounds``, after one first call of each), then (when NSQ's binaries are there)
    ``bench_writer``'s msgs/s for ``runfor`` into the same broker in each round."""
    df = (spark.range(rows, numPartitions=partitions)
          .select(F.lpad(F.col("id").cast("string"), 100, "x").alias("body")).cache())
    df.count()
    tcp = free_port()
    proc, address = start_pynsqd("--tcp-address", f"127.0.0.1:{tcp}")
    client = Client(address)
    folder = nsq_bin()
    processes = Processes(spark, proc.pid)
    batch = iter(range(1_000_000))

    def noop() -> None:
        df.write.format("noop").mode("overwrite").save()

    def foreach_batch() -> None:
        pub_to_topic(address, "bench-fb")(df, next(batch))
        client.admin("topic", "delete", "bench-fb")

    def sink() -> None:
        df.write.format("pynsq").option("address", address).option("topic", "bench-sink") \
            .mode("append").save()
        depths.append(client.stats("bench-sink").topics[0].depth)
        client.admin("topic", "delete", "bench-sink")

    writes = dict(zip(WRITERS, (noop, foreach_batch, sink)))
    depths: list[int] = []
    first, by_round = {}, []
    try:
        for name, write in writes.items():
            started = time.perf_counter()
            write()
            first[name] = round(time.perf_counter() - started, 2)
        for _ in range(rounds):
            measured = {name: measure(processes, rows, write) for name, write in writes.items()}
            if folder is not None:
                measured["bench_writer"] = bench_writer(folder, tcp, runfor, proc.pid)
                client.admin("topic", "delete", "bench-tool")
            by_round.append(measured)
    finally:
        client.close()
        stop(proc)
        df.unpersist()
    return summarise(rows, first, by_round, depths)


def summarise(rows: int, first: dict, by_round: list[dict], depths: list[int]) -> dict:
    median = lambda values: round(statistics.median(values))  # noqa: E731
    rate = {name: median(r[name]["rows_per_s"] for r in by_round) for name in WRITERS}
    cpu = {name: {k: round(statistics.median(r[name]["cpu_us_per_row"][k] for r in by_round), 2)
                  for k in by_round[0][name]["cpu_us_per_row"]} for name in WRITERS}
    result = {"rows": rows, "rounds": len(by_round), "first_write_s": first,
              "noop_rows_per_s": rate["noop"],
              "pub_to_topic_rows_per_s": rate["pub_to_topic"],
              "native_sink_rows_per_s": rate["native_sink"],
              "sink_depth": min(depths), "cpu_us_per_row": cpu,
              "pub_to_topic_vs_noop": round(rate["pub_to_topic"] / rate["noop"], 3),
              "native_sink_vs_noop": round(rate["native_sink"] / rate["noop"], 3),
              "native_sink_vs_pub_to_topic": _ratios(by_round, "native_sink", "pub_to_topic"),
              "bench_writer_msgs_per_s": None,
              "by_round": [{name: r[name]["rows_per_s" if name in WRITERS else "msgs_per_s"]
                            for name in r} for r in by_round]}
    if "bench_writer" in by_round[0]:
        result["bench_writer_msgs_per_s"] = median(r["bench_writer"]["msgs_per_s"]
                                                   for r in by_round)
        result["bench_writer_cpu_us_per_msg"] = {
            k: round(statistics.median(r["bench_writer"]["cpu_us_per_msg"][k] for r in by_round), 2)
            for k in by_round[0]["bench_writer"]["cpu_us_per_msg"]}
        for name in ("pub_to_topic", "native_sink"):
            result[f"{name}_vs_bench_writer"] = _ratios(by_round, name, "bench_writer")
    return result


def _ratios(by_round: list[dict], name: str, baseline: str) -> dict:
    """Each round's ``name`` ÷ that round's ``baseline``: their median and worst."""
    def figure(r: dict, key: str) -> float:
        return r[key]["rows_per_s" if key in WRITERS else "msgs_per_s"]
    each = [round(figure(r, name) / figure(r, baseline), 3) for r in by_round]
    return {"median": round(statistics.median(each), 3), "worst": min(each), "rounds": each}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--runfor", default="5s", help="how long bench_writer runs")
    args = parser.parse_args()
    spark = (SparkSession.builder.master("local[2]").appName("pynsq-bench-writers")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    print(json.dumps(run(spark, args.rows, args.partitions, args.runfor, args.rounds), indent=2))
    spark.stop()


if __name__ == "__main__":
    main()
