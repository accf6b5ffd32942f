"""A fuzzer of hostile clients: generated input (hypothesis) on the TCP, HTTP and
gRPC surfaces of one ``pynsqd`` subprocess, and slow senders (half-sent headers,
bodies, commands, AUTHs and TLS handshakes, many connections at once, left open).
After every input the broker must be alive, within a bound of RSS and of open
descriptors (/proc/PID/fd) over its start, serve a legitimate client, have answered
in its protocol (frames well formed, nsqd's error codes, no HTTP 500, no gRPC UNKNOWN
or INTERNAL), and its log must have no traceback, one line per complaint.

``HOSTILE_FUZZ_EXAMPLES`` (default 150 per surface, a thirtieth of it and two chosen
cases for slow senders; about 30 s in all) explores further.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import subprocess

import grpc
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from broker.api import broker_pb2 as pb

from .helpers import bin_path, free_port, rss, wait_for

EXAMPLES = int(os.environ.get("HOSTILE_FUZZ_EXAMPLES", 150))
RSS_BOUND = 128 << 20           # over the broker's RSS at start, for the whole session
FDS_BOUND = 32                  # descriptors over its start, once a client closed its own
#: The fuzzed broker's connection caps (--max-connections, --max-connections-per-client).
MAX_CONNECTIONS, MAX_PER_CLIENT = 200, 100
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                suppress_health_check=list(HealthCheck))
#: nsqd's error codes (and pynsqd's own for what nsqd has not).
NSQ_CODES = {b"E_INVALID", b"E_BAD_PROTOCOL", b"E_BAD_TOPIC", b"E_BAD_CHANNEL", b"E_BAD_BODY",
             b"E_BAD_MESSAGE", b"E_FIN_FAILED", b"E_REQ_FAILED", b"E_TOUCH_FAILED",
             b"E_AUTH_DISABLED", b"E_AUTH_FIRST", b"E_AUTH_FAILED", b"E_UNAUTHORIZED",
             b"E_PUB_FAILED", b"E_MPUB_FAILED", b"E_DPUB_FAILED"}
INPUTS = {"tcp": 0, "http": 0, "grpc": 0, "slow": 0}


class Broker:
    def __init__(self, log_path) -> None:
        self.grpc, self.tcp, self.http = (f"127.0.0.1:{free_port()}" for _ in range(3))
        self.log_path = log_path
        self.log = open(log_path, "wb")
        self.proc = subprocess.Popen([bin_path("pynsqd"), "--grpc-address", self.grpc,
                                      "--tcp-address", self.tcp, "--http-address", self.http,
                                      "--max-body-size", "65536", "--max-msg-size", "4096",
                                      "--max-connections", str(MAX_CONNECTIONS),
                                      "--max-connections-per-client", str(MAX_PER_CLIENT)],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        self.channel = grpc.insecure_channel(self.grpc)
        wait_for(self.answers, 30, message="pynsqd to start")
        self.base_rss = rss(self.proc.pid)
        self.base_fds = self.fds()
        self.peak_growth = 0
        self.peak_fds = 0

    def fds(self) -> int:
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))

    def answers(self) -> bool:
        assert self.proc.poll() is None, f"pynsqd exited: {self.log_text()}"
        try:
            # From an address of its own: the slow senders may fill 127.0.0.1's cap.
            _, status = http_request(self.http, b"GET /ping HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                                b"Connection: close\r\n\r\n",
                                     source="127.0.0.3")
            return status == 200
        except OSError:
            return False

    def check(self, open_here: int = 0) -> None:
        """Alive, answering, within its RSS bound, and holding no more descriptors than
        the connections still open (``open_here``) allow once the closed ones are gone."""
        assert self.answers(), "pynsqd stopped answering"
        grown = rss(self.proc.pid) - self.base_rss
        self.peak_growth = max(self.peak_growth, grown)
        assert grown < RSS_BOUND, f"pynsqd's RSS grew {grown >> 20} MiB"
        limit = self.base_fds + open_here + FDS_BOUND
        wait_for(lambda: self.fds() <= limit, 10, 0.02,
                 f"pynsqd's descriptors back under {limit}")

    def log_text(self) -> str:
        if not self.log.closed:
            self.log.flush()
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        self.channel.close()
        self.proc.terminate()
        self.proc.wait(30)
        self.log.close()


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    broker = Broker(tmp_path_factory.mktemp("fuzz") / "pynsqd.log")
    yield broker
    broker.stop()
    log = broker.log_text()
    print(f"\nhostile fuzz inputs: {INPUTS} ({sum(INPUTS.values())} in all); "
          f"{len(log.splitlines())} log lines; RSS {broker.base_rss >> 20} MiB at start, "
          f"at most {broker.peak_growth >> 20} MiB more; {broker.base_fds} descriptors at "
          f"start, at most {broker.peak_fds} while slow senders were open")
    assert "Traceback" not in log, log[-3000:]


# -- TCP ------------------------------------------------------------------------------

names = st.one_of(st.sampled_from(["t", "fuzz", "a#ephemeral", "", "x" * 65, "bad name",
                                   "ü", "t.-_"]), st.text(max_size=8))
ints = st.one_of(st.integers(-2, 70000), st.sampled_from([-2**31, 2**31 - 1, 0]))
json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                           lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(st.text(max_size=8), inner, max_size=3),
                           max_leaves=8)
identify_keys = st.sampled_from(["feature_negotiation", "heartbeat_interval",
                                 "output_buffer_size", "output_buffer_timeout", "msg_timeout",
                                 "sample_rate", "tls_v1", "snappy", "deflate", "client_id"])


def sized(body: bytes, lie: int | None) -> bytes:
    return struct.pack(">i", len(body) if lie is None else lie) + body


@st.composite
def tcp_command(draw) -> bytes:
    kind = draw(st.sampled_from(["IDENTIFY", "AUTH", "SUB", "PUB", "MPUB", "DPUB", "RDY",
                                 "FIN", "REQ", "TOUCH", "CLS", "NOP", "raw", "nested"]))
    lie = draw(st.none() | ints)
    if kind == "IDENTIFY":
        body = json.dumps(draw(st.dictionaries(identify_keys, json_values, max_size=4)
                               | json_values)).encode()
        return b"IDENTIFY\n" + sized(body, lie)
    if kind == "nested":
        depth = draw(st.integers(1, 50_000))
        return b"IDENTIFY\n" + sized(draw(st.sampled_from([b"[", b'{"a":'])) * depth, None)
    if kind == "AUTH":
        return b"AUTH\n" + sized(draw(st.binary(max_size=32)), lie)
    if kind == "SUB":
        return f"SUB {draw(names)} {draw(names)}\n".encode()
    if kind in ("PUB", "DPUB"):
        delay = f" {draw(ints)}" if kind == "DPUB" else ""
        return f"{kind} {draw(names)}{delay}\n".encode() + sized(draw(st.binary(max_size=64)), lie)
    if kind == "MPUB":
        bodies = draw(st.lists(st.binary(max_size=16), max_size=4))
        inner = struct.pack(">i", draw(st.sampled_from([len(bodies), 0, -1, 99])))
        inner += b"".join(sized(b, None) for b in bodies)
        return f"MPUB {draw(names)}\n".encode() + sized(inner, lie)
    if kind in ("RDY", "FIN", "REQ", "TOUCH"):
        arg = draw(st.sampled_from(["", " 0123456789abcdef", " short", f" {draw(ints)}"]))
        extra = f" {draw(ints)}" if kind == "REQ" else ""
        return f"{kind}{arg}{extra}\n".encode()
    if kind in ("CLS", "NOP"):
        return f"{kind}\n".encode()
    return draw(st.binary(max_size=64))


def read_frames(sock: socket.socket) -> list[tuple[int, bytes]]:
    """Every frame until the broker closes (or is quiet for a second)."""
    buf = b""
    sock.settimeout(1.0)
    while True:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            break
        except OSError:
            break
        if not chunk:
            break
        buf += chunk
    frames, pos = [], 0
    while len(buf) - pos >= 8:
        size, kind = struct.unpack_from(">ii", buf, pos)
        assert 4 <= size <= 1 << 20 and kind in (0, 1, 2), f"malformed frame at {pos}: {buf!r}"
        if len(buf) - pos < 4 + size:
            break
        frames.append((kind, buf[pos + 8:pos + 4 + size]))
        pos += 4 + size
    assert pos == len(buf), f"trailing bytes after the frames: {buf[pos:]!r}"
    return frames


@FUZZ
@given(magic=st.sampled_from([b"  V2", b"  V2", b"  V2", b"  V1", b""]),
       commands=st.lists(tcp_command(), min_size=1, max_size=6),
       cut=st.none() | st.integers(0, 200))
def test_tcp_hostile_input_gets_nsqds_errors_and_the_broker_stays_bounded(
        target, magic, commands, cut):
    INPUTS["tcp"] += 1
    data = magic + b"".join(commands)
    if cut is not None:
        data = data[:cut]
    host, port = target.tcp.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        try:
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass                        # closed on an error before all was sent
        frames = read_frames(sock)
    for kind, body in frames:
        if kind == 1:
            assert body.split(b" ")[0] in NSQ_CODES, body
    target.check()


# -- HTTP -----------------------------------------------------------------------------

def http_request(address: str, request: bytes, half_close: bool = False,
                 source: str | None = None) -> tuple[bytes, int]:
    """Send ``request`` (then close our side, with ``half_close``) and read the answer
    until the broker closes; returns it and its status (0: none)."""
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5,
                                  source_address=(source, 0) if source else None) as sock:
        try:
            sock.sendall(request)
            if half_close:
                sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        data = b""
        while True:
            try:
                chunk = sock.recv(65536)
            except OSError:
                break
            if not chunk:
                break
            data += chunk
    head = data.split(b"\r\n", 1)[0]
    parts = head.split(b" ")
    status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
    return data, status


paths = st.sampled_from(["/ping", "/info", "/pub", "/mpub", "/stats", "/metrics",
                         "/topic/create", "/topic/delete", "/topic/empty", "/topic/pause",
                         "/topic/unpause", "/channel/create", "/channel/delete",
                         "/channel/empty", "/channel/pause", "/channel/unpause", "/nope",
                         "/pub/", "//", "/%ff"])
query_keys = st.sampled_from(["topic", "channel", "defer", "binary", "format", "ttl",
                              "max_attempts", "dead_letter_topic", "x"])
query_values = st.one_of(names, st.integers(-5, 10**12).map(str), st.just("%zz"))


@FUZZ
@given(method=st.sampled_from(["GET", "POST", "PUT", "DELETE", "OPTIONS", "HEAD", "BREW",
                               "G\x00T"]),
       path=paths,
       query=st.lists(st.tuples(query_keys, query_values), max_size=4),
       headers=st.lists(st.sampled_from([b"Content-Length: 5", b"Content-Length: -1",
                                         b"Content-Length: 99999999999",
                                         b"Transfer-Encoding: chunked", b"Origin: http://evil",
                                         b"Sec-Fetch-Site: cross-site", b"Expect: 100-continue",
                                         b"X: " + b"y" * 9000, b"bad header",
                                         b"Content-Type: application/json"]), max_size=3),
       body=st.binary(max_size=256),
       cut=st.none() | st.integers(0, 100))
def test_http_hostile_requests_get_nsqds_answers_and_never_500(
        target, method, path, query, headers, body, cut):
    INPUTS["http"] += 1
    qs = "&".join(f"{k}={v}" for k, v in query)
    target_path = (path + ("?" + qs if qs else "")).encode("utf-8", "replace")
    request = (method.encode("utf-8", "replace") + b" " + target_path + b" HTTP/1.1\r\n"
               + b"Host: 127.0.0.1\r\nConnection: close\r\n" + b"".join(h + b"\r\n" for h in headers)
               + b"\r\n" + body)
    if cut is not None:
        request = request[:cut]
    data, status = http_request(target.http, request, half_close=cut is not None)
    assert status != 500 or b"PUB_FAILED" in data, data[:500]
    target.check()


# -- gRPC -----------------------------------------------------------------------------

UNARY = ["Publish", "MultiPublish", "CreateTopic", "DeleteTopic", "EmptyTopic", "PauseTopic",
         "UnpauseTopic", "CreateChannel", "DeleteChannel", "EmptyChannel", "PauseChannel",
         "UnpauseChannel", "Stats", "Ping", "Info", "Reserve", "FinishLeases",
         "RequeueLeases", "TouchLeases", "AdoptLeases"]
BAD_CODES = {grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL}

client_frames = st.one_of(
    st.builds(lambda t, c, m: pb.ClientFrame(sub=pb.Sub(topic=t, channel=c, msg_timeout_ms=m)),
              names, names, st.integers(0, 2**32 - 1)),
    st.builds(lambda n: pb.ClientFrame(rdy=pb.Rdy(count=n)), st.integers(0, 2**32 - 1)),
    st.builds(lambda ids: pb.ClientFrame(fin=pb.Fin(ids=ids)),
              st.lists(st.text(max_size=17), max_size=50)),
    st.builds(lambda i, d: pb.ClientFrame(req=pb.Req(id=i, delay_ms=d)), st.text(max_size=17),
              st.integers(0, 2**32 - 1)),
    st.builds(lambda ids: pb.ClientFrame(touch=pb.Touch(ids=ids)),
              st.lists(st.text(max_size=17), max_size=5)),
    st.just(pb.ClientFrame(cls=pb.Cls())), st.just(pb.ClientFrame(nop=pb.Nop())),
    st.just(pb.ClientFrame()))


@FUZZ
@given(method=st.sampled_from(UNARY), request=st.binary(max_size=128),
       frames=st.lists(st.one_of(client_frames.map(lambda f: f.SerializeToString()),
                                 st.binary(max_size=64)), max_size=6))
def test_grpc_hostile_requests_get_a_status_that_names_the_fault(target, method, request,
                                                                   frames):
    INPUTS["grpc"] += 1
    unary = target.channel.unary_unary(f"/pynsq.v1.Broker/{method}")
    try:
        unary(request, timeout=5)
    except grpc.RpcError as err:
        assert err.code() not in BAD_CODES, (method, err.code(), err.details())
    stream = target.channel.stream_stream("/pynsq.v1.Broker/Subscribe")
    call = stream(iter(frames), timeout=2)
    try:
        for _ in call:
            pass
    except grpc.RpcError as err:
        assert err.code() not in BAD_CODES, (err.code(), err.details())
    target.check()


# -- slow senders ---------------------------------------------------------------------

SLOW_STARTS = {
    "http headers": ("http", b"POST /pub?topic=slow HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Le"),
    "http body": ("http", b"POST /pub?topic=slow HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                          b"Content-Length: 1000\r\n\r\nsome"),
    "tcp command": ("tcp", b"  V2PUB slow\n" + struct.pack(">i", 1000) + b"some"),
    "tcp line": ("tcp", b"  V2PUB slo"),
    "tcp auth": ("tcp", b"  V2AUTH\n" + struct.pack(">i", 64) + b"secr"),
    # A TLS ClientHello's first bytes, on listeners that speak no TLS here.
    "tls handshake": ("tcp", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03"),
    "tls on http": ("http", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03"),
}


@settings(FUZZ, max_examples=max(5, EXAMPLES // 30))
@example(kind="http body", count=MAX_PER_CLIENT + 50, cut=64)
@example(kind="tcp auth", count=MAX_PER_CLIENT + 50, cut=64)
@given(kind=st.sampled_from(sorted(SLOW_STARTS)), count=st.integers(1, MAX_PER_CLIENT + 50),
       cut=st.integers(0, 64))
def test_slow_senders_hold_no_more_than_the_caps_and_a_legitimate_client_is_served(
        target, kind, count, cut):
    INPUTS["slow"] += 1
    surface, start = SLOW_STARTS[kind]
    host, port = getattr(target, surface).rsplit(":", 1)
    socks = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.settimeout(5)
            sock.connect((host, int(port)))
            socks.append(sock)
            try:
                sock.sendall(start[:max(1, min(cut, len(start)))])
            except OSError:
                pass                            # refused over a cap, or answered at once
        held = target.fds() - target.base_fds
        target.peak_fds = max(target.peak_fds, target.fds())
        assert held <= MAX_PER_CLIENT + FDS_BOUND, f"{held} descriptors held for {count}"
        # Another client address is served meanwhile, on both listeners.
        legit = socket.socket()
        legit.bind(("127.0.0.2", 0))
        legit.settimeout(5)
        legit.connect(tuple((target.tcp.rsplit(":", 1)[0], int(target.tcp.rsplit(":", 1)[1]))))
        legit.sendall(b"  V2PUB legit\n" + struct.pack(">i", 2) + b"ok")
        assert read_frames(legit)[:1] == [(0, b"OK")]
        legit.close()
        target.check(open_here=len(socks))
    finally:
        for sock in socks:
            sock.close()
    target.check()
