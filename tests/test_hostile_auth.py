"""The auth server as a dependency: a slow one delays only the clients whose secrets it
is slow on, a garbage-answering one costs bounded memory and event-loop time, and an
answer's size, identity and authorizations are bounded."""

from __future__ import annotations

import json
import socket
import struct
import time

import pytest

from broker import EmbeddedBroker
from broker.security import auth as auth_module
from broker.security.auth import InvalidAuthReply, parse_reply

from .authserver import HOLD, AuthServer, Huge, reply
from .helpers import Daemon, free_port, rss, wait_for

ATTACKER = "127.0.0.2"


def v2_auth(address: str, secret: str, source: str = "127.0.0.1") -> socket.socket:
    host, port = address.rsplit(":", 1)
    sock = socket.socket()
    sock.bind((source, 0))
    sock.settimeout(30)
    sock.connect((host, int(port)))
    sock.sendall(b"  V2AUTH\n" + struct.pack(">i", len(secret)) + secret.encode())
    return sock


def read_frame(sock: socket.socket) -> tuple[int, bytes]:
    def exactly(n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = sock.recv(n - len(data))
            if not chunk:
                raise ConnectionError("closed")
            data += chunk
        return data

    size, kind = struct.unpack(">ii", exactly(8))
    return kind, exactly(size - 4)


@pytest.fixture
def slow_auth():
    with AuthServer({"slow": HOLD, "good": reply(publish=".*", identity="legit")}) as auth:
        yield auth
        auth.release()


def test_a_legitimate_auth_is_answered_at_once_while_150_slow_auths_are_pending(slow_auth):
    with EmbeddedBroker(auth_http_addresses=[slow_auth.address],
                        http_client_request_timeout="60s") as broker:
        slow = [v2_auth(broker.tcp_address, "slow", ATTACKER) for _ in range(150)]
        try:
            per_address = auth_module.MAX_PENDING_PER_ADDRESS
            # The address's pending bound: the rest are refused at once.
            for sock in slow[per_address:]:
                assert read_frame(sock) == (1, b"E_AUTH_FAILED AUTH failed")
            wait_for(lambda: len(slow_auth.queries) == per_address, 10, 0.01, "pending")
            started = time.monotonic()
            legit = v2_auth(broker.tcp_address, "good")
            kind, data = read_frame(legit)
            took = time.monotonic() - started
            legit.close()
            assert kind == 0 and json.loads(data)["identity"] == "legit"
            assert len(slow_auth.queries) == per_address + 1   # the slow ones still wait
            print(f"\nlegitimate AUTH with 150 slow AUTHs pending: {took:.3f} s (wall)")
            slow_auth.release()
            for sock in slow[:per_address]:
                assert read_frame(sock)[0] == 0
        finally:
            for sock in slow:
                sock.close()


def test_slow_auths_from_many_addresses_below_the_pool_leave_a_turn_for_others(slow_auth):
    """Waiting for a turn is not the connect timeout: with aiohttp's pool of 100 and its
    connect timeout counting the wait, the 101st AUTH failed after 2 s."""
    with EmbeddedBroker(auth_http_addresses=[slow_auth.address],
                        http_client_connect_timeout="500ms",
                        http_client_request_timeout="60s") as broker:
        # 150 from six addresses, each under its pending bound.
        addresses = [f"127.0.0.{i}" for i in range(2, 8)]
        slow = [v2_auth(broker.tcp_address, "slow", a) for a in addresses for _ in range(25)]
        try:
            wait_for(lambda: len(slow_auth.queries) >= 100, 10, 0.01, "pending")
            legit = v2_auth(broker.tcp_address, "good")
            kind, data = read_frame(legit)
            legit.close()
            assert kind == 0, data
        finally:
            slow_auth.release()
            for sock in slow:
                sock.close()


def test_an_answer_over_its_size_is_refused_reading_no_further_and_others_are_served():
    with AuthServer({"huge": Huge(100 << 20), "good": reply(publish=".*")}) as auth, \
            EmbeddedBroker(auth_http_addresses=[auth.address]) as broker:
        sock = v2_auth(broker.tcp_address, "huge")
        assert read_frame(sock) == (1, b"E_AUTH_FAILED AUTH failed")
        sock.close()
        # The broker stopped reading: far less than the answer was ever sent.
        assert auth.sent < 16 << 20
        legit = v2_auth(broker.tcp_address, "good")
        assert read_frame(legit)[0] == 0
        legit.close()


def test_a_100mb_answer_costs_the_broker_bounded_memory():
    with AuthServer({"huge": Huge(100 << 20)}) as auth:
        tcp = f"127.0.0.1:{free_port()}"
        d = Daemon("--tcp-address", tcp, "--auth-http-address", auth.address).wait_ready()
        try:
            base = rss(d.proc.pid)
            sock = v2_auth(tcp, "huge")
            assert read_frame(sock) == (1, b"E_AUTH_FAILED AUTH failed")
            sock.close()
            growth = rss(d.proc.pid) - base
            assert growth < 16 << 20, f"RSS +{growth >> 20} MB"
            print(f"\n100 MB auth answer: RSS +{growth >> 20} MB, {auth.sent >> 20} MB sent")
        finally:
            d.kill()


@pytest.mark.parametrize("doc, problem", [
    ({"ttl": 1, "identity": "x" * (auth_module.MAX_IDENTITY_LENGTH + 1)}, "identity of"),
    ({"ttl": 1, "identity_url": "x" * (auth_module.MAX_IDENTITY_LENGTH + 1)},
     "identity_url of"),
    ({"ttl": 1, "authorizations": [{"topic": "a", "channels": [], "permissions": []}]
      * (auth_module.MAX_AUTHORIZATIONS + 1)}, "authorizations, over"),
    ({"ttl": 1, "authorizations": [{"topic": "a", "channels": ["b"] * 1000,
                                    "permissions": []}] * 5}, "regexes, over"),
    ({"ttl": 1, "identity": "y" * (auth_module.MAX_REPLY_BYTES)}, "bytes"),
    ({"ttl": 1, "authorizations": {"topic": "a"}}, "not a list"),
])
def test_an_answer_over_a_bound_is_refused_naming_it(doc, problem):
    with pytest.raises(InvalidAuthReply, match=problem):
        parse_reply(json.dumps(doc).encode(), 0.0)


def test_an_answer_at_every_bound_is_taken():
    doc = {"ttl": 1, "identity": "x" * auth_module.MAX_IDENTITY_LENGTH,
           "authorizations": [{"topic": "a", "channels": ["b"] * 3, "permissions": ["publish"]}]
           * auth_module.MAX_AUTHORIZATIONS}
    state = parse_reply(json.dumps(doc).encode(), 0.0)
    assert len(state.authorizations) == auth_module.MAX_AUTHORIZATIONS
