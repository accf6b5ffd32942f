"""Memory past ``--mem-queue-size``, for every state a message can wait in: a channel
keeps at most that many ready messages in memory (plus what it reads ahead and what a
consumer gave back), and as many deferred ones; the rest wait on disk as their place
in the log, with their delivery count and due time, at run time and after a restart.
Checked with ``memory_count``, the stat of messages whose body the broker holds."""

from __future__ import annotations

import pytest

from broker.backlog import SLACK
from broker.clock import ManualClock
from broker.storage import records

from .corekit import Recorder
from .test_storage_recovery import RESTARTS, drain, start

LIMIT = 5


def memory_count(broker, topic="events", channel="work") -> int:
    stats = broker.topic(topic).stats()
    return stats.channels[0].memory_count if channel else stats.memory_count


def test_requeued_messages_wait_on_disk_past_mem_queue_size_with_their_attempts(tmp_path):
    clock = ManualClock()
    broker = start(tmp_path, clock, mem_queue_size=LIMIT)
    ids = broker.multi_publish("events", [b"m%03d" % i * 100 for i in range(300)])
    consumer = Recorder(broker)
    ch = broker.subscribe(consumer, "events", "work")
    ch.set_rdy(consumer, 300)
    ch.set_rdy(consumer, 0)
    assert len(consumer.received) == 300
    for msg_id in ids:
        ch.requeue(consumer, msg_id)
    assert ch.depth == 300
    assert memory_count(broker) <= LIMIT
    ch.set_rdy(consumer, 300)
    again = consumer.received[300:]
    assert [m.id for m in again] == ids
    assert [m.attempts for m in again] == [2] * 300
    assert [m.body for m in again] == [b"m%03d" % i * 100 for i in range(300)]


def test_timed_out_messages_wait_on_disk_past_mem_queue_size_with_their_attempts(tmp_path):
    clock = ManualClock()
    broker = start(tmp_path, clock, mem_queue_size=LIMIT)
    ids = broker.multi_publish("events", [b"m%03d" % i for i in range(300)])
    consumer = Recorder(broker, msg_timeout_ms=1000)
    ch = broker.subscribe(consumer, "events", "work")
    ch.set_rdy(consumer, 300)
    ch.set_rdy(consumer, 0)
    clock.advance(2)
    broker.tick()
    assert ch.timeout_count == 300 and ch.depth == 300
    assert memory_count(broker) <= LIMIT
    ch.set_rdy(consumer, 300)
    assert consumer.ids[300:] == ids
    assert [m.attempts for m in consumer.received[300:]] == [2] * 300


def test_a_consumer_that_leaves_gives_back_its_messages_to_disk_past_the_slack(tmp_path):
    clock = ManualClock()
    broker = start(tmp_path, clock, mem_queue_size=LIMIT, max_rdy_count=3 * SLACK)
    ids = broker.multi_publish("events", [b"m%04d" % i for i in range(3 * SLACK)])
    consumer = Recorder(broker)
    ch = broker.subscribe(consumer, "events", "work")
    ch.set_rdy(consumer, 3 * SLACK)
    ch.remove_consumer(consumer)
    assert ch.depth == 3 * SLACK
    assert memory_count(broker) <= LIMIT + SLACK
    assert list(drain(broker, "events", "work")) == ids


@pytest.mark.parametrize("stop", RESTARTS)
def test_deferred_messages_wait_on_disk_past_mem_queue_size_across_restarts(tmp_path, stop):
    clock = ManualClock()
    broker = start(tmp_path, clock, mem_queue_size=LIMIT)
    broker.create_channel("events", "work")
    dpub = [broker.publish("events", b"d%03d" % i, defer_ms=60_000) for i in range(200)]
    ids = broker.multi_publish("events", [b"r%03d" % i for i in range(200)])
    consumer = Recorder(broker)
    ch = broker.subscribe(consumer, "events", "work")
    ch.set_rdy(consumer, 200)
    for msg_id in ids:
        ch.requeue(consumer, msg_id, delay=30)
    assert ch.deferred_count == 400
    assert memory_count(broker) <= LIMIT
    stop(broker)
    broker = start(tmp_path, clock, mem_queue_size=LIMIT)
    ch = broker.channel("events", "work")
    assert ch.deferred_count == 400
    assert memory_count(broker) <= LIMIT
    clock.advance(29)
    broker.tick()
    assert drain(broker, "events", "work") == {}
    clock.advance(2)
    broker.tick()
    consumer = Recorder(broker)
    broker.subscribe(consumer, "events", "work").set_rdy(consumer, 1000)
    assert consumer.ids == ids                # REQed: due after 30 s, attempts kept
    assert [m.attempts for m in consumer.received] == [2] * 200
    consumer.fin_all()
    ch.remove_consumer(consumer)
    clock.advance(30)
    broker.tick()
    back = drain(broker, "events", "work")
    assert list(back) == dpub
    assert list(back.values()) == [b"d%03d" % i for i in range(200)]


def test_a_topic_without_channels_holds_its_deferred_messages_on_disk(tmp_path):
    clock = ManualClock()
    broker = start(tmp_path, clock, mem_queue_size=LIMIT)
    dpub = [broker.publish("events", b"d%03d" % i, defer_ms=10_000) for i in range(200)]
    assert broker.topic("events").depth == 200
    assert memory_count(broker, channel=None) <= LIMIT
    broker.create_channel("events", "work")
    assert broker.channel("events", "work").deferred_count == 200
    assert memory_count(broker) <= LIMIT
    clock.advance(11)
    broker.tick()
    assert list(drain(broker, "events", "work")) == dpub


def test_held_deferred_messages_on_disk_that_came_due_are_ready_once_a_channel_exists(tmp_path):
    clock = ManualClock()
    broker = start(tmp_path, clock, mem_queue_size=LIMIT)
    dpub = [broker.publish("events", b"d%03d" % i, defer_ms=5000) for i in range(20)]
    clock.advance(30)
    broker.tick()
    broker.create_channel("events", "work")
    ch = broker.channel("events", "work")
    assert (ch.depth, ch.deferred_count) == (20, 0)
    assert sorted(drain(broker, "events", "work")) == sorted(dpub)


def test_a_paused_topic_holds_deferred_messages_on_disk_for_each_of_its_channels(tmp_path):
    clock = ManualClock()
    broker = start(tmp_path, clock, mem_queue_size=LIMIT)
    for name in ("a", "b"):
        broker.create_channel("events", name)
    topic = broker.topic("events")
    topic.pause()
    dpub = [broker.publish("events", b"d%03d" % i, defer_ms=10_000) for i in range(50)]
    stats = topic.stats()
    assert stats.memory_count <= LIMIT
    assert stats.on_disk_count + stats.memory_count == 50   # each message counted once
    topic.unpause()
    assert [broker.channel("events", n).deferred_count for n in ("a", "b")] == [50, 50]
    clock.advance(11)
    broker.tick()
    assert list(drain(broker, "events", "a")) == dpub
    assert list(drain(broker, "events", "b")) == dpub


@pytest.mark.parametrize("stop", RESTARTS)
def test_a_topic_without_channels_keeps_its_deferred_messages_on_disk_across_restarts(
        tmp_path, stop):
    clock = ManualClock()
    broker = start(tmp_path, clock, mem_queue_size=LIMIT)
    dpub = [broker.publish("events", b"d%03d" % i, defer_ms=10_000) for i in range(50)]
    stop(broker)
    broker = start(tmp_path, clock, mem_queue_size=LIMIT)
    assert broker.topic("events").depth == 50
    broker.create_channel("events", "work")
    clock.advance(9)
    broker.tick()
    assert broker.channel("events", "work").depth == 0      # not due before its time
    clock.advance(2)
    broker.tick()
    assert sorted(drain(broker, "events", "work")) == sorted(dpub)


def test_emptying_a_topic_drops_what_it_holds_on_disk_for_good(tmp_path):
    clock = ManualClock()
    broker = start(tmp_path, clock, mem_queue_size=LIMIT)
    broker.multi_publish("events", [b"m%03d" % i for i in range(50)])
    broker.publish("events", b"later", defer_ms=5000)
    broker.topic("events").empty()
    assert broker.topic("events").depth == 0
    broker.storage.close()
    broker = start(tmp_path, clock, mem_queue_size=LIMIT)
    broker.create_channel("events", "work")
    clock.advance(6)
    broker.tick()
    assert drain(broker, "events", "work") == {}


def test_a_publish_split_past_the_largest_record_reads_each_message_back_as_itself(
        tmp_path, monkeypatch):
    """Past MAX_PAYLOAD an MPUB is written as several records; a body too large to share
    one goes in a PUB of its own between BATCHes, and every message waiting on disk is
    read back from its own place."""
    monkeypatch.setattr(records, "MAX_PAYLOAD", 1_000)
    broker = start(tmp_path, ManualClock(), mem_queue_size=0)
    broker.get_or_create_topic("events").get_or_create_channel("work")
    bodies = [b"a" * 600, b"b" * 600, b"c" * 10, b"d" * 10, b"e" * 700, b"f" * 5]
    ids = broker.multi_publish("events", bodies)
    assert memory_count(broker) == 0
    assert drain(broker, "events", "work") == dict(zip(ids, bodies))
