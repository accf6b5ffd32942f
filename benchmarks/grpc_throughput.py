"""gRPC throughput and latency: pynsqd against a raw grpc.aio stream moving the same bytes.

    python benchmarks/grpc_throughput.py [--messages 200000]

Publish: MPUB of 100 × 100-byte messages, one awaited at a time. Consume: one
Subscribe stream, RDY 1000, every message FINed (the ids of a frame in one
FIN). The baseline is a bare gRPC service in the same kind of subprocess,
answering the same requests with no broker behind it: an empty reply per
MPUB, and frames of the same messages for the consumer. Latency: publish →
delivery at 1000 msgs/s, one message per PUB, measured on one clock.
"""

from __future__ import annotations

import asyncio
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
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.BrokerStub(channel)
        call = stub.Subscribe()
        await call.write(pb.ClientFrame(sub=pb.Sub(topic="latency", channel="work")))
        await call.read()
        await call.write(pb.ClientFrame(rdy=pb.Rdy(count=100)))
        sent: dict[bytes, float] = {}
        delays: list[float] = []

        async def produce() -> None:
            start = time.perf_counter()
            for i in range(n):
                await asyncio.sleep(max(0.0, start + i / rate - time.perf_counter()))
                body = b"%08d" % i
                sent[body] = time.perf_counter()
                await stub.Publish(pb.PublishRequest(topic="latency", body=body))

        producer = asyncio.create_task(produce())
        while len(delays) < n:
            frame = await call.read()
            now = time.perf_counter()
            for m in frame.messages.messages:
                delays.append((now - sent[m.body]) * 1000)
            await call.write(pb.ClientFrame(fin=pb.Fin(ids=[m.id for m in
                                                           frame.messages.messages])))
        await producer
        call.cancel()
    delays.sort()
    return {"p50_ms": round(delays[len(delays) // 2], 3),
            "p99_ms": round(delays[int(len(delays) * 0.99)], 3)}


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


def run(n: int, latency_messages: int = 3000) -> dict:
    broker, address = start_pynsqd("--tcp-address", "", "--http-address", "",
                                   "--mem-queue-size", str(n))
    try:
        result = measure(address, n)
        lat = asyncio.run(latency(address, latency_messages))
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
