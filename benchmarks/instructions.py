"""Instructions per message, counted by callgrind: where the broker's work goes, whatever
the machine's load.

    python benchmarks/instructions.py [--messages 20000] [--cases grpc,grpc-memory,...]
                                      [--keep DIR] [--event-loop uvloop]

Each case runs a broker inside a process under ``valgrind --tool=callgrind``, with
counting off while it is set up; its clients run in a subprocess callgrind does not
follow. So a count is the broker's own user-space instructions, of the measured part only:

- ``grpc``, ``tcp`` (durable: ``--data-path``) and ``grpc-memory``, ``tcp-memory``
  (memory-only): a backlog of ``--messages`` messages (MPUB 100 × 100 B, published
  through the core, the channel there first) is consumed by one consumer (RDY 1000, the
  ids of each read FINed together, then CLS); counted from its first RDY to its CLOSE_WAIT;
- ``pub`` (durable) and ``pub-memory``: ``--messages`` PUBs of 100 B through the core to
  a topic with one channel, each written as it is made (as a PUB over a wire is
  acknowledged);
- ``fanout-10``, ``fanout-1000`` and ``fanout-idle`` (memory-only): ``benchmarks/scaling.py``'s
  shape of many consumers on one channel: 10 or 1,000 consumers over TCP, each with RDY
  2,500 ÷ consumers and a FIN per message, drain ``--messages`` published meanwhile
  (MPUB 200 × 100 B); ``fanout-idle`` is the 10 beside 2,000 more subscribed that never
  send RDY. Counted from the first RDY to the last delivery, per delivery. The consumers
  ask for heartbeats every 60 s, NSQ's most: a heartbeat costs by the second, and the
  broker runs slowly under callgrind.

The process's garbage collector is set as pynsqd sets it (``broker.daemon``): with
Python's defaults, young collections of the messages read back from disk would count
towards a durable consume (about 1,300 instructions a message).

The broker runs on asyncio's event loop, or on uvloop with ``--event-loop uvloop`` (as
``pynsqd --event-loop``). Counting is switched on and off with ``callgrind_control``. ``--keep DIR`` keeps each
case's ``callgrind.out.CASE`` for ``callgrind_annotate``. Needs valgrind.
``--profile CASE`` runs one case without callgrind, and prints where the broker's
thread spent its CPU time in the measured part, by Python function (cProfile).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import os
import pstats
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from broker import Broker
    from broker.embedded import EmbeddedBroker

BATCH, SIZE, RDY = 100, 100, 1000
BODY = b"x" * SIZE
CASES = ("grpc", "grpc-memory", "tcp", "tcp-memory", "pub", "pub-memory", "fanout-10",
         "fanout-1000", "fanout-idle")
# (active consumers, idle consumers) of each fan-out case.
FANOUT = {"fanout-10": (10, 0), "fanout-1000": (1000, 0), "fanout-idle": (10, 2000)}
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def count(case: str, messages: int, keep: Path | None, event_loop: str = "asyncio") -> int:
    """The instructions ``case`` counts (a callgrind run of this file's ``--case``)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / f"callgrind.out.{case}"
        subprocess.run(["valgrind", "--tool=callgrind", "--instr-atstart=no",
                        f"--callgrind-out-file={out}", sys.executable, __file__,
                        "--case", case, "--messages", str(messages),
                        "--event-loop", event_loop],
                       check=True, cwd=ROOT, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        text = out.read_text(errors="replace")
        if keep is not None:
            keep.mkdir(parents=True, exist_ok=True)
            shutil.copy(out, keep / out.name)
    found = re.search(r"^totals: (\d+)", text, re.M)
    if found is None:
        raise RuntimeError(f"{case}: callgrind wrote no total")
    return int(found.group(1))


def run_case(case: str, messages: int, profile: bool = False,
             event_loop: str = "asyncio") -> None:
    """One case, in the process callgrind watches (or, with ``profile``, cProfile the
    broker's thread)."""
    from broker.daemon import freeze_start_up_objects, tune_garbage_collector
    from broker.embedded import EmbeddedBroker

    protocol, _, store = case.partition("-")
    tune_garbage_collector()  # as pynsqd does
    freeze_start_up_objects()
    with tempfile.TemporaryDirectory() as data:
        options = {} if store == "memory" or case in FANOUT else {"data_path": data}
        if case in FANOUT:
            from benchmarks.scaling import more_sockets
            more_sockets()
        with EmbeddedBroker(event_loop=event_loop, **options) as embedded:
            broker = embedded.broker
            profiler = cProfile.Profile(time.thread_time_ns, 1e-9)

            def counting(on: bool) -> None:
                if profile:  # (cProfile follows the thread that enables it)
                    embedded.call(profiler.enable if on else profiler.disable)
                else:  # callgrind answers once it has switched
                    subprocess.run(["callgrind_control", "-i", "on" if on else "off",
                                    str(os.getpid())], check=True, stdout=subprocess.DEVNULL)

            embedded.call(lambda: broker.create_channel("bench", "work"))
            if case in FANOUT:
                consume(case, embedded, messages, counting)
            elif protocol == "pub":
                counting(True)
                for first in range(0, messages, BATCH):  # (a call may take 30 s at most)
                    embedded.call(publish, broker, min(BATCH, messages - first))
                counting(False)
            else:
                for _ in range(messages // BATCH):
                    embedded.call(lambda: broker.multi_publish("bench", [BODY] * BATCH))
                consume(protocol, embedded, messages, counting)
    if profile:
        pstats.Stats(profiler).sort_stats("tottime").print_stats(40)


def publish(broker: "Broker", n: int) -> None:
    for _ in range(n):
        broker.publish("bench", BODY)


def consume(protocol: str, embedded: "EmbeddedBroker", messages: int,
            counting: Callable[[bool], None]) -> None:
    """A consumer in a subprocess drains the backlog, counted from its first RDY to the
    answer to its CLS."""
    address = embedded.address if protocol == "grpc" else embedded.tcp_address
    client = subprocess.Popen(
        [sys.executable, __file__, "--client", protocol, address, "--messages",
         str(messages)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert client.stdout.readline().strip() == "subscribed"
    counting(True)
    client.stdin.write("go\n")
    client.stdin.flush()
    assert client.stdout.readline().strip() == "done"
    counting(False)
    client.wait()


async def grpc_client(address: str, n: int) -> None:
    import grpc

    from broker.api import broker_pb2 as pb
    from broker.api import broker_pb2_grpc as pb_grpc

    async with grpc.aio.insecure_channel(address) as channel:
        call = pb_grpc.BrokerStub(channel).Subscribe()
        await call.write(pb.ClientFrame(sub=pb.Sub(topic="bench", channel="work")))
        await call.read()
        await ready()
        await call.write(pb.ClientFrame(rdy=pb.Rdy(count=RDY)))
        got = 0
        while got < n:
            frame = await call.read()
            ids = [m.id for m in frame.messages.messages]
            got += len(ids)
            if ids:
                await call.write(pb.ClientFrame(fin=pb.Fin(ids=ids)))
        await call.write(pb.ClientFrame(cls=pb.Cls()))
        while not (await call.read()).HasField("close_wait"):
            pass
        call.cancel()


async def tcp_client(address: str, n: int) -> None:
    host, port = address.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"  V2SUB bench work\n")
    buf = bytearray()

    async def frames() -> list[tuple[int, bytes]]:
        got: list[tuple[int, bytes]] = []
        while not got:
            chunk = await reader.read(1 << 20)
            if not chunk:
                raise ConnectionError("closed")
            buf.extend(chunk)
            pos = 0
            while len(buf) - pos >= 8:
                size, kind = struct.unpack_from(">ii", buf, pos)
                if len(buf) - pos < 4 + size:
                    break
                got.append((kind, bytes(buf[pos + 8:pos + 4 + size])))
                pos += 4 + size
            del buf[:pos]
        return got

    assert (await frames())[0] == (0, b"OK")
    await ready()
    writer.write(b"RDY %d\n" % RDY)
    got = 0
    while got < n:
        fins = [b"FIN %s\n" % data[10:26] for kind, data in await frames() if kind == 2]
        got += len(fins)
        writer.write(b"".join(fins))
    writer.write(b"CLS\n")
    while (0, b"CLOSE_WAIT") not in await frames():
        pass
    writer.close()


async def fanout_client(case: str, address: str, n: int) -> None:
    """``scaling.shape``'s consumers and publisher, counted from their first RDY."""
    from benchmarks.scaling import BATCH as MPUB_BATCH, drain, mpub
    from benchmarks.tcp_throughput import read_frames

    active, idle = FANOUT[case]
    port = int(address.rsplit(":", 1)[1])
    # Heartbeats as seldom as NSQ allows: they cost by the second, not by the delivery,
    # and a broker under callgrind runs some 50 times slower.
    identify = json.dumps({"heartbeat_interval": 60_000}).encode()

    async def subscribe(port: int, topic: str, channel: str) -> tuple:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"  V2IDENTIFY\n" + struct.pack(">i", len(identify)) + identify
                     + b"SUB %s %s\n" % (topic.encode(), channel.encode()))
        buf, frames = bytearray(), []
        while len(frames) < 2:
            frames += await read_frames(reader, buf)
        assert frames[:2] == [(0, b"OK"), (0, b"OK")], frames
        return reader, writer
    subs = [await subscribe(port, "bench", "work") for _ in range(active)]
    idlers = [await subscribe(port, "bench", "work") for _ in range(idle)]
    pub_reader, pub = await asyncio.open_connection("127.0.0.1", port)
    pub.write(b"  V2")
    await ready()
    target = n // MPUB_BATCH * MPUB_BATCH
    counter, done = {"got": 0}, asyncio.Event()
    drains = [asyncio.create_task(drain(r, w, max(1, 2500 // active), counter, target, done))
              for r, w in subs]
    buf = bytearray()
    for _ in range(target // MPUB_BATCH):
        pub.write(mpub("bench", MPUB_BATCH))
        await read_frames(pub_reader, buf)
    await done.wait()
    for task in drains:
        task.cancel()
    await asyncio.gather(*drains, return_exceptions=True)
    for _, writer in subs + idlers + [(None, pub)]:
        writer.close()


async def ready() -> None:
    """Say so, and wait for the word to go (counting is switched on between)."""
    print("subscribed", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--keep", type=Path)
    parser.add_argument("--profile", metavar="CASE", choices=CASES)
    parser.add_argument("--event-loop", default="asyncio", choices=("asyncio", "uvloop"),
                        help="the broker's event loop (as pynsqd's --event-loop)")
    parser.add_argument("--case", help=argparse.SUPPRESS)
    parser.add_argument("--client", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case or args.profile:
        run_case(args.case or args.profile, args.messages, profile=bool(args.profile),
                 event_loop=args.event_loop)
        return
    if args.client:
        protocol, address = args.client
        if protocol in FANOUT:
            from benchmarks.scaling import more_sockets
            more_sockets()
            asyncio.run(fanout_client(protocol, address, args.messages))
        else:
            asyncio.run((grpc_client if protocol == "grpc" else tcp_client)(address,
                                                                           args.messages))
        print("done", flush=True)
        return
    results = {}
    for case in args.cases.split(","):
        if case not in CASES:
            parser.error(f"--cases: {case!r} is none of {', '.join(CASES)}")
        results[case] = count(case, args.messages, args.keep, args.event_loop)
        unit = "PUB" if case.startswith("pub") else \
            "delivery" if case in FANOUT else "message"
        print(f"{case:12} {results[case]:>13,} instructions  "
              f"{results[case] / args.messages:>9,.0f} per {unit}", flush=True)
    for protocol in ("grpc", "tcp"):
        if protocol in results and f"{protocol}-memory" in results:
            print(f"{protocol}: durable ÷ memory-only instructions "
                  f"{results[protocol] / results[protocol + '-memory']:.3f}")


if __name__ == "__main__":
    main()
