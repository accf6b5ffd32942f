"""TLS cost: gRPC and TCP publish/consume throughput with TLS on ÷ plain text, in the same run.

    python benchmarks/tls_throughput.py [--messages 200000]

Two ``pynsqd`` subprocesses, one plain and one with a certificate (made here
with trustme); the same clients against each. gRPC: MPUB of 100 × 100-byte
messages one awaited at a time, then one Subscribe stream with RDY 1000 and
every message FINed. TCP: MPUB of 200 × 100-byte messages waiting for each OK,
then RDY 2500 with FINs, after IDENTIFY negotiates ``tls_v1`` and the
connection is upgraded, as NSQ's clients do.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import ssl
import struct
import tempfile
import time
from functools import partial
from pathlib import Path

import grpc

from broker.api import broker_pb2 as pb
from broker.api import broker_pb2_grpc as pb_grpc

try:
    from .common import free_port, start_pynsqd, stop, wait_listening
    from .tcp_throughput import consume as tcp_consume, publish as tcp_publish, read_frames
except ImportError:  # run as a script
    from common import free_port, start_pynsqd, stop, wait_listening
    from tcp_throughput import consume as tcp_consume, publish as tcp_publish, read_frames

BATCH, SIZE, RDY = 100, 100, 1000
BODY = b"x" * SIZE


def _channel(address: str, ca: bytes | None) -> grpc.aio.Channel:
    if ca is None:
        return grpc.aio.insecure_channel(address)
    return grpc.aio.secure_channel(address, grpc.ssl_channel_credentials(ca))


async def grpc_publish(address: str, ca: bytes | None, n: int) -> float:
    async with _channel(address, ca) as channel:
        stub = pb_grpc.BrokerStub(channel)
        await stub.CreateChannel(pb.ChannelRequest(topic="bench", channel="work"))
        request = pb.MultiPublishRequest(topic="bench", bodies=[BODY] * BATCH)
        started = time.perf_counter()
        for _ in range(n // BATCH):
            await stub.MultiPublish(request)
        return time.perf_counter() - started


async def grpc_consume(address: str, ca: bytes | None, n: int) -> float:
    async with _channel(address, ca) as channel:
        call = pb_grpc.BrokerStub(channel).Subscribe()
        await call.write(pb.ClientFrame(sub=pb.Sub(topic="bench", channel="work")))
        await call.read()
        await call.write(pb.ClientFrame(rdy=pb.Rdy(count=RDY)))
        got = 0
        started = time.perf_counter()
        while got < n:
            ids = [m.id for m in (await call.read()).messages.messages]
            got += len(ids)
            if ids:
                await call.write(pb.ClientFrame(fin=pb.Fin(ids=ids)))
        elapsed = time.perf_counter() - started
        call.cancel()
        return elapsed


async def _tcp_connect(port: int, ca: str | None):
    """A V2 connection, upgraded to TLS after IDENTIFY when ``ca`` is given."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"  V2")
    buf = bytearray()
    if ca is not None:
        body = json.dumps({"feature_negotiation": True, "tls_v1": True}).encode()
        writer.write(b"IDENTIFY\n" + struct.pack(">i", len(body)) + body)
        (kind, data), = await read_frames(reader, buf)
        assert json.loads(data)["tls_v1"] is True, data
        await writer.start_tls(ssl.create_default_context(cafile=ca),
                               server_hostname="127.0.0.1")
        frames = await read_frames(reader, buf)
        assert frames[0] == (0, b"OK"), frames
    return reader, writer, buf


def measure(n: int, ca_path: str | None, flags: list[str]) -> dict:
    tcp_port = free_port()
    proc, address = start_pynsqd("--tcp-address", f"127.0.0.1:{tcp_port}",
                                 "--http-address", "", "--mem-queue-size", str(2 * n), *flags)
    try:
        wait_listening(tcp_port)
        ca = Path(ca_path).read_bytes() if ca_path else None
        tcp = partial(_tcp_connect, ca=ca_path)
        return {
            "grpc_publish_msgs_per_s": round(n / asyncio.run(grpc_publish(address, ca, n))),
            "grpc_consume_msgs_per_s": round(n / asyncio.run(grpc_consume(address, ca, n))),
            "tcp_publish_msgs_per_s": round(n / asyncio.run(tcp_publish(tcp_port, n, tcp))),
            "tcp_consume_msgs_per_s": round(n / asyncio.run(tcp_consume(tcp_port, n, tcp))),
        }
    finally:
        stop(proc)


def run(n: int) -> dict:
    import trustme

    with tempfile.TemporaryDirectory() as tmp:
        ca = trustme.CA()
        cert = ca.issue_cert("127.0.0.1", "localhost")
        paths = {name: str(Path(tmp) / name) for name in ("ca.pem", "cert.pem", "key.pem")}
        ca.cert_pem.write_to_path(paths["ca.pem"])
        cert.cert_chain_pems[0].write_to_path(paths["cert.pem"])
        cert.private_key_pem.write_to_path(paths["key.pem"])
        plain = measure(n, None, [])
        tls = measure(n, paths["ca.pem"], ["--tls-cert", paths["cert.pem"],
                                           "--tls-key", paths["key.pem"]])
    return {"messages": n, "plain": plain, "tls": tls,
            **{f"{key[:-len('_msgs_per_s')]}_ratio": round(tls[key] / plain[key], 3)
               for key in plain}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200_000)
    print(json.dumps(run(parser.parse_args().messages), indent=2))


if __name__ == "__main__":
    main()
