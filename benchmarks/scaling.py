"""How cost grows: channels per topic, topics, and consumers per channel.

    python benchmarks/scaling.py [--messages 20000]

Each shape runs against a fresh ``pynsqd`` subprocess (memory only) over NSQ's
TCP protocol: messages are published with MPUB (200 × 100 B), then every
consumer drains its share with RDY and a FIN per message. Reported per shape:
deliveries per second (a message copied to 10 channels is 10 deliveries) and
the broker's CPU time per delivery, read from ``/proc``. The first row of each
family is its baseline, so each ratio says what scaling that axis costs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import struct
import tempfile
import time
from pathlib import Path

try:
    from .common import cpu_seconds, free_port, start, start_pynsqd, stop, wait_listening
    from .tcp_throughput import read_frames
except ImportError:  # run as a script
    from common import cpu_seconds, free_port, start, start_pynsqd, stop, wait_listening
    from tcp_throughput import read_frames

BATCH, SIZE = 200, 100
BODY = b"x" * SIZE

# (family, label, topics, channels per topic, consumers per channel)
SHAPES = [
    ("channels", "1 channel", 1, 1, 1),
    ("channels", "10 channels", 1, 10, 1),
    ("channels", "100 channels", 1, 100, 1),
    ("topics", "1 topic", 1, 1, 1),
    ("topics", "100 topics", 100, 1, 1),
    ("consumers", "10 consumers", 1, 1, 10),
    ("consumers", "1000 consumers", 1, 1, 1000),
]


def mpub(topic: str, bodies: int) -> bytes:
    body = struct.pack(">i", bodies) + (struct.pack(">i", SIZE) + BODY) * bodies
    return b"MPUB %s\n" % topic.encode() + struct.pack(">i", len(body)) + body


async def subscribe(port: int, topic: str, channel: str) -> tuple:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"  V2SUB %s %s\n" % (topic.encode(), channel.encode()))
    await read_frames(reader, bytearray())  # OK
    return reader, writer


async def drain(reader, writer, rdy: int, counter: dict, target: int,
                done: asyncio.Event) -> None:
    """Consume with RDY ``rdy`` and FIN everything; set ``done`` at ``target`` deliveries."""
    writer.write(b"RDY %d\n" % rdy)
    buf = bytearray()
    while True:
        frames = await read_frames(reader, buf)
        fins = [b"FIN " + data[10:26] + b"\n" for kind, data in frames if kind == 2]
        counter["got"] += len(fins)
        writer.write(b"".join(fins))
        if counter["got"] >= target:
            done.set()


async def shape(port: int, pid: int, topics: int, channels: int, consumers: int,
                messages: int, idle: int = 0) -> dict:
    """Publish ``messages`` and drain them with ``consumers`` per channel; ``idle`` more
    consumers subscribed to the first channel never send RDY (they receive nothing)."""
    names = [f"scale{i}" for i in range(topics)]
    subs = [await subscribe(port, t, f"c{c}") for t in names for c in range(channels)
            for _ in range(consumers)]
    idlers = [await subscribe(port, names[0], "c0") for _ in range(idle)]
    pub_reader, pub = await asyncio.open_connection("127.0.0.1", port)
    pub.write(b"  V2")
    per_topic = max(1, messages // topics // BATCH) * BATCH  # whole MPUBs: what is published
    target = per_topic * topics * channels
    rdy = max(1, min(2500, 2500 // consumers))
    counter, done = {"got": 0}, asyncio.Event()
    cpu0, started = cpu_seconds(pid), time.perf_counter()
    drains = [asyncio.create_task(drain(r, w, rdy, counter, target, done)) for r, w in subs]
    buf = bytearray()
    for t in names:
        for _ in range(per_topic // BATCH):
            pub.write(mpub(t, BATCH))
            await read_frames(pub_reader, buf)
    await asyncio.wait_for(done.wait(), 600)
    elapsed, cpu = time.perf_counter() - started, cpu_seconds(pid) - cpu0
    for task in drains:
        task.cancel()
    await asyncio.gather(*drains, return_exceptions=True)
    for _, writer in subs + idlers:
        writer.close()
    pub.close()
    return {"deliveries": target, "deliveries_per_s": round(target / elapsed),
            "broker_cpu_us_per_delivery": round(cpu / target * 1e6, 2)}


def more_sockets() -> None:
    """Thousands of consumers need thousands of sockets here, and in the brokers this
    process starts (they inherit the limit)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 32768)), hard))


def measure(broker: str, messages: int, consumers: int, idle: int = 0,
            nsq_folder: Path | None = None) -> dict:
    """One channel drained by ``consumers`` (``idle`` more beside them) of a fresh
    ``broker`` ("pynsqd" memory only, or "nsqd" holding everything in memory)."""
    port = free_port()
    if broker == "nsqd":
        data = tempfile.TemporaryDirectory(prefix="nsqd-scaling-")
        proc = start([str(nsq_folder / "nsqd"), "--tcp-address", f"127.0.0.1:{port}",
                      "--http-address", f"127.0.0.1:{free_port()}", "--data-path", data.name,
                      "--log-level", "warn", "--mem-queue-size", str(messages * 2)], port)
    else:
        data = None
        # Every consumer here comes from one address, which pynsqd's default per-client
        # cap (half the connections the open-file limit allows) would refuse past some
        # thousands: the cap is let up to what this shape opens (nsqd has none).
        proc, _ = start_pynsqd("--tcp-address", f"127.0.0.1:{port}", "--http-address", "",
                               "--mem-queue-size", str(messages * 2),
                               "--max-connections-per-client", str(consumers + idle + 16))
    try:
        wait_listening(port)
        return asyncio.run(shape(port, proc.pid, 1, 1, consumers, messages, idle))
    finally:
        stop(proc)
        if data is not None:
            data.cleanup()


def consumers_vs_nsqd(messages: int = 20_000, nsq_folder: Path | None = None,
                      many: int = 1000, few: int = 10, idle: int = 10_000,
                      rounds: int = 1) -> dict:
    """Many consumers on one channel, in production's terms: pynsqd and nsqd each with
    ``few`` and ``many`` consumers (this harness, the same run), and pynsqd's ``few``
    with ``idle`` more consumers subscribed that never send RDY (what idle consumers
    cost the active ones). ``many`` against nsqd is measured ``rounds`` times, the two
    brokers' order alternating: ``by_round`` holds each round's pair, ``pynsqd``/``nsqd``
    the median round's (by pynsqd's rate ÷ nsqd's). nsqd's figures are left out when its
    binary is absent."""
    more_sockets()
    out = {"messages": messages, "few": few, "many": many, "idle": idle,
           "pynsqd": {"few": measure("pynsqd", messages, few),
                      "few_with_idle": measure("pynsqd", messages, few, idle)}}
    if nsq_folder is None:
        out["pynsqd"]["many"] = measure("pynsqd", messages, many)
        return out
    out["nsqd"] = {"few": measure("nsqd", messages, few, nsq_folder=nsq_folder)}
    by_round = []
    for i in range(rounds):
        pair = {}
        for broker in ("pynsqd", "nsqd") if i % 2 == 0 else ("nsqd", "pynsqd"):
            pair[broker] = measure(broker, messages, many, nsq_folder=nsq_folder)
        by_round.append(pair)
    rate = "deliveries_per_s"
    middle = sorted(by_round, key=lambda p: p["pynsqd"][rate] / p["nsqd"][rate])[rounds // 2]
    out["pynsqd"]["many"], out["nsqd"]["many"] = middle["pynsqd"], middle["nsqd"]
    out["by_round"] = by_round
    return out


def run(messages: int = 20_000) -> dict:
    more_sockets()
    results = []
    for family, label, topics, channels, consumers in SHAPES:
        port = free_port()
        proc, _ = start_pynsqd("--tcp-address", f"127.0.0.1:{port}", "--http-address", "",
                               "--mem-queue-size", str(messages * 2))
        try:
            wait_listening(port)
            r = asyncio.run(shape(port, proc.pid, topics, channels, consumers, messages))
        finally:
            stop(proc)
        results.append({"family": family, "shape": label, **r})
    for r in results:
        base = next(b for b in results if b["family"] == r["family"])
        r["rate_ratio"] = round(r["deliveries_per_s"] / base["deliveries_per_s"], 3)
        # CPU time comes in clock ticks (10 ms): a short run's baseline can show none.
        base_cpu = base["broker_cpu_us_per_delivery"]
        r["cpu_ratio"] = (round(r["broker_cpu_us_per_delivery"] / base_cpu, 3) if base_cpu
                          else None)
    return {"messages": messages, "shapes": results}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20_000,
                        help="messages published per shape (split across topics)")
    args = parser.parse_args()
    print(json.dumps(run(args.messages), indent=2))


if __name__ == "__main__":
    main()
