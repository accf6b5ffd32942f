"""Finding a fleet's gRPC addresses through the real nsqlookupd, for the Spark source."""

from __future__ import annotations

import pytest

from broker import Client, EmbeddedBroker
from spark_connector.discovery import (DiscoveryError, Fleet, discover, grpc_address,
                                       producer_http_addresses)
from spark_connector.options import ReaderOptions
from spark_connector.session import LeaseKeeper

from .grpckit import channel_stats
from .helpers import Daemon, free_port, wait_for
from .nsqkit import Lookupd, http_json


def test_a_wildcard_grpc_host_is_replaced_by_the_broadcast_address():
    assert grpc_address({"grpc_address": "0.0.0.0:4170"}, "10.0.0.5") == "10.0.0.5:4170"
    assert grpc_address({"grpc_address": "127.0.0.1:4171"}, "10.0.0.5") == "127.0.0.1:4171"
    assert grpc_address({"version": "1.3.0"}, "10.0.0.5") is None  # nsqd: no gRPC


def test_producers_are_read_from_both_lookup_answer_shapes():
    producer = {"broadcast_address": "h", "http_port": 4151, "tcp_port": 4150}
    assert producer_http_addresses({"producers": [producer]}) == [("h", 4151)]
    assert producer_http_addresses({"data": {"producers": [producer]}}) == [("h", 4151)]


def test_no_lookupd_answering_is_an_error_naming_the_addresses():
    dead = f"127.0.0.1:{free_port()}"
    with pytest.raises(DiscoveryError, match=dead):
        discover([dead], "events", timeout=2)


@pytest.fixture
def lookupd():
    daemon = Lookupd().start()
    yield daemon
    daemon.stop()


def test_discover_finds_every_broker_that_has_the_topic(lookupd):
    fleet = [Daemon("--lookupd-tcp-address", lookupd.tcp_address,
                    "--broadcast-address", "127.0.0.1") for _ in range(3)]
    try:
        for daemon in fleet:
            daemon.wait_ready()
        for daemon, topic in zip(fleet, ("events", "events", "other")):
            with Client(daemon.address, timeout=10) as client:
                client.publish(topic, b"x")
        with_events = sorted(d.address for d in fleet[:2])
        wait_for(lambda: discover([lookupd.http_address], "events") == with_events, 60,
                 message="both brokers with events discovered")
        # Each broker registers on its own connection: "other" may be listed later.
        wait_for(lambda: discover([lookupd.http_address], "other") == [fleet[2].address], 60,
                 message="the broker with other discovered")
        assert discover([lookupd.http_address], "none-has-it") == []
        fleet[0].stop()
        wait_for(lambda: discover([lookupd.http_address], "events") == [fleet[1].address], 60,
                 message="the stopped broker to leave the fleet")
    finally:
        for daemon in fleet:
            daemon.kill()


def test_a_fleet_picks_up_a_new_broker_and_outlives_a_lookupd_restart(lookupd):
    now = [0.0]
    fleet = Fleet([lookupd.http_address], "events", poll_interval=10, clock=lambda: now[0])
    brokers = [Daemon("--lookupd-tcp-address", lookupd.tcp_address,
                      "--broadcast-address", "127.0.0.1") for _ in range(2)]
    try:
        first = brokers[0].wait_ready()
        with Client(first.address, timeout=10) as client:
            client.publish("events", b"x")

        def found(expected: list[str]) -> bool:
            now[0] += 10  # the poll interval has passed
            return fleet.brokers() == expected

        wait_for(lambda: found([first.address]), 60, message="the first broker")
        second = brokers[1].wait_ready()
        with Client(second.address, timeout=10) as client:
            client.publish("events", b"y")
        assert fleet.brokers() == [first.address]  # not asked again within the interval
        both = sorted([first.address, second.address])
        wait_for(lambda: found(both), 60, message="the broker added to the fleet")
        lookupd.stop()
        now[0] += 10
        assert fleet.brokers() == both  # kept while no nsqlookupd answers
    finally:
        for daemon in brokers:
            daemon.kill()


def test_a_fleet_that_never_found_a_lookupd_says_so():
    dead = f"127.0.0.1:{free_port()}"
    with pytest.raises(DiscoveryError, match=dead):
        Fleet([dead], "events", timeout=2).brokers()


def test_a_broker_that_left_nsqlookupd_is_not_reserved_from_but_its_leases_are_finished(
        lookupd):
    """The Spark source's driver reserves only from the brokers nsqlookupd lists now. Here
    an operator tombstones one broker's topic in nsqlookupd (as nsqadmin does, to drain it):
    that broker keeps running and keeps its messages, and a batch it already leased is
    still FINed when Spark commits it."""
    joined = {"lookupd_tcp_address": (lookupd.tcp_address,), "broadcast_address": "127.0.0.1"}
    with EmbeddedBroker(**joined) as a, EmbeddedBroker(**joined) as b, \
            Client(a.address, timeout=10) as client_a, Client(b.address, timeout=10) as client_b:
        for c in (client_a, client_b):
            c.create_channel("events", "spark")
            c.multi_publish("events", [b"0123456789"] * 100)
        wait_for(lambda: len(lookupd.lookup("events")) == 2, 60, message="both registered")
        keeper = LeaseKeeper(ReaderOptions.parse({
            "lookupdHttpAddress": lookupd.http_address, "topic": "events", "channel": "spark",
            "timeoutMs": "5000", "lookupdPollIntervalMs": "100"}))
        try:
            first = keeper.reserve(1, 20, 1 << 20)
            assert per_broker(first) == {a.address: 10, b.address: 10}
            http_json(f"http://{lookupd.http_address}/topic/tombstone?topic=events"
                      f"&node={b.http_address}", "POST")
            wait_for(lambda: keeper.brokers() == [a.address], 30,
                     message="the tombstoned broker to leave the fleet")
            second = keeper.reserve(2, 1000, 1 << 20)
            assert per_broker(second) == {a.address: 90}
            left = channel_stats(client_b, "events", "spark")
            assert (left.depth, left.in_flight_count) == (90, 10)   # not reserved from
            keeper.finish_through(2, second)
            left = channel_stats(client_b, "events", "spark")
            assert (left.finish_count, left.in_flight_count, left.depth) == (10, 0, 90)
            assert channel_stats(client_a, "events", "spark").finish_count == 100
        finally:
            keeper.close()


def per_broker(leases: dict[str, dict]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for lease in leases.values():
        counts[lease["address"]] = counts.get(lease["address"], 0) + lease["count"]
    return counts
