"""Secrets never leave the process: a client's secret, sent on every listener to auth
servers that fail in every way, appears in no log line (tracebacks included), no
error a client gets, and neither /stats nor /metrics."""

from __future__ import annotations

import json
import logging
import socket
import urllib.request
from urllib.parse import quote, quote_plus

import pytest

from broker import Client, ClientError, EmbeddedBroker

from .authserver import AuthServer, Huge, Redirect, reply
from .test_hostile_auth import read_frame, v2_auth

MARK = "CANARY-7f3a9c"
SECRET = f"{MARK} s/+&=%?#"          # encoded differently in a URL, a form and a header


def leaks(text: str) -> list[str]:
    return [form for form in (SECRET, quote(SECRET), quote_plus(SECRET), MARK)
            if form in text]


@pytest.fixture
def backlog_full():
    """An address whose connect times out: a listener that accepts nothing, its
    backlog filled."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(0)
    fillers = []
    for _ in range(4):
        f = socket.socket()
        f.setblocking(False)
        f.connect_ex(sock.getsockname())
        fillers.append(f)
    yield "127.0.0.1:%d" % sock.getsockname()[1]
    for f in fillers:
        f.close()
    sock.close()


@pytest.fixture
def silent():
    """An address that accepts and never answers."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    yield "127.0.0.1:%d" % sock.getsockname()[1]
    sock.close()


def closed_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return "127.0.0.1:%d" % s.getsockname()[1]


FAILURES = ["refused", "connect timeout", "silent", "500", "403", "not json", "huge",
            "bad regex"]


@pytest.mark.parametrize("method", ["get", "post"])
@pytest.mark.parametrize("failure", FAILURES)
def test_a_secret_sent_to_failing_auth_servers_appears_nowhere(failure, method, caplog,
                                                             backlog_full, silent):
    answers = {"500": 500, "not json": b"{not json", "huge": Huge(4 << 20),
               "bad regex": {"ttl": 1, "authorizations": [
                   {"topic": ".*", "channels": [SECRET + "("], "permissions": ["publish"]}]}}
    with AuthServer({}) as auth:
        if failure in answers:
            auth.secrets[SECRET] = answers[failure]
            address = auth.address
        elif failure == "403":
            address = auth.address           # a secret it does not know: refused
        else:
            address = {"refused": closed_port(), "connect timeout": backlog_full,
                       "silent": silent}[failure]
        seen = []
        caplog.set_level(logging.DEBUG)
        with EmbeddedBroker(auth_http_addresses=[address], auth_http_request_method=method,
                            http_client_connect_timeout="300ms",
                            http_client_request_timeout="1s") as broker:
            sock = v2_auth(broker.tcp_address, SECRET)
            seen.append(repr(read_frame(sock)))
            sock.close()
            with Client(broker.address, auth_secret=SECRET, timeout=10) as client:
                with pytest.raises(ClientError) as err:
                    client.publish("events", b"x")
                seen.append(repr(err.value) + str(err.value))
            request = urllib.request.Request(
                f"http://{broker.http_address}/pub?topic=events", data=b"x",
                headers={"Authorization": f"Bearer {SECRET}"})
            try:
                urllib.request.urlopen(request, timeout=10)
            except urllib.error.HTTPError as answer:
                seen.append(f"{answer.code} {answer.read()!r} {answer.headers}")
    log_text = "\n".join(
        r.getMessage() + (logging.Formatter().formatException(r.exc_info) if r.exc_info else "")
        for r in caplog.records)
    assert not leaks(log_text), [line for line in log_text.splitlines() if leaks(line)]
    assert not leaks("\n".join(seen)), seen


def test_stats_and_metrics_of_a_client_with_a_secret_show_no_secret():
    with AuthServer({SECRET: reply(publish=".*", subscribe=".*")}) as auth, \
            EmbeddedBroker(auth_http_addresses=[auth.address]) as broker:
        sock = v2_auth(broker.tcp_address, SECRET)
        assert read_frame(sock)[0] == 0
        sock.sendall(b"SUB events ch\n")
        assert read_frame(sock) == (0, b"OK")
        shown = []
        for path in ("/stats", "/stats?format=json", "/metrics"):
            request = urllib.request.Request(f"http://{broker.http_address}{path}",
                                             headers={"Authorization": f"Bearer {SECRET}"})
            with urllib.request.urlopen(request, timeout=10) as answer:
                shown.append(answer.read().decode())
        with Client(broker.address, auth_secret=SECRET, timeout=10) as client:
            shown.append(str(client.stats()))
        sock.close()
    assert "events" in shown[1]
    assert not leaks("\n".join(shown))


@pytest.mark.parametrize("method", ["get", "post"])
def test_an_auth_server_redirecting_elsewhere_does_not_send_the_secret_there(method):
    with AuthServer({SECRET: reply(publish=".*")}) as elsewhere, \
            AuthServer({SECRET: Redirect(f"http://{elsewhere.address}/auth")}) as auth, \
            EmbeddedBroker(auth_http_addresses=[auth.address],
                           auth_http_request_method=method) as broker:
        sock = v2_auth(broker.tcp_address, SECRET)
        assert read_frame(sock) == (1, b"E_AUTH_FAILED AUTH failed")
        sock.close()
        assert len(auth.queries) == 1 and elsewhere.queries == []
