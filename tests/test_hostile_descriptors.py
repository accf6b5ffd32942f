"""Hostile clients that hold descriptors: slow HTTP bodies, connection floods, and an
accept loop out of descriptors. The broker's descriptors stay under its open-file
limit, a reserve is kept for serving, and a legitimate client is served throughout.

The floods run against ``pynsqd`` as a subprocess with a hard ``nofile`` of 1,024,
its descriptors counted in /proc/PID/fd and its RSS in /proc/PID/status; the
timeouts against an embedded broker.
"""

from __future__ import annotations

import os
import resource
import socket
import struct
import subprocess
import time

import pytest

from broker import Client, EmbeddedBroker
from broker.server import admission
from broker.server.http import HttpApi

from .helpers import bin_path, free_port, rss, wait_for

NOFILE = 1024
SLOW_BODIES = 1100
ATTACKER = "127.0.0.2"       # Linux routes all of 127/8 to loopback


def fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def raise_own_nofile(needed: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < needed:
        if hard != resource.RLIM_INFINITY and hard < needed:
            pytest.skip(f"the test needs {needed} descriptors, the hard limit is {hard}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))


class LimitedDaemon:
    """pynsqd with ``nofile`` set hard to ``NOFILE``, its log in a file."""

    def __init__(self, tmp_path, *args: str) -> None:
        self.grpc, self.tcp, self.http = (f"127.0.0.1:{free_port()}" for _ in range(3))
        self.log_path = tmp_path / "pynsqd.log"
        self._log = open(self.log_path, "wb")

        def lower_nofile() -> None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (NOFILE, NOFILE))

        self.proc = subprocess.Popen(
            [bin_path("pynsqd"), "--grpc-address", self.grpc, "--tcp-address", self.tcp,
             "--http-address", self.http, *args],
            stdout=self._log, stderr=subprocess.STDOUT, preexec_fn=lower_nofile)
        with Client(self.grpc, timeout=1) as client:
            wait_for(lambda: self._answers(client), 30, 0.05, "pynsqd")

    def _answers(self, client: Client) -> bool:
        assert self.proc.poll() is None, self.log()
        try:
            return client.ping(timeout=1) == "OK"
        except Exception:
            return False

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)
        self._log.close()


def slow_body(address: str, source: str) -> socket.socket:
    """A POST /pub that promises 1,000 bytes and sends one."""
    host, port = address.rsplit(":", 1)
    sock = socket.socket()
    sock.bind((source, 0))
    sock.settimeout(5)
    sock.connect((host, int(port)))
    sock.sendall(f"POST /pub?topic=slow HTTP/1.1\r\nHost: {address}\r\n"
                 f"Content-Length: 1000\r\n\r\nx".encode())
    return sock


def tcp_pub(address: str, topic: str, body: bytes) -> bytes:
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(b"  V2" + f"PUB {topic}\n".encode() + struct.pack(">l", len(body)) + body)
        size, kind = struct.unpack(">ll", _read_exactly(sock, 8))
        return _read_exactly(sock, size - 4)


def _read_exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError(f"closed after {len(data)} of {n} bytes")
        data += chunk
    return data


def http_get(address: str, path: str) -> tuple[int, bytes]:
    import http.client
    host, port = address.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=5)
    try:
        conn.request("GET", path)
        answer = conn.getresponse()
        return answer.status, answer.read()
    finally:
        conn.close()


@pytest.fixture
def limited(tmp_path):
    raise_own_nofile(SLOW_BODIES + 512)
    d = LimitedDaemon(tmp_path)
    yield d
    d.kill()


def open_slow_bodies(address: str, source: str, n: int) -> list[socket.socket]:
    """``n`` slow bodies; a connection the broker refuses is closed by it."""
    socks = []
    for _ in range(n):
        try:
            socks.append(slow_body(address, source))
        except OSError:
            pass      # refused at once: the connection was closed under the client
    return socks


def test_a_legitimate_client_is_served_on_every_listener_while_1100_slow_bodies_are_open(
        limited):
    pid = limited.proc.pid
    base_fds, base_rss = fds(pid), rss(pid)
    socks = open_slow_bodies(limited.http, ATTACKER, SLOW_BODIES)
    try:
        held = fds(pid)
        # The broker holds what its per-client cap allows, and no more: under its limit,
        # with the reserve free.
        assert held < NOFILE - admission.MIN_RESERVE, held
        assert tcp_pub(limited.tcp, "legit", b"tcp") == b"OK"
        assert http_get(limited.http, "/ping") == (200, b"OK")
        with Client(limited.grpc, timeout=5) as client:
            client.publish("legit", b"grpc")
        print(f"\n{SLOW_BODIES} slow bodies: broker fds {base_fds} -> {held}, "
              f"RSS +{(rss(pid) - base_rss) >> 20} MB")
    finally:
        for sock in socks:
            sock.close()
    wait_for(lambda: fds(pid) < base_fds + 8, 10, 0.05, "their descriptors closed")
    log = limited.log()
    # One line says the refusals; the clients that left mid-body cost no traceback each.
    assert 1 <= log.count("connection(s) over the connection caps") <= 3
    assert "Traceback" not in log, log[-3000:]


def test_slow_bodies_from_many_addresses_stop_at_the_global_cap_and_grpc_is_served(limited):
    pid = limited.proc.pid
    socks = []
    try:
        for i in range(4):   # four addresses, each under the per-client cap
            socks += open_slow_bodies(limited.http, f"127.0.0.{2 + i}", SLOW_BODIES // 4)
        cap = admission.default_max_connections(NOFILE)
        # The broker accepts and closes those over its cap as it gets to them.
        wait_for(lambda: sum(_still_open(s) for s in socks) <= cap, 20, 0.1,
                 f"at most {cap} connections kept")
        assert fds(pid) < NOFILE - admission.MIN_RESERVE // 2
        with Client(limited.grpc, timeout=5) as client:
            client.publish("legit", b"grpc")
    finally:
        for sock in socks:
            sock.close()
    # Their places come back: a new client is served again.
    wait_for(lambda: _ping_ok(limited.http), 10, 0.1, "HTTP served again")


def _still_open(sock: socket.socket) -> bool:
    sock.setblocking(False)
    try:
        return sock.recv(1) != b""
    except BlockingIOError:
        return True
    except OSError:
        return False


def _ping_ok(address: str) -> bool:
    try:
        return http_get(address, "/ping") == (200, b"OK")
    except OSError:
        return False


def test_an_accept_loop_out_of_descriptors_backs_off_logs_once_and_serves_its_connections(
        tmp_path):
    """Descriptors taken by something other than the capped connections (here: caps
    set above the limit, so client connections take them all): accept fails with
    EMFILE, and the broker backs off instead of spinning or logging in a loop."""
    raise_own_nofile(SLOW_BODIES + 512)
    d = LimitedDaemon(tmp_path, "--max-connections", "100000",
                      "--max-connections-per-client", "100000")
    host, port = d.tcp.rsplit(":", 1)
    kept = socket.create_connection((host, int(port)), timeout=5)
    kept.sendall(b"  V2")
    socks = []
    try:
        socks = open_slow_bodies(d.http, ATTACKER, SLOW_BODIES)
        wait_for(lambda: "cannot accept connections" in d.log(), 10, 0.05, "EMFILE")
        assert fds(d.proc.pid) >= NOFILE - 8          # the broker is out of descriptors
        body = b"kept"
        kept.sendall(b"PUB legit\n" + struct.pack(">l", len(body)) + body)
        size, _ = struct.unpack(">ll", _read_exactly(kept, 8))
        assert _read_exactly(kept, size - 4) == b"OK"
        cpu, started = _cpu_seconds(d.proc.pid), time.monotonic()
        for _ in range(3):
            assert _ping_gets_no_answer(d.http)       # still out of descriptors
        # Backing off, not spinning: the broker is nearly idle (its CPU time, not the
        # clock's) while accept cannot succeed.
        spent, wall = _cpu_seconds(d.proc.pid) - cpu, time.monotonic() - started
        assert spent < wall / 4, (spent, wall)
    finally:
        for sock in socks:
            sock.close()
        kept.close()
    try:
        wait_for(lambda: _ping_ok(d.http), 10, 0.1, "HTTP served again")
        log = d.log()
        assert log.count("cannot accept connections") == 1, log[-3000:]
        assert "accepting connections again" in log
        print(f"\nout of descriptors: {spent:.2f} s of CPU in {wall:.2f} s")
    finally:
        d.kill()


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _ping_gets_no_answer(address: str) -> bool:
    host, port = address.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=0.5) as sock:
            sock.sendall(f"GET /ping HTTP/1.1\r\nHost: {address}\r\n\r\n".encode())
            return sock.recv(100) == b""
    except OSError:
        return True


def test_a_request_body_sent_slowly_gets_408_and_its_connection_closed(monkeypatch):
    monkeypatch.setattr(HttpApi, "body_timeout", 0.5)
    with EmbeddedBroker() as broker:
        address = broker.http_address
        sock = slow_body(address, "127.0.0.1")
        started = time.monotonic()
        answer = b""
        while True:
            chunk = sock.recv(4096)
            if not chunk:
                break
            answer += chunk
            sock.sendall(b"y")      # a byte now and then: never the whole body
        sock.close()
        assert answer.startswith(b"HTTP/1.1 408"), answer
        assert b"REQUEST_TIMEOUT" in answer
        assert time.monotonic() - started < 30
        assert _ping_ok(address)


def test_connections_over_the_per_client_cap_are_closed_and_others_served(monkeypatch):
    with EmbeddedBroker(max_connections=10, max_connections_per_client=3) as broker:
        host, port = broker.tcp_address.rsplit(":", 1)
        mine = [socket.create_connection((host, int(port)), timeout=5) for _ in range(3)]
        over = socket.socket()
        over.bind(("127.0.0.1", 0))
        over.settimeout(5)
        over.connect((host, int(port)))
        assert over.recv(1) == b""                   # closed by the broker
        other = socket.socket()
        other.bind((ATTACKER, 0))
        other.settimeout(5)
        other.connect((host, int(port)))
        other.sendall(b"  V2NOP\n")
        other.settimeout(0.3)
        with pytest.raises(TimeoutError):
            other.recv(1)                            # served: open, nothing to say
        for sock in mine + [over, other]:
            sock.close()
        # A closed connection gives its place back.
        wait_for(lambda: tcp_pub(broker.tcp_address, "t", b"x") == b"OK", 10, 0.05, "served")


def _grpc_connection(address: str) -> socket.socket | None:
    """A raw connection to the gRPC port: open (the server's HTTP/2 SETTINGS frame
    arrives) or None (closed by the server without a byte)."""
    host, port = address.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=5)
    if sock.recv(9) == b"":
        sock.close()
        return None
    return sock


@pytest.mark.parametrize("cap", [2, 3])
def test_grpc_connections_past_their_own_cap_are_closed_before_the_handshake(cap):
    """``--max-grpc-connections``, at its edge: the cap's connections are open, one more
    is closed at once, and a place given back serves a gRPC client again. The TCP
    gate's count is not gRPC's: TCP is served while gRPC is full."""
    with EmbeddedBroker(max_grpc_connections=cap, max_connections=1) as broker:
        held = [_grpc_connection(broker.address) for _ in range(cap)]
        assert all(held), f"{held.count(None)} of the first {cap} were closed"
        assert _grpc_connection(broker.address) is None
        assert tcp_pub(broker.tcp_address, "t", b"x") == b"OK"
        held.pop().close()

        def served() -> bool:
            with Client(broker.address, timeout=2) as client:
                try:
                    return client.ping(timeout=2) == "OK"
                except Exception:
                    return False
        wait_for(served, 10, 0.05, "a gRPC client in the place given back")
        for sock in held:
            sock.close()


def test_grpc_connections_default_to_the_tcp_and_http_cap():
    """0 (the default) is --max-connections' value, a count of its own."""
    with EmbeddedBroker(max_connections=2) as broker:
        held = [_grpc_connection(broker.address) for _ in range(2)]
        assert all(held)
        assert _grpc_connection(broker.address) is None
        for sock in held:
            sock.close()


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    from .securitykit import make_certs
    return make_certs(tmp_path_factory.mktemp("certs"))


# A TLS ClientHello's first bytes: a handshake begun and never finished.
HALF_HELLO = b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03"


def _closed_within(address: str, sent: bytes, seconds: float) -> bool:
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=seconds) as sock:
        sock.sendall(sent)
        try:
            while sock.recv(4096):
                pass
        except TimeoutError:
            return False
        except OSError:
            pass
    return True


@pytest.mark.parametrize("listener", ["https", "tcp upgrade", "grpc"])
def test_a_tls_or_http2_handshake_left_unfinished_is_closed_after_its_timeout(
        monkeypatch, certs, listener):
    from broker.server import grpc_server, http, tcp

    monkeypatch.setattr(http, "TLS_HANDSHAKE_TIMEOUT", 0.5)
    monkeypatch.setattr(tcp, "TLS_HANDSHAKE_TIMEOUT", 0.5)
    monkeypatch.setattr(grpc_server, "HANDSHAKE_TIMEOUT_MS", 500)
    with EmbeddedBroker(tls_cert=certs.server_cert, tls_key=certs.server_key,
                        https_address="127.0.0.1:0") as broker:
        if listener == "https":
            address, sent = broker.https_address, HALF_HELLO
        elif listener == "tcp upgrade":
            body = b'{"feature_negotiation": true, "tls_v1": true}'
            address = broker.tcp_address
            sent = b"  V2IDENTIFY\n" + struct.pack(">i", len(body)) + body + HALF_HELLO
        else:
            address, sent = broker.address, HALF_HELLO
        assert _closed_within(address, sent, 10)
        assert _ping_ok(broker.http_address)
