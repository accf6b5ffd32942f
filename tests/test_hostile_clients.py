"""Hostile clients: what one connection can make the broker hold is bounded, what
was read before a TLS upgrade never runs as the certificate holder, bad input of
any shape gets nsqd's error and one log line, and slow HTTP clients are timed out.

The memory attacks run against ``pynsqd`` as a subprocess, whose RSS is read from
/proc; the others against an embedded broker.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import struct
import time

import grpc
import pytest

from broker import Client, EmbeddedBroker
from broker.api import broker_pb2 as pb
from broker.api import broker_pb2_grpc as pb_grpc
from broker.options import split_listen_address
from broker.server.http import HttpApi

from .helpers import Daemon, free_port, rss, wait_for
from .securitykit import Raw, make_certs

# What one hostile connection may add to the broker's RSS (its budgets, see
# broker/server/limits.py, plus the allocator's slack) while it attacks.
RSS_GROWTH_BOUND = 32 << 20
ATTACK_SECONDS = 4.0


def start_daemon(*args: str) -> Daemon:
    """pynsqd as a subprocess, with its TCP address (``tcp_address``) on a known port."""
    tcp = f"127.0.0.1:{free_port()}"
    d = Daemon("--tcp-address", tcp, *args)
    d.tcp_address = tcp
    return d.wait_ready()


@pytest.fixture
def daemon():
    d = start_daemon()
    yield d
    d.kill()


def flood(sock: socket.socket, chunk: bytes, seconds: float, pid: int
          ) -> tuple[int, int, bool]:
    """Send ``chunk`` over and over for ``seconds``; returns the bytes sent, the
    broker's highest RSS growth seen, and whether the broker closed the connection."""
    sock.settimeout(0.5)
    base, peak, sent = rss(pid), 0, 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            sent += sock.send(chunk)
        except TimeoutError:
            pass                     # the broker has stopped reading: keep pushing
        except OSError:
            return sent, peak, True
        peak = max(peak, rss(pid) - base)
    return sent, peak, False


# -- the TLS upgrade ------------------------------------------------------------

@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return make_certs(tmp_path_factory.mktemp("certs"))


def test_plaintext_sent_along_with_the_tls_upgrade_is_discarded_not_run(certs):
    """An on-path attacker appends a PUB to a client's IDENTIFY; the client then
    upgrades with its certificate. The PUB must not run as that client."""
    with EmbeddedBroker(tls_cert=certs.server_cert, tls_key=certs.server_key,
                        tls_root_ca_file=certs.ca, tls_client_auth_policy="require-verify",
                        tls_required="true") as b:
        raw = Raw(b.tcp_address)
        identify = json.dumps({"feature_negotiation": True, "tls_v1": True}).encode()
        injected = b"PUB injected\n" + struct.pack(">i", 5) + b"owned"
        raw.sock.sendall(b"IDENTIFY\n" + struct.pack(">i", len(identify)) + identify
                         + injected + b"NOP\n" + injected)
        kind, data = raw.frame()
        assert kind == 0 and json.loads(data)["tls_v1"] is True
        raw.upgrade(certs.ca, certs.client_cert, certs.client_key)
        raw.send("PUB legit", b"mine")
        assert raw.frame() == (0, b"OK")      # the first answer after OK: the legit PUB's
        client = Client(b.address, tls_ca=certs.ca, tls_cert=certs.client_cert,
                        tls_key=certs.client_key, timeout=10)
        names = {t.name for t in client.stats().topics}
        client.close()
        assert "legit" in names and "injected" not in names


# -- memory budgets -------------------------------------------------------------

def subscribed_tcp(address: str) -> socket.socket:
    host, port = address.rsplit(":", 1)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((host, int(port)))
    sock.sendall(b"  V2SUB flood ch\nRDY 0\n")
    return sock


def test_a_tcp_fin_flood_that_never_reads_its_errors_stops_being_read(daemon):
    """FIN for ids it does not hold, error replies never read: the broker stops
    reading the client once its replies cannot be sent, so its RSS stays bounded."""
    sock = subscribed_tcp(daemon.tcp_address)
    fins = b"".join(b"FIN %016x\n" % i for i in range(4096))
    sent, growth, _ = flood(sock, fins, 1.5 * ATTACK_SECONDS, daemon.proc.pid)
    sock.close()
    assert growth < RSS_GROWTH_BOUND, f"RSS grew {growth >> 20} MiB ({sent >> 20} MiB sent)"
    assert Client(daemon.address, timeout=5).ping() == "OK"


def test_a_client_that_reads_none_of_its_replies_for_its_message_timeout_is_disconnected():
    d = start_daemon("--msg-timeout", "1s")
    try:
        sock = subscribed_tcp(d.tcp_address)
        fins = b"".join(b"FIN %016x\n" % i for i in range(4096))
        _, _, closed = flood(sock, fins, 3 * ATTACK_SECONDS, d.proc.pid)
        sock.close()
    finally:
        d.kill()
    assert closed, "the broker kept the connection of a client reading nothing"


def grpc_fin_flood(address: str, pid: int, seconds: float) -> tuple[int, int, str]:
    """A consumer stream sending FIN frames of 20,000 ids it does not hold, reading
    none of the replies, for ``seconds``; returns the frames sent, the broker's highest
    RSS growth seen, and how the call ended ("" while it was still open)."""
    ids = [f"{i:016x}" for i in range(20000)]

    async def attack() -> tuple[int, int, str]:
        async with grpc.aio.insecure_channel(address) as channel:
            call = pb_grpc.BrokerStub(channel).Subscribe()   # its replies are never read
            await call.write(pb.ClientFrame(sub=pb.Sub(topic="flood", channel="ch")))
            sent = 0

            async def write_forever() -> None:
                nonlocal sent
                while True:
                    await call.write(pb.ClientFrame(fin=pb.Fin(ids=ids)))
                    sent += 1

            writer = asyncio.ensure_future(write_forever())
            base, peak = rss(pid), 0
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline and not writer.done():
                peak = max(peak, rss(pid) - base)
                await asyncio.sleep(0.05)
            ended = ""
            if writer.done():
                ended = str(await call.code())
            writer.cancel()
            call.cancel()
            return sent, peak, ended

    return asyncio.run(attack())


def test_a_grpc_fin_flood_that_never_reads_its_errors_stops_being_read(daemon):
    """The same on a gRPC consumer stream: its replies wait in a bounded queue and
    the broker stops reading requests while they cannot be sent."""
    sent, peak, ended = grpc_fin_flood(daemon.address, daemon.proc.pid, ATTACK_SECONDS)
    assert not ended, f"the call ended: {ended}"
    assert peak < RSS_GROWTH_BOUND, f"RSS grew {peak >> 20} MiB ({sent} FIN frames sent)"


@pytest.fixture
def silent_auth_server():
    """An auth server that accepts connections and never answers."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    yield f"127.0.0.1:{sock.getsockname()[1]}"
    sock.close()


def test_input_sent_while_auth_is_pending_is_not_read(silent_auth_server):
    tcp = f"127.0.0.1:{free_port()}"
    d = Daemon("--tcp-address", tcp, "--auth-http-address", silent_auth_server,
               "--http-client-request-timeout", "30s").wait_ready()
    try:
        host, port = tcp.rsplit(":", 1)
        sock = socket.create_connection((host, int(port)))
        sock.sendall(b"  V2AUTH\n" + struct.pack(">i", 6) + b"secret")
        sent, growth, _ = flood(sock, b"x" * 65536, ATTACK_SECONDS, d.proc.pid)
        sock.close()
        assert growth < RSS_GROWTH_BOUND, f"RSS grew {growth >> 20} MiB ({sent >> 20} MiB sent)"
    finally:
        d.kill()


# -- bad input --------------------------------------------------------------------

def test_deeply_nested_identify_json_gets_e_bad_body_and_one_log_line(broker, caplog):
    raw = Raw(broker.tcp_address)
    caplog.set_level(logging.INFO)
    raw.send("IDENTIFY", b"[" * 100_000)
    assert raw.error_then_closed().startswith(b"E_BAD_BODY IDENTIFY failed to decode JSON")
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"


def test_a_malformed_http_request_gets_400_and_one_log_line_without_a_traceback(broker,
                                                                                caplog):
    caplog.set_level(logging.INFO)
    host, port = broker.http_address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"GET /ping HTTP/1.1\r\nHost: 127.0.0.1\r\nnot a header\r\n\r\n")
        status_line = sock.recv(4096).split(b"\r\n")[0]
    assert status_line.startswith(b"HTTP/1.") and b" 400 " in status_line, status_line
    wait_for(lambda: [r for r in caplog.records
                      if r.getMessage().startswith("HTTP client ") and "bad request (400)"
                      in r.getMessage()], 10, message="the bad request's log line")
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"
    with Client(broker.address) as client:
        assert client.ping() == "OK"


# -- HTTP timeouts ------------------------------------------------------------------

def closed_by_peer(sock: socket.socket) -> bool:
    try:
        return sock.recv(4096) == b""
    except (ConnectionError, OSError):
        return True


@pytest.mark.parametrize("sent", [b"GET /ping HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ",
                                  b"GET /ping HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"],
                         ids=["half-sent-headers", "idle-keep-alive"])
def test_http_connections_with_half_sent_headers_or_idle_are_closed(monkeypatch, sent):
    monkeypatch.setattr(HttpApi, "idle_timeout", 0.5)
    with EmbeddedBroker() as b:
        host, port = b.http_address.rsplit(":", 1)
        sock = socket.create_connection((host, int(port)), timeout=5)
        sock.sendall(sent)
        started = time.monotonic()
        if sent.endswith(b"\r\n\r\n"):
            assert sock.recv(4096).startswith(b"HTTP/1.1 200")
        assert closed_by_peer(sock)
        assert time.monotonic() - started < 4
        sock.close()


# -- IPv6 -----------------------------------------------------------------------------

def has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not has_ipv6_loopback(), reason="this machine has no IPv6 loopback")
def test_every_listener_binds_an_ipv6_address_in_brackets():
    with EmbeddedBroker(grpc_address="[::1]:0", tcp_address="[::1]:0",
                        http_address="[::1]:0") as b:
        for address in (b.address, b.tcp_address, b.http_address):
            assert address.startswith("[::1]:") and int(address.rpartition(":")[2]) > 0
        assert Client(b.address, timeout=5).ping() == "OK"
        port = int(b.tcp_address.rpartition(":")[2])
        with socket.create_connection(("::1", port), timeout=5) as sock:
            sock.sendall(b"  V2PUB v6\n" + struct.pack(">i", 2) + b"hi")
            assert sock.recv(64).endswith(b"OK")
        port = int(b.http_address.rpartition(":")[2])
        with socket.create_connection(("::1", port), timeout=5) as sock:
            sock.sendall(b"GET /ping HTTP/1.1\r\nHost: [::1]\r\nConnection: close\r\n\r\n")
            assert sock.recv(4096).startswith(b"HTTP/1.1 200")


@pytest.mark.parametrize("address, parsed", [
    ("127.0.0.1:4150", ("127.0.0.1", 4150)), ("[::]:4150", ("::", 4150)),
    ("[::1]:0", ("::1", 0)), (":4151", ("", 4151)), ("localhost:1", ("localhost", 1))])
def test_listen_addresses_are_host_port_or_ipv6_in_brackets(address, parsed):
    assert split_listen_address(address, "tcp-address") == parsed


@pytest.mark.parametrize("address", ["::1:4150", "[::1]", "host", "host:x", "host:70000",
                                     "[[::1]]:1"])
def test_a_bad_listen_address_is_refused_naming_the_option(address):
    with pytest.raises(ValueError, match="tcp-address: expected host:port"):
        split_listen_address(address, "tcp-address")


def test_pynsqd_refuses_an_ipv6_listen_address_without_brackets_naming_the_flag(capsys):
    from broker.daemon import main as pynsqd

    with pytest.raises(SystemExit):
        pynsqd(["--tcp-address", "::1:4150"])
    assert "(an IPv6 host in brackets: [::1]:4150)" in capsys.readouterr().err
