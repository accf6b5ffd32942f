"""Every limit of tests/LIMITS.md, at value − 1, value and value + 1, on every path the
table names, against a real broker on loopback (or the option parser that is the path).

The cases are generated from the table: a row is three tests, and a row whose path has no
probe here fails. The table is checked for completeness against the product (every
``--max-*``/``--min-*`` option, every ``--max-*`` flag the README names, every Spark option
parsed with a minimum, every constant of ``broker/server/limits.py``) and its values against
the product's defaults and constants.
"""

from __future__ import annotations

import ast
import io
import json
import re
import socket
import struct
import time
import urllib.error
import urllib.request
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import fields
from pathlib import Path
from typing import Callable

import grpc
import pytest

from broker import Client, EmbeddedBroker, Options
from broker.api import broker_pb2 as pb
from broker.api import broker_pb2_grpc as pb_grpc
from broker.errors import BrokerError

from .grpckit import SENTINEL_ID

TESTS = Path(__file__).parent
REPO = TESTS.parent
TABLE = TESTS / "LIMITS.md"
ROW = re.compile(r"^\|([^|]+)\|\s*(-?\d+)\s*\|([^|]+)\|\s*(max|min)\s*\|([^|]+)\|([^|]+)\|\s*$")
HELD = re.compile(r"^\|\s*([A-Za-z_-]+)\s*\|\s*(\d+(?:\.\d+)?)\s*\|([^|]+)\|([^|]+)\|\s*$")


def table() -> list[tuple[str, int, str, str, str, str]]:
    """(limit, value, path, side, within, beyond) of every row with edge tests."""
    return [(m[1].strip(), int(m[2]), m[3].strip(), m[4], m[5].strip(), m[6].strip())
            for line in TABLE.read_text().splitlines() if (m := ROW.match(line))]


def held() -> dict[str, tuple[float, str]]:
    """Limits held without an edge test: name -> (value, the tests named)."""
    return {m[1]: (float(m[2]), m[3].strip())
            for line in TABLE.read_text().splitlines() if (m := HELD.match(line))}


def cases() -> list:
    out = []
    for limit, value, path, side, within, beyond in table():
        below, above = (within, beyond) if side == "max" else (beyond, within)
        for n, answer in ((value - 1, below), (value, within), (value + 1, above)):
            out.append(pytest.param(limit, path, n, answer, id=f"{limit}|{path}|{n}"))
    return out


# -- the broker every probe talks to --------------------------------------------------

@pytest.fixture(scope="module")
def target():
    """One broker at its defaults for every probe; each probe uses its own topic."""
    with EmbeddedBroker() as b:
        c = Client(b.address, timeout=30)
        yield b, c
        c.close()


PROBES: dict[str, Callable] = {}


def probe(*paths: str):
    def register(fn):
        for path in paths:
            PROBES[path] = fn
        return fn
    return register


_counter = iter(range(1_000_000))


def fresh(prefix: str = "t") -> str:
    return f"{prefix}{next(_counter)}"


# -- gRPC ---------------------------------------------------------------------------

def grpc_answer(call: Callable[[], object]) -> str:
    try:
        call()
    except BrokerError as err:
        return err.code
    except ValueError as err:       # protobuf: a negative value for an unsigned field
        assert "out of range" in str(err), err
        return "unsendable"
    return "OK"


def stream_answer(sub) -> str:
    """The first error a consumer stream reported for its requests so far: a sentinel FIN
    (of an id no one holds) is answered after them, as the broker answers a stream's
    requests in order; a fatal error ends the stream instead."""
    sub.fin(SENTINEL_ID)
    deadline = time.monotonic() + 30
    first = None
    while time.monotonic() < deadline:
        error = sub.error(timeout=0.05)
        if error is not None:
            if error.id == SENTINEL_ID:
                return first or "OK"
            first = first or error.code
            continue
        try:
            sub.get(timeout=0)
        except BrokerError as err:
            return err.code
    raise AssertionError("the stream neither answered the sentinel FIN nor ended")


@probe("grpc Publish")
def _grpc_publish(target, n):
    _, c = target
    return grpc_answer(lambda: c.publish(fresh(), b"x" * n))


@probe("grpc MultiPublish")
def _grpc_mpub(target, n):
    _, c = target
    return grpc_answer(lambda: c.multi_publish(fresh(), [b"a", b"x" * n]))


@probe("grpc Publish defer_ms")
def _grpc_defer(target, n):
    _, c = target
    return grpc_answer(lambda: c.publish(fresh(), b"x", defer_ms=n))


@probe("grpc Publish topic")
def _grpc_topic(target, n):
    _, c = target
    return grpc_answer(lambda: c.publish(fresh().ljust(n, "a")[:n], b"x"))


@probe("grpc Publish ephemeral topic")
def _grpc_ephemeral_topic(target, n):
    _, c = target
    return grpc_answer(lambda: c.publish(fresh().ljust(n - 10, "a")[:n - 10] + "#ephemeral",
                                         b"x"))


@probe("grpc CreateChannel channel")
def _grpc_channel(target, n):
    _, c = target
    return grpc_answer(lambda: c.create_channel(fresh(), "c" * n))


@probe("grpc CreateChannel max_attempts")
def _grpc_max_attempts(target, n):
    _, c = target
    return grpc_answer(lambda: c.create_channel(fresh(), "ch", max_attempts=n))


@probe("grpc CreateTopic ttl_ms")
def _grpc_ttl(target, n):
    _, c = target
    return grpc_answer(lambda: c.create_topic(fresh(), ttl_ms=n))


def sized_request(topic: str, n: int) -> pb.MultiPublishRequest:
    """A MultiPublish request of ``topic`` encoding to exactly ``n`` bytes, each body
    under max-msg-size."""
    piece = 1 << 18
    full = [b"x" * piece] * max(n // (piece + 8) - 1, 0)
    for extra in range(3):      # empty bodies (2 bytes each) where a length prefix steps
        head = [*full, *[b"y"] * extra]
        base = pb.MultiPublishRequest(topic=topic, bodies=head).ByteSize()
        for prefix in range(1, 6):      # the last body's tag and length prefix
            last = n - base - 1 - prefix
            request = pb.MultiPublishRequest(topic=topic, bodies=[*head, b"z" * last])
            if request.ByteSize() == n:
                return request
    raise AssertionError(f"no request of {n} bytes")


@probe("grpc request")
def _grpc_request(target, n):
    """A MultiPublish request whose encoded size is exactly ``n`` bytes."""
    b, _ = target
    request = sized_request(fresh(), n)
    with grpc.insecure_channel(b.address, options=[
            ("grpc.max_send_message_length", -1)]) as channel:
        try:
            pb_grpc.BrokerStub(channel).MultiPublish(request, timeout=30)
        except grpc.RpcError as err:
            return err.code().name
    return "OK"


@probe("grpc Rdy")
def _grpc_rdy(target, n):
    _, c = target
    with c.subscribe(fresh(), "ch", rdy=0) as sub:
        sub.rdy(n)
        return stream_answer(sub)


@probe("grpc Subscribe rdy")
def _grpc_sub_rdy(target, n):
    _, c = target
    with c.subscribe(fresh(), "ch", rdy=n) as sub:
        return stream_answer(sub)


@probe("grpc Subscribe msg_timeout_ms")
def _grpc_sub_timeout(target, n):
    _, c = target
    try:
        with c.subscribe(fresh(), "ch", msg_timeout_ms=n) as sub:
            return stream_answer(sub)
    except BrokerError as err:
        return err.code


@probe("grpc Req")
def _grpc_req(target, n):
    _, c = target
    topic = fresh()
    c.publish(topic, b"x")
    with c.subscribe(topic, "ch", rdy=1) as sub:
        msg = sub.get(timeout=30)
        assert msg is not None, "the message published was not delivered"
        sub.req(msg.id, n)
        return stream_answer(sub)


# -- TCP (NSQ's V2) -------------------------------------------------------------------

class V2:
    """A hand-written V2 client: commands out, frames in."""

    def __init__(self, address: str) -> None:
        host, port = address.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=30)
        self.sock.sendall(b"  V2")
        self.buf = b""

    def send(self, line: str | bytes, body: bytes | None = None) -> None:
        data = (line.encode() if isinstance(line, str) else line) + b"\n"
        if body is not None:
            data += struct.pack(">i", len(body)) + body
        self.sock.sendall(data)

    def answer(self) -> str:
        """``OK`` (or any response frame but a heartbeat), the error code of an error
        frame, or ``closed`` when the broker closed the connection without a frame."""
        while len(self.buf) < 4 or len(self.buf) < 4 + struct.unpack(">i", self.buf[:4])[0]:
            try:
                chunk = self.sock.recv(1 << 16)
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                return "closed"
            self.buf += chunk
        size = struct.unpack(">i", self.buf[:4])[0]
        kind, data = struct.unpack(">i", self.buf[4:8])[0], self.buf[8:4 + size]
        self.buf = self.buf[4 + size:]
        if kind == 1:
            return data.split(b" ", 1)[0].decode()
        if data == b"_heartbeat_":      # the broker is still waiting: not an answer
            return "no answer (a heartbeat)"
        return "OK"

    def close(self) -> None:
        self.sock.close()


def tcp(target, *commands: tuple[str | bytes, bytes | None]) -> str:
    """The answer to the last of ``commands`` (each before it must be answered OK)."""
    b, _ = target
    conn = V2(b.tcp_address)
    try:
        for i, (line, body) in enumerate(commands):
            conn.send(line, body)
            if i < len(commands) - 1:
                assert conn.answer() == "OK", f"{line!r} was refused"
        return conn.answer()
    finally:
        conn.close()


def mpub_body(bodies: list[bytes]) -> bytes:
    return struct.pack(">i", len(bodies)) + b"".join(struct.pack(">i", len(x)) + x
                                                     for x in bodies)


@probe("tcp PUB")
def _tcp_pub(target, n):
    return tcp(target, (f"PUB {fresh()}", b"x" * n))


@probe("tcp DPUB")
def _tcp_dpub(target, n):
    return tcp(target, (f"DPUB {fresh()} 0", b"x" * n))


@probe("tcp DPUB defer")
def _tcp_dpub_defer(target, n):
    return tcp(target, (f"DPUB {fresh()} {n}", b"x"))


@probe("tcp MPUB")
def _tcp_mpub(target, n):
    return tcp(target, (f"MPUB {fresh()}", mpub_body([b"a", b"x" * n])))


def sized_mpub(n: int) -> bytes:
    """An MPUB body of exactly ``n`` bytes, each message under 1 MiB."""
    count = n // (1 << 19) + 1
    sizes = [(n - 4 - 4 * count) // count] * count
    sizes[-1] += n - 4 - 4 * count - sum(sizes)
    body = mpub_body([b"x" * s for s in sizes])
    assert len(body) == n
    return body


@probe("tcp MPUB body")
def _tcp_mpub_body(target, n):
    return tcp(target, (f"MPUB {fresh()}", sized_mpub(n)))


@probe("tcp MPUB body size")
def _tcp_mpub_body_size(target, n):
    """The size an MPUB declares, its messages read from the stream after it (as nsqd
    reads them): only a size of at least 1 is asked of it."""
    b, _ = target
    conn = V2(b.tcp_address)
    try:
        conn.sock.sendall(f"MPUB {fresh()}\n".encode() + struct.pack(">i", n)
                          + mpub_body([b"x"]))
        return conn.answer()
    finally:
        conn.close()


def identify(**fields_: object) -> bytes:
    return json.dumps(fields_).encode()


def padded_identify(n: int) -> bytes:
    """An IDENTIFY body of exactly ``n`` bytes: JSON padded with spaces."""
    body = identify(client_id="edge")
    return body + b" " * (n - len(body))


@probe("tcp IDENTIFY")
def _tcp_identify(target, n):
    return tcp(target, ("IDENTIFY", padded_identify(n)))


def identify_field(name: str) -> Callable:
    def run(target, n):
        return tcp(target, ("IDENTIFY", identify(**{name: n})))
    return run


for _field in ("msg_timeout", "heartbeat_interval", "output_buffer_size",
               "output_buffer_timeout", "sample_rate"):
    PROBES[f"tcp IDENTIFY {_field}"] = identify_field(_field)


@probe("tcp RDY")
def _tcp_rdy(target, n):
    # A FIN of an id not held answers a non-fatal E_FIN_FAILED: it comes first when the RDY
    # before it was taken, after E_INVALID (and the close) when it was not.
    answer = tcp(target, (f"SUB {fresh()} ch", None), (f"RDY {n}\nFIN 0000000000000000", None))
    return "OK" if answer == "E_FIN_FAILED" else answer


@probe("tcp REQ (clamped, as nsqd)")
def _tcp_req(target, n):
    b, c = target
    topic = fresh()
    c.publish(topic, b"x")
    conn = V2(b.tcp_address)
    try:
        conn.send(f"SUB {topic} ch")
        assert conn.answer() == "OK"
        conn.send("RDY 1")
        conn.buf = b""
        while len(conn.buf) < 4 or len(conn.buf) < 4 + struct.unpack(">i", conn.buf[:4])[0]:
            conn.buf += conn.sock.recv(1 << 16)
        msg_id = conn.buf[8 + 8 + 2:8 + 8 + 2 + 16].decode()   # after timestamp, attempts
        conn.buf = b""
        conn.send(f"REQ {msg_id} {n}\nFIN 0000000000000000")
        answer = conn.answer()
        return "OK" if answer == "E_FIN_FAILED" else answer
    finally:
        conn.close()


@probe("tcp PUB topic")
def _tcp_topic(target, n):
    return tcp(target, (f"PUB {fresh().ljust(n, 'a')[:n]}", b"x"))


@probe("tcp SUB channel")
def _tcp_channel(target, n):
    return tcp(target, (f"SUB {fresh()} {'c' * n}", None))


@probe("tcp SUB ephemeral channel")
def _tcp_ephemeral_channel(target, n):
    return tcp(target, (f"SUB {fresh()} {'c' * (n - 10)}#ephemeral", None))


@probe("tcp PUB line")
def _tcp_line(target, n):
    # A line of n bytes naming a topic too long: answered E_BAD_TOPIC while the line fits.
    return tcp(target, (b"PUB " + b"a" * (n - 4), b"x"))


def wire_answer(read: Callable[[], object]) -> str:
    """What the parser does with the bytes: ``OK``, ``Incomplete`` (waits for more) or the
    error it raises."""
    from broker.server import wire

    try:
        read()
    except wire.Incomplete:
        return "Incomplete"
    except (BrokerError, wire.LineTooLong) as err:
        return type(err).__name__
    return "OK"


@probe("wire MPUB count")
def _wire_mpub_count(target, n):
    from broker.server import wire

    # The count alone: a count it takes waits for its messages.
    return wire_answer(lambda: wire.read_mpub(struct.pack(">i", n), 0, max_msg_size=1 << 20,
                                              max_body_size=5 << 20))


@probe("wire MPUB message awaiting its body")
def _wire_mpub_awaiting(target, n):
    from broker.server import wire

    return wire_answer(lambda: wire.read_mpub(struct.pack(">ii", 1, n), 0,
                                              max_msg_size=1 << 20, max_body_size=5 << 20))


@probe("wire IDENTIFY body size")
def _wire_body_size(target, n):
    from broker.server import wire

    body = b" " * n
    return wire_answer(lambda: wire.read_body(b"NOP\n" + struct.pack(">i", n) + body, 4,
                                              "IDENTIFY", max_size=5 << 20))


@probe("wire line awaiting its newline")
def _wire_line(target, n):
    from broker.server import wire

    try:     # after a line already read: the limit is the line's, not the buffer's
        wire.read_line(b"NOP\n" + b"PUB " + b"a" * (n - 4), 4)
    except wire.LineTooLong:
        return "LineTooLong"
    except wire.Incomplete:
        return "Incomplete"
    return "a line without its newline was read"


# -- the auth server's answer, as parse_reply reads it (a pure function of bytes) ------

def auth_answer(doc: dict, pad_to: int = 0) -> str:
    from broker.security.auth import InvalidAuthReply, parse_reply

    data = json.dumps(doc).encode()
    data += b" " * (pad_to - len(data)) if pad_to else b""
    try:
        parse_reply(data, 0.0)
    except InvalidAuthReply:
        return "InvalidAuthReply"
    return "OK"


@probe("auth answer parser, bytes")
def _auth_bytes(target, n):
    return auth_answer({"ttl": 1}, pad_to=n)


@probe("auth answer parser, authorizations")
def _auth_authorizations(target, n):
    return auth_answer({"ttl": 1, "authorizations": [
        {"topic": "a", "channels": [], "permissions": ["publish"]}] * n})


@probe("auth answer parser, regexes")
def _auth_regexes(target, n):
    # One authorization of n - 1 channel regexes and its topic's: n regexes in all.
    return auth_answer({"ttl": 1, "authorizations": [
        {"topic": "a", "channels": ["b"] * (n - 1), "permissions": ["subscribe"]}]})


@probe("auth answer parser, identity")
def _auth_identity(target, n):
    return auth_answer({"ttl": 1, "identity": "x" * n})


@probe("auth answer parser, identity_url")
def _auth_identity_url(target, n):
    return auth_answer({"ttl": 1, "identity_url": "x" * n})


# -- nsqlookupd's answers (broker/lookupd.py's reader, a pure function of bytes) --------

@probe("lookupd response frame size")
def _lookupd_frame(target, n):
    from broker.lookupd import LookupdError, parse_response

    try:
        response, used = parse_response(struct.pack(">i", n) + b"x" * n)
    except LookupdError:
        return "LookupdError"
    assert (len(response), used) == (n, n + 4)
    return "OK"


# -- HTTP -----------------------------------------------------------------------------

def http(target, path: str, body: bytes | None = None) -> str:
    b, _ = target
    request = urllib.request.Request(f"http://{b.http_address}{path}", data=body,
                                     method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            status, data = response.status, response.read()
    except urllib.error.HTTPError as err:
        status, data = err.code, err.read()
    if status == 200:
        return "200 OK" if data == b"OK" else "200"
    return f"{status} {json.loads(data)['message']}"


@probe("http /pub")
def _http_pub(target, n):
    return http(target, f"/pub?topic={fresh()}", b"x" * n)


@probe("http /mpub")
def _http_mpub(target, n):
    return http(target, f"/mpub?topic={fresh()}", b"a\n" + b"x" * n)


@probe("http /mpub binary")
def _http_mpub_binary(target, n):
    return http(target, f"/mpub?topic={fresh()}&binary=true", mpub_body([b"a", b"x" * n]))


@probe("http /mpub body")
def _http_mpub_body(target, n):
    return http(target, f"/mpub?topic={fresh()}&binary=true", sized_mpub(n))


@probe("http /pub defer")
def _http_defer(target, n):
    return http(target, f"/pub?topic={fresh()}&defer={n}", b"x")


@probe("http /pub topic")
def _http_topic(target, n):
    return http(target, f"/pub?topic={fresh().ljust(n, 'a')[:n]}", b"x")


@probe("http /channel/create channel")
def _http_channel(target, n):
    topic = fresh()
    assert http(target, f"/topic/create?topic={topic}") == "200"
    return http(target, f"/channel/create?topic={topic}&channel={'c' * n}")


@probe("http /channel/create max_attempts")
def _http_max_attempts(target, n):
    topic = fresh()
    assert http(target, f"/topic/create?topic={topic}") == "200"
    return http(target, f"/channel/create?topic={topic}&channel=ch&max_attempts={n}")


@probe("http /topic/create ttl")
def _http_ttl(target, n):
    return http(target, f"/topic/create?topic={fresh()}&ttl={n}ms")


# -- topics and channels counted: a broker of its own, filled to the count -------------

@pytest.fixture(scope="module")
def crowded():
    """A broker at its defaults whose topics (or one topic's channels) a probe fills through
    the core to the count before its own, kept apart so the other probes' topics stay few."""
    with EmbeddedBroker() as b:
        c = Client(b.address, timeout=30)
        yield b, c
        c.close()


def _fill_topics(core, count: int) -> None:
    fill = sorted(name for name in core.topics if name.startswith("fill"))
    while len(core.topics) > count and fill:
        core.delete_topic(fill.pop())
    while len(core.topics) < count:
        core.create_topic(fresh("fill"))


def _fill_channels(core, count: int) -> None:
    _fill_topics(core, 0)       # the topic probes' fill goes: "crowd" is one topic more
    _clear_wide(core)           # and --max-channels' fill: its channels count too
    topic = core.create_topic("crowd")
    fill = sorted(name for name in topic.channels if name.startswith("fill"))
    while len(topic.channels) > count and fill:
        topic.delete_channel(fill.pop())
    while len(topic.channels) < count:
        core.create_channel("crowd", fresh("fill"))


WIDE = 4_000   # channels a topic of --max-channels' fill holds: under --max-channels-per-topic


def _clear_wide(core) -> None:
    for name in [n for n in core.topics if n.startswith("wide")]:
        core.delete_topic(name)


def _fill_channels_over_topics(core, count: int) -> None:
    """The broker's channels, over topics ``wide1``... (``WIDE`` each), up to ``count``;
    a probe makes its own on ``wide0``."""
    _fill_topics(core, 0)
    if "crowd" in core.topics:
        core.delete_topic("crowd")
    core.create_topic("wide0")
    spread = sorted((n for n in core.topics if n.startswith("wide") and n != "wide0"),
                    key=lambda n: int(n[4:]))
    while core.channel_count > count:
        topic = next(core.topics[n] for n in reversed(spread) if core.topics[n].channels)
        topic.delete_channel(next(iter(topic.channels)))
    i = 1
    while core.channel_count < count:
        topic = core.topics.get(f"wide{i}")
        if topic is not None and len(topic.channels) >= WIDE:
            i += 1
            continue
        core.create_channel(f"wide{i}", fresh("fill"))


def counted(fill: Callable) -> Callable:
    """A probe that makes the ``n``th topic (or channel of ``crowd``) along its path."""
    def wrap(make: Callable) -> Callable:
        def run(target, n):
            b, _ = target
            b.call(fill, b.broker, n - 1)
            return make(target)
        run.needs_crowded = True
        return run
    return wrap


PROBES["grpc CreateTopic, one more topic"] = counted(_fill_topics)(
    lambda t: grpc_answer(lambda: t[1].create_topic(fresh())))
PROBES["tcp PUB, one more topic"] = counted(_fill_topics)(
    lambda t: tcp(t, (f"PUB {fresh()}", b"x")))
PROBES["http /topic/create, one more topic"] = counted(_fill_topics)(
    lambda t: http(t, f"/topic/create?topic={fresh()}"))
PROBES["grpc CreateChannel, one more channel"] = counted(_fill_channels)(
    lambda t: grpc_answer(lambda: t[1].create_channel("crowd", fresh("c"))))
PROBES["tcp SUB, one more channel"] = counted(_fill_channels)(
    lambda t: tcp(t, (f"SUB crowd {fresh('c')}", None)))
PROBES["http /channel/create, one more channel"] = counted(_fill_channels)(
    lambda t: http(t, f"/channel/create?topic=crowd&channel={fresh('c')}"))
PROBES["grpc CreateChannel, one more channel over all topics"] = counted(
    _fill_channels_over_topics)(
    lambda t: grpc_answer(lambda: t[1].create_channel("wide0", fresh("c"))))
PROBES["tcp SUB, one more channel over all topics"] = counted(_fill_channels_over_topics)(
    lambda t: tcp(t, (f"SUB wide0 {fresh('c')}", None)))
PROBES["http /channel/create, one more channel over all topics"] = counted(
    _fill_channels_over_topics)(
    lambda t: http(t, f"/channel/create?topic=wide0&channel={fresh('c')}"))


# -- the CLI (in-process, its entry point) --------------------------------------------

def cli(*argv: str) -> str:
    from broker.cli import main

    out = io.StringIO()
    try:
        with redirect_stdout(out), redirect_stderr(out):
            code = main(list(argv))
    except SystemExit as exit_:
        code = exit_.code
    return str(code or 0)


@probe("cli pub")
def _cli_pub(target, n):
    b, _ = target
    return cli("--address", b.address, "pub", fresh(), "x" * n)


@probe("cli pub --defer-ms")
def _cli_defer(target, n):
    b, _ = target
    return cli("--address", b.address, "pub", "--defer-ms", str(n), fresh(), "x")


@probe("cli channel create --max-attempts")
def _cli_max_attempts(target, n):
    b, _ = target
    return cli("--address", b.address, "channel", "create", fresh(), "ch",
               "--max-attempts", str(n))


# -- options: flags, TOML and the embedded broker all build an Options ----------------

def options_answer(**values: object) -> str:
    try:
        Options(**values)
    except ValueError:
        return "ValueError"
    return "OK"


def option(name: str, **extra: object) -> Callable:
    def run(target, n, tmp_path):
        values = {name: n, **extra}
        if extra.get("data_path") is True:
            values["data_path"] = str(tmp_path)
        return options_answer(**values)
    run.needs_tmp_path = True
    return run


for _name in ("max_connections", "max_connections_per_client", "max_grpc_connections",
              "max_topics",
              "max_channels_per_topic", "max_channels",
              "max_attempts", "node_id", "workers", "broadcast_tcp_port",
              "broadcast_http_port", "mem_queue_size", "max_msg_size", "max_body_size",
              "max_rdy_count", "max_bytes_per_file", "max_disk_bytes", "max_memory_bytes",
              "sync_every", "dedupe_window", "dedupe_capacity", "statsd_interval",
              "statsd_udp_packet_size"):
    PROBES[f"options {_name.replace('_', '-')}"] = option(_name)
PROBES["options max-msg-size with data-path"] = option("max_msg_size", data_path=True)
PROBES["options max-bytes-per-file with data-path"] = option("max_bytes_per_file",
                                                             data_path=True)


@probe("options msg-timeout")
def _options_msg_timeout(target, n):
    # At the default max-msg-timeout, when the table's limit is it; else msg-timeout alone.
    return options_answer(msg_timeout=n)


@probe("options tcp-address")
def _options_port(target, n):
    return options_answer(tcp_address=f"127.0.0.1:{n}")


# -- the Spark connector's option parsers (what fails a query at start) ----------------

READER_BASE = {"address": "127.0.0.1:4170", "topic": "t", "channel": "c"}


def reader_answer(**options: str) -> str:
    from spark_connector.options import OptionError, ReaderOptions

    given = {**READER_BASE, **options}
    if "lookupdHttpAddress" in given:
        del given["address"]
    try:
        ReaderOptions.parse(given)
    except OptionError:
        return "OptionError"
    return "OK"


def spark_option(name: str) -> Callable:
    def run(target, n):
        extra = {"lookupdHttpAddress": "127.0.0.1:4161"} if name.startswith("lookupd") else {}
        return reader_answer(**{name: str(n)}, **extra)
    return run


for _name in ("maxMessagesPerTrigger", "maxBytesPerTrigger", "msgTimeoutMs", "numPartitions",
              "timeoutMs", "lookupdPollIntervalMs", "reconnectTimeoutMs", "maxAttempts"):
    PROBES[f"spark option {_name}"] = spark_option(_name)


@probe("spark option topic")
def _spark_topic(target, n):
    return reader_answer(topic="t" * n)


@probe("spark option channel")
def _spark_channel(target, n):
    return reader_answer(channel="c" * n)


@probe("spark sink option batchSize")
def _spark_batch_size(target, n):
    from pyspark.sql.types import BinaryType, StructField, StructType

    from spark_connector.options import OptionError
    from spark_connector.writer import WriterOptions

    schema = StructType([StructField("body", BinaryType())])
    try:
        WriterOptions.parse({"address": "127.0.0.1:4170", "topic": "t", "batchSize": str(n)},
                            schema)
    except OptionError:
        return "OptionError"
    return "OK"


# -- the generated edge tests ---------------------------------------------------------

@pytest.mark.parametrize("limit, path, n, answer", cases())
def test_a_limit_answers_as_documented_one_below_at_and_one_above_its_edge(
        request, limit, path, n, answer):
    run = PROBES.get(path)
    assert run is not None, f"LIMITS.md names the path {path!r}, which has no probe here"
    if getattr(run, "needs_crowded", False):
        got = run(request.getfixturevalue("crowded"), n)
    elif getattr(run, "needs_tmp_path", False):
        got = run(None, n, request.getfixturevalue("tmp_path"))
    elif path.startswith(("options", "spark", "wire", "auth", "lookupd")):
        got = run(None, n)
    else:
        got = run(request.getfixturevalue("target"), n)
    assert got == answer, f"{limit} = {n} on {path}: answered {got!r}, documented {answer!r}"


# -- the table against the product ----------------------------------------------------

def product_value(limit: str, path: str, value: int) -> int | None:
    """The product's own value of a row's limit (None: a value the table alone states,
    checked by its edge tests)."""
    from broker.server import tcp
    from broker.storage import records, segments

    if limit.isupper():                 # a bound named by its constant
        return server_constant(limit)

    defaults = {f.name.replace("_", "-"): f.default for f in fields(Options)}
    if limit in defaults and isinstance(defaults[limit], int):
        if path == f"options {limit}":
            return value            # the option's own range: its edges are the check
        if limit == "max-msg-size" and "data-path" in path:
            return records.MAX_BODY
        if limit == "max-bytes-per-file" and "data-path" in path:
            return segments.MAX_FILE
        return defaults[limit]
    # An MPUB's count: as many messages as the largest body holds at 5 bytes each.
    return {"max-output-buffer-size": tcp.MAX_OUTPUT_BUFFER,
            "MPUB message count": (Options().max_body_size - 4) // 5}.get(limit)


def test_each_rows_value_is_the_products_own():
    wrong = [f"{limit} on {path}: table {value}, product {own}"
             for limit, value, path, *_ in table()
             if (own := product_value(limit, path, value)) is not None and own != value]
    assert not wrong, "\n".join(wrong)


def limited_options() -> set[str]:
    """The broker's options that are limits: ``--max-*`` and ``--min-*``."""
    return {f.name.replace("_", "-") for f in fields(Options)
            if f.name.startswith(("max_", "min_"))}


def test_every_max_and_min_option_has_a_row():
    named = {limit for limit, *_ in table()}
    missing = sorted(limited_options() - named - {"max-channel-consumers", "max-deflate-level"})
    assert not missing, f"options that are limits with no row in LIMITS.md: {missing}"


def documentation() -> str:
    """README.md and docs/*.md, less the sections that say what is not built yet ("What is
    open"): a flag proposed there is not one the product has."""
    text = (REPO / "README.md").read_text()
    docs = REPO / "docs"
    if docs.is_dir():
        text += "".join(p.read_text() for p in sorted(docs.glob("*.md")))
    return re.sub(r"^## What is open.*?(?=^## |\Z)", "", text, flags=re.M | re.S)


SERVER_MODULES = ("broker.server.limits", "broker.security.auth", "broker.server.grpc_server",
                  "broker.server.tcp", "broker.server.wire", "broker.server.admission",
                  "broker.security.printable", "broker.server.http", "broker.lookupd")


def server_constant(name: str):
    """The value of a bound named in the servers' modules (None: no such constant)."""
    import importlib

    for module_name in SERVER_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        value = getattr(module, name, None)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return value
    return None


def test_every_constant_the_docs_name_as_a_bound_has_a_row():
    named = set(re.findall(r"`([A-Z][A-Z0-9_]{3,})`", documentation()))
    bounds = {name for name in named if server_constant(name) is not None}
    rows = set(held()) | {limit for limit, *_ in table()}
    missing = sorted(bounds - rows)
    assert not missing, f"bounds the docs name with no row in LIMITS.md: {missing}"


def test_every_max_flag_the_readme_names_has_a_row():
    text = documentation()
    flags = {m for m in re.findall(r"--((?:max|min)-[a-z-]+[a-z])", text)}
    named = {limit for limit, *_ in table()}
    # Kept at one value only, refused at any other (README: "accepted at the value pynsqd has").
    fixed = {"max-channel-consumers", "max-deflate-level"}
    missing = sorted(flags - named - fixed)
    assert not missing, f"--max-*/--min-* flags the README names with no row: {missing}"


def calls_outside_mutants(tree: ast.AST):
    """Every call of ``tree``, but those in the copies mutmut makes of a function (under a
    mutation run, the connector's files hold them beside the original)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and "__mutmut_" in node.name:
            continue
        if isinstance(node, ast.Call):
            yield node
        yield from calls_outside_mutants(node)


def spark_minimums() -> set[tuple[str, int]]:
    """(option, minimum) of every ``_int(given, NAME, default[, minimum=M])`` call of the
    connector (the minimum's default is 1)."""
    found = set()
    for path in (REPO / "spark_connector").glob("*.py"):
        for node in calls_outside_mutants(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "_int" \
                    and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant):
                minimum = 1
                for kw in node.keywords:
                    if kw.arg == "minimum":
                        minimum = ast.literal_eval(kw.value)
                if len(node.args) >= 4:
                    minimum = ast.literal_eval(node.args[3])
                found.add((node.args[1].value, minimum))
    return found


def test_every_spark_option_with_a_minimum_has_a_row_at_it():
    rows = {(limit, value) for limit, value, path, side, *_ in table()
            if path.startswith("spark") and side == "min"}
    missing = sorted(spark_minimums() - rows)
    assert not missing, f"Spark options parsed with a minimum and no row: {missing}"


def test_every_bound_of_the_servers_limits_module_has_a_row():
    from broker.security import auth
    from broker.server import limits

    constants = {name: value for module in (limits, auth) for name, value in vars(module).items()
                 if name.isupper() and isinstance(value, (int, float))
                 and not isinstance(value, bool)}
    rows = held()
    edged = {limit for limit, *_ in table()}       # an edge row may name the bound itself
    missing = sorted(set(constants) - set(rows) - edged)
    assert not missing, f"bounds of broker/server/limits.py with no row in LIMITS.md: {missing}"
    wrong = [f"{name}: table {rows[name][0]}, product {value}"
             for name, value in constants.items() if name in rows and rows[name][0] != value]
    assert not wrong, "\n".join(wrong)


def test_each_held_rows_value_is_the_servers_own_constant():
    defaults = {f.name.replace("_", "-"): f.default for f in fields(Options)}
    wrong = []
    for name, (value, _tests) in held().items():
        own = defaults[name] if name in defaults else server_constant(name)
        if own is None:
            wrong.append(f"{name}: no such option or constant in the servers")
        elif own != value:
            wrong.append(f"{name}: table {value}, product {own}")
    assert not wrong, "\n".join(wrong)


def test_every_test_a_held_row_names_exists():
    from .test_promises import NAMED, collected

    missing = [f"{file}::{name}" for _value, tests in held().values()
               for file, name in NAMED.findall(tests)
               if not (TESTS / file).exists() or name not in collected(TESTS / file)]
    assert not missing, missing


def test_an_mpub_refused_for_a_body_over_max_msg_size_names_that_body_not_one_at_it(target):
    _, c = target
    limit = Options().max_msg_size
    with pytest.raises(BrokerError) as refused:
        c.multi_publish(fresh(), [b"x" * limit, b"y" * (limit + 1)])
    assert refused.value.code == "E_BAD_MESSAGE"
    assert f"message 1: body of {limit + 1} bytes" in str(refused.value)
