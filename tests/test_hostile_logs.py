"""Logs are the operator's: every string a client sends that reaches a log line or
/stats text (IDENTIFY's client_id, hostname and user_agent, gRPC client ids, names in
errors, HTTP request lines) is escaped, so one client string is part of one line and
cannot forge a line of the broker's own."""

from __future__ import annotations

import json
import logging
import queue
import socket
import struct
import urllib.request

import grpc
import pytest

from broker import EmbeddedBroker
from broker.api import broker_pb2 as pb
from broker.api import broker_pb2_grpc as pb_grpc
from broker.security.printable import printable

from .helpers import wait_for

FORGED = "FORGED-LINE"
# What a client appends to its strings to forge lines, a terminal's view or the text's
# direction: newlines of every kind, a carriage return, ANSI and bidi controls.
FORGE = (f"x\n[pynsqd] 2026-01-01 00:00:00,000 WARNING: {FORGED} a\r\n"
         f"[pynsqd] 2026-01-01 00:00:01,000 ERROR: {FORGED} b\x1b[2K\x0b\x0c\x85\u2028\u2029"
         f"\u202e{FORGED} c")
LINE_BREAKERS = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029\x1b\u202e"


def _frame(sock: socket.socket) -> tuple[int, bytes]:
    head = b""
    while len(head) < 8:
        head += sock.recv(8 - len(head))
    size, kind = struct.unpack(">ii", head)
    data = b""
    while len(data) < size - 4:
        data += sock.recv(size - 4 - len(data))
    return kind, data


def _command(sock: socket.socket, line: bytes, body: bytes | None = None) -> None:
    sock.sendall(line + b"\n" + (b"" if body is None else struct.pack(">i", len(body)) + body))


@pytest.fixture
def logged(caplog):
    caplog.set_level(logging.DEBUG)
    return caplog


def forged_lines(records) -> list[str]:
    """The messages that carry the forge with a character that breaks or rewrites a
    line (a record's traceback is apart, and the broker's own)."""
    return [r.getMessage() for r in records
            if FORGED in r.getMessage() and any(c in r.getMessage() for c in LINE_BREAKERS)]


def test_identify_strings_and_names_in_errors_are_escaped_in_the_log_and_stats_text(logged):
    with EmbeddedBroker() as broker:
        host, port = broker.tcp_address.rsplit(":", 1)
        sub = socket.create_connection((host, int(port)), timeout=10)
        sub.sendall(b"  V2")
        _command(sub, b"IDENTIFY", json.dumps({"client_id": FORGE, "hostname": FORGE,
                                               "user_agent": FORGE}).encode())
        assert _frame(sub) == (0, b"OK")
        _command(sub, b"SUB events ch")
        assert _frame(sub) == (0, b"OK")
        with urllib.request.urlopen(f"http://{broker.http_address}/stats", timeout=10) as a:
            stats = a.read().decode()
        # A name the client sends in a command line, refused and logged.
        bad = socket.create_connection((host, int(port)), timeout=10)
        bad.sendall(b"  V2")
        _command(bad, b"PUB " + FORGE.replace("\n", "\r").encode(), b"x")
        assert _frame(bad)[0] == 1
        bad.close()
        sub.close()
        wait_for(lambda: any("gone" in r.getMessage() for r in logged.records), 10)
    assert sum(FORGED in r.getMessage() for r in logged.records) >= 3
    assert forged_lines(logged.records) == []
    assert FORGED in stats
    lines = stats.splitlines()
    assert not [line for line in lines if FORGED in line and
                any(c in line for c in LINE_BREAKERS)]
    assert not [line for line in lines if line.startswith("[pynsqd]")]


def test_grpc_client_ids_are_escaped_in_the_log(logged):
    with EmbeddedBroker() as broker, grpc.insecure_channel(broker.address) as channel:
        stub = pb_grpc.BrokerStub(channel)
        frames: queue.Queue = queue.Queue()
        frames.put(pb.ClientFrame(sub=pb.Sub(topic="events", channel="ch", client_id=FORGE)))
        stream = stub.Subscribe(iter(frames.get, None))
        assert next(stream).HasField("subscribed")
        session = stub.OpenLeaseSession(pb.LeaseSessionRequest(client_id=FORGE))
        next(session)
        session.cancel()
        frames.put(None)
        stream.cancel()
        wait_for(lambda: sum(FORGED in r.getMessage() for r in logged.records) >= 2, 10)
    assert forged_lines(logged.records) == []


@pytest.mark.parametrize("request_line", [
    f"GET /\x1b[2K\r{FORGED}\x85 HTTP/1.1",     # a bad path
    f"G\x1b{FORGED}\rT / HTTP/1.1",               # a bad method
])
def test_a_malformed_http_request_line_is_one_escaped_log_line(logged, request_line):
    with EmbeddedBroker() as broker:
        host, port = broker.http_address.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(f"{request_line}\r\nHost: {host}\r\n\r\n".encode("latin-1"))
            assert sock.recv(4096).split(b"\r\n")[0].endswith(b" 400 Bad Request")
        wait_for(lambda: any("bad request" in r.getMessage() for r in logged.records), 10)
    assert forged_lines(logged.records) == []
    assert not [r for r in logged.records if r.name.startswith("aiohttp") and r.exc_info]


@pytest.mark.parametrize("text, shown", [
    ("plain name-1.2_x", "plain name-1.2_x"),
    ("a\nb", "a\\x0ab"),
    ("tab\there", "tab\\x09here"),
    ("back\\slash", "back\\\\slash"),
    ("\x1b[31mred", "\\x1b[31mred"),
    ("caf\u00e9 \u65e5\u672c", "caf\u00e9 \u65e5\u672c"),
    ("\u2028\u202e\x85", "\\u2028\\u202e\\x85"),
])
def test_printable_escapes_what_breaks_or_rewrites_a_line_and_keeps_the_rest(text, shown):
    assert printable(text) == shown


def test_printable_cuts_a_long_string_saying_how_much():
    assert printable("y" * 300, 10) == "yyyyyyyyyy...(290 more)"
