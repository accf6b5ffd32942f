"""Certificates made per test session with trustme (a CA that signs the broker's
certificate, for 127.0.0.1 and localhost, and a client's; a second CA nobody
trusts), a V2 client that can upgrade to TLS, and an HTTP(S) helper."""

from __future__ import annotations

import json
import socket
import ssl
import struct
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest
import trustme

CLIENT_NAME = "spark-executor"


@dataclass
class Certs:
    ca: str                 # the CA's certificate, trusted by clients and by the broker
    server_cert: str
    server_key: str
    client_cert: str        # signed by ``ca``; common name CLIENT_NAME
    client_key: str
    rogue_ca: str           # another CA
    rogue_client_cert: str  # signed by ``rogue_ca``
    rogue_client_key: str
    rogue_server_cert: str
    rogue_server_key: str


def make_certs(directory: Path) -> Certs:
    ca, rogue = trustme.CA(), trustme.CA()
    paths: dict[str, str] = {}

    def write(name: str, blob) -> None:
        path = directory / name
        blob.write_to_path(str(path))
        paths[name] = str(path)

    write("ca.pem", ca.cert_pem)
    write("rogue-ca.pem", rogue.cert_pem)
    for prefix, issuer in (("", ca), ("rogue-", rogue)):
        server = issuer.issue_cert("127.0.0.1", "localhost")
        write(f"{prefix}server.pem", server.cert_chain_pems[0])
        write(f"{prefix}server.key", server.private_key_pem)
        client = issuer.issue_cert(f"{CLIENT_NAME}.test", common_name=CLIENT_NAME)
        write(f"{prefix}client.pem", client.cert_chain_pems[0])
        write(f"{prefix}client.key", client.private_key_pem)
    return Certs(paths["ca.pem"], paths["server.pem"], paths["server.key"], paths["client.pem"],
                 paths["client.key"], paths["rogue-ca.pem"], paths["rogue-client.pem"],
                 paths["rogue-client.key"], paths["rogue-server.pem"], paths["rogue-server.key"])



class Raw:
    """A hand-written V2 client that can upgrade to TLS after IDENTIFY."""

    def __init__(self, address: str) -> None:
        host, port = address.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=10)
        self.sock.sendall(b"  V2")

    def send(self, line: str, body: bytes | None = None) -> None:
        data = line.encode() + b"\n"
        if body is not None:
            data += struct.pack(">i", len(body)) + body
        self.sock.sendall(data)

    def _read(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            if not chunk:
                raise ConnectionError("closed")
            data += chunk
        return data

    def frame(self) -> tuple[int, bytes]:
        size = struct.unpack(">i", self._read(4))[0]
        data = self._read(size)
        return struct.unpack(">i", data[:4])[0], data[4:]

    def identify(self, **fields) -> dict:
        self.send("IDENTIFY", json.dumps({"feature_negotiation": True, **fields}).encode())
        kind, data = self.frame()
        assert kind == 0, data
        return json.loads(data)

    def upgrade(self, ca: str, cert: str | None = None, key: str | None = None) -> None:
        ctx = ssl.create_default_context(cafile=ca)
        if cert:
            ctx.load_cert_chain(cert, key)
        self.sock = ctx.wrap_socket(self.sock, server_hostname="127.0.0.1")
        assert self.frame() == (0, b"OK")

    def error_then_closed(self) -> bytes:
        """The error frame, then the broker's close (an EOF, a reset or a TLS close);
        a socket timeout is no close and fails the test."""
        kind, data = self.frame()
        assert kind == 1, data
        try:
            extra = self.frame()
        except TimeoutError:
            pytest.fail(f"the broker did not close the connection after {data!r}")
        except (ConnectionError, OSError):
            return data
        pytest.fail(f"a frame after the error {data!r}: {extra!r}")


def http(broker, path: str, secret: str | None = None, body: bytes | None = None,
         ca: str | None = None, address: str | None = None) -> tuple[int, bytes]:
    scheme = "https" if ca else "http"
    request = urllib.request.Request(f"{scheme}://{address or broker.http_address}{path}",
                                     data=body, method="POST" if body is not None else "GET")
    if secret:
        request.add_header("Authorization", f"Bearer {secret}")
    context = ssl.create_default_context(cafile=ca) if ca else None
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as reply_:
            return reply_.status, reply_.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()
