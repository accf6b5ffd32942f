"""gRPC throughput and latency: pynsqd against a raw grpc.aio stream moving the same bytes.

    python benchmarks/grpc_throughput.py [--messages 200000]

Publish: MPUB of 100 × 100-byte messages, one awaited at a time. Consume: one
Subscribe stream, RDY 1000, every message FINed (the ids of a frame in one
FIN). The baseline is a bare gRPC service in the same kind of subprocess,
answering the same requests with no broker behind it: an empty reply per
MPUB, and frames of the same messages for the consumer. Latency: publish →
delivery at 1000 msgs/s, one message per PUB, measured on one clock; p50 and p99
are the medians of several rounds' (``latency_rounds``).
"""

from __future__ import annotations

import asyncio
import gc
import statistics
import sys
import time

import grpc

from broker.api import broker_pb2 as pb
from broker.api import broker_pb2_grpc as pb_grpc

try:
    from .common import free_port, main_with_baseline, ratios, start, start_pynsqd, stop
except ImportError:  # run as a script
    from common import free_port, main_with_baseline, ratios, start, start_pynsqd, stop

BATCH, SIZE, RDY = 100, 100, 1000
BODY = b"x" * SIZE


async def publish(address: str, n: int) -> float:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.BrokerStub(channel)
        await stub.CreateChannel(pb.ChannelRequest(topic="bench", channel="work"))
        request = pb.MultiPublishRequest(topic="bench", bodies=[BODY] * BATCH)
        started = time.perf_counter()
        for _ in range(n // BATCH):
            await stub.MultiPublish(request)
        return time.perf_counter() - started


async def consume(address: str, n: int) -> float:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.BrokerStub(channel)
        call = stub.Subscribe()
        await call.write(pb.ClientFrame(sub=pb.Sub(topic="bench", channel="work")))
        await call.read()
        await call.write(pb.ClientFrame(rdy=pb.Rdy(count=RDY)))
        got = 0
        started = time.perf_counter()
        while got < n:
            frame = await call.read()
            ids = [m.id for m in frame.messages.messages]
            got += len(ids)
            if ids:
                await call.write(pb.ClientFrame(fin=pb.Fin(ids=ids)))
        elapsed = time.perf_counter() - started
        call.cancel()
        return elapsed


async def latency(address: str, n: int, rate: float = 1000.0) -> dict:
    """One round: ``n`` messages published one per PUB at ``rate`` per second, each
    timed from just before its PUB to the moment its delivery frame is read. The
    consumer reads its stream without waiting for its FINs to be written (a second
    task sends them), as a pipelined consumer does: a frame that arrives while a FIN
    is being written is read at once. Every message's delay counts."""
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.BrokerStub(channel)
        call = stub.Subscribe()
        await call.write(pb.ClientFrame(sub=pb.Sub(topic="latency", channel="work")))
        await call.read()
        await call.write(pb.ClientFrame(rdy=pb.Rdy(count=100)))
        sent: dict[bytes, float] = {}
        delays: list[float] = []
        fins: asyncio.Queue[list[str]] = asyncio.Queue()

        async def produce() -> None:
            start = time.perf_counter()
            for i in range(n):
                await asyncio.sleep(max(0.0, start + i / rate - time.perf_counter()))
                body = b"%08d" % i
                sent[body] = time.perf_counter()
                await stub.Publish(pb.PublishRequest(topic="latency", body=body))

        async def finish() -> None:
            while True:
                ids = await fins.get()
                await call.write(pb.ClientFrame(fin=pb.Fin(ids=ids)))
                fins.task_done()

        producer = asyncio.create_task(produce())
        finisher = asyncio.create_task(finish())
        try:
            while len(delays) < n:
                frame = await call.read()
                now = time.perf_counter()
                msgs = frame.messages.messages
                for m in msgs:
                    delays.append((now - sent[m.body]) * 1000)
                if msgs:
                    fins.put_nowait([m.id for m in msgs])
            await producer
            await fins.join()
            # A clean close: the broker has read every FIN before the stream ends, so
            # none of these messages comes back in the next round.
            await call.done_writing()
            while await call.read() is not grpc.aio.EOF:
                pass
        finally:
            finisher.cancel()
            call.cancel()
    delays.sort()
    return {"p50_ms": round(delays[len(delays) // 2], 3),
            "p99_ms": round(delays[int(len(delays) * 0.99)], 3)}


def latency_rounds(address: str, n: int, rounds: int) -> dict:
    """``rounds`` rounds of ``latency``; p50 and p99 are the medians of the rounds' own
    (each round's listed too), so one round that met a burst of the machine's load
    does not make the figure. The client is the measuring instrument: its garbage
    collector is off during a round (its own pauses are not the broker's) and
    collects between rounds."""
    results = []
    enabled = gc.isenabled()
    try:
        for _ in range(rounds):
            gc.collect()
            gc.disable()
            results.append(asyncio.run(latency(address, n)))
            gc.enable()
    finally:
        if enabled:
            gc.enable()
        else:
            gc.disable()
    return {"p50_ms": statistics.median(r["p50_ms"] for r in results),
            "p99_ms": statistics.median(r["p99_ms"] for r in results),
            "rounds": results}


class Baseline(pb_grpc.BrokerServicer):
    """The same RPCs with nothing behind them."""

    async def CreateChannel(self, request, context):
        return pb.AdminResponse()

    async def MultiPublish(self, request, context):
        return pb.PublishResponse()

    async def Subscribe(self, request_iterator, context):
        await context.read()
        yield pb.ServerFrame(subscribed=pb.Subscribed())
        ts = time.time_ns()
        counter = 0
        credit = 0
        while True:
            frame = await context.read()
            if frame is grpc.aio.EOF:
                return
            kind = frame.WhichOneof("command")
            credit += frame.rdy.count if kind == "rdy" else len(frame.fin.ids)
            if credit:
                msgs = [pb.Message(id=f"{counter + i:016x}", body=BODY, timestamp=ts, attempts=1)
                        for i in range(credit)]
                counter += credit
                credit = 0
                yield pb.ServerFrame(messages=pb.Messages(messages=msgs))


async def serve_baseline(port: int) -> None:
    server = grpc.aio.server()
    pb_grpc.add_BrokerServicer_to_server(Baseline(), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


def measure(address: str, n: int) -> dict:
    return {"publish_msgs_per_s": round(n / asyncio.run(publish(address, n))),
            "consume_msgs_per_s": round(n / asyncio.run(consume(address, n)))}


def run(n: int, latency_messages: int = 3000, latency_round_count: int = 5) -> dict:
    broker, address = start_pynsqd("--tcp-address", "", "--http-address", "",
                                   "--mem-queue-size", str(n))
    try:
        result = measure(address, n)
        lat = latency_rounds(address, latency_messages, latency_round_count)
    finally:
        stop(broker)
    port = free_port()
    raw = start([sys.executable, __file__, "--baseline-server", str(port)], port)
    try:
        baseline = measure(f"127.0.0.1:{port}", n)
    finally:
        stop(raw)
    return {"messages": n, "pynsqd": result, "raw_grpc": baseline, "latency": lat,
            **ratios(result, baseline)}


def main() -> None:
    main_with_baseline(__doc__, 200_000, run, serve_baseline)


if __name__ == "__main__":
    main()
