"""NSQ TCP protocol throughput: MPUB and a RDY-2500 consumer against pynsqd,
each next to a raw asyncio socket server moving the same bytes.

    python benchmarks/tcp_throughput.py [--messages 400000]

Publish: one connection sends MPUB of 200 × 100-byte messages and waits for
each OK, as NSQ's bench_writer does. Consume: one connection, RDY 2500, FIN for
every message (FINs of a read written together). The baseline server answers
the same commands without a broker behind it: OK per MPUB; for the consumer,
message frames as fast as FINs make room. Both servers run as subprocesses.
"""

from __future__ import annotations

import asyncio
import struct
import sys
import time

try:
    from .common import (free_port, main_with_baseline, ratios, start, start_pynsqd, stop,
                         wait_listening)
except ImportError:  # run as a script
    from common import (free_port, main_with_baseline, ratios, start, start_pynsqd, stop,
                        wait_listening)

BATCH, SIZE, RDY = 200, 100, 2500
BODY = b"x" * SIZE
MPUB = (b"MPUB bench\n" + struct.pack(">ii", 4 + BATCH * (4 + SIZE), BATCH)
        + (struct.pack(">i", SIZE) + BODY) * BATCH)
OK = struct.pack(">ii", 6, 0) + b"OK"


async def read_frames(reader: asyncio.StreamReader, buf: bytearray) -> list[tuple[int, bytes]]:
    """At least one whole frame from the stream."""
    frames = []
    while not frames:
        chunk = await reader.read(1 << 20)
        if not chunk:
            raise ConnectionError("closed")
        buf += chunk
        pos = 0
        while len(buf) - pos >= 8:
            size, kind = struct.unpack_from(">ii", buf, pos)
            if len(buf) - pos < 4 + size:
                break
            frames.append((kind, bytes(buf[pos + 8:pos + 4 + size])))
            pos += 4 + size
        del buf[:pos]
    return frames


async def connect(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, bytearray]:
    """A plain V2 connection: (reader, writer, read buffer)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"  V2")
    return reader, writer, bytearray()


async def publish(port: int, n: int, connect=connect) -> float:
    reader, writer, buf = await connect(port)
    started = time.perf_counter()
    for _ in range(n // BATCH):
        writer.write(MPUB)
        frames = await read_frames(reader, buf)
        assert frames[0] == (0, b"OK"), frames[0]
    elapsed = time.perf_counter() - started
    writer.close()
    return elapsed


async def consume(port: int, n: int, connect=connect) -> float:
    reader, writer, buf = await connect(port)
    writer.write(b"SUB bench work\nRDY %d\n" % RDY)
    got = 0
    started = time.perf_counter()
    while got < n:
        fins = []
        for kind, data in await read_frames(reader, buf):
            if kind == 2:
                fins.append(b"FIN " + data[10:26] + b"\n")
                got += 1
        writer.write(b"".join(fins))
    elapsed = time.perf_counter() - started
    writer.close()
    return elapsed


# -- the baseline: the same bytes, no broker ----------------------------------

async def baseline_server(port: int) -> None:
    frame = struct.pack(">iiqH", 30 + SIZE, 2, time.time_ns(), 1)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await serve(reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the client is done

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readexactly(4)
        line = await reader.readline()
        if line.startswith(b"MPUB"):
            while True:
                size = struct.unpack(">i", await reader.readexactly(4))[0]
                await reader.readexactly(size)
                writer.write(OK)
                line = await reader.readline()
                if not line:
                    return
        await reader.readline()  # RDY
        counter = 0

        def messages(k: int) -> bytes:
            nonlocal counter
            out = []
            for _ in range(k):
                out.append(frame + b"%016x" % counter + BODY)
                counter += 1
            return b"".join(out)

        writer.write(messages(RDY))
        pending = b""
        while True:
            data = await reader.read(1 << 20)
            if not data:
                return
            data = pending + data
            fins = data.count(b"\n")
            pending = data[data.rfind(b"\n") + 1:]
            writer.write(messages(fins))

    server = await asyncio.start_server(handle, "127.0.0.1", port)
    async with server:
        await server.serve_forever()


def measure(port: int, n: int) -> dict:
    pub = asyncio.run(publish(port, n))
    sub = asyncio.run(consume(port, n))
    return {"publish_msgs_per_s": round(n / pub), "consume_msgs_per_s": round(n / sub)}


def run(n: int) -> dict:
    port = free_port()
    broker, _ = start_pynsqd("--tcp-address", f"127.0.0.1:{port}", "--http-address", "",
                             "--mem-queue-size", str(n))
    try:
        wait_listening(port)
        result = measure(port, n)
    finally:
        stop(broker)
    port = free_port()
    raw = start([sys.executable, __file__, "--baseline-server", str(port)], port)
    try:
        baseline = measure(port, n)
    finally:
        stop(raw)
    return {"messages": n, "pynsqd": result, "raw_asyncio": baseline,
            **ratios(result, baseline)}


def main() -> None:
    main_with_baseline(__doc__, 400_000, run, baseline_server)


if __name__ == "__main__":
    main()
