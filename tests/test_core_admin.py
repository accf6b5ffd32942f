"""Names, sizes, ephemeral topics and channels, pause, empty, delete and stats
in the core (DESIGN.md 6, 7 and 9), on a ManualClock."""

from __future__ import annotations

import pytest

from broker import (ChannelNotFound, InvalidChannel, InvalidMessage, InvalidTopic, MessageTooBig,
                    NotInFlight, TopicNotFound)

from .corekit import Recorder, advance, new_broker, subscribe

GOOD_NAMES = ["a", "x" * 64, "Events.v1_2-3", "events#ephemeral", "x" * 54 + "#ephemeral"]
BAD_NAMES = ["", "x" * 65, "has space", "a/b", "a#b", "#ephemeral", "x#ephemeral#ephemeral", "é"]


@pytest.mark.parametrize("name", GOOD_NAMES)
def test_valid_names_are_accepted(name):
    broker, _ = new_broker()
    broker.create_channel(name, name)
    assert name in broker.topics and name in broker.topics[name].channels


@pytest.mark.parametrize("name", BAD_NAMES)
def test_invalid_topic_name_is_refused_naming_it(name):
    broker, _ = new_broker()
    with pytest.raises(InvalidTopic, match=f"invalid topic name {name!r}"):
        broker.publish(name, b"x")
    assert broker.topics == {}


@pytest.mark.parametrize("name", BAD_NAMES)
def test_invalid_channel_name_is_refused_naming_it(name):
    broker, _ = new_broker()
    with pytest.raises(InvalidChannel, match=f"invalid channel name {name!r}"):
        subscribe(broker, "events", name)
    assert "events" not in broker.topics or broker.topics["events"].channels == {}


def test_empty_body_is_refused():
    broker, _ = new_broker()
    with pytest.raises(InvalidMessage, match="empty body"):
        broker.publish("events", b"")


def test_body_over_max_msg_size_is_refused_with_both_sizes():
    broker, _ = new_broker(max_msg_size=10)
    broker.publish("events", b"x" * 10)
    with pytest.raises(MessageTooBig, match="body of 11 bytes is over the max-msg-size of 10"):
        broker.publish("events", b"x" * 11)


def test_multi_publish_with_one_bad_body_accepts_none():
    broker, _ = new_broker(max_msg_size=10)
    c = subscribe(broker, "events", "work")
    with pytest.raises(MessageTooBig, match="message 2: body of 11 bytes"):
        broker.multi_publish("events", [b"a", b"b", b"x" * 11, b"d"])
    assert c.received == [] and broker.topics["events"].message_count == 0


def test_ephemeral_channel_goes_away_with_its_last_consumer():
    broker, _ = new_broker()
    durable = subscribe(broker, "events", "keep")
    first = subscribe(broker, "events", "tail#ephemeral")
    second = subscribe(broker, "events", "tail#ephemeral")
    ch = first.channel
    ch.remove_consumer(first)
    assert "tail#ephemeral" in broker.topics["events"].channels
    ch.remove_consumer(second)
    assert list(broker.topics["events"].channels) == ["keep"]
    durable.channel.remove_consumer(durable)
    assert "keep" in broker.topics["events"].channels


def test_ephemeral_topic_goes_away_with_its_last_channel():
    broker, _ = new_broker()
    c = subscribe(broker, "scratch#ephemeral", "tail#ephemeral")
    broker.publish("scratch#ephemeral", b"x")
    c.channel.remove_consumer(c)
    assert broker.topics == {}


def test_paused_channel_delivers_nothing_until_unpaused():
    broker, _ = new_broker()
    c = subscribe(broker, "events", "work")
    other = subscribe(broker, "events", "other")
    c.channel.pause()
    ids = broker.multi_publish("events", [b"a", b"b"])
    assert c.received == [] and c.channel.depth == 2
    assert other.ids == ids
    c.channel.unpause()
    assert c.ids == ids


def test_paused_topic_holds_messages_for_every_channel_until_unpaused():
    broker, _ = new_broker()
    a = subscribe(broker, "events", "a")
    b = subscribe(broker, "events", "b")
    topic = broker.topic("events")
    topic.pause()
    ids = broker.multi_publish("events", [b"1", b"2"])
    assert a.received == [] and b.received == [] and topic.depth == 2
    topic.unpause()
    assert a.ids == ids and b.ids == ids and topic.depth == 0


def test_topic_without_channels_keeps_messages_for_its_first_channel():
    broker, _ = new_broker()
    ids = broker.multi_publish("events", [b"1", b"2"])
    assert broker.topic("events").depth == 2
    c = subscribe(broker, "events", "late")
    assert c.ids == ids


def test_a_topic_without_channels_paused_and_unpaused_keeps_its_messages_for_its_first_channel():
    broker, _ = new_broker()
    ids = broker.multi_publish("events", [b"1", b"2"])
    topic = broker.topic("events")
    topic.pause()
    topic.unpause()
    assert topic.depth == 2
    assert subscribe(broker, "events", "late").ids == ids


def test_a_channel_created_on_a_paused_topic_gets_nothing_until_unpaused():
    broker, _ = new_broker()
    ids = broker.multi_publish("events", [b"1", b"2"])
    broker.topic("events").pause()
    c = subscribe(broker, "events", "late")
    assert c.received == [] and broker.topic("events").depth == 2
    broker.topic("events").unpause()
    assert c.ids == ids


def test_empty_topic_drops_what_it_holds_for_channels_created_later():
    broker, _ = new_broker()
    broker.multi_publish("events", [b"1", b"2"])
    broker.topic("events").empty()
    assert broker.topic("events").depth == 0
    c = subscribe(broker, "events", "late")
    new_id = broker.publish("events", b"3")
    assert c.ids == [new_id]


def test_empty_channel_drops_ready_deferred_and_in_flight_messages():
    broker, _ = new_broker()
    c = subscribe(broker, "events", "work", rdy=1)
    ids = broker.multi_publish("events", [b"1", b"2", b"3"])
    ch = c.channel
    ch.requeue(c, ids[0], delay=10)   # deferred; 2 goes in flight, 3 waits
    ch.empty()
    assert (ch.depth, ch.in_flight_count, ch.deferred_count) == (0, 0, 0)
    with pytest.raises(NotInFlight):
        ch.finish(c, ids[1])
    new_id = broker.publish("events", b"4")
    assert c.ids[-1] == new_id  # the consumer's RDY is free again


def test_deleting_a_channel_evicts_its_consumers_and_keeps_the_others():
    broker, _ = new_broker()
    gone = subscribe(broker, "events", "gone")
    kept = subscribe(broker, "events", "kept")
    evicted = []
    gone.on_evicted = lambda: evicted.append(gone)
    broker.delete_channel("events", "gone")
    assert evicted == [gone]
    msg_id = broker.publish("events", b"x")
    assert kept.ids == [msg_id] and gone.received == []
    with pytest.raises(ChannelNotFound, match="channel events/gone does not exist"):
        broker.channel("events", "gone")


def test_deleting_the_last_channel_of_a_topic_keeps_the_topic():
    broker, _ = new_broker()
    broker.create_channel("events", "only")
    broker.delete_channel("events", "only")
    assert broker.topic("events").channels == {}
    msg_id = broker.publish("events", b"x")
    assert subscribe(broker, "events", "next").ids == [msg_id]


def test_deleting_a_topic_evicts_every_consumer():
    broker, _ = new_broker()
    c = subscribe(broker, "events", "work")
    evicted = []
    c.on_evicted = lambda: evicted.append(c)
    broker.delete_topic("events")
    assert evicted == [c] and broker.topics == {}
    with pytest.raises(TopicNotFound, match="topic events does not exist"):
        broker.topic("events")


def test_stats_count_depth_in_flight_deferred_requeues_timeouts_and_clients():
    broker, clock = new_broker()
    c = subscribe(broker, "events", "work", rdy=2, msg_timeout_ms=1000)
    ids = broker.multi_publish("events", [b"1", b"2", b"3", b"4"])
    c.channel.requeue(c, ids[0], delay=5)     # deferred; 3 delivered
    advance(broker, clock, 1.0)               # 2 and 3 time out; 4 and 2 go out
    [topic] = broker.stats("events")
    [ch] = topic.channels
    assert (topic.name, topic.message_count, topic.message_bytes) == ("events", 4, 4)
    assert (ch.depth, ch.in_flight_count, ch.deferred_count) == (1, 2, 1)
    assert (ch.message_count, ch.requeue_count, ch.timeout_count) == (4, 1, 2)
    [client] = ch.clients
    assert (client.ready_count, client.in_flight_count, client.message_count) == (2, 2, 5)


def test_stats_counts_add_up_over_publishes_deferrals_requeues_and_disconnects():
    broker, _ = new_broker()
    worker = Recorder(broker, client_id="worker-1")
    ch = broker.subscribe(worker, "events", "work")
    ch.set_rdy(worker, 3)
    ids = broker.multi_publish("events", [b"1", b"22"]) + [broker.publish("events", b"333")]
    broker.publish("events", b"4444", defer_ms=5000)
    ch.finish(worker, ids[0])
    ch.requeue(worker, ids[1])                # back at once: held again
    ch.requeue(worker, ids[1])
    ch.finish(worker, ids[2])
    [topic] = broker.stats("events")
    [work] = topic.channels
    assert (topic.message_count, topic.message_bytes) == (4, 10)
    assert (work.name, work.message_count, work.deferred_count) == ("work", 4, 1)
    [client] = work.clients
    assert (client.client_id, client.finish_count, client.requeue_count) == ("worker-1", 2, 2)
    assert (client.message_count, client.in_flight_count) == (5, 1)
    ch.remove_consumer(worker)                # the message it still held is requeued too
    [work] = broker.stats("events")[0].channels
    assert (work.requeue_count, work.finish_count, work.depth, work.clients) == (3, 2, 1, [])


def test_stats_show_paused_state_and_depth_and_filter_by_channel():
    broker, _ = new_broker()
    for name in ("a", "b", "c"):
        broker.create_channel("events", name)
    broker.topic("events").pause()
    broker.channel("events", "b").pause()
    broker.publish("events", b"x")
    [topic] = broker.stats("events", "b")
    assert (topic.name, topic.paused, topic.depth) == ("events", True, 1)
    assert [(c.name, c.paused) for c in topic.channels] == [("b", True)]
    assert [c.name for c in broker.stats("events")[0].channels] == ["a", "b", "c"]
    broker.topic("events").unpause()
    broker.channel("events", "b").unpause()
    [topic] = broker.stats("events", "b")
    assert (topic.paused, topic.channels[0].paused) == (False, False)   # false, not null


def test_stats_count_leased_messages_and_their_fins_with_latency():
    broker, clock = new_broker()
    broker.create_channel("events", "spark")
    broker.multi_publish("events", [b"x"] * 5)
    session = broker.open_lease_session("driver")
    first, _ = broker.reserve(session.session_id, "events", "spark", 2, 5000)
    second, _ = broker.reserve(session.session_id, "events", "spark", 2, 5000)
    assert broker.stats("events")[0].channels[0].in_flight_count == 4
    clock.advance(0.25)
    broker.finish_leases([first.lease_id])
    broker.finish_leases([second.lease_id])
    [spark] = broker.stats("events")[0].channels
    assert (spark.finish_count, spark.in_flight_count, spark.depth) == (4, 0, 1)
    assert dict(spark.e2e_processing_latency) == pytest.approx({0.5: 250, 0.95: 250, 0.99: 250})


def test_stats_report_end_to_end_latency_percentiles_from_publish_to_fin():
    broker, clock = new_broker()
    c = subscribe(broker, "events", "work")
    ids = broker.multi_publish("events", [b"x"] * 100)
    for i, msg_id in enumerate(ids):
        clock.advance(0.001)  # the i-th message is FINed (i+1) ms after publish
        c.channel.finish(c, msg_id)
    [topic] = broker.stats("events")
    assert topic.channels[0].finish_count == 100
    latency = dict(topic.channels[0].e2e_processing_latency)
    assert latency == pytest.approx({0.5: 51.0, 0.95: 96.0, 0.99: 100.0})
    assert dict(topic.e2e_processing_latency) == latency


def test_latency_percentiles_cover_only_the_last_4096_fins():
    broker, clock = new_broker()
    c = subscribe(broker, "events", "work", rdy=2500)
    slow = broker.multi_publish("events", [b"x"] * 1000)
    clock.advance(1.0)                        # these 1000 are FINed 1 s after publish
    for msg_id in slow:
        c.channel.finish(c, msg_id)
    fast = broker.multi_publish("events", [b"x"] * 2048) + \
        broker.multi_publish("events", [b"x"] * 2048)
    for msg_id in fast:                       # these 4096 at once: 0 ms
        c.channel.finish(c, msg_id)
    latency = dict(broker.stats("events")[0].channels[0].e2e_processing_latency)
    assert latency[0.99] == pytest.approx(0, abs=0.01)


def test_the_info_log_has_a_line_per_change_an_operator_follows_and_none_per_message(caplog):
    """README "The log": nsqd's lines for topics, channels, consumers and lease
    sessions, each naming what changed, and nothing per message."""
    import logging

    from broker.consumer import Consumer
    from broker.stats import ClientIdentity

    caplog.set_level(logging.INFO, logger="pynsqd")
    broker, clock = new_broker()
    broker.create_channel("events", "archive")
    received = []
    who = ClientIdentity(client_id="spark-1", remote_address="127.0.0.1:5123", version="grpc")
    consumer = Consumer.attach(broker, "events", "spark", received.append, identity=who)
    consumer.channel.set_rdy(consumer, 5)
    broker.multi_publish("events", [b"x"] * 50)
    consumer.detach()
    session = broker.open_lease_session("planner-7")
    broker.reserve(session.session_id, "events", "archive", 3)
    broker.reserve(session.session_id, "events", "archive", 4)
    broker.close_lease_session(session.session_id)
    topic, archive = broker.topic("events"), broker.channel("events", "archive")
    archive.pause()
    archive.unpause()
    archive.empty()
    topic.pause()
    topic.unpause()
    topic.empty()
    broker.delete_channel("events", "archive")
    broker.delete_topic("events")
    lines = [r.getMessage() for r in caplog.records if r.name == "pynsqd"]
    assert lines == [
        "TOPIC(events): created",
        "CHANNEL(events/archive): created",
        "CHANNEL(events/spark): created",
        "CLIENT(grpc spark-1 127.0.0.1:5123): subscribed to events/spark",
        "CLIENT(grpc spark-1 127.0.0.1:5123): left events/spark (5 in flight requeued)",
        "lease session planner-7 ended: requeueing 2 lease(s)",
        "CHANNEL(events/archive): pausing",
        "CHANNEL(events/archive): unpausing",
        "CHANNEL(events/archive): emptying",
        "TOPIC(events): pausing",
        "TOPIC(events): unpausing",
        "TOPIC(events): emptying",
        "CHANNEL(events/archive): deleted",
        "TOPIC(events): deleted",
    ], "\n".join(lines)


def test_an_mpub_of_no_messages_is_refused_saying_so():
    broker, _ = new_broker()
    with pytest.raises(InvalidMessage, match="^MPUB: no messages$"):
        broker.multi_publish("events", [])
    assert "events" not in broker.topics
