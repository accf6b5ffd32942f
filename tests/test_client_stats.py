"""Who each client is, in /stats as nsqd shows it (and nsqadmin's client table reads):
``client_id``, ``hostname`` and ``user_agent`` from a TCP client's IDENTIFY (the peer's
host where it gives none), ``remote_address`` from the socket, ``version`` its protocol;
a gRPC subscriber's from its call's peer and metadata; TLS and auth as negotiated."""

from __future__ import annotations

import json
import re
import urllib.request

import pytest

from broker import Client, EmbeddedBroker

from .authserver import AuthServer, reply
from .helpers import free_port, wait_for
from .nsqkit import NsqProcess, nsq_binary
from .securitykit import Raw, make_certs


def clients(http_address: str, secret: str = "", topic: str = "events",
            channel: str = "work") -> list[dict]:
    request = urllib.request.Request(f"http://{http_address}/stats?format=json&topic={topic}")
    if secret:
        request.add_header("Authorization", f"Bearer {secret}")
    with urllib.request.urlopen(request, timeout=10) as response:
        stats = json.loads(response.read())
    for t in stats["topics"]:
        for c in t["channels"]:
            if t["topic_name"] == topic and c["channel_name"] == channel:
                return c["clients"]
    return []


def subscribed(address: str, **identify) -> Raw:
    """A TCP client that IDENTIFYs with ``identify`` and SUBs to events/work."""
    raw = Raw(address)
    raw.identify(**identify)
    raw.send("SUB events work")
    assert raw.frame() == (0, b"OK")
    return raw


def local_address(raw: Raw) -> str:
    host, port = raw.sock.getsockname()[:2]
    return f"{host}:{port}"


def the_client(http_address: str, remote_address: str, secret: str = "") -> dict:
    def found() -> dict | None:
        return next((k for k in clients(http_address, secret)
                     if k["remote_address"] == remote_address), None)
    wait_for(found, 30, message=f"client {remote_address} in /stats")
    return found()


def test_stats_shows_a_tcp_clients_identify_names_its_address_and_protocol(broker):
    named = subscribed(broker.tcp_address, client_id="worker-7", hostname="box-7",
                       user_agent="pynsq/0.13.0")
    anonymous = subscribed(broker.tcp_address)
    k = the_client(broker.http_address, local_address(named))
    assert (k["client_id"], k["hostname"], k["user_agent"]) == ("worker-7", "box-7",
                                                                "pynsq/0.13.0")
    assert (k["version"], k["state"], k["tls"]) == ("V2", 3, False)
    assert "authed" not in k           # as nsqd: left out until a client authenticates
    k = the_client(broker.http_address, local_address(anonymous))
    assert (k["client_id"], k["hostname"], k["user_agent"]) == ("127.0.0.1", "127.0.0.1", "")
    with urllib.request.urlopen(f"http://{broker.http_address}/stats", timeout=10) as response:
        text = response.read().decode()     # nsqd's text format lists clients the same way
    port = named.sock.getsockname()[1]
    assert f"[V2 box-7:{port} pynsq/0.13.0] state: 3 " in text
    named.sock.close()
    anonymous.sock.close()


def test_stats_shows_a_grpc_subscribers_peer_user_agent_and_protocol(broker, client):
    with client.subscribe("events", "work", rdy=1, client_id="spark-driver"):
        wait_for(lambda: clients(broker.http_address), 30, message="the subscriber in /stats")
        [k] = clients(broker.http_address)
    assert (k["client_id"], k["hostname"], k["version"]) == ("spark-driver", "127.0.0.1", "grpc")
    assert re.fullmatch(r"127\.0\.0\.1:\d+", k["remote_address"])
    assert k["user_agent"].startswith("grpc-python/")


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return make_certs(tmp_path_factory.mktemp("certs"))


def test_stats_shows_tls_and_auth_as_each_client_negotiated(certs):
    answer = dict(reply(subscribe=".*", identity="etl-team"),
                  identity_url="https://auth.example/etl-team")
    with AuthServer({"s3cret": answer}) as auth, \
            EmbeddedBroker(tls_cert=certs.server_cert, tls_key=certs.server_key,
                           auth_http_addresses=[auth.address]) as secure:
        raw = Raw(secure.tcp_address)
        raw.identify(tls_v1=True)
        raw.upgrade(certs.ca)
        raw.send("AUTH", b"s3cret")
        assert raw.frame()[0] == 0
        raw.send("SUB events work")
        assert raw.frame() == (0, b"OK")
        k = the_client(secure.http_address, local_address(raw), "s3cret")
        assert k["tls"] is True and re.fullmatch(r"TLS1\.[23]", k["tls_version"])
        assert k["tls_cipher_suite"]
        assert (k["authed"], k["auth_identity"], k["auth_identity_url"]) == (
            True, "etl-team", "https://auth.example/etl-team")
        with Client(secure.address, tls_ca=certs.ca, auth_secret="s3cret", timeout=10) as c, \
                c.subscribe("events", "work", rdy=1, client_id="over-grpc"):
            wait_for(lambda: len(clients(secure.http_address, "s3cret")) == 2, 30,
                     message="the gRPC subscriber in /stats")
            [g] = [k for k in clients(secure.http_address, "s3cret") if k["version"] == "grpc"]
        assert (g["client_id"], g["tls"], g["authed"]) == ("over-grpc", True, True)
        raw.sock.close()


def test_a_tcp_clients_stats_fields_are_nsqds(broker, tmp_path):
    tcp, http = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    nsqd = NsqProcess([nsq_binary("nsqd"), "--tcp-address", tcp, "--http-address", http,
                       "--data-path", str(tmp_path), "--log-level", "warn"],
                      f"http://{http}/ping")
    nsqd.start()
    try:
        got = {}
        for name, tcp_address, http_address in (("nsqd", tcp, http),
                                                 ("pynsqd", broker.tcp_address,
                                                  broker.http_address)):
            raw = subscribed(tcp_address, client_id="worker-7", hostname="box-7",
                             user_agent="pynsq/0.13.0")
            got[name] = the_client(http_address, local_address(raw))
            raw.sock.close()
    finally:
        nsqd.stop()
    assert list(got["pynsqd"]) == list(got["nsqd"])
    for key in ("client_id", "hostname", "version", "user_agent", "state", "ready_count",
                "tls", "tls_version", "sample_rate"):
        assert got["pynsqd"][key] == got["nsqd"][key], key
