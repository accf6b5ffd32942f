"""What durability costs, and what 1M queued messages take.

    python benchmarks/durability.py [--messages 200000] [--queued 1000000] [--rounds 3]

1. Publish N × 100-byte messages (MPUB, batches of 100) to a `pynsqd`, then
   consume and FIN them all, memory-only and durable (default --sync-every) in
   turn for --rounds rounds, each broker a fresh subprocess: the median msgs/s,
   their ratio, and the broker's median CPU per message in each phase. The durable
   broker keeps --mem-queue-size (10,000) of the backlog in memory and reads the rest
   back from its log, where the memory-only one holds all N: a third broker, durable
   with --mem-queue-size N, holds all N too (``durable_in_memory``), so what the log's
   records cost is seen apart from what reading back costs.
2. Queue M messages on a durable broker: its RSS, and the data path's size
   before and after a consumer has FINed them all.
3. RSS with M messages queued in each backlog shape (a topic with no channel, a
   paused topic, a paused channel, a deep channel), each in a fresh broker.
4. Restart with M messages pending in each of 3 channels: time until the
   broker answers, and its peak RSS (VmHWM) during recovery; then with M
   pending in one channel after 1,000 channels were made and deleted.
5. Write amplification: bytes of pending messages copied to the end of the log
   (``rewritten_bytes`` in HTTP /stats) per byte published, for an idle channel
   and for a slow consumer that defers one message in thirty for ten minutes.

`--queued 0` runs part 1 only.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from broker import Client

try:
    from .common import cpu_seconds, free_port, start_pynsqd, stop
except ImportError:  # run as a script
    from common import cpu_seconds, free_port, start_pynsqd, stop

BODY = b"x" * 100


def publish(address: str, n: int, batch: int = 100, channels: tuple[str, ...] = ("work",)
            ) -> float:
    with Client(address) as client:
        for channel in channels:
            client.admin("channel", "create", "bench", channel)
        started = time.perf_counter()
        for _ in range(0, n, batch):
            client.multi_publish("bench", [BODY] * batch)
        return time.perf_counter() - started


def consume(address: str, n: int) -> float:
    with Client(address) as client, client.subscribe("bench", "work", rdy=2500) as sub:
        started = time.perf_counter()
        pending = []
        for _ in range(n):
            pending.append(sub.get(timeout=30).id)
            if len(pending) >= 500:
                sub.fin(*pending)
                pending = []
        sub.fin(*pending)
        elapsed = time.perf_counter() - started
    return elapsed


def rss_mb(pid: int, field: str = "VmRSS") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    return 0.0


SHAPES = {
    "topic with no channel": [],
    "paused topic": [("channel", "create", "work"), ("topic", "pause", "")],
    "paused channel": [("channel", "create", "work"), ("channel", "pause", "work")],
    "deep channel": [("channel", "create", "work")],
}


def shape_rss(tmp: str, queued: int) -> dict:
    """RSS (MB) of a durable broker with ``queued`` messages in each backlog shape."""
    out = {}
    for i, (shape, setup) in enumerate(SHAPES.items()):
        proc, address = start_pynsqd("--data-path", f"{tmp}/shape-{i}")
        try:
            with Client(address) as client:
                for kind, action, channel in setup:
                    client.admin(kind, action, "bench", channel)
            publish(address, queued, batch=500, channels=())
            out[shape] = round(rss_mb(proc.pid), 1)
        finally:
            stop(proc)
    return out


def restart(tmp: str, pending: int, channels: int = 3, cycles: int = 0,
            rounds: int = 3) -> dict:
    """Seconds to restart with ``pending`` messages in each of ``channels`` channels
    (after ``cycles`` channels were made and deleted), the median of ``rounds`` restarts
    of the same data path (a start changes nothing there; one start alone moves by a tenth
    between runs), and the peak RSS (MB) of the restarted broker, the highest of them."""
    data = f"{tmp}/restart-{channels}-{cycles}"
    proc, address = start_pynsqd("--data-path", data)
    try:
        publish(address, pending, batch=500,
                channels=tuple(f"c{i}" for i in range(channels)))
        with Client(address) as client:
            for _ in range(cycles):
                client.admin("channel", "create", "bench", "gone")
                client.admin("channel", "delete", "bench", "gone")
    finally:
        stop(proc)
    starts, peaks = [], []
    for _ in range(max(rounds, 1)):
        started = time.perf_counter()
        proc, address = start_pynsqd("--data-path", data, timeout=600)
        try:
            starts.append(time.perf_counter() - started)
            with Client(address) as client:
                depth = sum(c.depth for c in client.stats("bench").topics[0].channels)
            peaks.append(rss_mb(proc.pid, "VmHWM"))
        finally:
            stop(proc)
    return {"seconds": round(statistics.median(starts), 2), "peak_rss_mb": round(max(peaks), 1),
            "pending": depth, "rounds": [round(s, 2) for s in starts]}


def http_stats(port: int, topic: str) -> dict:
    url = f"http://127.0.0.1:{port}/stats?format=json&topic={topic}"
    with urllib.request.urlopen(url, timeout=10) as reply:
        return json.loads(reply.read())["topics"][0]


def write_amplification(tmp: str, messages: int, settle: float = 5.0) -> dict:
    """Bytes copied to the log's end per byte published (bodies), on two topics of one
    broker with 64 KiB files: ``idle`` (its channel never read) and ``slow`` (read at
    about 2,000 msgs/s, one message in thirty deferred for ten minutes, the rest FINed),
    after the consumer is done and ``settle`` seconds more."""
    port = free_port()
    proc, address = start_pynsqd("--data-path", f"{tmp}/amplification", "--http-address",
                                 f"127.0.0.1:{port}", "--max-bytes-per-file", str(64 << 10),
                                 "--mem-queue-size", "100")
    body = b"x" * 1000
    try:
        with Client(address) as client:
            for topic in ("idle", "slow"):
                client.admin("channel", "create", topic, "work")

            def slow_consumer() -> None:
                with Client(address) as reader, reader.subscribe("slow", "work",
                                                                 rdy=10) as sub:
                    for i in range(messages):
                        msg = sub.get(timeout=60)
                        if i % 30 == 0:
                            sub.req(msg.id, delay_ms=600_000)
                        else:
                            sub.fin(msg.id)
                        if i % 20 == 0:
                            time.sleep(0.01)

            reader = threading.Thread(target=slow_consumer)
            reader.start()
            for _ in range(0, messages, 100):
                client.multi_publish("idle", [body] * 100)
                client.multi_publish("slow", [body] * 100)
            reader.join()
        time.sleep(settle)
        published = messages * len(body)
        return {topic: round(http_stats(port, topic)["rewritten_bytes"] / published, 4)
                for topic in ("idle", "slow")}
    finally:
        stop(proc)


def du_mb(path: Path) -> float:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / 1e6


def throughput(n: int, *args: str) -> dict:
    """msgs/s of publishing then consuming ``n`` messages, and the broker's CPU (user +
    system, all its threads) per message in each phase: steadier than msgs/s on a busy
    machine."""
    proc, address = start_pynsqd(*args)
    try:
        cpu_0 = cpu_seconds(proc.pid)
        pub_s = publish(address, n)
        cpu_1 = cpu_seconds(proc.pid)
        sub_s = consume(address, n)
        cpu_2 = cpu_seconds(proc.pid)
    finally:
        stop(proc)
    return {"publish_msgs_per_s": round(n / pub_s), "consume_msgs_per_s": round(n / sub_s),
            "publish_cpu_us_per_msg": round((cpu_1 - cpu_0) / n * 1e6, 2),
            "consume_cpu_us_per_msg": round((cpu_2 - cpu_1) / n * 1e6, 2)}


def medians(results: list[dict]) -> dict:
    """Each figure's median over rounds."""
    return {key: statistics.median(r[key] for r in results) for key in results[0]}


def run(messages: int, queued: int, rounds: int = 3, settle: float = 5.0) -> dict:
    """Every part; ``queued`` 0 skips parts 2-4 (RSS, data path size, restart). Part 1
    runs ``rounds`` times, memory-only and durable in turn: medians. ``settle``: the
    seconds given to the broker's background ticks before a size is read."""
    with tempfile.TemporaryDirectory() as tmp:
        runs: dict[str, list[dict]] = {"memory": [], "durable": [], "durable_in_memory": []}
        for i in range(rounds):
            runs["memory"].append(throughput(messages))
            runs["durable"].append(throughput(messages, "--data-path", f"{tmp}/throughput-{i}"))
            runs["durable_in_memory"].append(throughput(
                messages, "--data-path", f"{tmp}/in-memory-{i}", "--mem-queue-size",
                str(messages)))
        memory, durable = medians(runs["memory"]), medians(runs["durable"])
        held = medians(runs["durable_in_memory"])
        speed = {
            "messages": messages, "rounds": rounds, "memory": memory, "durable": durable,
            "durable_in_memory": held,
            "durable_vs_memory_publish": round(durable["publish_msgs_per_s"]
                                               / memory["publish_msgs_per_s"], 3),
            "durable_vs_memory_consume": round(durable["consume_msgs_per_s"]
                                               / memory["consume_msgs_per_s"], 3),
            "durable_in_memory_vs_memory_consume": round(
                held["consume_msgs_per_s"] / memory["consume_msgs_per_s"], 3)}
        if not queued:
            return speed
        data = Path(tmp) / "queued"
        proc, address = start_pynsqd("--data-path", str(data))
        try:
            publish(address, queued, batch=500)
            rss = rss_mb(proc.pid)
            before = du_mb(data)
            consume(address, queued)
            time.sleep(min(3.0, settle))  # let the next sync/reclaim tick run
            after = du_mb(data)
        finally:
            stop(proc)
        shapes = shape_rss(tmp, queued)
        restarted = restart(tmp, queued)
        churned = restart(tmp, queued, channels=1, cycles=1000)
        amplification = write_amplification(tmp, max(queued // 50, 2000), settle)
    return {
        **speed, "queued": queued, "rss_mb_with_queued": round(rss, 1),
        "data_path_mb_before_consuming": round(before, 1),
        "data_path_mb_after_consuming": round(after, 2),
        "rss_mb_by_shape": shapes, "restart": restarted,
        "restart_after_1000_channel_cycles": churned,
        "rewritten_per_published": amplification}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--queued", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(json.dumps(run(args.messages, args.queued, args.rounds), indent=2))


if __name__ == "__main__":
    main()
