"""Soak: many producers and consumers on every protocol for a while, with slow
consumers among them; then count what was lost and check the stats add up.

    python -m benchmarks.soak [--duration 60] [--data-path DIR]

8 producers per protocol (gRPC MultiPublish, TCP MPUB, HTTP /mpub) publish
numbered messages to one topic; channel ``grpc`` is read by 4 gRPC consumers and
channel ``tcp`` by 4 TCP consumers, one of each slow (it sleeps between reads,
so its messages time out and go to the others). After ``--duration`` the
producers stop, the consumers drain both channels, and the report gives:

- messages lost per channel (published and never received: must be 0) and
  duplicates (redeliveries after a timeout: allowed);
- pynsqd's RSS over time, next to the backlog (messages waiting in both channels);
- per channel, published = FINed + depth + in flight + deferred, from /stats.

It prints one JSON object. It is a benchmark, not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import socket
import struct
import sys
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import free_port, start, stop  # noqa: E402
from broker import Client  # noqa: E402
from broker.server.wire import split_frames  # noqa: E402

TOPIC = "soak"
PRODUCERS = CONSUMERS = 4
BATCH = 10


def _frames(sock: socket.socket, buf: bytearray) -> list[tuple[int, bytes]]:
    """At least one whole frame from the socket."""
    while True:
        frames, used = split_frames(buf)
        if frames:
            del buf[:used]
            return frames
        chunk = sock.recv(1 << 16)
        if not chunk:
            raise ConnectionError("closed")
        buf += chunk


class Soak:
    def __init__(self, grpc: str, tcp: str, http: str) -> None:
        self.grpc, self.tcp, self.http = grpc, tcp, http
        self.stop_producing = threading.Event()
        self.stop_consuming = threading.Event()
        self.lock = threading.Lock()
        self.published: dict[str, int] = {"grpc": 0, "tcp": 0, "http": 0}
        self.sent: set[bytes] = set()
        self.received: dict[str, list[bytes]] = {"grpc": [], "tcp": []}
        self.errors: list[str] = []

    # -- producers -----------------------------------------------------------
    def _bodies(self, kind: str, n: int, seq: int) -> list[bytes]:
        return [f"{kind}-{n}-{seq + i}".encode() for i in range(BATCH)]

    def _accepted(self, kind: str, bodies: list[bytes]) -> None:
        with self.lock:
            self.published[kind] += len(bodies)
            self.sent.update(bodies)

    def produce_grpc(self, n: int) -> None:
        with Client(self.grpc) as client:
            seq = 0
            while not self.stop_producing.is_set():
                bodies = self._bodies("grpc", n, seq)
                client.multi_publish(TOPIC, bodies)
                self._accepted("grpc", bodies)
                seq += BATCH
                time.sleep(0.01)

    def produce_tcp(self, n: int) -> None:
        host, port = self.tcp.rsplit(":", 1)
        with socket.create_connection((host, int(port))) as sock:
            sock.sendall(b"  V2")
            buf, seq = bytearray(), 0
            pending: list[tuple[int, bytes]] = []
            while not self.stop_producing.is_set():
                bodies = self._bodies("tcp", n, seq)
                payload = struct.pack(">i", len(bodies)) + b"".join(
                    struct.pack(">i", len(b)) + b for b in bodies)
                sock.sendall(f"MPUB {TOPIC}\n".encode() + struct.pack(">i", len(payload))
                             + payload)
                while True:
                    if not pending:
                        pending += _frames(sock, buf)
                    kind, data = pending.pop(0)
                    if (kind, data) != (0, b"_heartbeat_"):
                        break
                    sock.sendall(b"NOP\n")
                if (kind, data) != (0, b"OK"):
                    raise RuntimeError(f"MPUB answered {data!r}")
                self._accepted("tcp", bodies)
                seq += BATCH
                time.sleep(0.01)

    def produce_http(self, n: int) -> None:
        seq = 0
        while not self.stop_producing.is_set():
            bodies = self._bodies("http", n, seq)
            request = urllib.request.Request(f"http://{self.http}/mpub?topic={TOPIC}",
                                             data=b"\n".join(bodies), method="POST")
            with urllib.request.urlopen(request, timeout=30) as response:
                if response.read() != b"OK":
                    raise RuntimeError("HTTP /mpub did not answer OK")
            self._accepted("http", bodies)
            seq += BATCH
            time.sleep(0.01)

    # -- consumers -----------------------------------------------------------
    def consume_grpc(self, slow: bool) -> None:
        with Client(self.grpc) as client, \
                client.subscribe(TOPIC, "grpc", rdy=5 if slow else 200,
                                 msg_timeout_ms=2000 if slow else 0) as sub:
            while not self.stop_consuming.is_set():
                msg = sub.get(timeout=0.5)
                if msg is None:
                    continue
                if slow:
                    time.sleep(0.5)   # longer than its share of the timeout: some time out
                with self.lock:
                    self.received["grpc"].append(msg.body)
                sub.fin(msg.id)

    def consume_tcp(self, slow: bool) -> None:
        host, port = self.tcp.rsplit(":", 1)
        with socket.create_connection((host, int(port))) as sock:
            identify = json.dumps({"msg_timeout": 2000 if slow else 60_000}).encode()
            sock.sendall(b"  V2IDENTIFY\n" + struct.pack(">i", len(identify)) + identify
                         + f"SUB {TOPIC} tcp\nRDY {5 if slow else 200}\n".encode())
            sock.settimeout(0.5)
            buf = bytearray()
            while not self.stop_consuming.is_set():
                try:
                    frames = _frames(sock, buf)
                except socket.timeout:
                    continue
                fins = []
                for kind, data in frames:
                    if kind == 0 and data == b"_heartbeat_":
                        sock.sendall(b"NOP\n")
                    elif kind == 2:
                        if slow:
                            time.sleep(0.5)
                        with self.lock:
                            self.received["tcp"].append(data[26:])
                        fins.append(b"FIN " + data[10:26] + b"\n")
                    elif kind == 1:
                        self.errors.append(data.decode(errors="replace"))
                if fins:
                    sock.sendall(b"".join(fins))


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


def channel_stats(grpc: str) -> dict[str, dict]:
    """Per channel: message, finish, requeue and timeout counts, depth, in flight, deferred."""
    with Client(grpc) as client:
        [topic] = client.stats(TOPIC).topics
    out: dict[str, dict] = {c.name: {f: getattr(c, f) for f in (
        "message_count", "finish_count", "requeue_count", "timeout_count", "depth",
        "in_flight_count", "deferred_count")} for c in topic.channels}
    out["_topic"] = {"message_count": topic.message_count}
    return out


def run(duration: float, data_path: str) -> dict:
    grpc, tcp, http = (f"127.0.0.1:{free_port()}" for _ in range(3))
    args = [str(Path(sys.executable).parent / "pynsqd"), "--grpc-address", grpc,
            "--tcp-address", tcp, "--http-address", http, "--log-level", "warning"]
    if data_path:
        args += ["--data-path", data_path]
    proc = start(args, int(grpc.rsplit(":", 1)[1]))
    soak = Soak(grpc, tcp, http)
    threads: list[threading.Thread] = []
    try:
        with Client(grpc) as client:
            client.admin("channel", "create", TOPIC, "grpc")
            client.admin("channel", "create", TOPIC, "tcp")
        for i in range(CONSUMERS):
            for target in (soak.consume_grpc, soak.consume_tcp):
                threads.append(threading.Thread(target=target, args=(i == 0,), daemon=True))
        producers = [threading.Thread(target=target, args=(i,), daemon=True)
                     for i in range(2 * PRODUCERS)
                     for target in (soak.produce_grpc, soak.produce_tcp, soak.produce_http)]
        for t in threads + producers:
            t.start()
        started = time.monotonic()
        def sample() -> tuple[int, float, int]:
            """(seconds, RSS MB, messages waiting in both channels)."""
            channels = channel_stats(grpc)
            waiting = sum(channels[c]["depth"] + channels[c]["in_flight_count"]
                          for c in ("grpc", "tcp"))
            return round(time.monotonic() - started), rss_mb(proc.pid), waiting

        rss = [sample()]
        while time.monotonic() - started < duration:
            time.sleep(min(5.0, duration / 6))
            rss.append(sample())
        soak.stop_producing.set()
        for t in producers:
            t.join(60)
        drain_deadline = time.monotonic() + 120
        while time.monotonic() < drain_deadline:
            channels = channel_stats(grpc)
            if all(channels[c]["depth"] + channels[c]["in_flight_count"]
                   + channels[c]["deferred_count"] == 0 for c in ("grpc", "tcp")):
                break
            time.sleep(0.5)
        soak.stop_consuming.set()
        for t in threads:
            t.join(30)
        channels = channel_stats(grpc)
        rss.append(sample())
    finally:
        soak.stop_producing.set()
        soak.stop_consuming.set()
        stop(proc)
    published = sum(soak.published.values())
    report: dict = {"duration_s": duration, "published": soak.published,
                    "published_total": published, "seconds_rss_mb_backlog": rss,
                    "tcp_errors": soak.errors[:5], "channels": {}}
    for name in ("grpc", "tcp"):
        c = channels[name]
        got = soak.received[name]
        report["channels"][name] = {
            "received": len(got), "distinct": len(set(got)),
            "lost": len(soak.sent - set(got)), "duplicates": len(got) - len(set(got)),
            "requeued": c["requeue_count"], "timed_out": c["timeout_count"],
            "stats_message_count": c["message_count"],
            "stats": c,
            # published = FINed + depth + in flight + deferred
            "stats_consistent": published == c["message_count"] == c["finish_count"]
            + c["depth"] + c["in_flight_count"] + c["deferred_count"],
        }
    report["topic_message_count"] = channels["_topic"]["message_count"]
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=60.0)
    parser.add_argument("--data-path", default="", help="run pynsqd durable, in this directory")
    args = parser.parse_args()
    print(json.dumps(run(args.duration, args.data_path), indent=2))


if __name__ == "__main__":
    main()
