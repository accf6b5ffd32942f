"""The crash loop: a real `pynsqd --data-path` killed (`kill -9`) or stopped (SIGTERM)
and restarted, again and again, under a mixed workload; then every acknowledged
message is accounted for.

    python -m benchmarks.crashloop [--duration 180] [--data-path DIR]     # make crashloop

Producers publish numbered bodies with PUB, MPUB and DPUB (delays up to 1 s);
consumers on two durable channels FIN most messages, REQ some (half with a delay),
and leave some to time out (msg_timeout 1 s); an admin thread pauses and unpauses a
channel and makes, empties and deletes a scratch channel. Every 1 to 4 s the broker is
killed with SIGKILL or SIGTERM (at random) and started again on the same data path.
After ``--duration`` the last broker drains both channels.

The oracle: a message is acknowledged once its publish returned ids. It reports
restarts (and how many were kills), restarts that failed (the broker did not answer
within 60 s), and per channel: acknowledged messages never FINed there (lost: must
be 0), bodies stored under two ids (duplicates: must be 0), and messages delivered
again after their FIN (allowed after a kill: the FINs of the killed broker's last
pass). Publishes that failed with the broker going down are not acknowledged: kept
or not, they count as neither. It prints one JSON object and exits 1 if anything was
lost, duplicated or failed to restart.
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import free_port, wait_listening  # noqa: E402
from broker import Client  # noqa: E402
from broker.client import ClientError  # noqa: E402

TOPIC = "crash"
CHANNELS = ("a", "b")


class Broker:
    """``pynsqd`` on a fixed port and data path, restarted at will."""

    def __init__(self, data_path: str) -> None:
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.cmd = [str(Path(sys.executable).parent / "pynsqd"), "--grpc-address",
                    self.address, "--tcp-address", "127.0.0.1:0", "--http-address",
                    "127.0.0.1:0", "--data-path", data_path, "--mem-queue-size", "50",
                    "--max-bytes-per-file", str(256 << 10), "--log-level", "error"]
        self.proc: subprocess.Popen | None = None

    def start(self) -> bool:
        self.proc = subprocess.Popen(self.cmd)
        try:
            wait_listening(self.port, 60)
            return True
        except RuntimeError:
            return False

    def stop(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class Oracle:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.acked: dict[str, bytes] = {}            # id -> body
        self.finned = {c: set() for c in CHANNELS}   # ids FINed per channel
        self.again = {c: 0 for c in CHANNELS}        # delivered again after their FIN
        self.seen_bodies = {c: {} for c in CHANNELS}  # body -> id, per channel
        self.duplicates = {c: 0 for c in CHANNELS}

    def delivered(self, channel: str, msg_id: str, body: bytes) -> None:
        with self.lock:
            if msg_id in self.finned[channel]:
                self.again[channel] += 1
            first = self.seen_bodies[channel].setdefault(body, msg_id)
            if first != msg_id:
                self.duplicates[channel] += 1


def produce(address: str, oracle: Oracle, stop: threading.Event, kind: str, seq) -> None:
    rng = random.Random(kind)
    client = Client(address, timeout=5)
    while not stop.is_set():
        bodies = [f"{kind}-{next(seq)}".encode() for _ in range(10 if kind == "mpub" else 1)]
        try:
            if kind == "mpub":
                ids = client.multi_publish(TOPIC, bodies)
            elif kind == "dpub":
                ids = [client.publish(TOPIC, bodies[0], defer_ms=rng.randint(1, 1000))]
            else:
                ids = [client.publish(TOPIC, bodies[0])]
        except ClientError:
            time.sleep(0.1)   # down: not acknowledged, kept or not
            continue
        with oracle.lock:
            oracle.acked.update(zip(ids, bodies))
        time.sleep(0.002)
    client.close()


def consume(address: str, oracle: Oracle, stop: threading.Event, channel: str,
            draining: threading.Event) -> None:
    rng = random.Random(channel)
    while not stop.is_set():
        try:
            with Client(address, timeout=5) as client, \
                    client.subscribe(TOPIC, channel, rdy=50, msg_timeout_ms=1000) as sub:
                while not stop.is_set():
                    msg = sub.get(timeout=0.5)
                    if msg is None:
                        continue
                    oracle.delivered(channel, msg.id, msg.body)
                    roll = rng.random()
                    if not draining.is_set() and msg.attempts < 3 and roll < 0.05:
                        continue                      # left to time out
                    if not draining.is_set() and msg.attempts < 3 and roll < 0.15:
                        sub.req(msg.id, delay_ms=rng.choice([0, 0, 300, 1000]))
                        continue
                    sub.fin(msg.id)
                    with oracle.lock:
                        oracle.finned[channel].add(msg.id)
        except ClientError:
            time.sleep(0.1)


def admin(address: str, stop: threading.Event) -> None:
    rng = random.Random("admin")
    client = Client(address, timeout=5)
    while not stop.is_set():
        action = rng.choice(["pause", "unpause", "unpause", "scratch"])
        try:
            if action == "scratch":
                client.admin("channel", "create", TOPIC, "scratch")
                client.admin("channel", "empty", TOPIC, "scratch")
                client.admin("channel", "delete", TOPIC, "scratch")
            else:
                client.admin("channel", action, TOPIC, "b")
        except ClientError:
            pass
        time.sleep(rng.uniform(0.2, 1.0))
    client.close()


def pending(address: str) -> int:
    with Client(address, timeout=5) as client:
        topic = client.stats(TOPIC).topics[0]
        return topic.depth + sum(c.depth + c.in_flight_count + c.deferred_count
                                 for c in topic.channels if c.name in CHANNELS)


def run(duration: float, data_path: str, seed: int = 1) -> dict:
    rng = random.Random(seed)
    broker = Broker(data_path)
    if not broker.start():
        raise RuntimeError("pynsqd did not start")
    with Client(broker.address) as client:
        for channel in CHANNELS:
            client.admin("channel", "create", TOPIC, channel)
    oracle, stop_work, draining = Oracle(), threading.Event(), threading.Event()
    stop_consumers = threading.Event()
    counter = iter(range(1 << 62))
    threads = [threading.Thread(target=produce, args=(broker.address, oracle, stop_work, k,
                                                      counter), daemon=True)
               for k in ("pub", "mpub", "dpub")]
    threads.append(threading.Thread(target=admin, args=(broker.address, stop_work),
                                    daemon=True))
    consumers = [threading.Thread(target=consume, args=(broker.address, oracle,
                                                        stop_consumers, c, draining),
                                  daemon=True) for c in CHANNELS]
    for t in threads + consumers:
        t.start()
    restarts = kills = failed = 0
    deadline = time.monotonic() + duration
    while time.monotonic() < deadline:
        time.sleep(rng.uniform(1, 4))
        sig = rng.choice([signal.SIGKILL, signal.SIGTERM])
        broker.stop(sig)
        restarts += 1
        kills += sig == signal.SIGKILL
        if not broker.start():
            failed += 1
            broker.stop(signal.SIGKILL)
            if not broker.start():
                raise RuntimeError("pynsqd does not start again")
    stop_work.set()
    for t in threads:
        t.join(30)
    with Client(broker.address, timeout=10) as client:
        client.admin("channel", "unpause", TOPIC, "b")   # the admin thread may have paused it
    draining.set()
    drained_by = time.monotonic() + 120
    while time.monotonic() < drained_by and pending(broker.address):
        time.sleep(0.5)
    stop_consumers.set()
    for t in consumers:
        t.join(30)
    left = pending(broker.address)
    broker.stop(signal.SIGTERM)
    acked = set(oracle.acked)
    report = {
        "seconds": duration, "restarts": restarts, "kills": kills,
        "sigterms": restarts - kills, "failed_restarts": failed,
        "acknowledged": len(acked), "left_pending": left,
        "channels": {c: {"lost": len(acked - oracle.finned[c]),
                         "duplicates": oracle.duplicates[c],
                         "delivered_again_after_fin": oracle.again[c]}
                     for c in CHANNELS}}
    report["ok"] = not failed and all(
        v["lost"] == 0 and v["duplicates"] == 0 for v in report["channels"].values())
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=180)
    parser.add_argument("--data-path")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        report = run(args.duration, args.data_path or tmp, args.seed)
    print(json.dumps(report, indent=2))
    sys.exit(0 if report["ok"] else 1)


if __name__ == "__main__":
    main()
