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
                "latency p99", "broker RSS", "durable publish",
                "TLS: gRPC MPUB", "scaling: 1 channel", "scaling: 1000 consumers"]
    if nsq_bench.nsq_bin() is not None:
        expected += ["nsq bench_writer", "nsq bench_reader"]
    for figure in expected:
        assert any(f.startswith(figure) for f in figures), figure
    for r in rows:
        assert set(r) == {"figure", "value", "unit", "baseline", "ratio", "goal"}
        assert r["value"] > 0
        assert r["ratio"] is None or r["ratio"] > 0
        assert r["figure"] in result.stdout
