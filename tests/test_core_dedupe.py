"""Idempotent publishing in the core: one entry per request, checked by content,
so a replay publishes nothing twice and a different request is never dropped."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.clock import ManualClock
from broker.dedupe import Deduplicator, Entry, content_digest
from broker.errors import ProducerConflict

from .corekit import new_broker, subscribe


def test_a_repeat_with_the_same_content_publishes_nothing_and_returns_the_first_ids():
    broker, _ = new_broker()
    c = subscribe(broker, "t", "ch")
    first = broker.multi_publish("t", [b"a", b"b"], producer_id="q:to-t:7:0", sequence=0)
    again = broker.multi_publish("t", [b"a", b"b"], producer_id="q:to-t:7:0", sequence=0)
    assert again == first
    assert [m.body for m in c.received] == [b"a", b"b"]


@pytest.mark.parametrize("topic, bodies, defers", [
    ("t", [b"a", b"c"], []),          # rows shifted
    ("t", [b"a"], []),                # another batch size
    ("t", [b"a", b"b", b"c"], []),    # another partitioning
    ("u", [b"a", b"b"], []),          # fan-out: another topic under the same key
    ("t", [b"a", b"b"], [0, 5000]),   # same bodies, other defers
])
def test_a_repeat_with_other_content_is_an_error_naming_the_producer(topic, bodies, defers):
    broker, _ = new_broker()
    c = subscribe(broker, "t", "ch")
    d = subscribe(broker, "u", "ch")
    broker.multi_publish("t", [b"a", b"b"], producer_id="q:to-t:7:0", sequence=0)
    with pytest.raises(ProducerConflict, match="producer 'q:to-t:7:0' sequence 0 already "
                                               "published other content") as err:
        broker.multi_publish(topic, bodies, defer_ms=defers, producer_id="q:to-t:7:0",
                             sequence=0)
    assert err.value.code == "E_PRODUCER_CONFLICT"
    assert [m.body for m in c.received] == [b"a", b"b"] and d.received == []


def test_the_window_keeps_one_entry_per_request_not_per_message():
    broker, _ = new_broker()
    broker.multi_publish("t", [b"x"] * 1000, producer_id="p", sequence=0)
    broker.multi_publish("t", [b"y"] * 1000, producer_id="p", sequence=1)
    assert len(broker.dedupe) == 2


def test_a_repeat_after_the_window_publishes_again():
    broker, clock = new_broker()
    c = subscribe(broker, "t", "ch")
    broker.multi_publish("t", [b"a"], producer_id="p", sequence=0)
    clock.advance(601)
    broker.multi_publish("t", [b"a"], producer_id="p", sequence=0)
    assert [m.body for m in c.received] == [b"a", b"a"]


def test_an_entry_survives_encoding_and_is_restored_only_while_live():
    clock = ManualClock()
    first = Deduplicator(clock=clock)
    digest = content_digest("t", [b"a", b"b"], [])
    entry = first.entry("q:to-t:3:1", 4, "00000000000000ff", 2, digest)
    payload = entry.encode()
    assert Entry.decode(payload) == entry
    # a broker's run of ids: the sequence above the node id's 10 bits goes up by one
    assert entry.ids == ["00000000000000ff", "00000000000004ff"]
    clock.advance(300)
    restarted = Deduplicator(clock=clock)
    restarted.restore(payload)
    assert restarted.seen("q:to-t:3:1", 4, digest) == entry.ids
    clock.advance(301)
    assert not restarted.is_live(payload)
    late = Deduplicator(clock=clock)
    late.restore(payload)
    assert len(late) == 0


def test_the_entry_of_a_request_is_handed_to_storage_with_its_messages():
    broker, _ = new_broker()
    seen: list[bytes | None] = []
    published = broker.storage.published

    def spy(topic, msgs, defers, producer=None):
        seen.append(producer)
        return published(topic, msgs, defers, producer=producer)

    broker.storage.published = spy
    ids = broker.multi_publish("t", [b"a", b"b"], producer_id="p", sequence=3)
    broker.multi_publish("t", [b"c"])
    entry = Entry.decode(seen[0])
    assert (entry.producer_id, entry.sequence, entry.ids) == ("p", 3, ids)
    assert seen[1] is None


requests = st.tuples(st.sampled_from(["p", "q"]), st.integers(0, 2), st.sampled_from(["t", "u"]),
                     st.lists(st.sampled_from([b"a", b"b"]), min_size=1, max_size=3))


@settings(max_examples=60, deadline=None)
@given(st.lists(requests, max_size=25))
def test_publishing_matches_an_oracle_that_never_drops_different_content(reqs):
    broker, _ = new_broker()
    inboxes = {t: subscribe(broker, t, "ch", rdy=1000) for t in ("t", "u")}
    oracle: dict[tuple[str, int], tuple[str, list[bytes]]] = {}
    expected: dict[str, list[bytes]] = {"t": [], "u": []}
    for producer, seq, topic, bodies in reqs:
        first = oracle.get((producer, seq))
        if first is not None and first != (topic, bodies):
            with pytest.raises(ProducerConflict):
                broker.multi_publish(topic, bodies, producer_id=producer, sequence=seq)
            continue
        broker.multi_publish(topic, bodies, producer_id=producer, sequence=seq)
        if first is None:
            oracle[(producer, seq)] = (topic, bodies)
            expected[topic] += bodies
    for topic, inbox in inboxes.items():
        assert [m.body for m in inbox.received] == expected[topic]


def test_a_replay_into_a_topic_deleted_and_made_anew_publishes_again():
    broker, _ = new_broker()
    broker.multi_publish("t", [b"a"], producer_id="q:to-t:3:0", sequence=0)
    broker.delete_topic("t")
    c = subscribe(broker, "t", "ch")
    broker.multi_publish("t", [b"a"], producer_id="q:to-t:3:0", sequence=0)
    assert [m.body for m in c.received] == [b"a"]
    assert len(broker.dedupe) == 1


def test_deleting_a_topic_keeps_the_entries_of_the_others():
    broker, _ = new_broker()
    c = subscribe(broker, "u", "ch")
    broker.multi_publish("t", [b"a"], producer_id="p", sequence=0)
    broker.multi_publish("u", [b"a"], producer_id="p", sequence=1)
    broker.delete_topic("t")
    broker.multi_publish("u", [b"a"], producer_id="p", sequence=1)
    assert [m.body for m in c.received] == [b"a"]


def test_the_window_and_the_capacity_are_options():
    broker, clock = new_broker(dedupe_window=5_000, dedupe_capacity=2)
    c = subscribe(broker, "t", "ch")
    for sequence in range(3):                      # the oldest of three is let go
        broker.multi_publish("t", [b"a"], producer_id="p", sequence=sequence)
    assert len(broker.dedupe) == 2
    broker.multi_publish("t", [b"a"], producer_id="p", sequence=2)     # remembered
    clock.advance(6)
    broker.multi_publish("t", [b"a"], producer_id="p", sequence=2)     # past the window
    assert len(c.received) == 4


@pytest.mark.parametrize("values, message", [
    ({"dedupe_window": -1}, "dedupe-window must not be negative"),
    ({"dedupe_capacity": 0}, "dedupe-capacity must be at least 1"),
])
def test_bad_dedupe_options_are_refused_naming_them(values, message):
    from broker.options import Options

    with pytest.raises(ValueError, match=message):
        Options(**values)


def test_pub_to_topic_refuses_a_bad_topic_name_before_any_batch_runs():
    from spark_connector import OptionError, pub_to_topic

    with pytest.raises(OptionError, match="topic: invalid topic name 'bad name'"):
        pub_to_topic("127.0.0.1:4170", "bad name")
