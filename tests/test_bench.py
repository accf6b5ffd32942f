"""`make bench` keeps working: it prints and writes one table of ratios, every row
marked against its goal. (The tests run it on the smoke sizes and assert the table's
shape only; speed is never asserted in tests.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import nsq_bench

ROOT = Path(__file__).parent.parent


def _row_is_well_formed(r: dict) -> None:
    from benchmarks.run import goal_met

    assert set(r) == {"figure", "value", "unit", "baseline", "ratio", "goal", "met"}
    # bytes rewritten: 0 is the goal; CPU per delivery: a smoke run's can be under one
    # clock tick of /proc
    assert r["value"] > 0 or r["unit"] in ("B/B", "us/dlv")
    assert r["ratio"] is None or r["ratio"] > 0 or r["unit"] == "us/dlv"
    assert r["met"] == goal_met(r)


@pytest.mark.timeout(660)  # the run's own limit (600 s) first: a slow machine, not a hang
def test_benchmark_prints_and_writes_the_table_with_every_row_marked(tmp_path):
    """Every row but Spark's from `python -m benchmarks.run --smoke --no-spark` (the Spark
    rows: the next test, in the suite's Spark session; this one runs beside it)."""
    from benchmarks.run import summary, table_row

    out = tmp_path / "bench.json"
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable)
    run = subprocess.run([sys.executable, "-m", "benchmarks.run", "--smoke", "--no-spark",
                          "--json", str(out)], cwd=ROOT, capture_output=True, text=True,
                         timeout=600, env=env)
    returncode, printed, errors = run.returncode, run.stdout, run.stderr
    assert returncode == 0, errors[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert not any(r["figure"].startswith("Spark") for r in rows)   # --no-spark
    assert "# Spark" not in printed
    figures = [r["figure"] for r in rows]
    expected = ["gRPC MPUB", "gRPC consume", "TCP V2 MPUB", "TCP V2 consume",
                "latency p99", "broker RSS", "durable publish", "restart, ",
                "bytes rewritten per byte published, idle",
                "TLS: gRPC MPUB", "scaling: 1 channel", "scaling: 1000 consumers",
                "CPU/delivery, 50 consumers (÷ 10)",
                "CPU/delivery, 10 active + 50 idle consumers (÷ 10 alone)"]
    if nsq_bench.nsq_bin() is not None:
        expected += ["nsq bench_writer", "nsq bench_reader", "nsq bench_writer memory-only",
                     "nsq bench_reader memory-only", "CPU/msg bench_writer: pynsqd durable",
                     "CPU/msg bench_reader: pynsqd memory-only",
                     "nsq channel first: bench_writer pynsqd durable ÷ nsqd in memory",
                     "nsq channel first: bench_reader pynsqd durable ÷ nsqd spilling",
                     "nsq write+read together: bench_writer pynsqd durable ÷ nsqd in memory",
                     "nsq write+read together: bench_reader pynsqd memory-only ÷ nsqd in memory",
                     "consumers: 50 on one channel (÷ nsqd)", "CPU/delivery, 50 consumers (÷ nsqd)"]
        if (cores := len(os.sched_getaffinity(0))) > 1:
            together = f"workers x{cores}, write+read together:"
            expected += ["workers: bench_writer", "workers: bench_reader",
                         f"{together} bench_writer pynsqd durable",
                         f"{together} bench_reader pynsqd memory-only"]
    for figure in expected:
        assert any(f.startswith(figure) for f in figures), figure
    printed_rows = printed.splitlines()
    for r in rows:
        _row_is_well_formed(r)
        assert table_row(r) in printed_rows
    assert sum(r["met"] is not None for r in rows) >= 10   # the goals are marked
    assert f"{summary(rows)} (smoke run, " in printed


@pytest.mark.timeout(660)
def test_the_spark_rows_are_measured_and_marked(spark):
    """The Spark rows, from `spark_rows`, which `make bench` runs in a session of its own,
    here in the suite's session."""
    from benchmarks.run import SMOKE, spark_rows

    rows = spark_rows(SMOKE, spark)
    figures = [r["figure"] for r in rows]
    for figure in ["Spark pynsq -> noop", "Spark pynsq -> noop, one",
                   "Spark pynsq -> noop, batches of", "Spark latency p50", "Spark latency p99",
                   "Spark pub_to_topic", "Spark format(\"pynsq\") sink",
                   "Spark format(\"pynsq\") sink (÷ pub_to_topic)",
                   "Spark pub_to_topic first call", "Spark format(\"pynsq\") sink first call"]:
        assert any(f.startswith(figure) for f in figures), figure
    if nsq_bench.nsq_bin() is not None:
        for figure in ["Spark pub_to_topic (÷ bench_writer, same broker)",
                       "Spark format(\"pynsq\") sink (÷ bench_writer, same broker)",
                       "Spark pub_to_topic CPU/row, all processes (÷ bench_writer's CPU/msg)"]:
            assert figure in figures
    for r in rows:
        _row_is_well_formed(r)
    assert all(r["figure"].startswith("Spark") for r in rows)
    assert sum(r["met"] is not None for r in rows) >= 4


def test_nsq_rounds_report_each_figures_median_and_the_median_of_each_rounds_ratio():
    rounds = [{"nsqd": {"read_msgs_per_s": r, "read_cpu_us_per_msg": c},
               "by_event_loop": {"asyncio": {"read_ratio": q}}}
              for r, c, q in ((100, 3.0, 0.7), (300, 2.0, 1.1), (230, 9.5, 0.8))]
    assert nsq_bench.medians(rounds) == {
        "nsqd": {"read_msgs_per_s": 230, "read_cpu_us_per_msg": 3.0},
        "by_event_loop": {"asyncio": {"read_ratio": 0.8}}}


def test_cpu_per_message_is_judged_by_its_worst_round_not_its_median():
    """"At or under nsqd's CPU per message in every round": one round over nsqd's misses
    the goal, however good the medians."""
    from benchmarks.run import row

    def setup(write: float, read: float) -> dict:
        return {"write_cpu_us_per_msg": write, "read_cpu_us_per_msg": read}

    rounds = [{"cpu_ratios": nsq_bench.cpu_ratios({
        "pynsqd": setup(2.0, ours), "pynsqd_memory_only": setup(1.5, 3.0),
        "nsqd": setup(6.0, 6.0), "nsqd_memory": setup(3.0, 6.0)})}
        for ours in (5.0, 6.6, 5.4)]
    worst = nsq_bench.worst_cpu_ratios(rounds)
    assert worst["durable_vs_nsqd"] == {"write": 0.333, "read": 1.1}
    assert worst["durable_vs_nsqd_memory"] == {"write": 0.667, "read": 1.1}
    assert worst["memory_only_vs_nsqd_memory"] == {"write": 0.5, "read": 0.5}
    # the median round (5.4 ÷ 6.0) is under nsqd's; the row still misses
    r = row("CPU/msg bench_reader", 5.4, "us/msg", 6.0, "ratio <= 1.0 in every round",
            ratio=worst["durable_vs_nsqd"]["read"])
    assert (r["ratio"], r["met"]) == (1.1, False)
    assert row("CPU/msg", 5.4, "us/msg", 6.0, "ratio <= 1.0")["met"] is True


def test_production_shapes_are_judged_by_their_worst_round_for_rates_and_cpu_alike():
    """"Durable at or above nsqd in memory in every round": one round below misses the
    row, however good the median; so does one round over nsqd's CPU per message."""
    from benchmarks.run import production_rows

    def setup(rate: int, cpu: float) -> dict:
        return {"write_msgs_per_s": rate, "read_msgs_per_s": rate,
                "write_cpu_us_per_msg": cpu, "read_cpu_us_per_msg": cpu}

    def one_round(durable_rate: int, durable_cpu: float) -> dict:
        setups = {"nsqd": setup(100, 4.0), "nsqd_memory": setup(200, 2.0),
                  "pynsqd": setup(durable_rate, durable_cpu),
                  "pynsqd_memory_only": setup(300, 1.0)}
        return {"shapes": {"together": {
            **setups, "cpu_ratios": nsq_bench.cpu_ratios(setups),
            "ratios": {name: {kind: round(setups[ours][f"{kind}_msgs_per_s"]
                                          / setups[theirs][f"{kind}_msgs_per_s"], 3)
                              for kind in ("write", "read")}
                       for name, (ours, theirs, _) in nsq_bench.CPU_COMPARISONS.items()}}}}

    rounds = [one_round(250, 1.5), one_round(190, 1.8), one_round(260, 2.2)]
    worst = nsq_bench.worst_shape_ratios(rounds)["together"]
    assert worst["ratios"]["durable_vs_nsqd_memory"] == {"write": 0.95, "read": 0.95}
    assert worst["cpu_ratios"]["durable_vs_nsqd_memory"] == {"write": 1.1, "read": 1.1}
    result = {"rounds": 3, "shapes": nsq_bench.medians([r["shapes"] for r in rounds]),
              "shapes_worst": nsq_bench.worst_shape_ratios(rounds),
              "shapes_by_round": [{"together": r["shapes"]["together"]} for r in rounds]}
    rows = {r["figure"]: r for r in production_rows(result)}
    durable = rows["nsq write+read together: bench_writer pynsqd durable ÷ nsqd in memory"]
    assert durable["value"] == 250 and durable["baseline"] == 200   # medians
    assert (durable["ratio"], durable["met"]) == (0.95, False)      # the worst round's
    assert "rounds 1.25, 0.95, 1.30" in durable["goal"]
    spilling = rows["nsq write+read together: bench_reader pynsqd durable ÷ nsqd spilling"]
    assert (spilling["ratio"], spilling["met"]) == (1.9, True)


def test_many_consumers_against_nsqd_are_judged_by_their_worst_round(monkeypatch):
    """"At or beyond nsqd" at many consumers, in every round: one round behind nsqd's
    rate, or over its CPU per delivery, misses the row however good the others."""
    from benchmarks import run, scaling

    def figures(rate: int, cpu: float) -> dict:
        return {"deliveries": 1000, "deliveries_per_s": rate, "broker_cpu_us_per_delivery": cpu}

    pairs = [(figures(120, 20.0), figures(100, 25.0)), (figures(90, 30.0), figures(100, 24.0)),
             (figures(130, 18.0), figures(100, 20.0))]
    by_round = [{"pynsqd": ours, "nsqd": theirs} for ours, theirs in pairs]
    result = {"messages": 1000, "few": 10, "many": 1000, "idle": 50,
              "pynsqd": {"few": figures(500, 4.0), "few_with_idle": figures(500, 4.0),
                         "many": by_round[0]["pynsqd"]},
              "nsqd": {"few": figures(400, 4.0), "many": by_round[0]["nsqd"]},
              "by_round": by_round}
    monkeypatch.setattr(scaling, "consumers_vs_nsqd", lambda *args: result)
    monkeypatch.setattr(nsq_bench, "nsq_bin", lambda: Path("nsq"))
    rows = {r["figure"]: r for r in run.consumer_rows(run.SMOKE)}
    rate = rows["consumers: 1,000 on one channel (÷ nsqd)"]
    assert (rate["ratio"], rate["met"]) == (0.9, False)
    assert "rounds 1.20, 0.90, 1.30" in rate["goal"]
    cpu = rows["CPU/delivery, 1,000 consumers (÷ nsqd)"]
    assert (cpu["ratio"], cpu["met"]) == (1.25, False)
    assert "rounds 0.80, 1.25, 0.90" in cpu["goal"]


def test_each_row_is_marked_met_or_missed_against_the_goal_it_opens_with():
    from benchmarks.run import row, summary, table_row

    rows = [row("fast enough", 90, "msgs/s", 100, "ratio >= 0.8 (÷ x)"),
            row("too slow", 50, "msgs/s", 100, "ratio >= 0.8 (÷ x)"),
            row("p99", 7.5, "ms", None, "<= 5 ms"),
            row("memory", 68.5, "MB", None, "<= 200 MB (for 1M)"),
            row("reference", 10, "msgs/s", 100, "reference")]
    assert [r["met"] for r in rows] == [True, False, False, True, None]
    lines = [table_row(r) for r in rows]
    assert "0.900  met     ratio >= 0.8" in lines[0]
    assert "0.500  MISSED  ratio >= 0.8" in lines[1]
    assert "MISSED  <= 5 ms" in lines[2] and "met     <= 200 MB" in lines[3]
    assert lines[4].endswith("0.100          reference")
    assert summary(rows) == "2 of 4 goals met; missed: too slow, p99"


def test_rows_are_printed_as_each_is_measured(monkeypatch, tmp_path, capsys):
    """``make bench`` shows each row while the next is being measured."""
    from benchmarks import run

    seen_before_second: list[str] = []

    sizes_asked: list[dict] = []

    def collect(sizes, with_spark=True):
        sizes_asked.append((sizes, with_spark))
        run.stage("first stage")
        yield run.row("first", 1, "msgs/s", 1, "ratio >= 0.5")
        seen_before_second.append(capsys.readouterr().out)
        yield run.row("second", 1, "msgs/s", 4, "ratio >= 0.5")

    monkeypatch.setattr(run, "collect", collect)
    monkeypatch.setattr(sys, "argv", ["run", "--quick", "--json", str(tmp_path / "b.json")])
    run.main()
    assert "# first stage ..." in seen_before_second[0]
    assert "first" in seen_before_second[0] and "met" in seen_before_second[0]
    assert "1 of 2 goals met; missed: second (quick run" in capsys.readouterr().out
    assert sizes_asked == [(run.QUICK, True)]


def test_nsq_tool_durations_are_read_in_any_go_unit():
    """A sub-second run prints its duration in ms; its rate per second stays right."""
    line = ("[bench_reader] 2026/11/25 22:48:30 duration: 503.520774ms - 9.995mb/s - "
            "104811.432ops/s - 9.541us/op")
    [took] = nsq_bench.DURATION.findall(line)
    assert nsq_bench.seconds(took) == pytest.approx(0.503520774)
    assert nsq_bench.seconds("1m30s") == 90 and nsq_bench.halved("1s") == "0.5s"
    with pytest.raises(ValueError, match="'1 s' is not a Go duration"):
        nsq_bench.seconds("1 s")


def test_latency_figures_are_the_medians_of_rounds_that_each_count_every_message(client):
    """Each round times every message it publishes, from its PUB to its delivery, and
    FINs them all (none comes back in the next round); the figures are the medians of
    the rounds' own. The client's garbage collector is back on after."""
    import gc
    import statistics

    from benchmarks.grpc_throughput import latency_rounds

    from .grpckit import channel_stats

    result = latency_rounds(client.address, 40, 3)
    rounds = result["rounds"]
    assert len(rounds) == 3 and all(0 < r["p50_ms"] <= r["p99_ms"] for r in rounds)
    assert result["p50_ms"] == statistics.median(r["p50_ms"] for r in rounds)
    assert result["p99_ms"] == statistics.median(r["p99_ms"] for r in rounds)
    stats = channel_stats(client, "latency", "work")
    assert (stats.finish_count, stats.requeue_count, stats.depth) == (120, 0, 0)
    assert gc.isenabled()


def test_the_writers_rates_are_medians_and_each_ratio_the_median_of_its_rounds_ratios():
    """A writer's ratio to bench_writer is taken round by round (the same load on both),
    then the median of those and the worst beside it; never one round's rate over another's."""
    from benchmarks.writers import summarise

    def measured(noop: int, fb: int, sink: int, tool: int, broker_us: float) -> dict:
        cpu = {"jvm": 1.0, "python_workers": 1.0, "broker": broker_us, "driver": 0.0}
        return {"noop": {"rows_per_s": noop, "cpu_us_per_row": cpu},
                "pub_to_topic": {"rows_per_s": fb, "cpu_us_per_row": cpu},
                "native_sink": {"rows_per_s": sink, "cpu_us_per_row": cpu},
                "bench_writer": {"msgs_per_s": tool,
                                 "cpu_us_per_msg": {"broker": 1.0, "bench_writer": 0.3}}}

    rounds = [measured(1000, 100, 150, 400, 2.0), measured(900, 300, 240, 500, 1.0),
              measured(800, 200, 100, 1000, 1.5)]
    r = summarise(10, {"noop": 1.0, "pub_to_topic": 9.0, "native_sink": 12.0}, rounds, [10] * 3)
    assert (r["pub_to_topic_rows_per_s"], r["native_sink_rows_per_s"],
            r["bench_writer_msgs_per_s"]) == (200, 150, 500)
    # each round's ratio: 0.25, 0.6, 0.2; the median rate over the median rate would be 0.4
    assert r["pub_to_topic_vs_bench_writer"] == {"median": 0.25, "worst": 0.2,
                                                 "rounds": [0.25, 0.6, 0.2]}
    assert r["native_sink_vs_bench_writer"]["median"] == 0.375
    assert r["native_sink_vs_pub_to_topic"] == {"median": 0.8, "worst": 0.5,
                                                "rounds": [1.5, 0.8, 0.5]}
    assert r["cpu_us_per_row"]["native_sink"]["broker"] == 1.5
    assert r["first_write_s"]["native_sink"] == 12.0


def test_a_python_worker_that_ends_mid_write_makes_no_cpu_figure_negative():
    """The Spark writer rows' CPU per row: a Python worker that ended between the two
    looks took its CPU seconds out of the sum (a smoke run printed -45 µs a row); each
    worker now counts from its own first look, one gone counts nothing."""
    from benchmarks.writers import spent

    before = {"jvm": 1.0, "python_workers": {10: 5.0, 11: 2.0}, "broker": 1.0, "driver": 1.0}
    after = {"jvm": 2.0, "python_workers": {11: 2.5, 12: 0.5}, "broker": 1.5, "driver": 1.25}
    assert spent(before, after) == {"jvm": 1.0, "python_workers": 1.0, "broker": 0.5,
                                    "driver": 0.25}
