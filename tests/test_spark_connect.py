"""The source and the writers used from a Spark Connect client: the native sink, a
batch write, and ``pub_to_topic`` in ``foreachBatch`` handed every DataFrame shape
through a failed batch's replay (``drivers/writer_shapes.py``).

The client runs in its own process (the suite's classic Spark session lives in
this one); ``SparkSession.builder.remote("local[2]")`` starts a local Spark
Connect server for it, whose Python workers import this repository's code.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from broker import Client, EmbeddedBroker

from .drivers.writer_shapes import SHAPES, expected_bodies
from .helpers import one_at_a_time
from .spark_helpers import channel_stats, publish
from .test_spark_writers import drain

DRIVER = Path(__file__).parent / "drivers" / "spark_connect_roundtrip.py"
N = 20  # two batches of writer_shapes.PER_TRIGGER: batch 1 fails and is replayed
CONNECT_MODULES = ("grpc_status", "google.rpc", "zstandard")


def _missing_connect_modules() -> list[str]:
    import importlib.util

    return [m for m in CONNECT_MODULES if importlib.util.find_spec(m.split(".")[0]) is None]


@pytest.fixture(scope="module")
def connect_run(tmp_path_factory):
    """One Spark Connect client run (a server start is most of its cost) against one
    broker; the tests below each check one part of what it did."""
    if _missing_connect_modules():
        pytest.skip("Spark Connect's client needs grpcio-status, googleapis-common-protos "
                    "and zstandard (the test extra)")
    tmp_path = tmp_path_factory.mktemp("connect")
    with EmbeddedBroker() as broker, Client(broker.address, timeout=10) as client:
        for topic, channel in (("connect-out", "check"), ("connect-out-unnamed", "check"),
                               *((f"shape-{name}", "check") for name in SHAPES),
                               ("connect-in", "connect"), ("connect-in", "shapes")):
            client.admin("channel", "create", topic, channel)
        sent = publish(client, "connect-in", N)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            filter(None, [str(Path(__file__).parent.parent), os.environ.get("PYTHONPATH")]))}
        with one_at_a_time("spark-connect"):   # its local server's fixed port, 15002
            run = subprocess.run([sys.executable, str(DRIVER), broker.address, "connect-in",
                                  "connect-out", str(tmp_path / "checkpoint")],
                                 capture_output=True, timeout=900, env=env)
        assert run.returncode == 0, run.stderr.decode(errors="replace")[-4000:]
        yield client, sent, json.loads(run.stdout.decode().strip().splitlines()[-1])


# The fixture's one Connect run is charged to the first test that asks for it.
pytestmark = pytest.mark.timeout(900)


def test_source_and_both_writers_work_from_a_spark_connect_client(connect_run):
    client, sent, result = connect_run
    assert result["connect"] is True

    # every message read and FINed once Spark committed
    stats = channel_stats(client, "connect-in", "connect")
    assert (stats.depth, stats.in_flight_count, stats.finish_count) == (0, 0, len(sent))
    # the sink wrote each one once, and the batch writer its two rows
    expected = sorted([f"MSG-{i}" for i in range(len(sent))] + ["static-1", "static-2"])
    assert sorted(b.decode() for b in drain(client, "connect-out").elements()) == expected


def test_under_connect_pub_to_topic_replays_every_dataframe_shape_exactly_once(connect_run):
    """select, selectExpr, withColumn, filter, union, a join, a cache: batch 1 published
    each, failed, and was replayed from the checkpoint; each shape's topic holds every
    expected body once (published = distinct, no duplicate, none lost)."""
    client, sent, result = connect_run
    assert "injected failure after batch 1 published every shape" in result["shapes_error"]
    stats = channel_stats(client, "connect-in", "shapes")
    assert (stats.depth, stats.in_flight_count) == (0, 0)
    for name in SHAPES:
        got, want = drain(client, f"shape-{name}"), expected_bodies(name, len(sent))
        print(f"connect {name}: published {sum(got.values())}, distinct {len(got)}, "
              f"duplicates {sum(got.values()) - len(got)}, lost {len(set(want) - set(got))}")
        assert got == want, name


def test_under_connect_pub_to_topic_without_a_producer_fails_saying_to_name_one(connect_run):
    client, _, result = connect_run
    assert "pub_to_topic under Spark Connect needs producer=" in result["unnamed_error"]
    assert channel_stats(client, "connect-out-unnamed", "check").depth == 0
