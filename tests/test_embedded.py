"""``EmbeddedBroker``: a broker in the test's (or notebook's) own process."""

from __future__ import annotations

import pytest

from broker import Client, EmbeddedBroker, Options


def test_a_stopped_embedded_broker_says_it_is_not_running_and_starts_again():
    broker = EmbeddedBroker()
    with broker:
        with Client(broker.address) as client:
            client.publish("events", b"first")
        assert broker.call(lambda: sorted(broker.broker.topics)) == ["events"]
    for use in (lambda: broker.address, lambda: broker.tcp_address, lambda: broker.broker,
                lambda: broker.call(print)):
        with pytest.raises(RuntimeError, match="^the embedded broker is not running$"):
            use()
    broker.stop()     # stopping twice is harmless
    with broker:      # a new broker: memory only, so nothing of the first is kept
        with Client(broker.address) as client:
            assert client.stats().topics == []
        assert broker.call(lambda: len(broker.broker.topics)) == 0


def test_options_given_with_overrides_keep_the_rest():
    options = Options(grpc_address="127.0.0.1:0", tcp_address="127.0.0.1:0",
                      http_address="127.0.0.1:0", max_rdy_count=7)
    with EmbeddedBroker(options, msg_timeout="5s") as broker, Client(broker.address) as client:
        info = client.info()
    assert (info.max_rdy_count, info.msg_timeout_ms) == (7, 5000)


def test_a_broker_that_cannot_start_raises_its_error_and_leaves_nothing_running():
    with EmbeddedBroker() as running:
        broker = EmbeddedBroker(grpc_address=running.address)
        with pytest.raises(OSError, match=f"cannot listen on {running.address}"):
            broker.start()
        with pytest.raises(RuntimeError, match="not running"):
            broker.address


def test_the_broker_runs_in_a_daemon_thread_of_its_own_named_for_it():
    """A notebook or test that never stops its broker still exits; a thread dump names it."""
    import threading

    before = set(threading.enumerate())
    with EmbeddedBroker():
        started = [t for t in threading.enumerate() if t not in before
                   and t.name == "pynsq-embedded"]
        assert len(started) == 1 and started[0].daemon
    started[0].join(10)
    assert not started[0].is_alive()


def test_an_embedded_broker_runs_on_the_event_loop_its_options_name():
    """``event_loop`` is pynsqd's ``--event-loop``: an embedded broker (the benchmarks'
    counts under each loop among its users) serves on the loop it names."""
    uvloop = pytest.importorskip("uvloop")
    import asyncio
    for name, kind in (("asyncio", asyncio.BaseEventLoop), ("uvloop", uvloop.Loop)):
        with EmbeddedBroker(event_loop=name) as embedded:
            assert isinstance(embedded.call(asyncio.get_running_loop), kind)
            with Client(embedded.address) as client:
                client.publish("t", b"on " + name.encode())
                with client.subscribe("t", "ch", rdy=1) as sub:
                    assert sub.get(30).body == b"on " + name.encode()
