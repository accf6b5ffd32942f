"""The source and the sink used from a Spark Connect client.

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

from broker import Client

from .helpers import wait_for
from .spark_helpers import channel_stats, publish

DRIVER = Path(__file__).parent / "drivers" / "spark_connect_roundtrip.py"
CONNECT_MODULES = ("grpc_status", "google.rpc", "zstandard")


def _missing_connect_modules() -> list[str]:
    import importlib.util

    return [m for m in CONNECT_MODULES if importlib.util.find_spec(m.split(".")[0]) is None]


@pytest.mark.skipif(bool(_missing_connect_modules()),
                    reason="Spark Connect's client needs grpcio-status, "
                           "googleapis-common-protos and zstandard (the test extra)")
def test_source_and_both_writers_work_from_a_spark_connect_client(broker, client: Client,
                                                                 tmp_path):
    for topic, channel in (("connect-out", "check"), ("connect-out-fb", "check"),
                           ("connect-in", "connect"), ("connect-in", "connect-fb")):
        client.admin("channel", "create", topic, channel)
    sent = publish(client, "connect-in", 40)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(Path(__file__).parent.parent), os.environ.get("PYTHONPATH")]))}
    run = subprocess.run([sys.executable, str(DRIVER), broker.address, "connect-in",
                          "connect-out", str(tmp_path / "checkpoint")],
                         capture_output=True, timeout=600, env=env)
    assert run.returncode == 0, run.stderr.decode(errors="replace")[-4000:]
    assert json.loads(run.stdout.decode().strip().splitlines()[-1]) == {"connect": True}

    # every message read and FINed once Spark committed
    stats = channel_stats(client, "connect-in", "connect")
    assert (stats.depth, stats.in_flight_count, stats.finish_count) == (0, 0, len(sent))
    # the sink wrote each one once, and the batch writer its two rows
    expected = sorted([f"MSG-{i}" for i in range(len(sent))] + ["static-1", "static-2"])
    got = []
    with client.subscribe("connect-out", "check", rdy=100) as sub:
        def read_all() -> bool:
            msg = sub.get(timeout=1)
            if msg is not None:
                got.append(msg.body.decode())
                sub.fin(msg.id)
            return len(got) >= len(expected)

        wait_for(read_all, 60, interval=0, message="the sink's messages")
    assert sorted(got) == expected
    # pub_to_topic in foreachBatch wrote each one once too
    fb = channel_stats(client, "connect-out-fb", "check")
    assert fb.depth == len(sent)
    with client.subscribe("connect-out-fb", "check", rdy=100) as sub:
        bodies = [sub.get(timeout=10).body.decode() for _ in range(len(sent))]
    assert sorted(bodies) == sorted(f"msg-{i}" for i in range(len(sent)))
