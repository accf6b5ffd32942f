"""Dead letters and message TTL in the core, under the manual clock."""

from __future__ import annotations

import pytest

from broker.errors import InvalidRequest, InvalidTopic, ProducerConflict

from .corekit import advance, new_broker, subscribe


def drain(broker, topic: str, channel: str) -> dict[str, tuple[bytes, int, int]]:
    """id -> (body, publish ns, attempts) of what the channel delivers now, FINed."""
    consumer = subscribe(broker, topic, channel, rdy=1000)
    got = {m.id: (m.body, m.timestamp, m.attempts) for m in consumer.received}
    consumer.fin_all()
    consumer.channel.remove_consumer(consumer)
    return got


def stats(broker, topic: str, channel: str):
    return broker.stats(topic, channel)[0].channels[0]


# -- max_attempts --------------------------------------------------------------
def test_a_message_reqd_max_attempts_times_goes_to_the_dead_letter_topic():
    broker, _ = new_broker()
    broker.create_channel("events", "work", max_attempts=3)
    published = broker.multi_publish("events", [b"poison", b"fine"])
    consumer = subscribe(broker, "events", "work", rdy=1)
    seen = []
    for _ in range(10):
        if not consumer.in_flight:
            break
        msg_id, msg = next(iter(consumer.in_flight.items()))
        seen.append((msg.body, msg.attempts))
        if msg.body == b"poison":
            consumer.channel.requeue(consumer, msg_id)
        else:
            consumer.channel.finish(consumer, msg_id)
    assert [a for b, a in seen if b == b"poison"] == [1, 2, 3]
    dead = drain(broker, "events.dead", "audit")
    assert list(dead) == [published[0]] and dead[published[0]][0] == b"poison"
    s = stats(broker, "events", "work")
    assert (s.dead_letter_count, s.depth, s.in_flight_count, s.deferred_count) == (1, 0, 0, 0)


def test_the_dead_letter_keeps_the_original_id_body_and_publish_time():
    broker, clock = new_broker()
    broker.create_channel("events", "work", max_attempts=1)
    msg_id = broker.publish("events", b"body")
    consumer = subscribe(broker, "events", "work", rdy=1)
    original = consumer.received[0]
    clock.advance(5)
    consumer.channel.requeue(consumer, msg_id)
    assert drain(broker, "events.dead", "audit") == {
        msg_id: (b"body", original.timestamp, 1)}


def test_timeouts_count_as_attempts_toward_the_dead_letter_topic():
    broker, clock = new_broker()
    broker.create_channel("events", "work", max_attempts=2)
    msg_id = broker.publish("events", b"slow")
    consumer = subscribe(broker, "events", "work", rdy=10, msg_timeout_ms=1000)
    advance(broker, clock, 2)
    advance(broker, clock, 2)
    assert len(consumer.received) == 2 and consumer.received[-1].attempts == 2
    assert list(drain(broker, "events.dead", "audit")) == [msg_id]
    s = stats(broker, "events", "work")
    assert (s.timeout_count, s.dead_letter_count, s.depth, s.in_flight_count) == (2, 1, 0, 0)


def test_a_deferred_req_past_max_attempts_is_dead_lettered_when_due():
    broker, clock = new_broker()
    broker.create_channel("events", "work", max_attempts=1)
    msg_id = broker.publish("events", b"x")
    consumer = subscribe(broker, "events", "work", rdy=10)
    consumer.channel.requeue(consumer, msg_id, delay=10)
    advance(broker, clock, 11)
    assert len(consumer.received) == 1
    assert list(drain(broker, "events.dead", "audit")) == [msg_id]


def test_a_channel_can_name_its_own_dead_letter_topic():
    broker, _ = new_broker()
    broker.create_channel("events", "work", max_attempts=1, dead_letter_topic="poison")
    msg_id = broker.publish("events", b"x")
    consumer = subscribe(broker, "events", "work", rdy=10)
    consumer.channel.requeue(consumer, msg_id)
    assert list(drain(broker, "poison", "audit")) == [msg_id]
    assert "events.dead" not in broker.topics


def test_an_ephemeral_topics_dead_letters_go_to_its_durable_dead_letter_topic():
    broker, _ = new_broker()
    broker.create_channel("events#ephemeral", "work", max_attempts=1)
    msg_id = broker.publish("events#ephemeral", b"x")
    consumer = subscribe(broker, "events#ephemeral", "work", rdy=10)
    consumer.channel.requeue(consumer, msg_id)
    assert list(drain(broker, "events.dead", "audit")) == [msg_id]
    assert not broker.topics["events.dead"].ephemeral


def test_the_broker_wide_max_attempts_applies_to_channels_that_set_none():
    broker, _ = new_broker(max_attempts=2)
    broker.create_channel("events", "own", max_attempts=0)
    broker.create_channel("events", "default")
    msg_id = broker.publish("events", b"x")
    default = subscribe(broker, "events", "default", rdy=10)
    own = subscribe(broker, "events", "own", rdy=10)
    for _ in range(3):
        for consumer in (default, own):
            if consumer.in_flight:
                consumer.channel.requeue(consumer, msg_id)
    assert len(default.received) == 2
    assert len(own.received) == 4 and own.received[-1].attempts == 4
    assert list(drain(broker, "events.dead", "audit")) == [msg_id]


def test_leases_do_not_take_a_message_past_max_attempts():
    broker, _ = new_broker()
    broker.create_channel("events", "spark", max_attempts=2)
    published = broker.multi_publish("events", [b"a", b"b"])
    session = broker.open_lease_session()
    for _ in range(2):
        lease, _ = broker.reserve(session.session_id, "events", "spark", 10)
        assert sorted(lease.in_flight) == published
        broker.requeue_leases([lease.lease_id])
    lease, _ = broker.reserve(session.session_id, "events", "spark", 10)
    assert lease is None
    assert sorted(drain(broker, "events.dead", "audit")) == published


def test_without_max_attempts_nothing_is_dead_lettered():
    broker, _ = new_broker()
    msg_id = broker.publish("events", b"x")
    consumer = subscribe(broker, "events", "work", rdy=10)
    for _ in range(20):
        consumer.channel.requeue(consumer, msg_id)
    assert consumer.received[-1].attempts == 21
    assert "events.dead" not in broker.topics


@pytest.mark.parametrize("kwargs, error, words", [
    ({"max_attempts": -1}, InvalidRequest, "max_attempts -1"),
    ({"max_attempts": 70000}, InvalidRequest, "max_attempts 70000"),
    ({"dead_letter_topic": "bad name"}, InvalidTopic, "bad name"),
    ({"dead_letter_topic": "events"}, InvalidRequest, "own topic"),
])
def test_bad_dead_letter_settings_are_refused_with_a_clear_error(kwargs, error, words):
    broker, _ = new_broker()
    with pytest.raises(error, match=words):
        broker.create_channel("events", "work", **kwargs)
    assert "events" not in broker.topics or "work" not in broker.topics["events"].channels


def test_an_existing_channel_cannot_be_given_its_own_topic_as_dead_letter_topic():
    broker, _ = new_broker()
    broker.create_channel("events", "work", max_attempts=2)
    with pytest.raises(InvalidRequest, match="own topic"):
        broker.create_channel("events", "work", dead_letter_topic="events")
    channel = broker.topics["events"].channels["work"]
    assert (channel.max_attempts, channel.dead_letter_topic) == (2, "")


def test_each_dead_letter_is_counted():
    broker, _ = new_broker()
    broker.create_channel("events", "work", max_attempts=1)
    published = broker.multi_publish("events", [b"a", b"b", b"c"])
    consumer = subscribe(broker, "events", "work", rdy=3)
    for msg in list(consumer.received):
        consumer.channel.requeue(consumer, msg.id)
    assert stats(broker, "events", "work").dead_letter_count == 3
    assert set(drain(broker, "events.dead", "audit")) == set(published)


# -- ttl -----------------------------------------------------------------------
def test_an_expired_message_is_never_delivered_and_is_counted():
    broker, clock = new_broker()
    short = broker.publish("events", b"short", ttl_ms=1000)
    forever = broker.publish("events", b"forever")
    broker.create_channel("events", "work")
    clock.advance(2)
    assert list(drain(broker, "events", "work")) == [forever]
    s = stats(broker, "events", "work")
    assert (s.expired_count, s.dead_letter_count, s.depth) == (1, 0, 0)
    assert short not in drain(broker, "events", "work")


def test_a_message_is_expired_from_the_instant_its_ttl_ends_for_leases_and_consumers():
    broker, clock = new_broker()
    broker.create_channel("events", "spark")
    broker.create_channel("events", "work")
    broker.multi_publish("events", [b"a", b"b"], ttl_ms=[1000, 1000])
    clock.advance(1)                                 # exactly the ttl
    session = broker.open_lease_session()
    lease, _ = broker.reserve(session.session_id, "events", "spark", 10)
    assert lease is None
    assert drain(broker, "events", "work") == {}
    assert (stats(broker, "events", "spark").expired_count,
            stats(broker, "events", "work").expired_count) == (2, 2)


def test_a_message_delivered_before_its_ttl_but_requeued_after_it_expires():
    broker, clock = new_broker()
    msg_id = broker.publish("events", b"x", ttl_ms=5000)
    consumer = subscribe(broker, "events", "work", rdy=10)
    clock.advance(6)
    consumer.channel.requeue(consumer, msg_id)
    assert [m.id for m in consumer.received] == [msg_id]
    assert stats(broker, "events", "work").expired_count == 1


def test_an_expired_message_goes_to_the_dead_letter_topic_when_the_channel_has_one():
    broker, clock = new_broker()
    broker.create_channel("events", "work", max_attempts=5)
    broker.create_channel("events", "other")
    msg_id = broker.publish("events", b"x", ttl_ms=1000)
    clock.advance(2)
    assert drain(broker, "events", "work") == {}
    assert drain(broker, "events", "other") == {}
    assert list(drain(broker, "events.dead", "audit")) == [msg_id]
    assert stats(broker, "events", "work").dead_letter_count == 1
    assert stats(broker, "events", "other").dead_letter_count == 0


def test_a_topic_ttl_applies_to_messages_published_without_one():
    broker, clock = new_broker()
    broker.create_topic("events", ttl_ms=1000)
    broker.create_channel("events", "work")
    old = broker.publish("events", b"default ttl")
    longer = broker.publish("events", b"own ttl", ttl_ms=10_000)
    clock.advance(2)
    fresh = broker.publish("events", b"published later")
    assert sorted(drain(broker, "events", "work")) == sorted([longer, fresh])
    assert old not in drain(broker, "events", "work")


def test_a_deferred_publish_that_expires_before_it_is_due_is_never_delivered():
    broker, clock = new_broker()
    consumer = subscribe(broker, "events", "work", rdy=10)
    broker.multi_publish("events", [b"late", b"on time"], defer_ms=[5000, 5000],
                         ttl_ms=[1000, 10_000])
    advance(broker, clock, 6)
    assert [m.body for m in consumer.received] == [b"on time"]


def test_a_negative_ttl_is_refused_and_nothing_is_published():
    broker, _ = new_broker()
    with pytest.raises(InvalidRequest, match="ttl -5"):
        broker.multi_publish("events", [b"a", b"b"], ttl_ms=[10, -5])
    with pytest.raises(InvalidRequest, match="2 ttls for 1 messages"):
        broker.multi_publish("events", [b"a"], ttl_ms=[10, 10])
    assert "events" not in broker.topics or broker.topics["events"].message_count == 0


def test_a_producer_repeat_with_other_ttls_is_a_conflict_not_a_silent_drop():
    broker, _ = new_broker()
    ids = broker.multi_publish("events", [b"a", b"b"], producer_id="p", sequence=1,
                               ttl_ms=[5000, 0])
    assert broker.multi_publish("events", [b"a", b"b"], producer_id="p", sequence=1,
                                ttl_ms=[5000, 0]) == ids
    with pytest.raises(ProducerConflict):
        broker.multi_publish("events", [b"a", b"b"], producer_id="p", sequence=1,
                             ttl_ms=[9000, 0])
    assert broker.stats("events")[0].message_count == 2


def test_a_lease_skips_expired_messages_among_live_ones_and_keeps_publish_order():
    broker, clock = new_broker()
    broker.create_channel("events", "spark", max_attempts=5)
    ids = broker.multi_publish("events", [b"%d" % i for i in range(6)],
                               ttl_ms=[1000, 0, 1000, 0, 0, 1000])
    clock.advance(2)
    session = broker.open_lease_session()
    lease, _ = broker.reserve(session.session_id, "events", "spark", 10)
    assert [m.id for m in lease.order] == [ids[1], ids[3], ids[4]]
    assert sorted(drain(broker, "events.dead", "audit")) == sorted([ids[0], ids[2], ids[5]])
