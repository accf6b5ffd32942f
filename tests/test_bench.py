"""`make bench --quick` keeps working: it prints and writes one table of ratios.
(It asserts the table's shape only; speed is never asserted in tests.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from benchmarks import nsq_bench

ROOT = Path(__file__).parent.parent


def test_quick_benchmark_prints_and_writes_the_table(tmp_path):
    out = tmp_path / "bench.json"
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable)
    result = subprocess.run([sys.executable, "-m", "benchmarks.run", "--quick", "--json",
                             str(out)], cwd=ROOT, capture_output=True, text=True, timeout=600,
                            env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    figures = [r["figure"] for r in rows]
    expected = ["gRPC MPUB", "gRPC consume", "TCP V2 MPUB", "TCP V2 consume",
                "Spark pynsq -> noop", "Spark pynsq -> noop, one", "Spark pub_to_topic",
                "Spark format(\"pynsq\") sink",
                "latency p99", "broker RSS", "durable publish", "restart, ",
                "bytes rewritten per byte published, idle",
                "TLS: gRPC MPUB", "scaling: 1 channel", "scaling: 1000 consumers"]
    if nsq_bench.nsq_bin() is not None:
        expected += ["nsq bench_writer", "nsq bench_reader"]
    for figure in expected:
        assert any(f.startswith(figure) for f in figures), figure
    for r in rows:
        assert set(r) == {"figure", "value", "unit", "baseline", "ratio", "goal"}
        assert r["value"] > 0 or r["unit"] == "B/B"   # bytes rewritten: 0 is the goal
        assert r["ratio"] is None or r["ratio"] > 0
        assert r["figure"] in result.stdout


def test_nsq_rounds_report_each_figures_median_and_the_median_of_each_rounds_ratio():
    rounds = [{"nsqd": {"read_msgs_per_s": r, "read_cpu_us_per_msg": c},
               "by_event_loop": {"asyncio": {"read_ratio": q}}}
              for r, c, q in ((100, 3.0, 0.7), (300, 2.0, 1.1), (230, 9.5, 0.8))]
    assert nsq_bench.medians(rounds) == {
        "nsqd": {"read_msgs_per_s": 230, "read_cpu_us_per_msg": 3.0},
        "by_event_loop": {"asyncio": {"read_ratio": 0.8}}}
