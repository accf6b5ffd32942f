"""Certificates made per test session with trustme: a CA that signs the broker's
certificate (for 127.0.0.1 and localhost) and a client's, and a second CA nobody
trusts."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

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

