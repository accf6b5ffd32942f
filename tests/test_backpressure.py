"""Backpressure: a consumer that stops reading stops receiving, its memory in the
broker stays bounded, and one stuck past its message timeout is disconnected with
what it held given to others."""

from __future__ import annotations

import json
import os
import socket
import struct
import time

import pytest

from broker import Client, EmbeddedBroker

from .helpers import wait_for

BODY = b"x" * 64 * 1024
COUNT = 300                      # ~19 MiB: far more than socket buffers hold


def stalled_consumer(address: str, msg_timeout_ms: int) -> socket.socket:
    """A V2 consumer with RDY 2500 that never reads (small receive buffer)."""
    host, port = address.rsplit(":", 1)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((host, int(port)))
    identify = json.dumps({"msg_timeout": msg_timeout_ms, "heartbeat_interval": 60_000}).encode()
    sock.sendall(b"  V2" + b"IDENTIFY\n" + struct.pack(">i", len(identify)) + identify
                 + b"SUB t ch\nRDY 2500\n")
    return sock


def wait_subscribed(client: Client) -> None:
    wait_for(lambda: client.stats("t").topics and client.stats("t").topics[0].channels[0].clients,
             10, message="the consumer to subscribe")


def consume_all(client: Client, count: int) -> set[str]:
    """The distinct ids a healthy consumer of t/ch gets until it has ``count``."""
    with client.subscribe("t", "ch", rdy=100) as sub:
        seen: set[str] = set()
        while len(seen) < count:
            msg = sub.get(30)
            assert msg is not None, f"only {len(seen)} of {count} messages arrived"
            seen.add(msg.id)
            sub.fin(msg.id)
    return seen


def held_output(broker: EmbeddedBroker) -> int:
    """Bytes the broker holds for its TCP clients (its own buffers, not the kernel's)."""
    def measure() -> int:
        return sum(c.transport.get_write_buffer_size() + c.out_bytes
                   for c in broker.app._tcp.connections)
    return broker.call(measure)


def test_a_consumer_that_does_not_read_stops_receiving_and_holds_little_memory(client, broker):
    sock = stalled_consumer(broker.tcp_address, 60_000)
    try:
        wait_subscribed(client)
        for start in range(0, COUNT, 50):
            client.multi_publish("t", [BODY] * 50)
        channel = client.stats("t").topics[0].channels[0]
        assert channel.message_count == COUNT
        # Delivery stopped at what its buffers hold; the rest waits in the channel.
        assert channel.in_flight_count < COUNT // 2 and channel.depth > COUNT // 2
        assert held_output(broker) < 256 * 1024
    finally:
        sock.close()


def test_pynsqd_raises_its_open_file_limit_and_serves_its_clients_at_the_limit():
    import resource
    import subprocess
    import urllib.request

    from .helpers import Daemon, bin_path, free_port

    def low_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 160))

    tcp_port, http = free_port(), f"127.0.0.1:{free_port()}"
    daemon = Daemon.__new__(Daemon)       # Daemon's own start, with a low limit inherited
    daemon.address = f"127.0.0.1:{free_port()}"
    daemon.proc = subprocess.Popen([bin_path("pynsqd"), "--grpc-address", daemon.address,
                                    "--tcp-address", f"127.0.0.1:{tcp_port}",
                                    "--http-address", http,
                                    # caps above the limit, so the broker runs out of descriptors
                                    "--max-connections", "100000",
                                    "--max-connections-per-client", "100000"],
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   preexec_fn=low_limit)
    extra: list[socket.socket] = []
    exhausted_at = time.monotonic()
    try:
        daemon.wait_ready()
        limits = open(f"/proc/{daemon.proc.pid}/limits").read()
        [line] = [x for x in limits.splitlines() if x.startswith("Max open files")]
        assert line.split()[3:5] == ["160", "160"]
        first = socket.create_connection(("127.0.0.1", tcp_port), timeout=30)
        first.sendall(b"  V2")
        exhausted_at = time.monotonic()
        for _ in range(220):      # past the limit: some of these cannot be accepted
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex(("127.0.0.1", tcp_port))
            extra.append(s)
        wait_for(lambda: len(os.listdir(f"/proc/{daemon.proc.pid}/fd")) == 160, 30,
                 message="pynsqd to reach its open-file limit")
        first.sendall(b"PUB t\n" + struct.pack(">i", 5) + b"still")
        assert first.recv(64)[8:] == b"OK"
        for s in extra:
            s.close()
        extra.clear()

        def pings() -> bool:
            try:
                with urllib.request.urlopen(f"http://{http}/ping", timeout=2) as r:
                    return r.read() == b"OK"
            except OSError:
                return False
        wait_for(pings, 30, message="/ping to answer once descriptors are free")
        with Client(daemon.address) as client:
            assert client.stats("t").topics[0].message_count == 1
        first.close()
    finally:
        for s in extra:
            s.close()
        daemon.kill()
        seconds = time.monotonic() - exhausted_at
    output = daemon.output()
    assert "cannot accept connections" in output                 # logged,
    for listener in ("TCP", "HTTP"):                              # not in a loop
        assert output.count(f"{listener}: cannot accept connections") <= seconds / 10 + 1


def stalled_grpc_stream(client: Client, msg_timeout_ms: int):
    """A gRPC consumer with RDY 2500 that reads its first frame and then nothing;
    its request stream stays open until the call is cancelled."""
    import threading

    from broker.api import broker_pb2 as pb

    done = threading.Event()

    def frames():
        yield pb.ClientFrame(sub=pb.Sub(topic="t", channel="ch", msg_timeout_ms=msg_timeout_ms))
        yield pb.ClientFrame(rdy=pb.Rdy(count=2500))
        done.wait(120)

    call = client.stub.Subscribe(frames())
    call.add_done_callback(lambda _: done.set())
    assert next(call).WhichOneof("frame") == "subscribed"
    return call


def test_a_grpc_stream_that_is_not_read_stops_receiving(client, broker):
    call = stalled_grpc_stream(client, 60_000)
    try:
        wait_subscribed(client)
        for start in range(0, COUNT * 2, 50):
            client.multi_publish("t", [BODY] * 50)
        channel = client.stats("t").topics[0].channels[0]
        assert channel.in_flight_count < COUNT and channel.depth > COUNT
    finally:
        call.cancel()


def stall_tcp(client: Client, broker: EmbeddedBroker, msg_timeout_ms: int):
    return stalled_consumer(broker.tcp_address, msg_timeout_ms).close


def stall_grpc(client: Client, broker: EmbeddedBroker, msg_timeout_ms: int):
    return stalled_grpc_stream(client, msg_timeout_ms).cancel


@pytest.mark.parametrize("stall", [stall_tcp, stall_grpc], ids=["tcp", "grpc"])
def test_a_consumer_stuck_past_its_timeout_is_disconnected_and_others_get_everything(
        client, broker, stall):
    close = stall(client, broker, 1000)
    try:
        wait_subscribed(client)
        ids = []
        for start in range(0, COUNT * 2, 50):
            ids += client.multi_publish("t", [BODY] * 50)
        wait_for(lambda: not client.stats("t").topics[0].channels[0].clients, 60,
                 message="the stuck consumer to be disconnected")
        assert consume_all(client, len(ids)) == set(ids)
    finally:
        close()


@pytest.mark.parametrize("protocol", ["tcp", "grpc"])
def test_a_refused_mpub_leaves_none_of_its_messages_to_the_garbage_collector(protocol):
    # pynsqd runs full collections rarely (see tune_garbage_collector): a refusal whose
    # error kept the request's frames in a reference cycle held its messages for long.
    import gc

    from broker.message import Message

    body = b"y" * 1000
    mpub = (b"MPUB t\n" + struct.pack(">ii", 4 + 100 * (4 + len(body)), 100)
            + b"".join(struct.pack(">i", len(body)) + body for _ in range(100)))
    with EmbeddedBroker(max_memory_bytes=1000, grpc_address="127.0.0.1:0",
                        tcp_address="127.0.0.1:0", http_address="127.0.0.1:0") as broker, \
            Client(broker.address) as client:
        host, port = broker.tcp_address.rsplit(":", 1)

        def refuse() -> None:
            if protocol == "grpc":
                with pytest.raises(Exception, match="max-memory-bytes"):
                    client.multi_publish("t", [body] * 100)
                return
            with socket.create_connection((host, int(port)), timeout=10) as sock:
                sock.sendall(b"  V2" + mpub)
                assert b"E_MPUB_FAILED" in sock.recv(4096)

        refuse()
        gc.collect()
        gc.disable()
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            for _ in range(20):
                refuse()
            wait_for(lambda: broker.call(lambda: True), 10)  # the loop has answered them all
            gc.collect()
            held = [o for o in gc.garbage if type(o) is Message]
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
            gc.enable()
        assert held == []
