"""Restart time per pending copy: many channels with a short backlog each against a few
channels with a long one (a start must be linear in the log, not in channels x pending).

Each shape is built with the core and a real data path (no network: the figure is the
start's own), stopped cleanly, and started again; the figure is the CPU time of that
start (``time.process_time``: wall clock is unreliable on a shared machine) divided by
the pending copies it restored.
"""

from __future__ import annotations

import gc
import tempfile
import time

from broker import Broker, Options
from broker.clock import ManualClock
from broker.storage import DiskStore


def _start(path: str) -> tuple[Broker, float]:
    opts = Options(data_path=path)
    broker = Broker(opts, clock=ManualClock())
    broker.storage = DiskStore(broker, opts)
    cpu = time.process_time()
    broker.storage.recover()
    return broker, time.process_time() - cpu


def restart_cpu(channels: int, pending: int, tmp: str) -> dict:
    """CPU seconds of a start with ``pending`` messages (100 B) in each of ``channels``
    channels of one topic, and per pending copy (us)."""
    path = f"{tmp}/restart-{channels}x{pending}"
    broker, _ = _start(path)
    for i in range(channels):
        broker.create_channel("bench", f"c{i}")
    body = b"x" * 100
    for first in range(0, pending, 500):
        broker.multi_publish("bench", [body] * min(500, pending - first))
    broker.storage.close()
    del broker
    gc.collect()  # what building the shape left is not the start's to collect
    broker, cpu = _start(path)
    copies = sum(c.depth for c in broker.topics["bench"].channels.values())
    broker.storage.close()
    assert copies == channels * pending, (copies, channels, pending)
    return {"cpu_s": round(cpu, 2), "copies": copies,
            "cpu_us_per_copy": round(cpu / copies * 1e6, 3)}


def rows(big: int = 1_000_000, many: int = 2_000, short: int = 100) -> list[tuple]:
    """``run.row`` arguments: (name, value, unit, baseline, goal)."""
    with tempfile.TemporaryDirectory(prefix="pynsq-restart-") as tmp:
        wide = restart_cpu(many, short, tmp)
        few = restart_cpu(3, big, tmp)
    return [
        (f"restart CPU per pending copy, 3 channels x {big:,} pending",
         few["cpu_us_per_copy"], "us", None, f"{few['cpu_s']} s CPU"),
        (f"restart CPU per pending copy, {many:,} channels x {short} pending",
         wide["cpu_us_per_copy"], "us", few["cpu_us_per_copy"],
         f"ratio <= 1 (linear in the log); {wide['cpu_s']} s CPU"),
    ]


if __name__ == "__main__":
    import sys
    for r in rows(*(int(a) for a in sys.argv[1:])):
        print(r)
