"""Finding a fleet's gRPC addresses through the real nsqlookupd, for the Spark source."""

from __future__ import annotations

import pytest

from broker import Client
from spark_connector.discovery import (DiscoveryError, Fleet, discover, grpc_address,
                                       producer_http_addresses)

from .helpers import Daemon, free_port, wait_for
from .nsqkit import Lookupd


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
        assert discover([lookupd.http_address], "other") == [fleet[2].address]
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
