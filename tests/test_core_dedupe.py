"""De-duplication of producers' batches in the core: a repeat of an accepted
(producer id, sequence) within the window publishes nothing and answers the
first ids; the Spark writers rely on it to publish a replayed batch once."""

from __future__ import annotations

from .corekit import new_broker, subscribe


def test_a_repeated_producer_sequence_publishes_nothing_and_returns_the_first_ids():
    broker, _ = new_broker()
    c = subscribe(broker, "events", "work")
    first = broker.multi_publish("events", [b"a", b"b"], producer_id="q1:7:0", sequence=0)
    again = broker.multi_publish("events", [b"a", b"b"], producer_id="q1:7:0", sequence=0)
    assert again == first
    assert c.ids == first and broker.topic("events").message_count == 2


def test_the_next_sequence_and_another_producer_are_published():
    broker, _ = new_broker()
    c = subscribe(broker, "events", "work")
    first = broker.multi_publish("events", [b"a"], producer_id="q1:7:0", sequence=0)
    next_ = broker.multi_publish("events", [b"b"], producer_id="q1:7:0", sequence=1)
    other = broker.multi_publish("events", [b"a"], producer_id="q1:7:1", sequence=0)
    assert c.ids == first + next_ + other and len(set(c.ids)) == 3


def test_a_repeat_after_the_ten_minute_window_is_published_again():
    broker, clock = new_broker()
    c = subscribe(broker, "events", "work")
    broker.multi_publish("events", [b"a", b"b"], producer_id="q1:7:0", sequence=0)
    clock.advance(601)
    broker.multi_publish("events", [b"a", b"b"], producer_id="q1:7:0", sequence=0)
    assert len(c.received) == 4
