"""The source on a real multi-process cluster: separate executor JVMs and Python
workers (local-cluster), so nothing can rely on sharing the driver's process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from .spark_helpers import channel_stats, publish

DRIVER = Path(__file__).parent / "drivers" / "stream_to_file.py"


def test_local_cluster_reads_every_message_and_finishes_it(broker, client, tmp_path):
    published = publish(client, "events", 3000)
    out = tmp_path / "ids.txt"
    driver = subprocess.Popen(
        [sys.executable, str(DRIVER), "--master", "local-cluster[2,1,1024]",
         "--address", broker.address, "--topic", "events", "--channel", "spark",
         "--checkpoint", str(tmp_path / "ck"), "--out", str(out), "--num-partitions", "4",
         "--max-per-trigger", "1000", "--available-now"],
        start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        assert driver.wait(600) == 0, driver.stderr.read().decode()[-3000:]
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
    ids = out.read_text().split()
    assert len(ids) == len(published)
    assert set(ids) == published
    stats = channel_stats(client, "events")
    assert (stats.finish_count, stats.depth, stats.in_flight_count) == (3000, 0, 0)
