"""``make bench``: every benchmark, one table of ratios against same-run baselines.

    python -m benchmarks.run [--quick | --smoke] [--no-spark] [--json benchmarks/results/latest.json]

Each row: a figure, the baseline measured in the same run, their ratio, and the
goal, marked ``met`` or ``MISSED``. Rows print as they are measured (a line
naming each stage first); a summary line counts the goals met. Machines are
shared and noisy: compare ratios, not absolute figures. ``--quick`` runs reduced
sizes; ``--smoke`` the smallest that still run every row end to end, in seconds rather
than minutes (the test suite runs it to keep the table working; it never asserts a speed).
``--no-spark`` leaves out the Spark rows (a host without Java, or a caller that runs
``spark_rows`` in its own Spark session).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Iterator

from . import (durability, grpc_throughput, nsq_bench, restart_channels, scaling, tcp_throughput,
               tls_throughput, workers_bench)

FULL = {"grpc": 200_000, "tcp": 400_000, "spark": 1_000_000, "writers": 1_000_000,
        "spark_latency_s": 20, "spark_warm_up_s": 5,
        "durable": 200_000, "durable_rounds": 3,
        "queued": 1_000_000, "latency": 3000, "latency_rounds": 5, "nsq_runfor": "5s",
        "nsq_rounds": 3, "scaling": 50_000, "tls": 200_000, "consumers_many": 1000,
        "consumers_idle": 10_000, "consumers_rounds": 3, "writers_runfor": "5s",
        "writers_rounds": 3}
QUICK = {"grpc": 20_000, "tcp": 40_000, "spark": 50_000, "writers": 20_000,
         "spark_latency_s": 5, "spark_warm_up_s": 5, "spark_latency_segments": 2,
         "durable": 20_000, "durable_rounds": 1,
         "queued": 50_000, "latency": 500, "latency_rounds": 3, "nsq_runfor": "2s", "nsq_rounds": 1,
         "scaling": 5_000, "tls": 20_000, "consumers_many": 1000, "consumers_idle": 2000,
         "consumers_rounds": 1, "writers_runfor": "2s", "writers_rounds": 2}
# Every row end to end on tiny sizes: the figures mean nothing, the table's shape does.
SMOKE = {"grpc": 2_000, "tcp": 4_000, "spark": 2_000, "writers": 2_000,
         "spark_latency_s": 2, "spark_warm_up_s": 1,
         "durable": 2_000, "durable_rounds": 1,
         "queued": 2_000, "latency": 100, "latency_rounds": 1, "nsq_runfor": "1s", "nsq_rounds": 1,
         "scaling": 200, "tls": 2_000, "settle": 0.0, "consumers_many": 50,
         "consumers_idle": 50, "consumers_rounds": 2, "writers_runfor": "1s", "writers_rounds": 1,
         # One memory-source run for each Spark ratio (not one before and one after the
         # pynsq reads), no warm-up, "batches of" in two batches, and the latency's
         # sources one turn each.
         "spark_memory_after": False, "spark_warm_up": False, "spark_small_batches": 2,
         "spark_latency_segments": 1}


GOAL = re.compile(r"^(ratio )?(>=|<=) ([\d.]+)")


def row(name: str, value: float, unit: str, baseline: float | None, goal: str,
        ratio: float | None = None) -> dict:
    """A row; its ratio is ``value / baseline`` unless given (a worst round's, say)."""
    if ratio is None and baseline:
        # Three places, but a positive ratio never rounds to 0 (a smoke run's 70 ÷ 300,000).
        ratio = round(value / baseline, 3) or float(f"{value / baseline:.2g}")
    r = {"figure": name, "value": value, "unit": unit, "baseline": baseline,
         "ratio": ratio, "goal": goal}
    r["met"] = goal_met(r)
    return r


def goal_met(r: dict) -> bool | None:
    """Whether the row meets the goal its ``goal`` opens with (``ratio >= 0.8``,
    ``<= 5 ms``); None for a row without one (a reference, a note)."""
    m = GOAL.match(r["goal"])
    if not m:
        return None
    measured = r["ratio"] if m.group(1) else r["value"]
    if measured is None:
        return None
    bound = float(m.group(3))
    return measured >= bound if m.group(2) == ">=" else measured <= bound


def spark_rows(sizes: dict, spark=None) -> list[dict]:
    """The Spark rows, in ``spark`` if given (left running) or in a session of their own."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from . import spark_latency, spark_source, writers

    own = spark is None
    if own:
        spark = (SparkSession.builder.master("local[2]").appName("pynsq-bench")
                 .config("spark.ui.enabled", "false")
                 .config("spark.ui.showConsoleProgress", "false").getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
    try:
        r = spark_source.run(spark, sizes["spark"], 2,
                             memory_after=sizes.get("spark_memory_after", True),
                             warm_up=sizes.get("spark_warm_up", True),
                             small_batches=sizes.get("spark_small_batches", 10))
        rate = spark_source.rate_micro_batch(spark, sizes["spark"])
        lat = spark_latency.run(spark, sizes["spark_latency_s"], sizes["spark_warm_up_s"],
                                segments=sizes.get("spark_latency_segments", 4))
        w = writers.run(spark, sizes["writers"], 2, sizes["writers_runfor"],
                        sizes["writers_rounds"])
    finally:
        if own:
            spark.stop()
    return [
        row("Spark pynsq -> noop (availableNow)", r["pynsq_rows_per_s"], "rows/s",
            r["memory_rows_per_s"], "ratio >= 0.8 (÷ in-memory Python source)"),
        row("Spark pynsq -> noop, one micro-batch", r["one_batch_rows_per_s"], "rows/s",
            r["memory_rows_per_s"], "what the default read limit's batches cost"),
        row(f"Spark pynsq -> noop, batches of {r['small_batch']:,}",
            r["batches_of_100k_rows_per_s"], "rows/s", r["memory_batches_of_100k_rows_per_s"],
            "ratio >= 0.8 (÷ in-memory Python source, same batches)"),
        *[row(f"Spark latency {q} publish->sink @1k/s, 0 s trigger", lat["pynsq"][f"{q}_ms"],
              "ms", lat["memory"][f"{q}_ms"],
              "ratio <= 1.2 (÷ in-memory Python source, same trigger)")
          for q in ("p50", "p99")],
        row("Spark rate-micro-batch -> noop (reference)", rate, "rows/s",
            r["memory_rows_per_s"], "reference"),
        row("Spark pub_to_topic (foreachBatch) (÷ noop)", w["pub_to_topic_rows_per_s"], "rows/s",
            w["noop_rows_per_s"], "÷ Spark's noop sink, same cached DataFrame"),
        row("Spark format(\"pynsq\") sink (÷ noop)", w["native_sink_rows_per_s"], "rows/s",
            w["noop_rows_per_s"], "÷ Spark's noop sink, same cached DataFrame"),
        *([row(f"Spark {name} (÷ bench_writer, same broker)", w[f"{key}_rows_per_s"], "rows/s",
               w["bench_writer_msgs_per_s"], "ratio >= 0.5 (÷ NSQ's bench_writer MPUB 200x100B "
               f"into the same pynsqd; median of {w['rounds']} rounds' ratios, worst "
               f"{w[f'{key}_vs_bench_writer']['worst']})",
               ratio=w[f"{key}_vs_bench_writer"]["median"])
           for name, key in (("pub_to_topic", "pub_to_topic"),
                             ("format(\"pynsq\") sink", "native_sink"))]
          if w["bench_writer_msgs_per_s"] else []),
        row("Spark format(\"pynsq\") sink (÷ pub_to_topic)", w["native_sink_rows_per_s"],
            "rows/s", w["pub_to_topic_rows_per_s"],
            "ratio >= 1.0 (the native sink no slower than pub_to_topic; median of "
            f"{w['rounds']} rounds' ratios, worst {w['native_sink_vs_pub_to_topic']['worst']})",
            ratio=w["native_sink_vs_pub_to_topic"]["median"]),
        *[row(f"Spark {name} first call (starts its Python workers)", w["first_write_s"][key],
              "s", None, "reference: a query's first batch; rows above: the calls after it")
          for name, key in (("pub_to_topic", "pub_to_topic"),
                            ("format(\"pynsq\") sink", "native_sink"))],
        *([row(f"Spark {name} CPU/row, all processes (÷ bench_writer's CPU/msg)",
               round(sum(w["cpu_us_per_row"][key].values()), 2), "us/row",
               round(sum(w["bench_writer_cpu_us_per_msg"].values()), 2),
               "reference: JVM + Python workers + broker + driver, from /proc")
           for name, key in (("pub_to_topic", "pub_to_topic"),
                             ("format(\"pynsq\") sink", "native_sink"))]
          if w["bench_writer_msgs_per_s"] else []),
    ]


def nsq_rows(sizes: dict) -> list[dict]:
    """NSQ's own bench_writer/bench_reader, pynsqd ÷ nsqd in the same run, under each
    event loop pynsqd can use; CPU per message (broker's, from /proc) beside each."""
    r = nsq_bench.run(sizes["nsq_runfor"], rounds=sizes["nsq_rounds"])
    if "skipped" in r:
        print(f"NSQ's bench tools: skipped ({r['skipped']})")
        return []
    nsqd, rows = r["nsqd"], []
    of = f" (medians of {r['rounds']})" if r["rounds"] > 1 else ""
    for i, (loop, p) in enumerate(r["by_event_loop"].items()):
        for kind, tool, shape, goal in (("write", "bench_writer", "MPUB 200x100B", ">= 1.0"),
                                        ("read", "bench_reader", "RDY 2500", ">= 1.0")):
            name = f"{tool} {shape}" if i == 0 else f"{tool} on {loop}"
            rows.append(row(f"nsq {name} (÷ nsqd)", p[f"{kind}_msgs_per_s"], "msgs/s",
                            nsqd[f"{kind}_msgs_per_s"],
                            f"ratio {goal} (÷ nsqd 1.3.0); CPU us/msg "
                            f"{p[f'{kind}_cpu_us_per_msg']:.2f} vs nsqd "
                            f"{nsqd[f'{kind}_cpu_us_per_msg']:.2f}{of}"))
    # Against nsqd holding everything in memory: pynsqd durable, and memory-only.
    fast = r["nsqd_memory"]
    for setup, ours, ratios in (("durable (÷ nsqd --mem-queue-size 1M)", r["pynsqd"],
                                 r["durable_vs_nsqd_memory"]),
                                ("memory-only (÷ nsqd in memory)", r["pynsqd_memory_only"],
                                 r["pynsqd_memory_only"])):
        for kind, tool in (("write", "bench_writer"), ("read", "bench_reader")):
            rows.append(row(f"nsq {tool} {setup}", ours[f"{kind}_msgs_per_s"], "msgs/s",
                            fast[f"{kind}_msgs_per_s"],
                            f"ratio >= 1.0 (median of each round's ratio "
                            f"{ratios[f'{kind}_ratio']:.3f}); CPU us/msg "
                            f"{ours[f'{kind}_cpu_us_per_msg']:.2f} vs nsqd "
                            f"{fast[f'{kind}_cpu_us_per_msg']:.2f}{of}"))
    # CPU per message at or under nsqd's in every round: the worst round's ratio.
    for name, (ours, theirs, label) in nsq_bench.CPU_COMPARISONS.items():
        for kind, tool in (("write", "bench_writer"), ("read", "bench_reader")):
            rows.append(row(f"CPU/msg {tool}: {label}", r[ours][f"{kind}_cpu_us_per_msg"],
                            "us/msg", r[theirs][f"{kind}_cpu_us_per_msg"],
                            f"ratio <= 1.0 in every round (the worst of {r['rounds']}; "
                            "figures: medians)", ratio=r["cpu_ratios_worst"][name][kind]))
    return rows + production_rows(r)


# How a row names each production shape of ``nsq_bench.SHAPES``.
SHAPE_LABELS = {"channel_first": "channel first", "together": "write+read together"}


def production_rows(r: dict) -> list[dict]:
    """NSQ's tools in production's shapes (channel created first; writer and reader at
    once), each pynsqd setup ÷ the nsqd setup it compares with: msgs/s judged by the
    worst round (durable ≥ nsqd in memory "in every round"), CPU per message beside."""
    rows = []
    for shape, label in SHAPE_LABELS.items():
        if shape not in r.get("shapes", {}):
            continue
        med, worst = r["shapes"][shape], r["shapes_worst"][shape]
        per_round = [each[shape] for each in r["shapes_by_round"]]
        for name, (ours, theirs, setup) in nsq_bench.CPU_COMPARISONS.items():
            for kind, tool in (("write", "bench_writer"), ("read", "bench_reader")):
                rounds = ", ".join(f"{x['ratios'][name][kind]:.2f}" for x in per_round)
                cpus = ", ".join(f"{x['cpu_ratios'][name][kind]:.2f}" for x in per_round)
                rows.append(row(
                    f"nsq {label}: {tool} {setup}", med[ours][f"{kind}_msgs_per_s"], "msgs/s",
                    med[theirs][f"{kind}_msgs_per_s"],
                    f"ratio >= 1.0 in every round (worst of {r['rounds']}; rounds {rounds}); "
                    f"CPU us/msg {med[ours][f'{kind}_cpu_us_per_msg']:.2f} vs "
                    f"{med[theirs][f'{kind}_cpu_us_per_msg']:.2f} (ratio by round {cpus})",
                    ratio=worst["ratios"][name][kind]))
    return rows


def scaling_rows(sizes: dict) -> list[dict]:
    """Deliveries/s per shape, each ÷ the first shape of its family; CPU per delivery."""
    r = scaling.run(sizes["scaling"])
    rows = []
    for s in r["shapes"]:
        base = next(b for b in r["shapes"] if b["family"] == s["family"])
        rows.append(row(f"scaling: {s['shape']}", s["deliveries_per_s"], "dlv/s",
                        base["deliveries_per_s"],
                        f"broker CPU {s['broker_cpu_us_per_delivery']:.1f} us/delivery"))
    return rows


def consumer_rows(sizes: dict) -> list[dict]:
    """Many consumers on one channel against nsqd (the scaling harness, the same run):
    deliveries/s and broker CPU per delivery at many consumers, how that cost grows from a
    few, and what idle consumers (subscribed, no RDY) cost the active ones."""
    r = scaling.consumers_vs_nsqd(sizes["scaling"], nsq_bench.nsq_bin(),
                                  sizes["consumers_many"], 10, sizes["consumers_idle"],
                                  sizes["consumers_rounds"])
    ours, many, few, idle = r["pynsqd"], r["many"], r["few"], r["idle"]
    cpu, rate = "broker_cpu_us_per_delivery", "deliveries_per_s"
    rows = []
    if "nsqd" in r:
        theirs, by_round = r["nsqd"], r["by_round"]
        # Each round's pynsqd ÷ nsqd, the brokers' order alternating; judged by the worst.
        rates = [p["pynsqd"][rate] / p["nsqd"][rate] for p in by_round]
        # (CPU time comes in 10 ms ticks: a tiny run's nsqd can show none.)
        cpus = [p["pynsqd"][cpu] / p["nsqd"][cpu] for p in by_round if p["nsqd"][cpu]]
        listed = ", ".join
        rows += [
            row(f"consumers: {many:,} on one channel (÷ nsqd)", ours["many"][rate],
                "dlv/s", theirs["many"][rate],
                f"ratio >= 1.0 in every round (worst of {len(by_round)}; rounds "
                f"{listed(f'{x:.2f}' for x in rates)}; figures: the median round); at {few}: "
                f"{ours['few'][rate]:,} vs {theirs['few'][rate]:,}",
                ratio=round(min(rates), 3)),
            row(f"CPU/delivery, {many:,} consumers (÷ nsqd)", ours["many"][cpu], "us/dlv",
                theirs["many"][cpu],
                f"ratio <= 1.0 in every round (worst of {len(by_round)}; rounds "
                f"{listed(f'{x:.2f}' for x in cpus)}); at {few}: "
                f"{ours['few'][cpu]:.2f} vs {theirs['few'][cpu]:.2f} us",
                ratio=round(max(cpus), 3) if len(cpus) == len(by_round) else None),
        ]
    rows += [
        row(f"CPU/delivery, {many:,} consumers (÷ {few})", ours["many"][cpu], "us/dlv",
            ours["few"][cpu], "ratio <= 2.0 (pynsqd; broker CPU from /proc)"),
        row(f"CPU/delivery, {few} active + {idle:,} idle consumers (÷ {few} alone)",
            ours["few_with_idle"][cpu], "us/dlv", ours["few"][cpu],
            "ratio <= 1.1 (idle: subscribed, never RDY; "
            f"{ours['few_with_idle']['deliveries_per_s']:,} vs "
            f"{ours['few']['deliveries_per_s']:,} dlv/s)"),
    ]
    return rows


def tls_rows(sizes: dict) -> list[dict]:
    """Throughput with TLS on ÷ plain text, both brokers in the same run."""
    r = tls_throughput.run(sizes["tls"])
    return [row(f"TLS: {name} (÷ plain text)", r["tls"][f"{key}_msgs_per_s"], "msgs/s",
                r["plain"][f"{key}_msgs_per_s"], "ratio >= 0.5")
            for name, key in (("gRPC MPUB 100x100B", "grpc_publish"),
                              ("gRPC consume RDY 1000 + FIN", "grpc_consume"),
                              ("TCP V2 MPUB 200x100B", "tcp_publish"),
                              ("TCP V2 consume RDY 2500 + FIN", "tcp_consume"))]


def collect(sizes: dict, with_spark: bool = True) -> Iterator[dict]:
    """Every row, each yielded as soon as it is measured (``stage`` lines between)."""
    stage("gRPC throughput and latency, TCP V2 throughput")
    g = grpc_throughput.run(sizes["grpc"], sizes["latency"], sizes["latency_rounds"])
    rounds = (f"median of {sizes['latency_rounds']} rounds of {sizes['latency']:,} msgs"
              if sizes["latency_rounds"] > 1 else f"{sizes['latency']:,} msgs")
    t = tcp_throughput.run(sizes["tcp"])
    yield from [
        row("gRPC MPUB 100x100B", g["pynsqd"]["publish_msgs_per_s"], "msgs/s",
            g["raw_grpc"]["publish_msgs_per_s"], "ratio >= 0.5 (÷ raw grpc.aio)"),
        row("gRPC consume RDY 1000 + FIN", g["pynsqd"]["consume_msgs_per_s"], "msgs/s",
            g["raw_grpc"]["consume_msgs_per_s"], "ratio >= 0.5 (÷ raw grpc.aio)"),
        row("TCP V2 MPUB 200x100B", t["pynsqd"]["publish_msgs_per_s"], "msgs/s",
            t["raw_asyncio"]["publish_msgs_per_s"], "÷ raw asyncio socket; nsqd ~390k"),
        row("TCP V2 consume RDY 2500 + FIN", t["pynsqd"]["consume_msgs_per_s"], "msgs/s",
            t["raw_asyncio"]["consume_msgs_per_s"], "÷ raw asyncio socket; nsqd ~340k"),
        row("latency p50 publish->deliver @1k/s", g["latency"]["p50_ms"], "ms", None, rounds),
        row("latency p99 publish->deliver @1k/s", g["latency"]["p99_ms"], "ms", None,
            f"<= 5 ms ({rounds})"),
    ]
    if with_spark:
        stage("Spark source and writers")
        yield from spark_rows(sizes)
    stage("durability: memory held, restart, durable ÷ memory-only")
    d = durability.run(sizes["durable"], sizes["queued"], sizes["durable_rounds"],
                       sizes.get("settle", 5.0))
    yield from [
        row(f"broker RSS, {sizes['queued']:,} x 100B queued (durable)", d["rss_mb_with_queued"],
            "MB", None, "<= 200 MB (for 1M)"),
        *[row(f"broker RSS, {sizes['queued']:,} x 100B in a {shape}", rss, "MB", None,
              "<= 200 MB (for 1M)") for shape, rss in d["rss_mb_by_shape"].items()],
        row(f"restart, {sizes['queued']:,} pending x 3 channels", d["restart"]["seconds"], "s",
            None, ""),
        row("peak RSS of that restart", d["restart"]["peak_rss_mb"], "MB", None,
            "<= 200 MB (for 1M)"),
        row(f"restart, {sizes['queued']:,} pending after 1,000 channel create/delete",
            d["restart_after_1000_channel_cycles"]["seconds"], "s",
            d["restart"]["seconds"],
            f"ratio <= 1 (÷ 3 channels: linear in the log; median of "
            f"{len(d['restart']['rounds'])} starts each)"),
        *[row(f"bytes rewritten per byte published, {shape} consumer", ratio, "B/B", None,
              "<= 0.5" if shape == "slow" else "0 (an idle backlog is never copied)")
          for shape, ratio in d["rewritten_per_published"].items()],
        *[row(f"durable {kind} (÷ memory-only)", d["durable"][f"{kind}_msgs_per_s"], "msgs/s",
              d["memory"][f"{kind}_msgs_per_s"],
              f"ratio >= {goal}; CPU us/msg {d['durable'][f'{kind}_cpu_us_per_msg']:.2f} vs "
              f"{d['memory'][f'{kind}_cpu_us_per_msg']:.2f} (medians of {d['rounds']})")
          for kind, goal in (("publish", "0.9"), ("consume", "0.85"))],
        row(f"durable consume, all {sizes['durable']:,} within --mem-queue-size (÷ memory-only)",
            d["durable_in_memory"]["consume_msgs_per_s"], "msgs/s",
            d["memory"]["consume_msgs_per_s"],
            f"ratio >= 0.85; CPU us/msg {d['durable_in_memory']['consume_cpu_us_per_msg']:.2f} "
            f"vs {d['memory']['consume_cpu_us_per_msg']:.2f} (medians of {d['rounds']}; the row "
            f"above reads {max(sizes['durable'] - 10_000, 0):,} back from the log: "
            f"--mem-queue-size 10,000)"),
    ]
    stage("restart CPU per pending copy: 2,000 channels x 100 ÷ 3 channels x a long backlog")
    yield from (row(*r) for r in restart_channels.rows(sizes["queued"]))
    stage("NSQ's bench_writer and bench_reader against nsqd and pynsqd")
    yield from nsq_rows(sizes)
    stage("one pynsqd against pynsqd --workers N")
    yield from workers_bench.rows(row, sizes["nsq_runfor"], sizes["nsq_rounds"])
    stage("scaling with channels, topics and consumers")
    yield from scaling_rows(sizes)
    stage("many consumers and idle consumers, pynsqd against nsqd")
    yield from consumer_rows(sizes)
    stage("TLS ÷ plain text")
    yield from tls_rows(sizes)


def stage(what: str) -> None:
    print(f"# {what} ...", flush=True)


COLUMNS = f"{'figure':<56} {'value':>12} {'unit':<7} {'baseline':>12} {'ratio':>7}  {'':<6}  goal"


# Units whose figures are small: printed to three places.
FINE_UNITS = ("ms", "MB", "us/msg", "us/dlv")


def table_row(r: dict) -> str:
    """One row as the table prints it; the mark says whether its goal was met."""
    baseline = "" if r["baseline"] is None else (
        f"{r['baseline']:,.3f}" if r["unit"] in FINE_UNITS[2:] else f"{r['baseline']:,.0f}")
    ratio = "" if r["ratio"] is None else f"{r['ratio']:.3f}"
    value = f"{r['value']:,.3f}" if r["unit"] in FINE_UNITS else f"{r['value']:,.0f}"
    mark = {True: "met", False: "MISSED", None: ""}[r.get("met")]
    return (f"{r['figure']:<56} {value:>12} {r['unit']:<7} {baseline:>12} {ratio:>7}  "
            f"{mark:<6}  {r['goal']}").rstrip()


def table(rows: list[dict]) -> str:
    return "\n".join([COLUMNS, "-" * len(COLUMNS), *map(table_row, rows)])


def summary(rows: list[dict]) -> str:
    goals = [r for r in rows if r.get("met") is not None]
    missed = [r["figure"] for r in goals if not r["met"]]
    line = f"{len(goals) - len(missed)} of {len(goals)} goals met"
    return line + (f"; missed: {', '.join(missed)}" if missed else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sizes = parser.add_mutually_exclusive_group()
    sizes.add_argument("--quick", action="store_true", help="reduced sizes")
    sizes.add_argument("--smoke", action="store_true",
                       help="the smallest sizes that run every row (figures mean nothing)")
    parser.add_argument("--no-spark", action="store_true",
                        help="leave out the Spark rows (they start a Spark session)")
    parser.add_argument("--json", default="benchmarks/results/latest.json",
                        help="where to write the table as JSON")
    args = parser.parse_args()
    started = time.perf_counter()
    print(COLUMNS, flush=True)
    rows = []
    kind = "smoke" if args.smoke else "quick" if args.quick else "full"
    for r in collect({"smoke": SMOKE, "quick": QUICK, "full": FULL}[kind],
                     with_spark=not args.no_spark):
        rows.append(r)
        print(table_row(r), flush=True)
    print(f"\n{summary(rows)} ({kind} run, {time.perf_counter() - started:.0f}s)")
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"quick": args.quick, "smoke": args.smoke, "rows": rows},
                              indent=2))


if __name__ == "__main__":
    main()
