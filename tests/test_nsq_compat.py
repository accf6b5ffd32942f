"""NSQ wire compatibility: NSQ's own clients (pynsq, gnsq), raw sockets for every
error code, nsqd's HTTP API, and messages crossing between gRPC, TCP and HTTP."""

from __future__ import annotations

from http.client import HTTPConnection
import json
import socket
import struct
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from broker import Client, EmbeddedBroker
from broker.server import tcp

from .helpers import wait_for

CLIENTS = Path(__file__).parent / "clients"


def run_client(script: str, *args: str, timeout: float = 90) -> object:
    result = subprocess.run([sys.executable, str(CLIENTS / script), *args], capture_output=True,
                            text=True, timeout=timeout)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


# -- NSQ's own clients ------------------------------------------------------

def test_pynsq_writer_pub_mpub_dpub_reach_a_grpc_consumer(broker, client):
    client.admin("channel", "create", "t", "grpc")
    assert run_client("pynsq_client.py", "publish", broker.tcp_address, "t") == ["OK"] * 3
    with client.subscribe("t", "grpc", rdy=10) as sub:
        bodies = [sub.get(10).body for _ in range(4)]
    assert sorted(bodies) == [b"four", b"one", b"three", b"two"]


def test_pynsq_reader_consumes_with_max_in_flight_fin_req_touch(broker, client):
    client.admin("channel", "create", "t", "reader")
    ids = client.multi_publish("t", [f"m-{i}".encode() for i in range(20)]
                               + [b"requeue-me", b"touch-me"])
    seen = run_client("pynsq_client.py", "consume", broker.tcp_address, "t", "reader", "22")
    assert {m["id"] for m in seen} == set(ids)
    assert {m["body"]: m["attempts"] for m in seen}["requeue-me"] == 2
    wait_for(lambda: client.stats("t").topics[0].channels[0].finish_count == 22, 10,
             message="22 FINs")
    assert client.stats("t").topics[0].channels[0].requeue_count == 1


def test_gnsq_producer_consumer_and_http_client(broker, client):
    client.admin("channel", "create", "g", "grpc")
    assert run_client("gnsq_client.py", "produce", broker.tcp_address, "g") == "ok"
    http = run_client("gnsq_client.py", "http", broker.http_address, "g")
    assert http["ping"] == "OK"
    seen = run_client("gnsq_client.py", "consume", broker.tcp_address, "g", "gnsq", "6")
    bodies = {m["body"] for m in seen}
    assert {"h-one", "h-two", "h-three", "h-four", "h-five"} <= bodies
    with client.subscribe("g", "grpc", rdy=20) as sub:
        got = {sub.get(10).body for _ in range(10)}
    assert got == {b"g-one", b"g-two", b"g-three", b"g-deferred", b"h-one", b"h-two",
                   b"h-three", b"h-four", b"h-five", b"h-deferred"}


# -- raw sockets --------------------------------------------------------------

class Raw:
    """A hand-written V2 client: send commands, read frames."""

    def __init__(self, address: str, magic: bytes = b"  V2") -> None:
        host, port = address.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=10)
        self.sock.sendall(magic)
        self.buf = b""

    def send(self, line: str, body: bytes | None = None) -> None:
        data = line.encode() + b"\n"
        if body is not None:
            data += struct.pack(">i", len(body)) + body
        self.sock.sendall(data)

    def frame(self) -> tuple[int, bytes]:
        while len(self.buf) < 4 or len(self.buf) < 4 + struct.unpack(">i", self.buf[:4])[0]:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("closed")
            self.buf += chunk
        size = struct.unpack(">i", self.buf[:4])[0]
        kind, data = struct.unpack(">i", self.buf[4:8])[0], self.buf[8:4 + size]
        self.buf = self.buf[4 + size:]
        return kind, data

    def closed(self) -> bool:
        """True when the broker closed the connection (a real EOF or reset); a
        socket timeout is not a close and fails the test."""
        try:
            self.frame()
        except ConnectionError:
            return True
        return False

    def frames_until_closed(self) -> list[tuple[int, bytes]]:
        """Every frame up to the broker's close; a timeout (never closed) fails."""
        frames = []
        while True:
            try:
                frames.append(self.frame())
            except ConnectionError:
                return frames


def mpub_body(*bodies: bytes) -> bytes:
    return struct.pack(">i", len(bodies)) + b"".join(struct.pack(">i", len(b)) + b
                                                     for b in bodies)


@pytest.mark.parametrize("commands, code", [
    ([("SUB bad!topic ch", None)], b"E_BAD_TOPIC"),
    ([("SUB t bad!channel", None)], b"E_BAD_CHANNEL"),
    ([("PUB bad!topic", b"x")], b"E_BAD_TOPIC"),
    ([("PUB t", b"")], b"E_BAD_MESSAGE"),
    ([("PUB t", b"x" * (1024 * 1024 + 1))], b"E_BAD_MESSAGE"),
    ([("MPUB t", b"")], b"E_BAD_BODY MPUB invalid body size 0"),
    ([("MPUB bad!topic", mpub_body(b"x"))], b"E_BAD_TOPIC MPUB invalid topic name 'bad!topic'"),
    ([("MPUB", None)], b"E_INVALID MPUB insufficient number of parameters"),
    ([("MPUB t", mpub_body(b"ok", b""))], b"E_BAD_MESSAGE"),
    ([("PUB", None)], b"E_INVALID"),
    ([("", None)], b"E_INVALID"),
    ([("MPUB t", struct.pack(">i", 0))], b"E_BAD_BODY"),
    ([("DPUB t 99999999999", b"x")], b"E_INVALID"),
    ([("SUB t ch", None), ("RDY 100000", None)], b"E_INVALID"),
    ([("SUB t ch", None), ("SUB t ch", None)], b"E_INVALID"),
    ([("RDY 1", None)], b"E_INVALID"),
    ([("IDENTIFY", b"not json")], b"E_BAD_BODY IDENTIFY failed to decode JSON body"),
    ([("IDENTIFY", b"[]")], b"E_BAD_BODY IDENTIFY failed to decode JSON body: not an object"),
    ([("IDENTIFY", b"[" * 100_000)],
     b"E_BAD_BODY IDENTIFY failed to decode JSON body: nested too deeply"),
    ([("IDENTIFY", b'{"heartbeat_interval": "soon"}')],
     b"E_BAD_BODY IDENTIFY failed to decode JSON body: heartbeat_interval is not an integer"),
    ([("IDENTIFY", b'{"msg_timeout": 5}')], b"E_BAD_BODY"),
    ([("EXPLODE", None)], b"E_INVALID"),
    ([("AUTH", b"secret")], b"E_AUTH_DISABLED"),
])
def test_fatal_errors_send_nsqds_code_and_close(broker, commands, code):
    raw = Raw(broker.tcp_address)
    for line, body in commands:
        raw.send(line, body)
    frames = raw.frames_until_closed()
    assert frames[-1][0] == 1 and frames[-1][1].startswith(code)


@pytest.mark.parametrize("commands, error", [
    (["SUB t ch", "RDY many"], b"E_INVALID RDY could not parse count many"),
    (["SUB t ch", "REQ 0123456789abcdef soon"], b"E_INVALID REQ could not parse timeout soon"),
    (["DPUB t later"], b"E_INVALID DPUB could not parse timeout later"),
])
def test_a_number_that_does_not_parse_is_refused_naming_the_command_and_the_text(
        broker, commands, error):
    raw = Raw(broker.tcp_address)
    for line in commands:
        raw.send(line)
    assert raw.frames_until_closed()[-1] == (1, error)


def test_a_client_still_sending_when_refused_reads_the_error_not_a_reset(broker):
    """A body far over the limit is refused on its size, while the client is still
    sending it: the broker reads and drops the rest, so the client's send completes and
    it reads the error, then the close. (Closing at once resets the connection: the
    send fails with EPIPE and the error is lost.)"""
    raw = Raw(broker.tcp_address)
    raw.send("PUB t", b"x" * (16 * 1024 * 1024))
    frames = raw.frames_until_closed()
    assert frames == [(1, b"E_BAD_MESSAGE PUB message too big 16777216 > 1048576")]


def test_a_client_that_never_closes_after_an_error_is_closed_when_the_linger_ends(
        broker, monkeypatch):
    """The broker's half-close waits for the client only so long: then the socket is
    closed, and what the client sends next is refused (a reset)."""
    monkeypatch.setattr(tcp, "LINGER", 0.3)
    raw = Raw(broker.tcp_address)
    raw.send("EXPLODE")
    assert raw.frames_until_closed() == [(1, b"E_INVALID invalid command EXPLODE")]

    def refused() -> bool:
        try:
            raw.sock.sendall(b"NOP\n")
        except (BrokenPipeError, ConnectionResetError):
            return True
        return False

    wait_for(refused, 10, interval=0.05, message="the broker to close the socket")


@pytest.mark.parametrize("data, code", [
    (b"PUB t\n\x00\x00", b"E_BAD_MESSAGE PUB failed to read message body size"),
    (b"PUB t\n\x00\x00\x00\x05abc", b"E_BAD_MESSAGE PUB failed to read message body"),
    (b"MPUB t\n\x00\x00", b"E_BAD_BODY MPUB failed to read body size"),
    (b"MPUB t\n\x00\x00\x00\x08\x00\x00", b"E_BAD_BODY MPUB failed to read message count"),
    (b"MPUB t\n\x00\x00\x00\x0c\x00\x00\x00\x02\x00\x00\x00\x01x",
     b"E_BAD_MESSAGE MPUB failed to read message(1) body size"),
    (b"IDENTIFY\n\x00\x00\x00\x09{}", b"E_BAD_BODY IDENTIFY failed to read body"),
])
def test_a_command_cut_short_by_the_client_closing_gets_nsqds_error(broker, data, code):
    raw = Raw(broker.tcp_address)
    raw.sock.sendall(data)
    raw.sock.shutdown(socket.SHUT_WR)
    assert raw.frames_until_closed() == [(1, code)]


def test_an_mpub_over_max_body_size_is_refused_before_its_body_arrives(broker, client):
    raw = Raw(broker.tcp_address)
    raw.sock.sendall(b"MPUB t\n" + struct.pack(">i", 5 * 1024 * 1024 + 1))
    assert raw.frames_until_closed() == [(1, b"E_BAD_BODY MPUB body too big 5242881 > 5242880")]
    assert client.ping() == "OK"


def test_publishes_pipelined_in_one_write_are_each_accepted_past_max_body_size_in_all():
    """--max-body-size bounds one command, not what a client pipelines: PUBs sent in one
    write, more bytes in all than the limit and the last cut short by the write's end,
    are each published once the rest of the last one comes."""
    body = b"x" * 1000
    pub = b"PUB t\n" + struct.pack(">i", len(body)) + body
    with EmbeddedBroker(max_body_size=4096, max_msg_size=1024) as broker, \
            Client(broker.address) as client:
        raw = Raw(broker.tcp_address)
        raw.sock.sendall(pub * 30 + pub[:500])
        assert [raw.frame() for _ in range(30)] == [(0, b"OK")] * 30
        raw.sock.sendall(pub[500:])
        assert raw.frame() == (0, b"OK")
        assert client.stats("t").topics[0].message_count == 31


@pytest.mark.parametrize("line, body", [
    ("PUB t", b"x" * 2000),
    ("DPUB t 1000", b"x" * 2000),
    ("MPUB t", mpub_body(b"x" * 600, b"y" * 600)),
])
def test_a_publish_the_broker_cannot_hold_gets_nsqds_failed_code_naming_its_command(
        line, body):
    command = line.split()[0].encode()
    with EmbeddedBroker(max_memory_bytes=1000) as broker, Client(broker.address) as client:
        raw = Raw(broker.tcp_address)
        raw.send(line, body)
        kind, error = raw.frame()
        assert kind == 1 and error.startswith(b"E_%s_FAILED %s failed " % (command, command))
        assert b"max-memory-bytes" in error
        assert client.stats("t").topics[0].message_count == 0


def test_a_partial_command_line_at_close_gets_no_answer_as_in_nsqd(broker):
    raw = Raw(broker.tcp_address)
    raw.sock.sendall(b"PUB t")
    raw.sock.shutdown(socket.SHUT_WR)
    assert raw.frames_until_closed() == []


def test_fin_req_touch_failures_are_reported_and_the_connection_stays(broker, client):
    raw = Raw(broker.tcp_address)
    raw.send("SUB t ch")
    assert raw.frame() == (0, b"OK")
    for line, code in (("FIN 0123456789abcdef", b"E_FIN_FAILED"),
                       ("REQ 0123456789abcdef 0", b"E_REQ_FAILED"),
                       ("TOUCH 0123456789abcdef", b"E_TOUCH_FAILED")):
        raw.send(line)
        kind, data = raw.frame()
        assert kind == 1 and data.startswith(code)
    raw.send("PUB t", b"still here")
    assert raw.frame() == (0, b"OK")


def test_fins_sent_in_one_write_finish_each_held_message_and_report_each_other_one(
        broker, client):
    ids = client.multi_publish("t", [b"a", b"b", b"c", b"d", b"e"])
    raw = Raw(broker.tcp_address)
    raw.send("SUB t ch")
    assert raw.frame() == (0, b"OK")
    raw.send("RDY 3")
    held = [raw.frame()[1][10:26].decode() for _ in range(3)]
    assert held == ids[:3]
    unknown = "00000000000000ff"
    lines = [held[0], unknown, held[1], held[1], held[2]]
    raw.sock.sendall(b"".join(f"FIN {i}\n".encode() for i in lines))
    frames = [raw.frame() for _ in range(4)]
    errors = [data for kind, data in frames if kind == 1]
    assert [e.split()[0] for e in errors] == [b"E_FIN_FAILED", b"E_FIN_FAILED"]
    assert unknown.encode() in errors[0] and held[1].encode() in errors[1]
    # The FINs freed the consumer's RDY: the other two messages came, and nothing else.
    assert sorted(data[10:26].decode() for kind, data in frames if kind == 2) == ids[3:]
    channel = client.stats("t").topics[0].channels[0]
    assert (channel.finish_count, channel.in_flight_count) == (3, 2)


def test_fins_and_the_commands_after_them_in_one_write_each_run(broker, client):
    """FIN lines read at once take a path of their own: what follows them in the same
    read (a REQ, a RDY, a FIN cut in two by the write) runs as well, in order."""
    ids = client.multi_publish("t", [b"a", b"b", b"c"])
    raw = Raw(broker.tcp_address)
    raw.send("SUB t ch")
    assert raw.frame() == (0, b"OK")
    raw.send("RDY 3")
    held = [raw.frame()[1][10:26].decode() for _ in range(3)]
    assert held == ids
    raw.sock.sendall(f"FIN {held[0]}\nRDY 0\nREQ {held[1]} 0\nRDY 2\nFIN {held[2][:5]}"
                     .encode())
    kind, data = raw.frame()   # REQ put it back, RDY 2 had it sent again
    assert (kind, data[10:26].decode(), struct.unpack(">H", data[8:10])[0]) == (2, held[1], 2)
    raw.sock.sendall(f"{held[2][5:]}\nFIN {held[1]}\n".encode())
    raw.send("NOP")
    channel = wait_for(lambda: (c := client.stats("t").topics[0].channels[0]).finish_count == 3
                       and c)
    assert (channel.requeue_count, channel.in_flight_count, channel.depth) == (1, 0, 0)


def test_req_delay_over_max_req_timeout_is_clamped_as_in_nsqd():
    with EmbeddedBroker(max_req_timeout="2s") as broker, Client(broker.address) as client:
        client.admin("channel", "create", "t", "ch")
        client.publish("t", b"x")
        raw = Raw(broker.tcp_address)
        raw.send("SUB t ch")
        raw.frame()
        raw.send("RDY 1")
        kind, data = raw.frame()
        msg_id = data[10:26].decode()
        raw.send(f"REQ {msg_id} 99999999999")
        raw.send("PUB other", b"connection still open")
        assert raw.frame() == (0, b"OK")
        channel = client.stats("t").topics[0].channels[0]
        assert (channel.requeue_count, channel.deferred_count) == (1, 1)
        # Clamped to 2 s, not 3 years: it comes back.
        kind, data = raw.frame()
        assert (kind, data[10:26].decode()) == (2, msg_id)


def test_garbage_gets_bad_protocol_and_others_keep_working(broker, client):
    garbage = Raw(broker.tcp_address, magic=b"GET / HTTP/1.1\r\n\r\n")
    assert garbage.frame() == (1, b"E_BAD_PROTOCOL")
    assert garbage.closed()
    good = Raw(broker.tcp_address)
    good.send("PUB t", b"fine")
    assert good.frame() == (0, b"OK")
    assert client.ping() == "OK"


def test_a_raw_consumer_gets_nsqs_message_layout_and_cls_gets_close_wait(broker, client):
    msg_id = client.publish("t", b"payload")
    raw = Raw(broker.tcp_address)
    raw.send("IDENTIFY", json.dumps({"feature_negotiation": True, "msg_timeout": 5000}).encode())
    kind, data = raw.frame()
    negotiated = json.loads(data)
    assert (negotiated["msg_timeout"], negotiated["tls_v1"], negotiated["snappy"],
            negotiated["deflate"], negotiated["max_rdy_count"]) == (5000, False, False, False,
                                                                    2500)
    raw.send("SUB t ch")
    assert raw.frame() == (0, b"OK")
    raw.send("RDY 5")
    kind, data = raw.frame()
    timestamp, attempts = struct.unpack(">qH", data[:10])
    assert kind == 2 and attempts == 1 and timestamp > 0
    assert data[10:26].decode() == msg_id and data[26:] == b"payload"
    raw.send(f"FIN {msg_id}")
    raw.send("CLS")
    assert raw.frame() == (0, b"CLOSE_WAIT")
    wait_for(lambda: client.stats("t").topics[0].channels[0].finish_count == 1, 10,
             message="FIN")


def test_sample_rate_is_ignored_and_every_message_is_delivered(broker, client):
    ids = client.multi_publish("t", [b"m%d" % i for i in range(50)])
    raw = Raw(broker.tcp_address)
    raw.send("IDENTIFY", json.dumps({"feature_negotiation": True, "sample_rate": 1}).encode())
    assert raw.frame()[0] == 0
    raw.send("SUB t ch")
    assert raw.frame() == (0, b"OK")
    raw.send("RDY 50")
    frames = [raw.frame() for _ in ids]
    assert {kind for kind, _ in frames} == {2}
    assert sorted(data[10:26].decode() for _, data in frames) == sorted(ids)


def test_heartbeats_are_sent_and_answered_with_nop(broker):
    raw = Raw(broker.tcp_address)
    raw.send("IDENTIFY", json.dumps({"heartbeat_interval": 1000}).encode())
    assert raw.frame() == (0, b"OK")
    assert raw.frame() == (0, b"_heartbeat_")
    raw.send("NOP")
    assert raw.frame() == (0, b"_heartbeat_")


def negotiate(raw: Raw, **fields: object) -> dict:
    raw.send("IDENTIFY", json.dumps({"feature_negotiation": True, **fields}).encode())
    kind, data = raw.frame()
    assert kind == 0, data
    return json.loads(data)


def test_identify_negotiation_answers_nsqds_fields_from_the_brokers_own_options():
    from broker import __version__

    with EmbeddedBroker(max_rdy_count=300, msg_timeout=45_000, max_msg_timeout=120_000) as b:
        asked = negotiate(Raw(b.tcp_address))
        # nsqd's answer to {"feature_negotiation": true}, field for field (deflate is
        # declined, so its levels are 0 where nsqd says 6)
        assert asked == {
            "max_rdy_count": 300, "version": __version__, "max_msg_timeout": 120_000,
            "msg_timeout": 45_000, "tls_v1": False, "deflate": False, "deflate_level": 0,
            "max_deflate_level": 0, "snappy": False, "sample_rate": 0,
            "auth_required": False, "output_buffer_size": 16384, "output_buffer_timeout": 250}
        given = negotiate(Raw(b.tcp_address), msg_timeout=5000, output_buffer_size=64,
                          output_buffer_timeout=1000, tls_v1=True)
        assert (given["msg_timeout"], given["output_buffer_size"],
                given["output_buffer_timeout"], given["tls_v1"]) == (5000, 64, 1000, False)


@pytest.mark.parametrize("field, value, text", [
    ("heartbeat_interval", 999, b"heartbeat interval (999)"),
    ("output_buffer_timeout", 10, b"output buffer timeout (10)"),
    ("output_buffer_size", 63, b"output buffer size (63)"),
    ("sample_rate", 100, b"sample rate (100)"),
    ("msg_timeout", 5, b"msg timeout (5)"),
])
def test_an_identify_setting_out_of_its_range_gets_nsqds_text_naming_it_and_its_value(
        broker, field, value, text):
    raw = Raw(broker.tcp_address)
    raw.send("IDENTIFY", json.dumps({field: value}).encode())
    assert raw.frames_until_closed() == [(1, b"E_BAD_BODY IDENTIFY " + text + b" is invalid")]


def test_an_identify_of_json_null_is_taken_as_no_settings_as_by_nsqd(broker):
    raw = Raw(broker.tcp_address)
    raw.send("IDENTIFY", b"null")
    assert raw.frame() == (0, b"OK")
    raw.send("SUB t ch")
    assert raw.frame() == (0, b"OK")
    # and a setting given as null is that setting left alone, as Go's zero value
    raw = Raw(broker.tcp_address)
    nulls = dict.fromkeys(["heartbeat_interval", "output_buffer_size", "output_buffer_timeout",
                           "sample_rate", "msg_timeout"])
    assert negotiate(raw, **nulls)["msg_timeout"] == 60_000
    raw.send("SUB t ch")
    assert raw.frame() == (0, b"OK")


def test_identify_minus_one_turns_heartbeats_off_so_sub_is_refused_as_by_nsqd(broker):
    raw = Raw(broker.tcp_address)
    assert negotiate(raw, heartbeat_interval=-1, output_buffer_size=-1,
                     output_buffer_timeout=-1)["output_buffer_timeout"] == 0   # nsqd's "off"
    raw.send("SUB t ch")
    assert raw.frame() == (1, b"E_INVALID cannot SUB with heartbeats disabled")
    # 0 is "no change": the default heartbeat stays on and SUB is taken
    raw = Raw(broker.tcp_address)
    negotiate(raw, heartbeat_interval=0, output_buffer_size=0, output_buffer_timeout=0)
    raw.send("SUB t ch")
    assert raw.frame() == (0, b"OK")


# -- HTTP ----------------------------------------------------------------------

def http(broker, method: str, path: str, body: bytes | None = None,
         headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(f"http://{broker.http_address}{path}", data=body,
                                     method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def test_http_ping_info_pub_mpub_and_stats(broker, client):
    assert http(broker, "GET", "/ping") == (200, b"OK")
    info = json.loads(http(broker, "GET", "/info")[1])
    assert info["tcp_port"] == int(broker.tcp_address.rsplit(":", 1)[1])
    client.admin("channel", "create", "t", "ch")
    assert http(broker, "POST", "/pub?topic=t", b"one") == (200, b"OK")
    assert http(broker, "POST", "/pub?topic=t&defer=60000", b"later") == (200, b"OK")
    assert http(broker, "POST", "/mpub?topic=t", b"two\nthree\n") == (200, b"OK")
    assert http(broker, "POST", "/mpub?topic=t&binary=true", mpub_body(b"4", b"5\n")) == (
        200, b"OK")
    stats = json.loads(http(broker, "GET", "/stats?format=json&topic=t&channel=ch")[1])
    [topic] = stats["topics"]
    [channel] = topic["channels"]
    assert (topic["topic_name"], topic["message_count"]) == ("t", 6)
    assert (channel["channel_name"], channel["depth"], channel["deferred_count"]) == ("ch", 5, 1)
    assert "[t" in http(broker, "GET", "/stats?format=text")[1].decode()


def test_the_kept_differences_from_nsqd_hold(broker, client):
    client.admin("channel", "create", "t", "ch")
    assert http(broker, "PUT", "/pub?topic=t", b"one") == (200, b"OK")
    assert http(broker, "PUT", "/mpub?topic=t", b"two\nthree") == (200, b"OK")
    assert client.stats("t").topics[0].channels[0].depth == 3
    info = json.loads(http(broker, "GET", "/info")[1])
    assert info["grpc_address"] == broker.address
    assert http(broker, "GET", "/config/nsqlookupd_tcp_addresses")[0] == 404
    assert http(broker, "GET", "/debug/pprof/")[0] == 404


@pytest.mark.parametrize("method, path, body, status, message", [
    ("POST", "/pub", b"x", 400, "MISSING_ARG_TOPIC"),
    ("POST", "/pub?topic=bad!name", b"x", 400, "INVALID_TOPIC"),
    ("POST", "/pub?topic=t", b"x" * (1024 * 1024 + 1), 413, "MSG_TOO_BIG"),
    ("POST", "/pub?topic=t", b"", 400, "MSG_EMPTY"),
    ("POST", "/pub?topic=t&defer=-5", b"x", 400, "INVALID_DEFER"),
    ("POST", "/pub?topic=t&defer=soon", b"x", 400, "INVALID_DEFER"),
    ("POST", "/pub?topic=t&defer=3600001", b"x", 400, "INVALID_DEFER"),
    ("POST", "/pub?topic=", b"x", 400, "INVALID_TOPIC"),
    ("POST", "/pub?topic=abc%0A", b"x", 400, "INVALID_TOPIC"),
    ("POST", "/mpub?topic=t&binary=true", b"\x00\x00\x00\x05", 413, "BAD_MESSAGE"),
    ("POST", "/mpub?topic=t&binary=true", b"\x00\x00\x00\x00", 413, "BAD_BODY"),
    ("POST", "/mpub?topic=t&binary=true", b"\x00\x00\x00\x01\x00\x00\x00\x00", 413,
     "BAD_MESSAGE"),
    ("POST", "/mpub?topic=t", b"x" * (5 * 1024 * 1024 + 1), 413, "BODY_TOO_BIG"),
    ("POST", "/mpub?topic=t", b"ok\n" + b"x" * (1024 * 1024 + 1), 413, "MSG_TOO_BIG"),
    ("GET", "/nowhere", None, 404, "NOT_FOUND"),
    ("GET", "/pub?topic=t", None, 405, "METHOD_NOT_ALLOWED"),
    ("POST", "/topic/pause?topic=missing", None, 404, "TOPIC_NOT_FOUND"),
    ("POST", "/channel/create?topic=t", None, 400, "MISSING_ARG_CHANNEL"),
    ("POST", "/channel/create?topic=t&channel=bad!", None, 400, "INVALID_ARG_CHANNEL"),
    ("POST", "/channel/create?topic=missing&channel=ch", None, 404, "TOPIC_NOT_FOUND"),
    ("POST", "/channel/delete?topic=t&channel=missing", None, 404, "CHANNEL_NOT_FOUND"),
])
def test_http_errors_use_nsqds_status_codes_and_strings(broker, client, method, path, body,
                                                        status, message):
    client.admin("topic", "create", "t")
    code, data = http(broker, method, path, body)
    assert (code, json.loads(data)["message"]) == (status, message)


def test_http_stats_filters_pick_one_topic_and_one_channel(broker, client):
    for topic in ("a", "b"):
        for channel in ("x", "y"):
            client.admin("channel", "create", topic, channel)
    stats = json.loads(http(broker, "GET", "/stats?format=json&topic=b&channel=y")[1])
    assert [(t["topic_name"], [c["channel_name"] for c in t["channels"]])
            for t in stats["topics"]] == [("b", ["y"])]
    stats = json.loads(http(broker, "GET", "/stats?format=json&topic=a")[1])
    assert [(t["topic_name"], sorted(c["channel_name"] for c in t["channels"]))
            for t in stats["topics"]] == [("a", ["x", "y"])]


def test_http_stats_answer_text_unless_format_is_json(broker, client):
    client.admin("topic", "create", "t")
    status, body = http(broker, "GET", "/stats?format=yaml")
    assert status == 200 and body.decode().startswith("pynsqd v")
    assert json.loads(http(broker, "GET", "/stats?format=json")[1])["topics"][0]["topic_name"] == "t"


@pytest.mark.parametrize("headers", [
    {"Origin": "http://evil.example"},
    {"Origin": "null"},
    {"Sec-Fetch-Site": "cross-site"},
    {"Sec-Fetch-Site": "same-site", "Origin": "http://other.localhost"},
])
def test_a_cross_origin_browser_request_that_changes_state_is_refused(broker, client, headers):
    client.admin("topic", "create", "keep")
    for path in ("/topic/delete?topic=keep", "/topic/create?topic=new", "/pub?topic=keep"):
        status, body = http(broker, "POST", path, b"x", headers=headers)
        assert (status, json.loads(body)["message"]) == (403, "CROSS_ORIGIN_REQUEST")
    assert [t.name for t in client.stats().topics] == ["keep"]
    assert client.stats("keep").topics[0].message_count == 0
    assert http(broker, "GET", "/stats?format=json", headers=headers)[0] == 200


def test_same_origin_and_non_browser_requests_change_state(broker, client):
    same = {"Origin": f"http://{broker.http_address}", "Sec-Fetch-Site": "same-origin"}
    assert http(broker, "POST", "/topic/create?topic=a", headers=same)[0] == 200
    assert http(broker, "POST", "/topic/create?topic=b", headers={"Sec-Fetch-Site": "none"})[0] \
        == 200
    assert http(broker, "POST", "/topic/create?topic=c")[0] == 200
    assert [t.name for t in client.stats().topics] == ["a", "b", "c"]


def test_a_same_origin_request_from_a_browser_sending_only_origin_changes_state(broker,
                                                                              client):
    """Browsers without Sec-Fetch-Site send Origin alone: the broker's own origin, in any
    case, is same-origin."""
    port = broker.http_address.rsplit(":", 1)[1]
    for host, origin in ((broker.http_address, f"http://{broker.http_address}"),
                         (f"localhost:{port}", f"http://localhost:{port}"),
                         (f"localhost:{port}", f"http://LocalHost:{port}")):
        assert http(broker, "POST", "/pub?topic=t", b"x",
                    headers={"Host": host, "Origin": origin}) == (200, b"OK"), origin
    assert client.stats("t").topics[0].message_count == 3


def test_info_names_the_http_port_and_answers_without_a_tcp_listener(broker):
    info = json.loads(http(broker, "GET", "/info")[1])
    assert info["http_port"] == int(broker.http_address.rsplit(":", 1)[1])
    with EmbeddedBroker(tcp_address="") as http_only:
        status, body = http(http_only, "GET", "/info")
        assert (status, json.loads(body)["tcp_port"]) == (200, 0)


def test_an_empty_tcp_or_http_address_turns_that_listener_off():
    from broker import Client

    with EmbeddedBroker(tcp_address="", http_address="") as off, Client(off.address) as client:
        assert (off.tcp_address, off.http_address, sorted(off.app.addresses)) == ("", "",
                                                                                 ["grpc"])
        assert client.ping() == "OK"
    with EmbeddedBroker(http_address="") as tcp_only:
        assert tcp_only.tcp_address and not tcp_only.http_address
        raw = Raw(tcp_only.tcp_address)
        raw.send("PUB t", b"x")
        assert raw.frame() == (0, b"OK")


@pytest.mark.parametrize("path, limit, message", [
    ("/pub?topic=t", 1048576, "MSG_TOO_BIG"),
    ("/mpub?topic=t", 5 * 1024 * 1024, "BODY_TOO_BIG"),
])
def test_an_http_body_over_its_limit_is_refused_with_or_without_its_length_given(
        broker, path, limit, message):
    """A Content-Length over the limit (--max-msg-size, --max-body-size) is refused before
    the body is read (none is sent here); a body sent in chunks, its length not given,
    is refused once it passes the limit."""
    host, port = broker.http_address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                     f"Content-Length: {limit + 1}\r\n\r\n".encode())
        head = sock.recv(65536)
    assert head.startswith(b"HTTP/1.1 413 ") and f'"message": "{message}"'.encode() in head
    conn = HTTPConnection(host, int(port), timeout=10)
    try:
        pieces = [b"x" * 65536] * (limit // 65536) + [b"y"]    # each piece under the limit
        conn.request("POST", path, body=iter(pieces), encode_chunked=True)
        answer = conn.getresponse()
        assert (answer.status, json.loads(answer.read())["message"]) == (413, message)
    finally:
        conn.close()


def test_an_http_mpub_in_text_mode_publishes_each_line_whole(broker, client):
    assert http(broker, "POST", "/mpub?topic=t", b"one message\n\nanother one\n")[0] == 200
    assert client.stats("t").topics[0].message_count == 2


@pytest.mark.parametrize("binary, published", [
    ("false", 1), ("0", 1), ("F", 1), ("False", 1),    # Go's ParseBool, as nsqd reads it
    ("true", 2), ("1", 2), ("yes", 2),                  # unrecognised: binary, as nsqd
])
def test_an_http_mpub_is_binary_unless_binary_is_a_false_value(broker, client, binary,
                                                               published):
    body = mpub_body(b"a", b"b")   # read as text, one line (it holds no newline)
    assert b"\n" not in body
    assert http(broker, "POST", f"/mpub?topic=t&binary={binary}", body)[0] == 200
    assert client.stats("t").topics[0].message_count == published


def test_an_http_channel_create_takes_each_setting_given_alone_and_an_empty_one_as_none(
        broker, client):
    client.admin("topic", "create", "jobs")
    assert http(broker, "POST", "/channel/create?topic=jobs&channel=work"
                                "&dead_letter_topic=jobs.failed")[0] == 200
    assert http(broker, "POST", "/channel/create?topic=jobs&channel=empty"
                                "&max_attempts=&dead_letter_topic=")[0] == 200
    channels = {c.name: c for c in client.stats("jobs").topics[0].channels}
    assert channels["work"].dead_letter_topic == "jobs.failed"
    assert (channels["empty"].max_attempts, channels["empty"].dead_letter_topic) == (0, "")


def test_http_topic_and_channel_admin(broker, client):
    for path in ("/topic/create?topic=t", "/channel/create?topic=t&channel=ch",
                 "/channel/pause?topic=t&channel=ch", "/topic/pause?topic=t"):
        assert http(broker, "POST", path)[0] == 200
    topic = client.stats("t").topics[0]
    assert topic.paused and topic.channels[0].paused
    for path in ("/topic/unpause?topic=t", "/channel/unpause?topic=t&channel=ch",
                 "/channel/empty?topic=t&channel=ch", "/topic/empty?topic=t",
                 "/channel/delete?topic=t&channel=ch", "/topic/delete?topic=t"):
        assert http(broker, "POST", path)[0] == 200
    assert client.stats().topics == []


# -- across protocols ----------------------------------------------------------

def test_grpc_in_tcp_out(broker, client):
    raw = Raw(broker.tcp_address)
    raw.send("SUB x ch")
    raw.frame()
    raw.send("RDY 1")
    msg_id = client.publish("x", b"from grpc")
    kind, data = raw.frame()
    assert (kind, data[10:26].decode(), data[26:]) == (2, msg_id, b"from grpc")


def test_http_and_tcp_in_grpc_out(broker, client):
    client.admin("channel", "create", "x", "ch")
    http(broker, "POST", "/pub?topic=x", b"from http")
    raw = Raw(broker.tcp_address)
    raw.send("PUB x", b"from tcp")
    assert raw.frame() == (0, b"OK")
    with client.subscribe("x", "ch", rdy=2) as sub:
        assert {sub.get(10).body, sub.get(10).body} == {b"from http", b"from tcp"}


def test_a_port_in_use_for_tcp_is_a_clear_error(broker):
    with pytest.raises(OSError, match=f"cannot listen on {broker.tcp_address} \\(TCP\\)"):
        EmbeddedBroker(tcp_address=broker.tcp_address).start()


def test_default_ports_are_nsqds():
    from broker import Options

    options = Options()
    assert (options.tcp_address, options.http_address) == ("127.0.0.1:4150", "127.0.0.1:4151")


def test_a_gnsq_consumer_reconnects_when_the_broker_comes_back(tmp_path):
    from broker import Client

    from .helpers import free_port

    tcp = f"127.0.0.1:{free_port()}"
    first = EmbeddedBroker(tcp_address=tcp).start()
    consumer = subprocess.Popen([sys.executable, str(CLIENTS / "gnsq_client.py"), "consume",
                                 tcp, "r", "ch", "2"], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    try:
        with Client(first.address) as client:
            wait_for(lambda: any(c.clients for t in client.stats().topics for c in t.channels),
                     30, message="the consumer to subscribe")
            client.publish("r", b"before")
            wait_for(lambda: client.stats("r").topics[0].channels[0].finish_count == 1, 30,
                     message="the first message to be FINed")
        first.stop()
        with EmbeddedBroker(tcp_address=tcp) as second, Client(second.address) as client:
            wait_for(lambda: any(c.clients for t in client.stats().topics for c in t.channels),
                     30, message="the consumer to reconnect")
            client.publish("r", b"after")
            out, err = consumer.communicate(timeout=60)
        assert consumer.returncode == 0, err[-3000:]
        assert [m["body"] for m in json.loads(out.strip().splitlines()[-1])] == ["before", "after"]
    finally:
        first.stop()
        if consumer.poll() is None:
            consumer.kill()
