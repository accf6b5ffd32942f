"""Message ids: 16 hex characters, unique and increasing per broker across restarts,
and never shared by two brokers of a fleet with different node ids (``--node-id``),
as nsqd's GUIDs carry its node id. The Spark source reads a whole fleet into one
DataFrame keyed by ``id``."""

from __future__ import annotations

import re
import subprocess

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from broker import Broker, Client, EmbeddedBroker, Options
from broker.clock import ManualClock
from broker.message import NODE_ID_BITS, IdFactory
from broker.storage import DiskStore

from .corekit import subscribe
from .helpers import Daemon, bin_path

ID = re.compile(r"^[0-9a-f]{16}$")


def publish_many(broker: Broker) -> list[str]:
    """What a busy producer sends: MPUBs and single PUBs, interleaved."""
    ids: list[str] = []
    for round_ in range(20):
        ids += broker.multi_publish("events", [b"m%d" % i for i in range(250)])
        ids += [broker.publish("events", b"p%d" % round_) for _ in range(25)]
    return ids


def assert_unique_and_increasing(ids: list[str]) -> None:
    assert all(ID.match(i) for i in ids), [i for i in ids if not ID.match(i)][:3]
    assert len(set(ids)) == len(ids)
    assert ids == sorted(ids)          # 16 hex characters: text order is number order


@given(st.integers(0, (1 << (64 - NODE_ID_BITS)) - 300), st.integers(0, 1023),
       st.integers(1, 250))
@example((1 << (64 - NODE_ID_BITS)) - 300, 1023, 250)   # the top bit set: the year 2540
def test_an_mpubs_ids_are_the_sequence_then_the_node_id_in_16_lower_case_hex_digits(
        sequence, node_id, count):
    ids = IdFactory(node_id, start=sequence)
    first = ids.many(count)
    assert first == [f"{(sequence + i) << NODE_ID_BITS | node_id:016x}" for i in range(count)]
    assert ids() == f"{(sequence + count) << NODE_ID_BITS | node_id:016x}"


def test_brokers_with_different_node_ids_never_share_an_id_published_at_the_same_instant():
    clock = ManualClock()   # both brokers start and publish at one and the same instant
    a = Broker(Options(node_id=1), clock=clock)
    b = Broker(Options(node_id=2), clock=clock)
    ids_a, ids_b = publish_many(a), publish_many(b)
    assert len(ids_a) == len(ids_b) == 5500
    assert_unique_and_increasing(ids_a)
    assert_unique_and_increasing(ids_b)
    assert not set(ids_a) & set(ids_b)


def test_a_repeated_producer_request_answers_the_ids_first_published():
    broker = Broker(Options(node_id=9), clock=ManualClock())
    first = broker.multi_publish("events", [b"a", b"b", b"c"], producer_id="w", sequence=1)
    broker.publish("events", b"between")
    again = broker.multi_publish("events", [b"a", b"b", b"c"], producer_id="w", sequence=1)
    assert again == first
    consumer = subscribe(broker, "events", "spark")
    assert set(first) <= set(consumer.ids)


def start(path, clock: ManualClock, node_id: int) -> Broker:
    opts = Options(data_path=str(path), node_id=node_id)
    broker = Broker(opts, clock=clock)
    broker.storage = DiskStore(broker, opts)
    broker.storage.recover()
    return broker


@pytest.mark.parametrize("stop", ["crash", "clean"])
def test_ids_stay_unique_and_increasing_across_restarts_with_the_clock_set_back(tmp_path, stop):
    before = start(tmp_path, ManualClock(), node_id=7)
    old = publish_many(before)
    if stop == "crash":         # kill -9: what write(2) put in the files stays
        before.storage.flush()
        before.storage.abandon()
    else:
        before.storage.close()
    # The host's clock stepped back an hour, and the broker came back with another node
    # id (its default follows the port): its new ids still come after the old ones.
    earlier = ManualClock(wall_start_ns=1_700_000_000 * 10**9 - 3600 * 10**9)
    after = start(tmp_path, earlier, node_id=3)
    try:
        new = publish_many(after)
        assert_unique_and_increasing(old + new)
    finally:
        after.storage.close()


def test_a_node_id_outside_0_to_1023_is_refused_naming_the_option():
    for bad in (1024, -2):
        with pytest.raises(ValueError, match="node-id must be 0 to 1023"):
            Options(node_id=bad)


def test_brokers_on_one_host_default_to_different_node_ids_for_different_ports():
    options = Options()
    ids = {options.node_id_for(f"127.0.0.1:{port}") for port in range(4170, 4170 + 1024)}
    assert len(ids) == 1024
    assert all(0 <= i <= 1023 for i in ids)
    assert Options(node_id=12).node_id_for("127.0.0.1:4170") == 12


def test_embedded_brokers_on_free_ports_give_ids_that_differ_in_their_node_part():
    with EmbeddedBroker(node_id=4) as a, EmbeddedBroker(node_id=5) as b, \
            Client(a.address) as ca, Client(b.address) as cb:
        ids_a = ca.multi_publish("events", [b"x"] * 500)
        ids_b = cb.multi_publish("events", [b"x"] * 500)
    assert_unique_and_increasing(ids_a)
    assert_unique_and_increasing(ids_b)
    assert not set(ids_a) & set(ids_b)
    assert {int(i, 16) % 1024 for i in ids_a} == {4}
    assert {int(i, 16) % 1024 for i in ids_b} == {5}


def test_pynsqd_takes_node_id_from_its_flag_or_config_file_and_refuses_a_bad_one(tmp_path):
    config = tmp_path / "pynsqd.toml"
    config.write_text("node_id = 77\n")
    daemons = [Daemon("--node-id", "1000"), Daemon("--config", str(config))]
    try:
        for daemon, node_id in zip(daemons, (1000, 77)):
            daemon.wait_ready()
            with Client(daemon.address, timeout=10) as client:
                ids = client.multi_publish("events", [b"x"] * 3)
            assert {int(i, 16) % 1024 for i in ids} == {node_id}
    finally:
        for daemon in daemons:
            daemon.kill()
    result = subprocess.run([bin_path("pynsqd"), "--node-id", "1024"], capture_output=True,
                            text=True, timeout=30)
    assert result.returncode == 2 and "node-id must be 0 to 1023" in result.stderr
