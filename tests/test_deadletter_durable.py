"""Dead-letter settings, dead letters and message expiry across restarts (real data path)."""

from __future__ import annotations

import errno
import logging

import pytest

from broker.clock import ManualClock
from broker.storage import fileops

from .corekit import Recorder
from .faultfs import FaultyFiles
from .test_storage_recovery import RESTARTS, clean, drain, start


@pytest.mark.parametrize("stop", RESTARTS)
def test_channel_dead_letter_settings_and_topic_ttl_survive_a_restart(tmp_path, stop):
    clock = ManualClock()
    broker = start(tmp_path, clock)
    broker.create_topic("events", ttl_ms=5000)
    broker.create_channel("events", "work", max_attempts=4, dead_letter_topic="poison")
    broker.create_channel("events", "plain")
    stop(broker)
    broker = start(tmp_path, clock)
    work = broker.channel("events", "work")
    assert (work.max_attempts, work.dead_letter_topic) == (4, "poison")
    plain = broker.channel("events", "plain")
    assert (plain.max_attempts, plain.dead_letter_topic) == (None, "")
    assert broker.topic("events").ttl_ms == 5000


@pytest.mark.parametrize("stop", RESTARTS)
def test_a_topic_ttl_set_back_to_none_stays_none_after_a_restart(tmp_path, stop):
    clock = ManualClock()
    broker = start(tmp_path, clock)
    broker.create_topic("events", ttl_ms=5000)
    broker.create_topic("events", ttl_ms=0)
    stop(broker)
    broker = start(tmp_path, clock)
    assert broker.topic("events").ttl_ms == 0


@pytest.mark.parametrize("stop", RESTARTS)
def test_settings_survive_after_the_segment_that_set_them_is_reclaimed(tmp_path, stop):
    clock = ManualClock()
    broker = start(tmp_path, clock, max_bytes_per_file=2048)
    broker.create_topic("events", ttl_ms=60_000)
    broker.create_channel("events", "work", max_attempts=2)
    for i in range(200):  # rolls many segments; each is finished, so the old ones go
        broker.publish("events", b"x" * 100)
        drain(broker, "events", "work")
        broker.storage.tick()
    broker.storage.wait_synced()
    assert min(broker.storage.logs["events"].segment_numbers()) > 1
    stop(broker)
    broker = start(tmp_path, clock)
    assert broker.channel("events", "work").max_attempts == 2
    assert broker.topic("events").ttl_ms == 60_000


def test_a_deleted_channels_settings_do_not_come_back_with_a_new_channel_of_that_name(tmp_path):
    clock = ManualClock()
    broker = start(tmp_path, clock)
    broker.create_channel("events", "work", max_attempts=3)
    broker.delete_channel("events", "work")
    broker.create_channel("events", "work")
    clean(broker)
    broker = start(tmp_path, clock)
    assert broker.channel("events", "work").max_attempts is None


@pytest.mark.parametrize("stop", RESTARTS)
def test_a_message_keeps_its_expiry_across_a_restart(tmp_path, stop):
    clock = ManualClock()
    broker = start(tmp_path, clock, mem_queue_size=1)
    broker.create_channel("events", "work")
    # past mem-queue-size, the second waits on disk only: its expiry is read back too
    expiring = broker.multi_publish("events", [b"a", b"b"], ttl_ms=[3000, 3000])
    kept = broker.publish("events", b"c")
    stop(broker)
    clock.advance(4)
    broker = start(tmp_path, clock, mem_queue_size=1)
    assert list(drain(broker, "events", "work")) == [kept]
    assert broker.stats("events", "work")[0].channels[0].expired_count == len(expiring)


@pytest.mark.parametrize("stop", RESTARTS)
def test_a_dead_letter_is_in_the_dead_letter_topic_after_a_restart_and_not_pending(tmp_path, stop):
    clock = ManualClock()
    broker = start(tmp_path, clock)
    broker.create_channel("events", "work", max_attempts=1)
    broker.create_channel("events.dead", "audit")
    msg_id = broker.publish("events", b"poison")
    consumer = Recorder(broker)
    ch = broker.subscribe(consumer, "events", "work")
    ch.set_rdy(consumer, 1)
    ch.requeue(consumer, msg_id)
    assert ch.stats().dead_letter_count == 1
    stop(broker)
    broker = start(tmp_path, clock)
    assert drain(broker, "events", "work") == {}
    assert drain(broker, "events.dead", "audit") == {msg_id: b"poison"}


def test_a_crash_between_the_dead_letter_and_the_fin_duplicates_but_never_loses(tmp_path):
    clock = ManualClock()
    broker = start(tmp_path, clock)
    broker.create_channel("events", "work", max_attempts=1)
    broker.create_channel("events.dead", "audit")
    msg_id = broker.publish("events", b"poison")
    consumer = Recorder(broker)
    ch = broker.subscribe(consumer, "events", "work")
    ch.set_rdy(consumer, 1)
    broker.storage.flush()
    ch.requeue(consumer, msg_id)
    # kill -9 before the end of the pass: the dead letter's PUB is written, the FIN is not
    broker.storage.abandon()
    broker = start(tmp_path, clock)
    assert drain(broker, "events.dead", "audit") == {msg_id: b"poison"}
    # the source still holds it (attempts were not written either): it is delivered
    # again or dead-lettered again, never gone
    again = drain(broker, "events", "work")
    dead_again = drain(broker, "events.dead", "audit")
    assert again == {msg_id: b"poison"} or dead_again == {msg_id: b"poison"}



@pytest.mark.parametrize("stop", RESTARTS)
def test_a_message_moved_out_of_an_old_file_keeps_its_expiry(tmp_path, stop):
    clock = ManualClock()
    broker = start(tmp_path, clock, max_bytes_per_file=2048, mem_queue_size=5)
    consumer = Recorder(broker)
    ch = broker.subscribe(consumer, "events", "work")
    old = broker.publish("events", b"old", ttl_ms=4_000_000)
    ch.set_rdy(consumer, 1)
    expires = consumer.received[0].expires
    assert expires
    ch.requeue(consumer, old, delay=3000)  # waits for 50 minutes, in the first file
    for i in range(300):
        broker.publish("events", f"new-{i}".encode() * 5)
        ch.set_rdy(consumer, 1000)
        consumer.fin_all()
    broker.storage.tick()  # "old" alone holds the first file ...
    clock.advance(1)
    broker.storage.tick()  # ... and still does a second later: it is moved out
    broker.storage.wait_synced()
    # the first file is gone: "old" was copied to the end of the log
    assert len(list((tmp_path / "topics" / "t-events").glob("*.log"))) <= 3
    stop(broker)
    broker = start(tmp_path, clock, max_bytes_per_file=2048)
    deferred = broker.channel("events", "work")._deferred.live()
    assert [(m.id, m.expires) for m in deferred] == [(old, expires)]
    clock.advance(4001)   # past the deferral and the ttl: never delivered
    broker.tick()
    assert drain(broker, "events", "work") == {}
    assert broker.stats("events", "work")[0].channels[0].expired_count == 1


@pytest.mark.parametrize("stop", RESTARTS)
@pytest.mark.parametrize("dead_topic", ["made", "new"])
def test_a_dead_letter_the_disk_refuses_is_kept_logged_and_moved_once_the_disk_takes_it(
        tmp_path, monkeypatch, caplog, dead_topic, stop):
    files = FaultyFiles()
    monkeypatch.setattr(fileops, "current", files)
    clock = ManualClock()
    broker = start(tmp_path, clock)
    broker.create_channel("events", "work", max_attempts=1)
    if dead_topic == "made":
        broker.create_channel("events.dead", "audit")
    msg_id = broker.publish("events", b"poison")
    consumer = Recorder(broker)
    ch = broker.subscribe(consumer, "events", "work")
    ch.set_rdy(consumer, 1)
    broker.storage.flush()
    files.fail("write", errno.ENOSPC)   # the disk is full: the dead letter's PUB fails
    caplog.set_level(logging.ERROR, logger="pynsqd")
    ch.requeue(consumer, msg_id)
    clock.advance(1)                    # the retry a second later fails too
    broker.tick()
    refusals = [r.getMessage() for r in caplog.records if "dead-lettered" in r.getMessage()]
    why = {"made": "PUB to events.dead failed: the data path could not take it (No space "
                   "left on device); nothing was accepted",
           "new": "topic events.dead could not be created: the data path could not take it "
                  "(No space left on device); nothing was changed"}[dead_topic]
    assert refusals == [f"events/work: message {msg_id} could not be dead-lettered to "
                        f"events.dead: {why} (kept; retried)"] * 2
    # Kept in its channel, waiting for the next try: neither delivered nor dead-lettered.
    stats = ch.stats()
    assert (stats.dead_letter_count, stats.deferred_count, stats.depth) == (0, 1, 0)
    assert [m.id for m in consumer.received] == [msg_id]
    assert "events.dead" in broker.topics or dead_topic == "new"
    files.heal()
    clock.advance(1)
    broker.tick()
    stats = ch.stats()
    assert (stats.dead_letter_count, stats.deferred_count, stats.depth) == (1, 0, 0)
    stop(broker)
    broker = start(tmp_path, clock)
    broker.create_channel("events.dead", "audit")
    assert drain(broker, "events", "work") == {}
    assert drain(broker, "events.dead", "audit") == {msg_id: b"poison"}
