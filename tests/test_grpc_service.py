"""The service calls around messaging, through a real gRPC server on loopback:
Ping, Info (the options in force) and an address nothing answers on."""

from __future__ import annotations

import pytest

from broker import Client, ClientError, EmbeddedBroker


def test_ping_answers_ok(client):
    assert client.ping() == "OK"


def test_info_reports_the_address_and_the_limits_in_force():
    with EmbeddedBroker(msg_timeout="5s", max_msg_timeout="10m", max_req_timeout="30m",
                        max_msg_size=2048, max_rdy_count=100) as broker, \
            Client(broker.address) as client:
        address, info = broker.address, client.info()
    assert info.grpc_address == address and address.startswith("127.0.0.1:") and info.version
    assert (info.msg_timeout_ms, info.max_msg_timeout_ms, info.max_req_timeout_ms) == (
        5_000, 600_000, 1_800_000)
    assert (info.max_msg_size, info.max_rdy_count) == (2048, 100)


def test_info_reports_nsqd_defaults(client):
    info = client.info()
    assert (info.msg_timeout_ms, info.max_msg_timeout_ms, info.max_req_timeout_ms) == (
        60_000, 15 * 60_000, 60 * 60_000)
    assert (info.max_msg_size, info.max_rdy_count) == (1024 * 1024, 2500)


def test_an_unreachable_broker_is_reported_by_address():
    with EmbeddedBroker() as b:
        address = b.address
    client = Client(address, timeout=2)
    try:
        with pytest.raises(ClientError, match=f"cannot reach the broker at {address}"):
            client.ping()
    finally:
        client.close()
