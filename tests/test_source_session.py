"""The source's sessions with its brokers, at their edges: what the error says when a
broker does not answer (the option that named it, the cause, the wait it was given), how
long a silent broker is waited for (``reconnectTimeoutMs``), a broker back within it read
as if nothing happened, a wait ended by stopping, a stalled connection given up after
``timeoutMs``, the leases touched while a batch runs longer than ``msgTimeoutMs``, and
TLS options used by every call. The driver's ``LeaseKeeper`` called as Spark's driver
calls it, without Spark; real brokers on loopback."""

from __future__ import annotations

import re
import threading

import pytest

from broker import Client, EmbeddedBroker
from spark_connector.options import ReaderOptions
from spark_connector.session import BrokerUnreachable, LeaseKeeper

from .faultproxy import FaultProxy
from .grpckit import channel_stats
from .helpers import free_port, json_http_server, wait_for
from .securitykit import make_certs


def keeper_options(**given: str) -> ReaderOptions:
    return ReaderOptions.parse({"topic": "events", "channel": "spark", "timeoutMs": "1000",
                                **given})


def in_thread(action) -> tuple[threading.Thread, dict]:
    """Run ``action`` in a thread; the dict gets its ``result`` or ``error``."""
    outcome: dict = {}

    def run():
        try:
            outcome["result"] = action()
        except Exception as err:  # noqa: BLE001 - the test asserts which
            outcome["error"] = err

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def refused(address: str) -> str:
    """What gRPC says of a loopback port nobody listens on (the error's cause)."""
    return rf"failed to connect to all addresses; .*{re.escape(address)}.*Connection refused"


# -- what the error says -----------------------------------------------------------------

def test_a_broker_not_answering_at_the_start_is_named_by_option_address_with_the_cause():
    dead = f"127.0.0.1:{free_port()}"
    with pytest.raises(BrokerUnreachable) as raised:
        LeaseKeeper(keeper_options(address=dead))
    # Nothing about a wait (none was given at the start) nor failOnBrokerDown (not set).
    assert re.fullmatch(rf"pynsq source: cannot reach the broker at {re.escape(dead)} "
                        rf"\(option address\): cannot reach the broker at "
                        rf"{re.escape(dead)}: {refused(dead)}", str(raised.value))


@pytest.fixture
def lookupd_listing_a_dead_broker():
    """An nsqlookupd that lists one broker for topic ``events``: its HTTP port answers
    ``/info`` naming a gRPC address where nobody listens. Returns (lookupd, gRPC address)."""
    dead = f"127.0.0.1:{free_port()}"

    def answer(path: str, port: int) -> dict:
        return ({"grpc_address": dead} if path.startswith("/info") else
                {"producers": [{"broadcast_address": "127.0.0.1", "http_port": port,
                                "tcp_port": 4150}]})

    with json_http_server(answer) as lookupd:
        yield lookupd, dead


def test_a_broker_listed_by_nsqlookupd_not_answering_is_named_by_option_lookupd_http_address(
        lookupd_listing_a_dead_broker):
    lookupd, dead = lookupd_listing_a_dead_broker
    with pytest.raises(BrokerUnreachable) as raised:
        LeaseKeeper(keeper_options(lookupdHttpAddress=lookupd))
    assert re.fullmatch(rf"pynsq source: cannot reach the broker at {re.escape(dead)} "
                        rf"\(listed by nsqlookupd, option lookupdHttpAddress\): cannot reach "
                        rf"the broker at {re.escape(dead)}: {refused(dead)}", str(raised.value))


def test_with_fail_on_data_loss_false_no_broker_answering_names_the_option_and_each_address(
        lookupd_listing_a_dead_broker):
    lookupd, dead = lookupd_listing_a_dead_broker
    with pytest.raises(BrokerUnreachable) as raised:
        LeaseKeeper(keeper_options(lookupdHttpAddress=lookupd, failOnDataLoss="false"))
    assert str(raised.value) == (f"pynsq source: no broker of option lookupdHttpAddress "
                                 f"answered: {dead}")
    other = f"127.0.0.1:{free_port()}"
    with pytest.raises(BrokerUnreachable) as raised:
        LeaseKeeper(keeper_options(address=f"{dead},{other}", failOnDataLoss="false"))
    assert str(raised.value) == (f"pynsq source: no broker of option address answered: "
                                 f"{dead}, {other}")


def test_fail_on_broker_down_names_the_broker_the_wait_it_was_given_and_the_other_choice(
        tmp_path):
    with EmbeddedBroker(data_path=str(tmp_path)) as durable:
        address = durable.address
        keeper = LeaseKeeper(keeper_options(address=address, failOnBrokerDown="true",
                                            reconnectTimeoutMs="300"))
    try:
        with pytest.raises(BrokerUnreachable) as raised:
            keeper.reserve(1, 10, 1 << 20)
        a = re.escape(address)
        assert re.fullmatch(
            rf"pynsq source: cannot reach the broker at {a} \(option address\), silent for "
            rf"longer than reconnectTimeoutMs \(300 ms\): cannot reach the broker at {a}: "
            rf".+ \(failOnBrokerDown=true; with false the other brokers are read meanwhile "
            rf"and its messages once it is back\)", str(raised.value))
    finally:
        keeper.close()


# -- how long a broker is waited for -------------------------------------------------------

def test_a_broker_back_within_reconnect_timeout_is_waited_for_and_its_messages_read(tmp_path):
    """A durable broker restarts while a trigger reserves: the reserve waits for it and
    returns its messages; no error, no broker counted down."""
    where = {"data_path": str(tmp_path), "grpc_address": f"127.0.0.1:{free_port()}"}
    with EmbeddedBroker(**where) as first, Client(first.address) as client:
        client.create_channel("events", "spark")
        client.multi_publish("events", [b"m"] * 10)
        keeper = LeaseKeeper(keeper_options(address=first.address,
                                            reconnectTimeoutMs="120000"))
    try:
        session = keeper._sessions[where["grpc_address"]]
        thread, outcome = in_thread(lambda: keeper.reserve(1, 10, 1 << 20))
        wait_for(lambda: session.silent_since is not None or not thread.is_alive(), 60,
                 message="the reserve waiting for the broker")
        assert thread.is_alive(), outcome
        with EmbeddedBroker(**where):
            thread.join(120)
            assert not thread.is_alive() and "error" not in outcome, outcome
            [lease] = outcome["result"].values()
            assert lease["count"] == 10 and keeper.down == {}
            assert session.silent_since is None  # answered: a later blip waits afresh
    finally:
        keeper.close()


def test_stopping_ends_a_reserve_waiting_for_a_silent_broker(broker, client):
    client.create_channel("events", "spark")
    keeper = LeaseKeeper(keeper_options(address=broker.address, reconnectTimeoutMs="3600000"))
    session = keeper._sessions[broker.address]
    broker.stop()
    thread, outcome = in_thread(lambda: keeper.reserve(1, 10, 1 << 20))
    wait_for(lambda: session.silent_since is not None or not thread.is_alive(), 60,
             message="the reserve waiting for the broker")
    keeper.close()
    thread.join(60)                   # not the hour reconnectTimeoutMs gives it
    assert not thread.is_alive()
    assert isinstance(outcome.get("error"), BrokerUnreachable), outcome


# A call to a stalled broker gives up after timeoutMs (here 0.5 s), a wait after
# reconnectTimeoutMs (1 s): well under this, and under the client's own default of 30 s.
GIVEN_UP_WITHIN = 25


def test_a_broker_whose_connection_stalls_is_given_up_after_timeout_and_reconnect_timeout(
        broker, client):
    """The broker's connection stays open but nothing comes back (a hung host, a firewall
    dropping packets): each call gives up after timeoutMs, the broker is waited for up to
    reconnectTimeoutMs, then named; not waited on for ever."""
    client.create_channel("events", "spark")
    with FaultProxy(broker.address) as proxy:
        keeper = LeaseKeeper(keeper_options(address=proxy.address, timeoutMs="500",
                                            reconnectTimeoutMs="1000"))
        try:
            proxy.blackhole(True)
            thread, outcome = in_thread(lambda: keeper.reserve(1, 10, 1 << 20))
            thread.join(GIVEN_UP_WITHIN)
            assert not thread.is_alive()
            a = re.escape(proxy.address)
            assert re.fullmatch(rf"pynsq source: cannot reach the broker at {a} \(option "
                                rf"address\), silent for longer than reconnectTimeoutMs "
                                rf"\(1000 ms\): cannot reach the broker at {a}: .+",
                                str(outcome.get("error")))
        finally:
            keeper.close()


def test_a_broker_stalled_at_the_start_is_named_after_timeout_ms(broker):
    """Asking for its workers and its first ping each give up after timeoutMs (0.1 s here;
    gRPC's own connect timeout, 20 s, ends a call with no deadline sooner than the client's
    default of 30 s, so the bound is under both)."""
    with FaultProxy(broker.address) as proxy:
        proxy.blackhole(True)
        thread, outcome = in_thread(
            lambda: LeaseKeeper(keeper_options(address=proxy.address, timeoutMs="100")))
        thread.join(10)
        assert not thread.is_alive()
        assert re.fullmatch(rf"pynsq source: cannot reach the broker at "
                            rf"{re.escape(proxy.address)} \(option address\): .+",
                            str(outcome.get("error")))


def test_a_silent_nsqlookupd_at_the_start_is_named_after_timeout_ms():
    """nsqlookupd's port takes connections and never answers."""
    import socket

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        lookupd = "127.0.0.1:%d" % listener.getsockname()[1]
        thread, outcome = in_thread(
            lambda: LeaseKeeper(keeper_options(lookupdHttpAddress=lookupd, timeoutMs="500")))
        thread.join(GIVEN_UP_WITHIN)
        assert not thread.is_alive()
    assert re.fullmatch(rf"pynsq source: no nsqlookupd answered .*{re.escape(lookupd)}.* "
                        rf"\(option lookupdHttpAddress\)", str(outcome.get("error")))


def test_with_fail_on_data_loss_false_a_broker_silent_at_the_start_is_logged_and_left_out(
        broker, client, caplog):
    import logging

    caplog.set_level(logging.INFO, "pynsq.spark")
    client.create_channel("events", "spark")
    client.multi_publish("events", [b"m"] * 4)
    dead = f"127.0.0.1:{free_port()}"
    keeper = LeaseKeeper(keeper_options(address=f"{dead},{broker.address}",
                                        failOnDataLoss="false"))
    try:
        leases = keeper.reserve(1, 10, 1 << 20)
        assert [(lease["address"], lease["count"]) for lease in leases.values()] == [
            (broker.address, 4)]
        [warning] = [m for m in caplog.messages if dead in m]
        assert re.fullmatch(rf"pynsq source: cannot reach the broker at {re.escape(dead)} "
                            rf"\(option address\): .+; going on with the other brokers "
                            rf"\(failOnDataLoss=false\)", warning)
    finally:
        keeper.close()


# -- what every call carries ---------------------------------------------------------------

def test_a_batch_held_longer_than_msg_timeout_keeps_its_messages_by_the_keepers_touches(
        broker, client):
    """A batch whose lease outlives msgTimeoutMs: the keeper touches it, so none of its
    messages times out; a lease of the same timeout nobody touches does, twice over."""
    client.create_channel("events", "spark")
    client.multi_publish("events", [b"held"] * 5)
    keeper = LeaseKeeper(keeper_options(address=broker.address, msgTimeoutMs="2000"))
    try:
        assert sum(lease["count"] for lease in keeper.reserve(1, 5, 1 << 20).values()) == 5
        client.multi_publish("events", [b"untouched"])
        bystander = client.open_lease_session("bystander", grace_ms=2000)
        try:
            for times_out in (1, 2):
                reply = client.reserve(bystander.session_id, "events", "spark", 1,
                                       msg_timeout_ms=2000)
                assert reply.count == 1
                wait_for(lambda: channel_stats(client, "events", "spark").timeout_count
                         == times_out, 60, message="the untouched lease timed out")
        finally:
            bystander.close()
        stats = channel_stats(client, "events", "spark")
        assert (stats.timeout_count, stats.in_flight_count) == (2, 5)
    finally:
        keeper.close()


def test_a_lease_nobody_touches_times_out_after_the_sources_msg_timeout(broker, client):
    """Each reserve asks for msgTimeoutMs (here 2 s), not the broker's own (60 s): a driver
    that stops touching (hung, paused) gives its batch back after that long."""
    client.create_channel("events", "spark")
    client.multi_publish("events", [b"m"] * 5)
    keeper = LeaseKeeper(keeper_options(address=broker.address, msgTimeoutMs="2000"))
    try:
        keeper._touch_every = 3600            # the driver stops touching (after one more)
        assert sum(lease["count"] for lease in keeper.reserve(1, 5, 1 << 20).values()) == 5
        wait_for(lambda: channel_stats(client, "events", "spark").timeout_count == 5, 30,
                 message="the untouched batch timed out")
    finally:
        keeper.close()


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return make_certs(tmp_path_factory.mktemp("certs"))


def test_the_tls_options_are_used_to_reach_each_broker_and_find_its_workers(certs):
    with EmbeddedBroker(tls_cert=certs.server_cert, tls_key=certs.server_key,
                        tls_required="true") as tls, \
            Client(tls.address, tls_ca=certs.ca) as client:
        client.create_channel("events", "spark")
        client.multi_publish("events", [b"m"] * 3)
        keeper = LeaseKeeper(keeper_options(address=tls.address, tlsCaFile=certs.ca))
        try:
            assert keeper.brokers() == [tls.address]
            [lease] = keeper.reserve(1, 10, 1 << 20).values()
            assert lease["count"] == 3
        finally:
            keeper.close()


def test_a_driver_that_never_stops_the_source_still_exits(broker, client):
    """The keeper's touch thread does not hold the driver's process open: a driver that
    dies without Spark calling ``stop`` exits (its leases are requeued after their grace)."""
    import subprocess
    import sys

    client.create_channel("events", "spark")
    driver = subprocess.run(
        [sys.executable, "-c",
         "from spark_connector.options import ReaderOptions\n"
         "from spark_connector.session import LeaseKeeper\n"
         f"LeaseKeeper(ReaderOptions.parse({{'address': '{broker.address}', "
         "'topic': 'events', 'channel': 'spark'})).reserve(1, 10, 1 << 20)\n"
         "print('planned')\n"],
        capture_output=True, text=True, timeout=60)
    assert (driver.returncode, driver.stdout) == (0, "planned\n"), driver.stderr

