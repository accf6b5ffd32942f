"""Recovery, case by case, on the core with a manual clock and a real data path.

``crash`` lets go of the data path as ``kill -9`` would (what ``write(2)``
put in the files stays; nothing is flushed, fsynced or closed); ``clean`` is an
orderly shutdown. Each test restarts and checks what each channel delivers.
"""

from __future__ import annotations

import pytest

from broker import Broker, Options
from broker.clock import ManualClock
import broker.storage.store as store_module
from broker.storage import DiskStore, fileops, records

from .corekit import Recorder, advance
from .faultfs import FaultyFiles
from .helpers import wait_for


def start(path, clock: ManualClock, **options) -> Broker:
    opts = Options(data_path=str(path), **options)
    broker = Broker(opts, clock=clock)
    broker.storage = DiskStore(broker, opts)
    broker.storage.recover()
    return broker


def crash(broker: Broker) -> None:
    broker.storage.flush()   # the end of the event-loop pass the request ran in
    broker.storage.abandon()


def clean(broker: Broker) -> None:
    broker.storage.close()


def drain(broker: Broker, topic: str, channel: str, fin: bool = True) -> dict[str, bytes]:
    """Everything the channel delivers now, FINed unless told otherwise."""
    consumer = Recorder(broker)
    ch = broker.subscribe(consumer, topic, channel)
    got: dict[str, bytes] = {}
    while True:
        ch.set_rdy(consumer, 1000)
        new = [m for m in consumer.received if m.id not in got]
        if not new:
            break
        got.update((m.id, m.body) for m in new)
        if fin:
            consumer.fin_all()
    ch.remove_consumer(consumer)
    return got


RESTARTS = [crash, clean]


@pytest.fixture(autouse=True)
def small_scan_blocks(monkeypatch):
    """Start reads files in blocks of a few records, so records straddle blocks."""
    monkeypatch.setattr(store_module, "SCAN_BLOCK", 97)


@pytest.mark.parametrize("stop", RESTARTS)
def test_a_channel_less_topic_past_mem_queue_size_restarts_with_every_message(tmp_path, stop):
    clock = ManualClock()
    broker = start(tmp_path, clock, mem_queue_size=10)
    ids = broker.multi_publish("events", [f"m{i}".encode() for i in range(100)])
    broker.get_or_create_topic("audit")
    stop(broker)
    broker = start(tmp_path, clock, mem_queue_size=10)
    assert set(broker.topics) == {"events", "audit"}
    assert broker.topic("events")._held.in_memory == 10
    assert list(drain(broker, "events", "work")) == ids


@pytest.mark.parametrize("stop", RESTARTS)
def test_messages_that_reached_no_durable_channel_do_not_come_back(tmp_path, stop):
    clock = ManualClock()
    broker = start(tmp_path, clock)
    broker.create_channel("events", "tmp#ephemeral")
    broker.publish("events", b"only-ephemeral")
    broker.delete_channel("events", "tmp#ephemeral")
    broker.create_channel("events", "work")
    kept = broker.publish("events", b"kept")
    stop(broker)
    broker = start(tmp_path, clock)
    assert drain(broker, "events", "work") == {kept: b"kept"}
    stop(broker)
    broker = start(tmp_path, clock)
    assert drain(broker, "events", "work") == {}  # FINed: never again


@pytest.mark.parametrize("stop", RESTARTS)
def test_a_deleted_channels_messages_do_not_reappear_in_a_new_channel_of_that_name(tmp_path,
                                                                                  stop):
    clock = ManualClock()
    broker = start(tmp_path, clock)
    broker.create_channel("events", "work")
    broker.publish("events", b"old")
    broker.delete_channel("events", "work")
    broker.create_channel("events", "work")
    new = broker.publish("events", b"new")
    stop(broker)
    broker = start(tmp_path, clock)
    assert drain(broker, "events", "work") == {new: b"new"}


@pytest.mark.parametrize("stop", RESTARTS)
def test_messages_held_during_a_pause_reach_a_channel_created_in_it(tmp_path, stop):
    clock = ManualClock()
    broker = start(tmp_path, clock)
    broker.create_channel("events", "first")
    broker.topic("events").pause()
    held = broker.publish("events", b"held")
    broker.create_channel("events", "second")
    broker.topic("events").unpause()
    stop(broker)
    broker = start(tmp_path, clock)
    assert drain(broker, "events", "first") == {held: b"held"}
    assert drain(broker, "events", "second") == {held: b"held"}


def test_an_empty_then_a_publish_in_one_pass_keeps_the_publish(tmp_path):
    clock = ManualClock()
    broker = start(tmp_path, clock)
    broker.create_channel("events", "work")
    broker.publish("events", b"emptied")
    broker.channel("events", "work").empty()
    kept = broker.publish("events", b"kept")  # same pass: the EMPTY is not written yet
    crash(broker)
    broker = start(tmp_path, clock)
    assert drain(broker, "events", "work") == {kept: b"kept"}


@pytest.mark.parametrize("stop", RESTARTS)
def test_spilled_messages_held_in_a_pause_keep_their_files_for_every_channel(tmp_path, stop):
    """One channel FINing everything a pause held must not free the files another
    channel still has to read, before a restart or after it."""
    clock = ManualClock()
    broker = start(tmp_path, clock, mem_queue_size=5, max_bytes_per_file=1024)
    broker.create_channel("events", "first")
    broker.create_channel("events", "second")
    broker.topic("events").pause()
    bodies = {broker.publish("events", f"message-{i:03d}".encode() * 4):
              f"message-{i:03d}".encode() * 4 for i in range(200)}
    broker.topic("events").unpause()
    assert drain(broker, "events", "first") == bodies
    broker.storage.tick()                     # files nobody needs are deleted here
    broker.storage.wait_synced()
    assert drain(broker, "events", "second", fin=False) == bodies
    stop(broker)
    broker = start(tmp_path, clock, mem_queue_size=5, max_bytes_per_file=1024)
    assert drain(broker, "events", "second") == bodies
    assert drain(broker, "events", "first") == {}


def test_an_ephemeral_channel_reads_its_spilled_messages_after_files_roll(tmp_path):
    clock = ManualClock()
    broker = start(tmp_path, clock, mem_queue_size=5, max_bytes_per_file=1024)
    broker.create_channel("events", "work")
    broker.create_channel("events", "tmp#ephemeral")
    bodies = [f"message-{i:03d}".encode() * 4 for i in range(200)]
    for body in bodies:
        broker.publish("events", body)
    drain(broker, "events", "work")           # the durable channel lets go of every file
    broker.storage.tick()
    broker.storage.wait_synced()
    consumer = Recorder(broker)
    ch = broker.subscribe(consumer, "events", "tmp#ephemeral")
    ch.set_rdy(consumer, 1000)
    assert [m.body for m in consumer.received] == bodies


@pytest.mark.parametrize("stop", RESTARTS)
def test_attempts_keep_their_value_across_restarts(tmp_path, stop):
    clock = ManualClock()
    broker = start(tmp_path, clock, mem_queue_size=2)
    broker.create_channel("events", "work")
    ids = broker.multi_publish("events", [b"a", b"b", b"c", b"d"])
    for _ in range(3):  # each round: delivered, timed out and redelivered, requeued
        consumer = Recorder(broker)
        ch = broker.subscribe(consumer, "events", "work")
        ch.set_rdy(consumer, 4)
        advance(broker, clock, 61)
        ch.remove_consumer(consumer)
    assert {m.id: m.attempts for m in consumer.received[-4:]} == {i: 6 for i in ids}
    stop(broker)
    broker = start(tmp_path, clock, mem_queue_size=2)
    consumer = Recorder(broker)
    broker.subscribe(consumer, "events", "work").set_rdy(consumer, 10)
    assert {m.id: m.attempts for m in consumer.received} == {i: 7 for i in ids}


def test_attempts_stop_at_the_largest_value_the_wire_can_carry(tmp_path):
    clock = ManualClock()
    broker = start(tmp_path, clock)
    consumer = Recorder(broker)
    ch = broker.subscribe(consumer, "events", "work")
    msg_id = broker.publish("events", b"x")
    ch.set_rdy(consumer, 1)
    consumer.in_flight[msg_id].attempts = 65534
    for _ in range(3):
        ch.requeue(consumer, msg_id)
    assert consumer.in_flight[msg_id].attempts == 65535
    crash(broker)
    broker = start(tmp_path, clock)
    consumer = Recorder(broker)
    broker.subscribe(consumer, "events", "work").set_rdy(consumer, 1)
    assert [m.attempts for m in consumer.received] == [65535]


@pytest.mark.parametrize("stop", RESTARTS)
def test_req_delays_and_dpub_defers_keep_their_time_across_restarts(tmp_path, stop):
    clock = ManualClock()
    broker = start(tmp_path, clock)
    consumer = Recorder(broker)
    ch = broker.subscribe(consumer, "events", "work")
    first = broker.publish("events", b"requeued")
    ch.set_rdy(consumer, 1)
    ch.requeue(consumer, first, delay=30)
    later = broker.publish("events", b"deferred", defer_ms=50_000)
    advance(broker, clock, 10)
    stop(broker)
    broker = start(tmp_path, clock)
    consumer = Recorder(broker)
    broker.subscribe(consumer, "events", "work").set_rdy(consumer, 10)
    advance(broker, clock, 19.9)
    assert consumer.received == []
    advance(broker, clock, 0.2)
    assert consumer.ids == [first]
    advance(broker, clock, 19.9)
    assert consumer.ids == [first, later]


def test_a_fin_counted_in_stats_does_not_come_back_after_a_crash(tmp_path):
    """What stats reports as finished is on disk: a crash right after the answer keeps it."""
    clock = ManualClock()
    broker = start(tmp_path, clock)
    broker.create_channel("events", "work")
    ids = broker.multi_publish("events", [b"a", b"b", b"c"])
    consumer = Recorder(broker)
    ch = broker.subscribe(consumer, "events", "work")
    ch.set_rdy(consumer, 3)
    ch.finish_many(consumer, ids[:2])
    assert broker.stats("events")[0].channels[0].finish_count == 2
    broker.storage.abandon()  # kill -9 right after the answer: nothing else is written
    broker = start(tmp_path, clock)
    assert set(drain(broker, "events", "work")) == {ids[2]}



@pytest.mark.parametrize("stop", RESTARTS)
def test_a_fin_batch_naming_another_consumers_message_finishes_only_its_own(tmp_path, stop):
    """A FIN of several ids, one of them held by another consumer, is refused for that one:
    after a restart it comes back, and only the ids this consumer held stay finished."""
    clock = ManualClock()
    broker = start(tmp_path, clock)
    broker.create_channel("events", "work")
    ids = broker.multi_publish("events", [b"a", b"b", b"c", b"d"])
    mine, theirs = Recorder(broker), Recorder(broker)
    ch = broker.subscribe(mine, "events", "work")
    broker.subscribe(theirs, "events", "work")
    ch.set_rdy(mine, 2)
    ch.set_rdy(theirs, 2)
    held = mine.ids
    other = theirs.ids
    failures = ch.finish_many(mine, [held[0], other[0], held[1]])
    assert [f.msg_id for f in failures] == [other[0]]
    stop(broker)
    broker = start(tmp_path, clock)
    assert set(drain(broker, "events", "work")) == set(ids) - set(held)


def logged_attempts(path, topic: str) -> list[int]:
    """The ids of every ATTEMPTS entry in ``topic``'s log files, in order."""
    ids = []
    for file in sorted((path / "topics" / f"t-{topic}").glob("*.log")):
        for record in records.scan_file(file.read_bytes(), str(file)):
            if record.kind == records.ATTEMPTS:
                ids += [msg_id for msg_id, _ in record.attempts()[1]]
    return ids


def test_deliveries_finished_before_their_counts_are_written_leave_no_count_on_disk(tmp_path):
    """A delivery count is written for what is still pending: those FINed in the same pass
    (before the pass's records are written) leave none, the others keep theirs."""
    clock = ManualClock()
    broker = start(tmp_path, clock)
    broker.create_channel("events", "work")
    ids = broker.multi_publish("events", [b"a", b"b", b"c"])
    broker.storage.flush()
    consumer = Recorder(broker)
    ch = broker.subscribe(consumer, "events", "work")
    ch.set_rdy(consumer, 3)
    ch.finish_many(consumer, ids[:2])
    broker.storage.flush()   # the end of the pass: one ATTEMPTS and one FIN record
    assert logged_attempts(tmp_path, "events") == [int(ids[2], 16)]
    ch.set_rdy(consumer, 0)
    ch.finish_many(consumer, ids[2:])
    broker.storage.flush()
    assert logged_attempts(tmp_path, "events") == [int(ids[2], 16)]
    crash(broker)
    broker = start(tmp_path, clock)
    assert drain(broker, "events", "work") == {}

def test_a_lease_fin_that_was_answered_does_not_come_back_after_a_crash(tmp_path):
    clock = ManualClock()
    broker = start(tmp_path, clock)
    broker.create_channel("events", "work")
    ids = broker.multi_publish("events", [b"a", b"b", b"c"])
    session = broker.open_lease_session("planner")
    lease, _ = broker.reserve(session.session_id, "events", "work", 2)
    assert broker.finish_leases([lease.lease_id]) == (2, [])
    broker.storage.abandon()
    broker = start(tmp_path, clock)
    assert set(drain(broker, "events", "work")) == {ids[2]}


def test_a_fin_of_more_ids_than_one_record_holds_is_kept(tmp_path):
    clock = ManualClock()
    broker = start(tmp_path, clock, mem_queue_size=100_000)
    broker.create_channel("events", "work")
    count = records.MAX_IDS_PER_RECORD + 1000
    broker.multi_publish("events", [b"x"] * count)
    session = broker.open_lease_session()
    lease, _ = broker.reserve(session.session_id, "events", "work", count)
    assert broker.finish_leases([lease.lease_id]) == (count, [])
    crash(broker)
    broker = start(tmp_path, clock)
    assert drain(broker, "events", "work") == {}


def test_idle_channels_cost_the_tick_nothing(tmp_path):
    clock = ManualClock()
    broker = start(tmp_path, clock)
    for i in range(1000):
        broker.create_channel("events", f"idle-{i}")
    consumer = Recorder(broker)
    broker.subscribe(consumer, "events", "busy").set_rdy(consumer, 1)
    broker.publish("events", b"x")
    assert [c.name for c in broker.timed_channels] == ["busy"]
    advance(broker, clock, 61)  # timed out: redelivered to the same consumer
    assert len(consumer.received) == 2 and consumer.received[-1].attempts == 2


def test_an_ephemeral_channel_writes_nothing_to_the_topic_log(tmp_path):
    clock = ManualClock()
    broker = start(tmp_path, clock)
    broker.get_or_create_topic("events")
    broker.storage.flush()
    log_dir = tmp_path / "topics" / "t-events"
    size = sum(p.stat().st_size for p in log_dir.glob("*.log"))
    broker.create_channel("events", "tmp#ephemeral")
    broker.channel("events", "tmp#ephemeral").pause()
    broker.delete_channel("events", "tmp#ephemeral")
    broker.storage.flush()
    assert sum(p.stat().st_size for p in log_dir.glob("*.log")) == size


def test_after_a_power_loss_everything_fsynced_is_back(tmp_path, monkeypatch):
    files = FaultyFiles()
    monkeypatch.setattr(fileops, "current", files)
    clock = ManualClock()
    broker = start(tmp_path, clock, sync_every=100)
    broker.create_channel("events", "work")
    synced = broker.multi_publish("events", [f"s{i}".encode() for i in range(100)])
    broker.storage.tick()                      # 100 messages: an fsync is due
    broker.storage.wait_synced()
    unsynced = broker.multi_publish("events", [f"u{i}".encode() for i in range(50)])
    broker.storage.abandon()
    files.power_loss(tmp_path)                 # what was never fsynced is gone
    broker = start(tmp_path, clock)
    back = drain(broker, "events", "work")
    assert set(synced) <= set(back) <= set(synced) | set(unsynced)


def test_sync_every_messages_start_an_fsync_and_a_power_loss_then_keeps_them(tmp_path,
                                                                            monkeypatch):
    files = FaultyFiles()
    monkeypatch.setattr(fileops, "current", files)
    broker = start(tmp_path, ManualClock(), sync_every=100, sync_timeout=3_600_000)
    broker.create_channel("events", "work")
    broker.storage.wait_synced()
    first = broker.multi_publish("events", [f"a{i}".encode() for i in range(99)])
    broker.storage.tick()                      # 99 of 100, and the timeout is an hour away
    assert files.unsynced_bytes(tmp_path) > 0
    last = broker.publish("events", b"a99")
    broker.storage.tick()                      # the 100th: an fsync starts, in its thread
    wait_for(lambda: files.unsynced_bytes(tmp_path) == 0, 30,
             message="the fsync that --sync-every starts")
    broker.storage.abandon()
    files.power_loss(tmp_path)
    broker = start(tmp_path, ManualClock())
    assert set(drain(broker, "events", "work")) == {*first, last}


def test_what_a_killed_broker_never_fsynced_is_fsynced_by_the_next_one(tmp_path, monkeypatch):
    files = FaultyFiles()
    monkeypatch.setattr(fileops, "current", files)
    clock = ManualClock()
    broker = start(tmp_path, clock)
    broker.create_channel("events", "work")
    ids = broker.multi_publish("events", [f"m{i}".encode() for i in range(20)])
    crash(broker)                              # killed before its first fsync
    broker = start(tmp_path, clock)
    broker.storage.wait_synced()               # the restarted broker's first sync
    broker.storage.abandon()
    files.power_loss(tmp_path)
    broker = start(tmp_path, clock)
    assert set(drain(broker, "events", "work")) == set(ids)


def test_without_a_data_path_publishes_past_max_memory_bytes_are_refused_until_consumed():
    from broker.errors import QueueFull

    clock = ManualClock()
    broker = Broker(Options(max_memory_bytes=1000), clock=clock)
    broker.create_channel("events", "a")
    broker.create_channel("events", "b")
    ids = broker.multi_publish("events", [b"x" * 100] * 5)  # 2 copies: 1000 bytes
    with pytest.raises(QueueFull, match="max-memory-bytes"):
        broker.publish("events", b"y")
    assert drain(broker, "events", "a") == {i: b"x" * 100 for i in ids}
    broker.multi_publish("events", [b"z" * 100] * 2)        # room again: a's copies went
    with pytest.raises(QueueFull):
        broker.publish("events", b"y" * 100)                  # 900 + 200 > 1000
    broker.channel("events", "b").empty()
    broker.publish("events", b"y" * 100)


def test_publishes_past_max_disk_bytes_fail_and_stats_show_bytes_on_disk(tmp_path):
    from broker.errors import StorageFailed

    clock = ManualClock()
    broker = start(tmp_path, clock, max_disk_bytes=20_000, max_bytes_per_file=4096,
                   mem_queue_size=10)
    broker.create_channel("events", "work")
    broker.create_channel("events", "paused")
    broker.channel("events", "paused").pause()
    ids = []
    with pytest.raises(StorageFailed, match="max-disk-bytes"):
        while True:
            ids.append(broker.publish("events", b"m" * 200))
    stats = broker.topic("events").stats()
    channels = {c.name: c for c in stats.channels}
    assert 15_000 < stats.disk_bytes <= 20_000
    assert channels["work"].disk_bytes == channels["paused"].disk_bytes == stats.disk_bytes
    assert channels["work"].on_disk_count == len(ids) - 10
    drain(broker, "events", "work")
    broker.storage.flush()
    channels = {c.name: c for c in broker.topic("events").stats().channels}
    assert channels["work"].disk_bytes == 0
    assert channels["paused"].disk_bytes == broker.topic("events").stats().disk_bytes
    broker.channel("events", "paused").empty()
    broker.storage.flush()
    broker.storage.wait_synced()
    broker.publish("events", b"m" * 200)  # the files were reclaimed: room again


@pytest.mark.parametrize("stop", RESTARTS)
def test_one_old_deferred_message_does_not_keep_every_later_file(tmp_path, stop):
    clock = ManualClock()
    broker = start(tmp_path, clock, max_bytes_per_file=2048, mem_queue_size=5)
    consumer = Recorder(broker)
    ch = broker.subscribe(consumer, "events", "work")
    old = broker.publish("events", b"old")
    ch.set_rdy(consumer, 1)
    ch.requeue(consumer, old, delay=3000)  # waits for 50 minutes
    for i in range(300):
        broker.publish("events", f"new-{i}".encode() * 5)
        ch.set_rdy(consumer, 1000)
        consumer.fin_all()
    broker.storage.tick()  # one old copy holds the first file ...
    clock.advance(1)
    broker.storage.tick()  # ... and still does a second later: it is moved out
    broker.storage.wait_synced()
    log_dir = tmp_path / "topics" / "t-events"
    assert len(list(log_dir.glob("*.log"))) <= 3
    stop(broker)
    broker = start(tmp_path, clock, max_bytes_per_file=2048)
    deferred = broker.channel("events", "work")._deferred.live()
    assert [(m.id, m.body, m.attempts) for m in deferred] == [(old, b"old", 1)]
    assert deferred[0].deadline == pytest.approx(clock.monotonic() + 2999, abs=1e-3)
    assert drain(broker, "events", "work") == {}


def test_a_file_left_behind_by_a_crash_is_deleted_before_the_fins_that_follow_it(tmp_path):
    clock = ManualClock()
    broker = start(tmp_path, clock, max_bytes_per_file=1024)
    broker.create_channel("events", "work")
    first = [broker.publish("events", b"a" * 100) for _ in range(8)]   # fill the first file
    later = broker.publish("events", b"b" * 100)                      # the next file
    consumer = Recorder(broker)
    ch = broker.subscribe(consumer, "events", "work")
    ch.set_rdy(consumer, 8)
    assert consumer.ids == first
    consumer.fin_all()            # their FINs go to the second file; the first is done with
    crash(broker)                 # ... but killed before it was deleted
    broker = start(tmp_path, clock, max_bytes_per_file=1024)
    assert drain(broker, "events", "work") == {later: b"b" * 100}  # the second file is done
    broker.storage.tick()
    broker.storage.wait_synced()
    crash(broker)
    broker = start(tmp_path, clock, max_bytes_per_file=1024)
    assert drain(broker, "events", "work") == {}


def test_a_held_dpub_moved_out_of_an_old_file_keeps_its_time_once_it_reaches_channels(
        tmp_path):
    clock = ManualClock()
    broker = start(tmp_path, clock)
    broker.create_channel("events", "work")
    for _ in range(20):  # consumed: bytes of the first file that copying it lets go of
        broker.publish("events", b"f" * 100)
    drain(broker, "events", "work")
    broker.topic("events").pause()
    later = broker.publish("events", b"later", defer_ms=5000)
    for _ in range(2):  # each start opens a file: three files, the first held by one copy
        clean(broker)
        broker = start(tmp_path, clock)
    broker.storage.tick()  # the first file is held by one copy that does not move on ...
    assert min(broker.storage.logs["events"].refs) == 1
    clock.advance(1)
    broker.storage.tick()  # ... for a second: it is moved out of the first file
    assert min(broker.storage.logs["events"].refs) > 1
    broker.topic("events").unpause()
    clean(broker)
    broker = start(tmp_path, clock)
    deferred = broker.channel("events", "work")._deferred.live()
    assert [m.id for m in deferred] == [later]
    assert deferred[0].deadline == pytest.approx(clock.monotonic() + 4, abs=1e-3)


def test_a_file_its_consumer_is_reading_through_is_not_copied_out(tmp_path):
    # Few copies hold the oldest file, but fewer at every tick: it drains by itself, and
    # copying its messages to the end of the log would only write them twice.
    clock = ManualClock()
    broker = start(tmp_path, clock, max_bytes_per_file=2048, mem_queue_size=5)
    ids = [i for n in range(40)
           for i in broker.multi_publish("events", [b"m%d-" % n * 40 for _ in range(10)])]
    broker.create_channel("events", "work")  # after: every message waits in the topic ...
    broker.storage.flush()
    assert len(broker.storage.logs["events"].refs) > 3   # ... spread over many files
    consumer = Recorder(broker)
    ch = broker.subscribe(consumer, "events", "work")
    while len(consumer.received) < len(ids):
        ch.set_rdy(consumer, 7)
        consumer.fin_all()
        clock.advance(0.5)
        broker.storage.tick()
    assert [m.id for m in consumer.received] == ids
    moves = [r for path in sorted((tmp_path / "topics" / "t-events").glob("*.log"))
             for r in records.scan(path.read_bytes(), str(path)) if r.kind == records.MOVE]
    assert moves == []


def test_a_topic_deleted_and_made_anew_gets_its_own_second_before_a_file_is_copied_out(
        tmp_path):
    clock = ManualClock()
    broker = start(tmp_path, clock, max_bytes_per_file=2048, mem_queue_size=5)

    def one_old_message_and_many_new() -> None:
        consumer = Recorder(broker)
        ch = broker.subscribe(consumer, "events", "work")
        old = broker.publish("events", b"old")
        ch.set_rdy(consumer, 1)
        ch.requeue(consumer, old, delay=3000)
        for i in range(300):
            broker.publish("events", f"new-{i}".encode() * 5)
            ch.set_rdy(consumer, 1000)
            consumer.fin_all()

    one_old_message_and_many_new()
    broker.storage.tick()          # one old copy holds the first file: watched from now
    clock.advance(1)
    broker.delete_topic("events")
    one_old_message_and_many_new()  # the same shape again, under the same name
    head = min(broker.storage.logs["events"].refs)
    broker.storage.tick()          # the new topic's first look: nothing is copied yet
    assert min(broker.storage.logs["events"].refs) == head
    clock.advance(1)
    broker.storage.tick()          # a second later it is
    assert min(broker.storage.logs["events"].refs) > head


def test_an_idle_backlog_is_never_copied_to_the_end_of_the_log(tmp_path):
    # Every file holds a few hundred pending messages and nothing else: copying the
    # oldest out would let go of no more than it writes, so nothing is copied, ever.
    clock = ManualClock()
    broker = start(tmp_path, clock, max_bytes_per_file=4096, mem_queue_size=5)
    broker.create_channel("events", "work")
    ids = [broker.publish("events", b"%04d" % i * 25) for i in range(200)]
    broker.storage.flush()
    log_dir = tmp_path / "topics" / "t-events"
    files = sorted(p.name for p in log_dir.glob("*.log"))
    assert len(files) > 3
    for _ in range(30):
        clock.advance(1)
        broker.storage.tick()
    assert broker.topic("events").stats().rewritten_bytes == 0
    assert sorted(p.name for p in log_dir.glob("*.log")) == files
    assert list(drain(broker, "events", "work")) == ids


def test_copies_out_of_old_files_write_at_most_half_of_what_else_is_written(tmp_path):
    # A consumer that defers one message in thirty for an hour and FINs the rest: old
    # files are kept by a few messages each and copied out, so they go, but the bytes
    # copied stay under 1/(RELOCATE_GAIN - 2) of every other byte written to the log.
    clock = ManualClock()
    broker = start(tmp_path, clock, max_bytes_per_file=4096, mem_queue_size=5)
    consumer = Recorder(broker)
    ch = broker.subscribe(consumer, "events", "work")
    for i in range(3000):
        broker.publish("events", b"%05d" % i * 20)
        ch.set_rdy(consumer, 10)
        for msg_id, msg in list(consumer.in_flight.items()):
            if int(msg.body[:5]) % 30 == 0:
                ch.requeue(consumer, msg_id, delay=3600)
            else:
                ch.finish(consumer, msg_id)
        if i % 20 == 0:
            clock.advance(0.5)
            broker.storage.tick()
    for _ in range(300):
        clock.advance(0.5)
        broker.storage.tick()
    topic_log = broker.storage.logs["events"]
    rewritten = broker.topic("events").stats().rewritten_bytes
    assert rewritten > 0, "old files were copied out"
    assert rewritten * (store_module.RELOCATE_GAIN - 2) <= topic_log.appended - rewritten
    assert len(topic_log.refs) < 10 < topic_log.current, "old files went"
    assert len(drain(broker, "events", "work")) == 0   # the hundred wait out their hour
    assert ch.deferred_count == 100


def test_a_first_file_that_never_held_a_message_does_not_stop_old_files_being_copied_out(
        tmp_path):
    # Every file keeps a message or two deferred for long, so none drains by itself.
    clock = ManualClock()
    broker = start(tmp_path, clock, max_bytes_per_file=2048, mem_queue_size=5)
    consumer = Recorder(broker)
    ch = broker.subscribe(consumer, "events", "work")   # the first file: its STATE only
    broker.multi_publish("events", [b"o" * 300] * 8)    # too big for it: the next one
    for i in range(300):
        broker.publish("events", f"new-{i}".encode() * 5)
    ch.set_rdy(consumer, 1000)
    for n, msg_id in enumerate(list(consumer.in_flight)):
        if n % 15 == 0:
            ch.requeue(consumer, msg_id, delay=3000)
        else:
            ch.finish(consumer, msg_id)
    for _ in range(3):
        clock.advance(1)
        broker.storage.tick()
    assert broker.topic("events").stats().rewritten_bytes > 0


@pytest.mark.parametrize("failing", [1, 3])
def test_a_file_is_not_deleted_while_the_fsync_of_what_replaced_it_fails(tmp_path, monkeypatch,
                                                                        failing):
    files = FaultyFiles()
    monkeypatch.setattr(fileops, "current", files)
    clock = ManualClock()
    broker = start(tmp_path, clock, max_bytes_per_file=2048, mem_queue_size=5)
    consumer = Recorder(broker)
    ch = broker.subscribe(consumer, "events", "work")
    old = broker.publish("events", b"old")
    ch.set_rdy(consumer, 1)
    ch.requeue(consumer, old, delay=3000)   # deferred: holds the first file
    for i in range(300):
        broker.publish("events", f"new-{i}".encode() * 5)
        ch.set_rdy(consumer, 1000)
        consumer.fin_all()
    broker.storage.wait_synced()
    first = files_of_topic(tmp_path)[0]
    files.fail("fsync")                     # the syncs after the MOVE fail (each fsync)
    broker.storage.tick()
    clock.advance(1)
    broker.storage.tick()                   # the deferred message is copied out (MOVE)
    for _ in range(failing):
        broker.storage.wait_synced()
        assert first.exists()               # kept: the MOVE may not be on disk
    assert broker.storage.failed
    broker.storage.abandon()
    files.power_loss(tmp_path)              # then the power goes
    files.heal()
    broker = start(tmp_path, clock, max_bytes_per_file=2048)
    deferred = broker.channel("events", "work")._deferred.live()
    assert [(m.id, m.body) for m in deferred] == [(old, b"old")]


def test_a_file_whose_move_was_synced_is_deleted_at_the_next_good_sync(tmp_path, monkeypatch):
    files = FaultyFiles()
    monkeypatch.setattr(fileops, "current", files)
    clock = ManualClock()
    broker = start(tmp_path, clock, max_bytes_per_file=2048, mem_queue_size=5)
    consumer = Recorder(broker)
    ch = broker.subscribe(consumer, "events", "work")
    old = broker.publish("events", b"old")
    ch.set_rdy(consumer, 1)
    ch.requeue(consumer, old, delay=3000)
    for i in range(300):
        broker.publish("events", f"new-{i}".encode() * 5)
        ch.set_rdy(consumer, 1000)
        consumer.fin_all()
    broker.storage.wait_synced()
    first = files_of_topic(tmp_path)[0]
    files.fail("fsync", times=1)
    broker.storage.tick()
    clock.advance(1)
    broker.storage.tick()
    broker.storage.wait_synced()             # fails: kept
    assert first.exists()
    broker.storage.wait_synced()             # succeeds: gone
    assert not first.exists() and not broker.storage.failed
    clean(broker)


def files_of_topic(path, topic: str = "events") -> list:
    return sorted((path / "topics" / f"t-{topic}").glob("*.log"))


def test_channel_settings_that_cannot_be_written_fail_and_change_nothing(tmp_path, monkeypatch):
    import errno
    from broker.errors import AdminFailed
    files = FaultyFiles()
    monkeypatch.setattr(fileops, "current", files)
    clock = ManualClock()
    broker = start(tmp_path, clock)
    broker.create_channel("events", "work", max_attempts=3, dead_letter_topic="dead")
    broker.create_topic("events", ttl_ms=5000)
    files.fail("write", errno.ENOSPC)
    with pytest.raises(AdminFailed, match="nothing was changed"):
        broker.create_channel("events", "work", max_attempts=9, dead_letter_topic="other")
    with pytest.raises(AdminFailed, match="nothing was changed"):
        broker.create_topic("events", ttl_ms=1)
    ch = broker.channel("events", "work")
    assert (ch.max_attempts, ch.dead_letter_topic, broker.topic("events").ttl_ms) == (
        3, "dead", 5000)
    files.heal()
    crash(broker)
    broker = start(tmp_path, clock)
    ch = broker.channel("events", "work")
    assert (ch.max_attempts, ch.dead_letter_topic, broker.topic("events").ttl_ms) == (
        3, "dead", 5000)


@pytest.mark.parametrize("stop", RESTARTS)
def test_a_log_written_as_one_pub_record_per_message_restarts_with_every_message(tmp_path,
                                                                                 stop):
    """Logs of brokers from before BATCH records (an MPUB written as one PUB record per
    message) restart as they were, and the MPUBs accepted since go beside them."""
    clock = ManualClock()
    directory = tmp_path / "topics" / "t-events"
    directory.mkdir(parents=True)
    ids = [f"{(1 << 50) + 1024 * i:016x}" for i in range(30)]
    old, _ = records.pubs(ids, [1] * 30, [f"old{i}".encode() for i in range(30)], [0] * 30,
                          [0] * 30, False)
    (directory / "00000001.log").write_bytes(
        records.state(False, {"work": False}) + old + records.fins_of("work", ids[:5]))
    broker = start(tmp_path, clock, mem_queue_size=10)   # past 10: read back from disk
    new = broker.multi_publish("events", [f"new{i}".encode() for i in range(30)])
    stop(broker)
    broker = start(tmp_path, clock, mem_queue_size=10)
    got = drain(broker, "events", "work")
    assert list(got) == ids[5:] + new
    assert list(got.values()) == [f"old{i}".encode() for i in range(5, 30)] + [
        f"new{i}".encode() for i in range(30)]


def test_max_disk_bytes_counts_every_byte_a_publish_writes_its_expiry_included(tmp_path):
    """What one message with a ttl writes is measured on a broker with no limit; with
    room for one byte less it is refused (a message without a ttl, smaller, still fits)."""
    from broker.errors import StorageFailed

    clock = ManualClock()

    def fresh(name: str, **options) -> tuple[Broker, int]:
        broker = start(tmp_path / name, clock, **options)
        broker.create_channel("events", "work")
        return broker, broker.topic("events").stats().disk_bytes

    probe, base = fresh("probe")
    probe.publish("events", b"m" * 100, ttl_ms=60_000)
    size = probe.topic("events").stats().disk_bytes - base
    clean(probe)
    short, _ = fresh("short", max_disk_bytes=base + size - 1)
    with pytest.raises(StorageFailed, match="max-disk-bytes"):
        short.publish("events", b"m" * 100, ttl_ms=60_000)
    kept = short.publish("events", b"m" * 100)
    assert short.topic("events").stats().disk_bytes <= base + size - 1
    clean(short)
    exact, _ = fresh("exact", max_disk_bytes=base + size)
    exact.publish("events", b"m" * 100, ttl_ms=60_000)
    assert exact.topic("events").stats().disk_bytes == base + size
    clean(exact)
    short = start(tmp_path / "short", clock)
    assert list(drain(short, "events", "work")) == [kept]


def test_a_topic_the_disk_cannot_take_is_refused_naming_it_and_leaves_nothing(
        tmp_path, monkeypatch, caplog):
    import errno
    import logging

    from broker.errors import AdminFailed

    files = FaultyFiles()
    monkeypatch.setattr(fileops, "current", files)
    clock = ManualClock()
    broker = start(tmp_path, clock)
    files.fail("write", errno.ENOSPC)
    caplog.set_level(logging.ERROR, logger="pynsqd")
    with pytest.raises(AdminFailed, match=r"^topic events could not be created: the data "
                       r"path could not take it \(No space left on device\); nothing was "
                       r"changed$"):
        broker.create_topic("events")
    directory = tmp_path / "topics" / "t-events"
    assert [r.getMessage() for r in caplog.records] == [
        f"{directory}: topic events could not be created: [Errno 28] No space left on device"]
    assert "events" not in broker.topics and not directory.exists()
    files.heal()
    broker.create_channel("events", "work")
    msg_id = broker.publish("events", b"after")
    crash(broker)
    broker = start(tmp_path, clock)
    assert drain(broker, "events", "work") == {msg_id: b"after"}


def test_a_clean_shutdown_whose_fsync_fails_logs_each_topic_and_lets_go_of_the_data_path(
        tmp_path, monkeypatch, caplog):
    import errno
    import logging

    files = FaultyFiles()
    monkeypatch.setattr(fileops, "current", files)
    clock = ManualClock()
    broker = start(tmp_path, clock)
    for name in ("events", "audit"):
        broker.create_channel(name, "work")
    ids = {name: broker.publish(name, name.encode()) for name in ("events", "audit")}
    files.fail("fsync", errno.EIO)
    caplog.set_level(logging.ERROR, logger="pynsqd")
    clean(broker)
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0] == ("fsync of the data path failed: [Errno 5] Input/output error; "
                        "publishes are refused until a sync succeeds")
    assert sorted(lines[1:]) == [f"{tmp_path / 'topics' / f't-{name}'}: [Errno 5] "
                                 f"Input/output error" for name in sorted(ids)]
    files.heal()
    broker = start(tmp_path, clock)   # the LOCK was let go; what was written is there
    for name, msg_id in ids.items():
        assert drain(broker, name, "work") == {msg_id: name.encode()}


@pytest.mark.parametrize("stop", RESTARTS)
def test_a_producers_replay_is_recognised_after_the_file_of_its_publish_is_reclaimed(
        tmp_path, stop):
    clock = ManualClock()
    broker = start(tmp_path, clock, max_bytes_per_file=2048)
    broker.create_channel("events", "work")
    first = broker.multi_publish("events", [b"a", b"b"], producer_id="job:1:0", sequence=3)
    for i in range(100):   # rolls many files; each is finished, so the old ones go
        broker.publish("events", b"x" * 100)
        drain(broker, "events", "work")
        broker.storage.tick()
    broker.storage.wait_synced()
    assert min(broker.storage.logs["events"].segment_numbers()) > 1
    stop(broker)
    broker = start(tmp_path, clock, max_bytes_per_file=2048)
    again = broker.multi_publish("events", [b"a", b"b"], producer_id="job:1:0", sequence=3)
    assert again == first
    assert drain(broker, "events", "work") == {}


def test_a_topic_whose_old_file_is_not_worth_copying_does_not_hold_up_another_topics(
        tmp_path):
    clock = ManualClock()
    broker = start(tmp_path, clock, max_bytes_per_file=2048, mem_queue_size=5)
    broker.create_channel("backlog", "work")     # an idle backlog: never worth copying
    backlog = [broker.publish("backlog", b"%04d" % i * 25) for i in range(100)]
    for _ in range(2):
        broker.storage.tick()
        clock.advance(1)
    broker.storage.tick()                        # looked at, and found not worth it
    consumer = Recorder(broker)                  # then one old message in another topic
    ch = broker.subscribe(consumer, "events", "work")
    old = broker.publish("events", b"old")
    ch.set_rdy(consumer, 1)
    ch.requeue(consumer, old, delay=3000)
    for i in range(300):
        broker.publish("events", f"new-{i}".encode() * 5)
        ch.set_rdy(consumer, 1000)
        consumer.fin_all()
    head = min(broker.storage.logs["events"].refs)
    broker.storage.tick()
    clock.advance(1)
    broker.storage.tick()                        # the old message is moved out all the same
    assert min(broker.storage.logs["events"].refs) > head
    assert broker.topic("backlog").stats().rewritten_bytes == 0
    assert list(drain(broker, "backlog", "work")) == backlog


@pytest.mark.parametrize("writer", ["zlib", "zlib-ng"])
def test_a_log_checked_by_either_crc32_recovers_and_reads_back_under_the_other(
        tmp_path, monkeypatch, writer):
    """Logs written before zlib-ng computed the checksum (zlib's ``crc32``: every record,
    PUBs, MPUB batches, FINs and delivery counts) recover and read back whole under
    zlib-ng, and the other way round: the two give the same numbers."""
    import zlib

    from broker.storage import checksum, segments

    used = {"zlib": zlib.crc32, "zlib-ng": checksum.crc32}
    other = used["zlib-ng" if writer == "zlib" else "zlib"]
    for module in (records, segments):
        monkeypatch.setattr(module, "crc32", used[writer])
    monkeypatch.setattr(records, "_KIND_SEEDS", [used[writer](bytes((k,))) for k in range(256)])
    clock = ManualClock()
    broker = start(tmp_path, clock, mem_queue_size=3)
    broker.create_channel("events", "work")
    ids = broker.multi_publish("events", [b"m%d" % i for i in range(8)])
    ids.append(broker.publish("events", b"one"))
    consumer = Recorder(broker)
    ch = broker.subscribe(consumer, "events", "work")
    ch.set_rdy(consumer, 2)
    ch.finish(consumer, ids[0])   # a FIN; delivery counts for the next two
    crash(broker)
    for module in (records, segments):
        monkeypatch.setattr(module, "crc32", other)
    monkeypatch.setattr(records, "_KIND_SEEDS", [other(bytes((k,))) for k in range(256)])
    broker = start(tmp_path, clock, mem_queue_size=3)
    consumer = Recorder(broker)
    broker.subscribe(consumer, "events", "work").set_rdy(consumer, 20)
    assert [m.id for m in consumer.received] == ids[1:]
    assert [m.body for m in consumer.received] == [b"m%d" % i for i in range(1, 8)] + [b"one"]
    assert [m.attempts for m in consumer.received] == [2, 2] + [1] * 6


@pytest.mark.parametrize("count", [40, 200])  # files a FIN looks at, and more (FEW_SEGMENTS)
def test_fins_of_messages_in_several_files_release_each_file_only_for_its_own(tmp_path, count):
    """One channel FINs messages written over several files while another still needs
    all of them: every file stays (synced, deletions done) and the other channel gets
    every message after a restart; the FINed ones never come back."""
    from broker.storage.segments import FEW_SEGMENTS

    clock = ManualClock()
    broker = start(tmp_path, clock, max_bytes_per_file=1024)
    broker.create_channel("events", "done")
    broker.create_channel("events", "later")
    ids = [broker.publish("events", b"%03d" % i + b"x" * 60) for i in range(count)]
    files = len(broker.storage.logs["events"].segment_numbers())
    assert 2 < files <= FEW_SEGMENTS if count == 40 else files > FEW_SEGMENTS
    consumer = Recorder(broker)
    ch = broker.subscribe(consumer, "events", "done")
    ch.set_rdy(consumer, count)
    assert [m.id for m in consumer.received] == ids
    ch.finish_many(consumer, ids[:3])       # in the oldest file
    ch.finish_many(consumer, ids[3:30])     # from it into the next ones
    ch.finish_many(consumer, ids[30:])      # in the newest files
    broker.storage.wait_synced()    # what was let go is deleted
    crash(broker)
    broker = start(tmp_path, clock, max_bytes_per_file=1024)
    assert drain(broker, "events", "done") == {}
    assert sorted(drain(broker, "events", "later").values()) == [
        b"%03d" % i + b"x" * 60 for i in range(count)]
