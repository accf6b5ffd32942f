"""Differential conformance against nsqd itself: the same generated inputs (valid
and invalid commands, random bytes, truncated frames, HTTP requests) go to nsqd
and to pynsqd, and the first answer must match: TCP frame type and error code,
HTTP status and ``message``.

nsqd's binaries are found through ``NSQ_BIN`` (default: ``../shared/nsq/bin``
next to the repository); without them the test is skipped, saying so.
Differences we keep on purpose are listed in the README ("NSQ compatibility").
"""

from __future__ import annotations

import http.client
import json
import os
import random
import socket
import struct
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from broker import EmbeddedBroker

from .helpers import free_port, wait_for

REPO = Path(__file__).resolve().parent.parent
NSQ_BIN = Path(os.environ.get("NSQ_BIN", REPO.parent / "shared" / "nsq" / "bin"))
TCP_INPUTS = int(os.environ.get("CONFORMANCE_TCP_INPUTS", 2400))
HTTP_INPUTS = int(os.environ.get("CONFORMANCE_HTTP_INPUTS", 800))
SEED = int(os.environ.get("CONFORMANCE_SEED", 20261123))   # another seed explores further

pytestmark = pytest.mark.skipif(not (NSQ_BIN / "nsqd").exists(),
                                reason=f"nsqd not found in {NSQ_BIN} (set NSQ_BIN to nsq's bin "
                                       f"directory to run the differential test)")


# -- the two brokers -------------------------------------------------------------

@pytest.fixture(scope="module")
def nsqd(tmp_path_factory):
    tcp, http = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    proc = subprocess.Popen([str(NSQ_BIN / "nsqd"), "--tcp-address", tcp, "--http-address", http,
                             "--data-path", str(tmp_path_factory.mktemp("nsqd")),
                             "--log-level", "fatal"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        def up() -> bool:
            try:
                return _http(http, "GET", "/ping")[0] == 200
            except OSError:
                return False
        wait_for(up, 30, message="nsqd to start")
        yield tcp, http
    finally:
        proc.terminate()
        proc.wait(30)


@pytest.fixture(scope="module")
def pynsqd():
    with EmbeddedBroker() as broker:
        yield broker.tcp_address, broker.http_address


# -- talking ------------------------------------------------------------------------

def first_answer(address: str, data: bytes) -> tuple:
    """Send ``data``, close our side, and return the first frame's (type, code)
    (type only for a message), or ("closed",) when nothing came before EOF."""
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        try:
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass                       # the broker closed first: read what it sent
        buf = b""
        while len(buf) < 8 or len(buf) < 4 + struct.unpack(">i", buf[:4])[0]:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                return ("closed",)
            buf += chunk
    kind = struct.unpack(">i", buf[4:8])[0]
    payload = buf[8:4 + struct.unpack(">i", buf[:4])[0]]
    if kind == 1:
        return (kind, payload.split(b" ", 1)[0].decode(errors="replace"))
    if kind == 0:
        return (kind, "json" if payload.startswith(b"{") else payload.decode(errors="replace"))
    return (kind,)


def _http(address: str, method: str, path: str, body: bytes | None = None) -> tuple:
    """(status, message) of an error, or (200, whether the body is JSON). Written on a
    raw socket: a broker may answer (413) before reading the whole body."""
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        head = f"{method} {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n"
        if body is not None:
            head += f"Content-Length: {len(body)}\r\n"
        try:
            sock.sendall(head.encode() + b"\r\n" + (body or b""))
        except OSError:
            pass
        response = http.client.HTTPResponse(sock)
        response.begin()
        status, data = response.status, response.read()
    if status == 200:
        return (status, data.startswith(b"{"))
    try:
        return (status, json.loads(data)["message"])
    except (ValueError, KeyError, TypeError):
        return (status, data[:40])


# -- inputs ---------------------------------------------------------------------------

NAMES = ["t", "t2", "t#ephemeral", "", "bad!", "a" * 64, "a" * 65, "ä", "x.y_z-1"]
IDS = ["0123456789abcdef", "short", "", "0123456789abcdefg"]
NUMBERS = ["0", "1", "1000", "-1", "abc", "", "2500", "2501", "3600000", "3600001", "+5",
           "99999999999"]


def sized(body: bytes) -> bytes:
    return struct.pack(">i", len(body)) + body


def mpub(*bodies: bytes) -> bytes:
    return struct.pack(">i", len(bodies)) + b"".join(sized(b) for b in bodies)


def body(rng: random.Random) -> bytes:
    return rng.choice([
        sized(b"hello"), sized(b""), struct.pack(">i", -1), struct.pack(">i", 1048577),
        sized(b"x" * 1048576), b"\x00\x00", sized(b"hello")[:6], sized(bytes(rng.randrange(256)
                                                                          for _ in range(8))),
    ])


def mpub_body(rng: random.Random) -> bytes:
    return rng.choice([
        sized(mpub(b"a", b"bb")), sized(mpub()), sized(struct.pack(">i", -3)),
        sized(mpub(b"a", b"")), sized(struct.pack(">i", 2) + sized(b"a")),
        sized(struct.pack(">i", 1) + struct.pack(">i", 1048577)), struct.pack(">i", 0),
        struct.pack(">i", -5), struct.pack(">i", 5 * 1024 * 1024 + 1), sized(b"\x00\x00"),
        sized(struct.pack(">i", 2000000)), sized(mpub(b"a"))[:9],
    ])


def identify(rng: random.Random) -> bytes:
    return sized(rng.choice([
        b'{}', b'null', b'[]', b'not json', b'{"feature_negotiation": true}',
        b'{"heartbeat_interval": -1}', b'{"heartbeat_interval": 999}',
        b'{"heartbeat_interval": "soon"}', b'{"msg_timeout": 5}', b'{"msg_timeout": 900001}',
        b'{"output_buffer_size": 63}', b'{"output_buffer_size": 65537}',
        b'{"output_buffer_timeout": 10}', b'{"sample_rate": 100}', b'{"client_id": "c"}',
    ])) if rng.random() < 0.9 else rng.choice([struct.pack(">i", 0), struct.pack(">i", -1)])


def command(rng: random.Random) -> bytes:
    n = rng.choice
    kind = rng.randrange(16)
    if kind == 0:
        return f"PUB {n(NAMES)}\n".encode() + body(rng)
    if kind == 1:
        return f"MPUB {n(NAMES)}\n".encode() + mpub_body(rng)
    if kind == 2:
        return f"DPUB {n(NAMES)} {n(NUMBERS)}\n".encode() + body(rng)
    if kind == 3:
        return f"SUB {n(NAMES)} {n(NAMES)}\n".encode()
    if kind == 4:
        return f"RDY {n(NUMBERS)}\n".encode() if rng.random() < 0.9 else b"RDY\n"
    if kind == 5:
        return f"{n(['FIN', 'TOUCH'])} {n(IDS)}\n".encode()
    if kind == 6:
        return f"REQ {n(IDS)} {n(NUMBERS)}\n".encode()
    if kind == 7:
        return b"IDENTIFY\n" + identify(rng)
    if kind == 8:
        return n([b"NOP\n", b"CLS\n", b"\n", b"\r\n", b"pub t\n", b"EXPLODE\n", b"PUB\n",
                  b"MPUB\n", b"DPUB t\n", b"SUB t\n", b"REQ 0123456789abcdef\n", b"FIN\n"])
    if kind == 9:
        return b"AUTH\n" + n([sized(b"secret"), struct.pack(">i", 0)]) if rng.random() < .8 \
            else b"AUTH x\n"
    if kind == 10:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(1, 24))) + b"\n"
    if kind == 11:
        return b"SUB t ch\n" + f"RDY {n(NUMBERS)}\n".encode()
    if kind == 12:
        return b"IDENTIFY\n" + sized(b'{"heartbeat_interval": -1}') + b"SUB t ch\n"
    if kind == 13:
        return b"SUB t ch\nCLS\n" + n([b"CLS\n", b"RDY 1\n", b"NOP\n"])
    if kind == 14:
        return b"SUB t ch\n" + f"{n(['FIN', 'REQ', 'TOUCH'])} {n(IDS)} {n(NUMBERS)}\n".encode()
    return b"SUB t ch\nIDENTIFY\n" + sized(b"{}")


def tcp_input(rng: random.Random) -> bytes:
    if rng.random() < 0.03:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(0, 12)))
    data = b"  V2" + b"".join(command(rng) for _ in range(rng.randrange(1, 3)))
    if rng.random() < 0.15:
        data = data[:rng.randrange(4, len(data) + 1)]      # truncated
    return data


QUERY = {"topic": [None, "", "t", "bad!", "gone", "abc%0A", "a" * 65],
         "channel": [None, "", "ch", "bad!", "gone"],
         "defer": [None, "10", "-1", "x", "3600001", "+5", "%205", "1_0", ""],
         "binary": [None, "true", "false", "1", "maybe"],
         "format": [None, "json", "text", "x"]}
PATHS = ["/ping", "/info", "/pub", "/mpub", "/stats", "/topic/create", "/topic/delete",
         "/topic/empty", "/topic/pause", "/topic/unpause", "/channel/create", "/channel/delete",
         "/channel/empty", "/channel/pause", "/channel/unpause", "/nowhere"]
BODIES = [None, b"", b"hello", b"a\nb\n", b"\n\n", mpub(b"a", b"b"), mpub(), mpub(b"a", b""),
          b"\x00\x00\x00\x05", struct.pack(">i", 2) + sized(b"a"), b"x" * (1024 * 1024 + 1)]


def http_input(rng: random.Random) -> tuple[str, str, bytes | None]:
    path = rng.choice(PATHS)
    args = [f"{k}={v}" for k, values in QUERY.items() if (v := rng.choice(values)) is not None]
    method = rng.choice(["GET", "POST"]) if rng.random() < 0.2 else (
        "GET" if path in ("/ping", "/info", "/stats", "/nowhere") else "POST")
    data = rng.choice(BODIES) if method == "POST" else None
    return method, path + ("?" + "&".join(args) if args else ""), data


# -- the test -------------------------------------------------------------------------

def test_pynsqd_answers_generated_inputs_as_nsqd_does(nsqd, pynsqd):
    rng = random.Random(SEED)
    for target in (nsqd, pynsqd):
        assert _http(target[1], "POST", "/channel/create?topic=t&channel=ch")[0] in (200, 404)
        _http(target[1], "POST", "/topic/create?topic=t")
        assert _http(target[1], "POST", "/channel/create?topic=t&channel=ch")[0] == 200

    tcp_inputs = [tcp_input(rng) for _ in range(TCP_INPUTS)]
    with ThreadPoolExecutor(8) as pool:
        theirs = list(pool.map(lambda d: first_answer(nsqd[0], d), tcp_inputs))
        ours = list(pool.map(lambda d: first_answer(pynsqd[0], d), tcp_inputs))
    differences = [(data, a, b) for data, a, b in zip(tcp_inputs, theirs, ours) if a != b]

    http_inputs = [http_input(rng) for _ in range(HTTP_INPUTS)]
    for method, path, data in http_inputs:   # in order: admin requests change state
        a, b = _http(nsqd[1], method, path, data), _http(pynsqd[1], method, path, data)
        if a != b:
            differences.append(((method, path, data if not data or len(data) < 64 else
                                 f"<{len(data)} bytes>"), a, b))

    print(f"{len(tcp_inputs)} TCP and {len(http_inputs)} HTTP inputs; "
          f"{len(differences)} differences")
    kinds: dict = {}
    for inp, a, b in differences:
        kinds.setdefault((a, b), []).append(inp)
    report = "\n".join(f"nsqd {a} / pynsqd {b}: {len(inps)}, e.g. {inps[0]!r}"
                       for (a, b), inps in kinds.items())
    assert not differences, f"{len(differences)} differences from nsqd:\n{report}"
