"""Damage, missing files and the log format's limits, on the core with a manual clock
and a real data path: one damaged byte costs at most the record it hits (the records
that decide which channels own messages are written twice), a missing file is named in
the log, and a topic may have as many durable channels as its log records hold (more
than a mask of 64 bits: the limit is checked when a channel is created)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

import broker.storage.store as store_module
from broker.clock import ManualClock
from broker.errors import InvalidChannel
from broker.storage import records

from .corekit import Recorder
from .test_storage_recovery import RESTARTS, clean, crash, drain, start


@pytest.fixture(autouse=True)
def small_scan_blocks(monkeypatch):
    """Start reads files in blocks of a few records, so records straddle blocks."""
    monkeypatch.setattr(store_module, "SCAN_BLOCK", 97)


def files_of(path: Path, topic: str) -> list[Path]:
    return sorted((path / "topics" / f"t-{topic}").glob("*.log"))


def damage(path: Path, kind: int, nth: int = 0) -> None:
    """Flip one byte in the middle of the ``nth`` record of ``kind`` in the file."""
    data = bytearray(path.read_bytes())
    found = [r for r in records.scan_file(bytes(data), str(path)) if r.kind == kind]
    record = found[nth]
    at = record.offset + records.HEADER_SIZE + max(0, len(record.payload) // 2)
    if not len(record.payload):
        at = record.offset + records.HEADER_SIZE - 1   # the CRC's last byte
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("copy", [0, 1])
def test_a_damaged_state_record_of_the_oldest_file_loses_no_message(tmp_path, copy, caplog):
    clock = ManualClock()
    broker = start(tmp_path, clock, max_bytes_per_file=1024)
    consumer = Recorder(broker)
    ch = broker.subscribe(consumer, "events", "work")
    for i in range(40):   # files whose CREATE record goes once they are all FINed
        broker.publish("events", f"done-{i}".encode() * 5)
        ch.set_rdy(consumer, 100)
        consumer.fin_all()
    ch.remove_consumer(consumer)
    ids = [broker.publish("events", f"kept-{i}".encode() * 5) for i in range(200)]
    broker.storage.wait_synced()     # the finished files are deleted
    crash(broker)
    # The oldest file with messages pending: its STATE record alone names the channel.
    oldest = next(f for f in files_of(tmp_path, "events")
                  if records.PUB in {r.kind for r in records.scan_file(f.read_bytes(), "")})
    assert records.CHANNEL not in {r.kind for r in records.scan_file(oldest.read_bytes(), "")}
    damage(oldest, records.STATE, copy)
    broker = start(tmp_path, clock, max_bytes_per_file=1024)
    assert sorted(drain(broker, "events", "work")) == sorted(ids)
    assert any("1 copy(ies) of a record written twice (nothing lost)" in r.getMessage()
               for r in caplog.records)


@pytest.mark.parametrize("stop", RESTARTS)
def test_a_damaged_channel_creation_record_loses_none_of_its_messages(tmp_path, stop):
    clock = ManualClock()
    broker = start(tmp_path, clock)
    broker.create_channel("events", "first")
    early = broker.multi_publish("events", [f"e{i}".encode() for i in range(100)])
    broker.create_channel("events", "late")
    late = broker.multi_publish("events", [f"l{i}".encode() for i in range(500)])
    stop(broker)
    log_file, = files_of(tmp_path, "events")
    damage(log_file, records.CHANNEL, 2)   # the first copy of "late"'s creation
    broker = start(tmp_path, clock)
    assert sorted(drain(broker, "events", "late")) == sorted(late)
    assert sorted(drain(broker, "events", "first")) == sorted(early + late)


@pytest.mark.parametrize("copies", [1, 2])
def test_a_damaged_flush_record_leaves_nothing_stuck_in_the_topic(tmp_path, copies):
    clock = ManualClock()
    broker = start(tmp_path, clock)
    broker.create_channel("events", "work")
    broker.topic("events").pause()
    ids = broker.multi_publish("events", [f"m{i}".encode() for i in range(300)])
    broker.topic("events").unpause()   # what the topic held goes to its channel
    crash(broker)
    log_file, = files_of(tmp_path, "events")
    for _ in range(copies):   # even both copies: the unpause says it again
        damage(log_file, records.FLUSH, 0)
    broker = start(tmp_path, clock)
    assert broker.topic("events").depth == 0
    assert sorted(drain(broker, "events", "work")) == sorted(ids)


def test_a_damaged_message_costs_that_message_only(tmp_path, caplog):
    clock = ManualClock()
    broker = start(tmp_path, clock)
    broker.create_channel("events", "work")
    ids = [broker.publish("events", f"m{i}".encode() * 10) for i in range(100)]
    clean(broker)
    log_file, = files_of(tmp_path, "events")
    damage(log_file, records.PUB, 40)
    caplog.set_level(logging.WARNING, logger="pynsqd")
    broker = start(tmp_path, clock)
    assert sorted(drain(broker, "events", "work")) == sorted(ids[:40] + ids[41:])
    assert any("damaged" in r.getMessage() and log_file.name in r.getMessage()
               for r in caplog.records)
    assert any("topic events: damaged records skipped" in r.getMessage()
               and "1 message(s) lost to channel(s) work" in r.getMessage()
               for r in caplog.records)


@pytest.mark.parametrize("where", [0.0, 0.3, 0.99])   # ids, publish times, bodies
def test_a_damaged_mpub_costs_the_messages_of_that_mpub_only(tmp_path, caplog, where):
    """An MPUB is one record with one checksum: one damaged byte loses that MPUB (it was
    accepted whole, it is lost whole), and every message published before or after it."""
    clock = ManualClock()
    broker = start(tmp_path, clock)
    broker.create_channel("events", "work")
    batches = [broker.multi_publish("events", [f"b{b}m{i}".encode() * 10 for i in range(50)])
               for b in range(3)]
    single = broker.publish("events", b"alone")
    clean(broker)
    log_file, = files_of(tmp_path, "events")
    data = bytearray(log_file.read_bytes())
    record = [r for r in records.scan_file(bytes(data), "") if r.kind == records.BATCH][1]
    data[record.offset + records.HEADER_SIZE + 5 + int(len(record.payload[5:]) * where)] ^= 0x10
    log_file.write_bytes(bytes(data))
    caplog.set_level(logging.WARNING, logger="pynsqd")
    broker = start(tmp_path, clock)
    assert sorted(drain(broker, "events", "work")) == sorted(batches[0] + batches[2] + [single])
    assert any("topic events: damaged records skipped" in r.getMessage()
               and "50 message(s) lost to channel(s) work" in r.getMessage()
               for r in caplog.records)


def test_an_mpub_damaged_after_the_start_loses_its_messages_and_frees_their_file(tmp_path,
                                                                               caplog):
    """Found damaged when read back from disk (past --mem-queue-size), each message of the
    MPUB is lost on its own: the others are delivered, and once they are FINed nothing
    holds the file (no copy of the lost ones is left counted)."""
    clock = ManualClock()
    broker = start(tmp_path, clock, mem_queue_size=10, max_bytes_per_file=4096)
    broker.create_channel("events", "work")
    batches = [broker.multi_publish("events", [f"b{b}m{i}".encode() * 4 for i in range(20)])
               for b in range(4)]
    first_file = files_of(tmp_path, "events")[0]
    data = bytearray(first_file.read_bytes())
    record = [r for r in records.scan_file(bytes(data), "") if r.kind == records.BATCH][2]
    data[record.offset + records.HEADER_SIZE + len(record.payload) - 3] ^= 0x10
    first_file.write_bytes(bytes(data))  # the same inode: the broker reads it back so
    caplog.set_level(logging.ERROR, logger="pynsqd")
    got = drain(broker, "events", "work")
    assert sorted(got) == sorted(batches[0] + batches[1] + batches[3])
    log_ = broker.storage.logs["events"]
    assert not any(log_.refs.values())
    lost = [r.getMessage() for r in caplog.records if "a message of it is lost" in r.getMessage()]
    assert len(lost) == 20   # each message of it, naming where the record starts
    assert all(f"the record at offset {record.offset} fails its check" in m for m in lost)


def test_a_missing_log_file_is_named_in_the_log_with_its_channels(tmp_path, caplog):
    clock = ManualClock()
    broker = start(tmp_path, clock, max_bytes_per_file=1024)
    broker.create_channel("events", "work")
    ids = [broker.publish("events", f"m{i}".encode() * 10) for i in range(100)]
    crash(broker)
    files = files_of(tmp_path, "events")
    files[2].unlink()
    caplog.set_level(logging.ERROR, logger="pynsqd")
    broker = start(tmp_path, clock, max_bytes_per_file=1024)
    got = drain(broker, "events", "work")
    assert set(got) < set(ids) and len(got) >= len(ids) - 20  # only that file's messages
    assert any(files[2].name in r.getMessage() and "missing" in r.getMessage()
               and "work" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("end", ["oldest", "newest"])
def test_a_missing_oldest_or_newest_log_file_is_named_with_the_ids_it_held(tmp_path, caplog,
                                                                          end):
    """Each file records the oldest file kept and the next message id when it is made,
    an older file where the log rolled on to, and the log each file the broker deleted:
    a missing oldest or newest file is found, and the ids of the messages it held said."""
    clock = ManualClock()
    broker = start(tmp_path, clock, max_bytes_per_file=1024)
    broker.create_channel("events", "work")
    consumer = Recorder(broker)
    ch = broker.subscribe(consumer, "events", "work")
    for i in range(40):                     # consumed: the broker deletes these files itself
        broker.publish("events", f"done{i}".encode() * 10)
        ch.set_rdy(consumer, 100)
        consumer.fin_all()
    broker.storage.wait_synced()
    ch.remove_consumer(consumer)
    ids = [broker.publish("events", f"m{i}".encode() * 10) for i in range(100)]
    clean(broker)
    files = files_of(tmp_path, "events")
    assert int(files[0].name[:-4]) > 1      # the broker deleted the first ones
    gone = files[0] if end == "oldest" else files[-1]
    held = {r.payload[:8].hex() for r in records.scan_file(gone.read_bytes(), "")
            if r.kind == records.PUB}
    gone.unlink()
    caplog.set_level(logging.ERROR, logger="pynsqd")
    broker = start(tmp_path, clock, max_bytes_per_file=1024)
    got = drain(broker, "events", "work")
    assert sorted(got) == sorted(set(ids) - held)
    said = [r.getMessage() for r in caplog.records if gone.name in r.getMessage()]
    assert len(said) == 1 and f"{end} log file" in said[0]
    if end == "oldest":   # the ids before the first one still there
        assert f"before {min(set(ids) - held)}" in said[0]
    else:                 # the ids from the first one it held
        assert f"from id {min(held)}" in said[0]


def test_files_the_broker_deleted_itself_are_not_reported_missing(tmp_path, caplog):
    clock = ManualClock()
    broker = start(tmp_path, clock, max_bytes_per_file=1024)
    broker.create_channel("events", "work")
    consumer = Recorder(broker)
    ch = broker.subscribe(consumer, "events", "work")
    for i in range(60):
        broker.publish("events", f"m{i}".encode() * 10)
        ch.set_rdy(consumer, 100)
        consumer.fin_all()
    broker.storage.wait_synced()
    crash(broker)
    assert int(files_of(tmp_path, "events")[0].name[:-4]) > 1
    caplog.set_level(logging.ERROR, logger="pynsqd")
    start(tmp_path, clock, max_bytes_per_file=1024)
    assert not [r for r in caplog.records if "missing" in r.getMessage()]


@pytest.mark.parametrize("stop", RESTARTS)
def test_a_topic_with_more_durable_channels_than_a_64_bit_mask_restarts(tmp_path, stop):
    clock = ManualClock()
    broker = start(tmp_path, clock)
    names = [f"c{i:03d}" for i in range(130)]
    for name in names:
        broker.create_channel("events", name)
    ids = broker.multi_publish("events", [f"m{i}".encode() for i in range(5)])
    broker.delete_channel("events", "c007")   # a freed bit, used again
    broker.create_channel("events", "again")
    more = broker.publish("events", b"more")
    consumer = Recorder(broker)
    ch = broker.subscribe(consumer, "events", "c100")
    ch.set_rdy(consumer, 2)
    consumer.fin_all()
    ch.remove_consumer(consumer)
    stop(broker)
    broker = start(tmp_path, clock)
    assert set(broker.topic("events").channels) == {*names, "again"} - {"c007"}
    assert set(drain(broker, "events", "c000")) == {*ids, more}
    assert set(drain(broker, "events", "c129")) == {*ids, more}
    assert set(drain(broker, "events", "again")) == {more}
    assert set(drain(broker, "events", "c100")) == {*ids[2:], more}


def test_a_durable_channel_past_what_the_log_holds_is_refused_at_creation(tmp_path,
                                                                          monkeypatch):
    monkeypatch.setattr(records, "MAX_CHANNELS", 3)
    clock = ManualClock()
    broker = start(tmp_path, clock)
    for name in ("a", "b", "c"):
        broker.create_channel("events", name)
    with pytest.raises(InvalidChannel, match="3 durable channels, the most its log holds"):
        broker.create_channel("events", "d")
    broker.create_channel("events", "e#ephemeral")   # ephemeral ones are not in the log
    assert set(broker.topic("events").channels) == {"a", "b", "c", "e#ephemeral"}
    crash(broker)
    broker = start(tmp_path, clock)
    assert set(broker.topic("events").channels) == {"a", "b", "c"}


def test_options_past_what_the_log_holds_are_refused_at_start_with_a_data_path(tmp_path):
    from broker import Options
    from broker.storage.segments import MAX_FILE
    with pytest.raises(ValueError, match="max-msg-size .* more than a durable message"):
        Options(data_path=str(tmp_path), max_msg_size=records.MAX_BODY + 1)
    with pytest.raises(ValueError, match="max-bytes-per-file .* more than a log file"):
        Options(data_path=str(tmp_path), max_bytes_per_file=MAX_FILE + 1)
    Options(max_msg_size=records.MAX_BODY + 1)   # memory only: no log to hold it
    Options(data_path=str(tmp_path), max_msg_size=records.MAX_BODY)


@pytest.mark.parametrize("stop", RESTARTS)
def test_channels_past_a_64_bit_mask_emptied_deleted_and_made_anew_restart_with_their_messages(
        tmp_path, stop):
    # Channels whose bits lie past 64 are emptied, deleted and made anew (a freed bit
    # used again) while the topic holds messages: a restart gives each channel exactly
    # the messages it had, no more (nothing of an emptied or deleted one comes back).
    clock = ManualClock()
    broker = start(tmp_path, clock)
    names = [f"c{i:03d}" for i in range(70)]
    for name in names:
        broker.create_channel("events", name)
    first = broker.multi_publish("events", [f"first-{i}".encode() for i in range(3)])
    topic = broker.topic("events")
    topic.channel("c068").empty()
    broker.delete_channel("events", "c069")
    topic.pause()
    held = broker.multi_publish("events", [b"held-1", b"held-2"])
    broker.create_channel("events", "again")  # paused: the topic keeps holding them
    topic.unpause()                           # handed over to every channel
    later = broker.publish("events", b"later")
    stop(broker)
    broker = start(tmp_path, clock)
    assert set(broker.topic("events").channels) == {*names, "again"} - {"c069"}
    assert set(drain(broker, "events", "c000")) == {*first, *held, later}
    assert set(drain(broker, "events", "c067")) == {*first, *held, later}
    assert set(drain(broker, "events", "c068")) == {*held, later}
    assert set(drain(broker, "events", "again")) == {*held, later}
    assert broker.topic("events").depth == 0
