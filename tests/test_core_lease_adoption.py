"""Adopting leases in the core: a restarted planner (the Spark driver replaying a
batch from its checkpoint) takes over the leases its failed run held, so the
replay reads the very messages the failed run read."""

from __future__ import annotations

from .corekit import new_broker, subscribe


def test_a_replay_adopts_a_requeued_lease_and_reads_the_same_messages():
    broker, _ = new_broker()
    broker.create_channel("events", "spark")
    broker.multi_publish("events", [f"m{i}".encode() for i in range(5)])
    failed = broker.open_lease_session("driver")
    lease, _ = broker.reserve(failed.session_id, "events", "spark", 3, 5000)
    first_read = [m.id for m in lease.slice(0, 1)]
    broker.close_lease_session(failed.session_id)  # the driver dies: its lease is requeued
    assert broker.channel("events", "spark").depth == 5
    replay = broker.open_lease_session("driver")
    assert broker.adopt_leases(replay.session_id, [lease.lease_id]) == (3, [])
    again = broker.lease(lease.lease_id).slice(0, 1)
    assert [m.id for m in again] == first_read
    assert all(m.attempts == 2 for m in again)
    assert broker.channel("events", "spark").depth == 2
    assert broker.finish_leases([lease.lease_id]) == (3, [])
    assert broker.channel("events", "spark").finish_count == 3
    consumer = subscribe(broker, "events", "spark")  # the two never leased are intact
    assert [m.body for m in consumer.received] == [b"m3", b"m4"]


def test_a_live_lease_changes_hands_and_the_old_holder_ending_requeues_nothing():
    broker, _ = new_broker()
    broker.create_channel("events", "spark")
    broker.multi_publish("events", [b"a", b"b"])
    old, new = broker.open_lease_session(), broker.open_lease_session()
    lease, _ = broker.reserve(old.session_id, "events", "spark", 1, 5000)
    assert broker.adopt_leases(new.session_id, [lease.lease_id]) == (1, [])
    broker.close_lease_session(old.session_id)
    ch = broker.channel("events", "spark")
    assert (ch.in_flight_count, ch.depth) == (1, 1)
    broker.close_lease_session(new.session_id)  # the holder now: its end requeues the lease
    assert (ch.in_flight_count, ch.depth) == (0, 2)


def test_a_requeued_lease_whose_messages_were_consumed_meanwhile_cannot_be_adopted():
    broker, _ = new_broker()
    broker.create_channel("events", "spark")
    broker.multi_publish("events", [b"a", b"b"])
    failed = broker.open_lease_session()
    lease, _ = broker.reserve(failed.session_id, "events", "spark", 1, 5000)
    broker.close_lease_session(failed.session_id)
    consumer = subscribe(broker, "events", "spark")  # takes the requeued message first
    assert len(consumer.received) == 2
    replay = broker.open_lease_session()
    assert broker.adopt_leases(replay.session_id, [lease.lease_id]) == (0, [lease.lease_id])


def test_a_lease_of_a_deleted_channel_cannot_be_adopted():
    broker, _ = new_broker()
    broker.create_channel("events", "spark")
    broker.multi_publish("events", [b"a", b"b"])
    failed = broker.open_lease_session()
    lease, _ = broker.reserve(failed.session_id, "events", "spark", 2, 5000)
    broker.close_lease_session(failed.session_id)
    broker.delete_channel("events", "spark")
    replay = broker.open_lease_session()
    assert broker.adopt_leases(replay.session_id, [lease.lease_id]) == (0, [lease.lease_id])


def test_a_replayed_lease_reports_the_attempts_of_its_first_delivery():
    broker, _ = new_broker()
    broker.create_channel("events", "spark")
    broker.multi_publish("events", [b"a", b"b"])
    failed = broker.open_lease_session("driver")
    lease, _ = broker.reserve(failed.session_id, "events", "spark", 2, 5000)
    first = lease.attempts_of(lease.order) or [m.attempts for m in lease.order]
    broker.close_lease_session(failed.session_id)
    replay = broker.open_lease_session("driver")
    broker.adopt_leases(replay.session_id, [lease.lease_id])
    again = broker.lease(lease.lease_id)
    assert [m.attempts for m in again.order] == [2, 2]          # the broker's own count
    assert again.attempts_of(again.order) == first == [1, 1]    # what the replay reads


def test_a_remembered_lease_is_dropped_once_none_of_its_messages_waits():
    broker, _ = new_broker()
    broker.create_channel("events", "spark")
    broker.multi_publish("events", [b"a", b"b", b"c"])
    session = broker.open_lease_session("driver")
    lease, _ = broker.reserve(session.session_id, "events", "spark", 3, 5000)
    broker.requeue_leases([lease.lease_id])
    assert lease.lease_id in broker._requeued
    other = broker.open_lease_session("other")
    taken, _ = broker.reserve(other.session_id, "events", "spark", 3, 5000)
    broker.finish_leases([taken.lease_id])     # another reader FINed all three
    assert broker._requeued == {} and not broker.channel("events", "spark").lease_claims


def test_thousands_of_requeued_leases_are_remembered_while_their_messages_wait():
    broker, _ = new_broker()
    broker.create_channel("events", "spark")
    broker.multi_publish("events", [b"m"] * 3000)
    session = broker.open_lease_session("churn")
    leases = [broker.reserve(session.session_id, "events", "spark", 1, 5000)[0]
              for _ in range(3000)]
    broker.close_lease_session(session.session_id)
    replay = broker.open_lease_session("driver")
    assert broker.adopt_leases(replay.session_id, [leases[0].lease_id]) == (1, [])


def test_the_lease_journal_keeps_only_live_leases(tmp_path):
    from broker.lease import LeaseJournal
    from broker.storage import records

    broker, _ = new_broker()
    broker.create_channel("events", "spark")
    broker.multi_publish("events", [f"m{i}".encode() for i in range(6)])
    journal = LeaseJournal(tmp_path / "leases.journal")
    broker.restore_leases(journal)
    session = broker.open_lease_session("driver")
    first, _ = broker.reserve(session.session_id, "events", "spark", 2, 5000)
    second, _ = broker.reserve(session.session_id, "events", "spark", 2, 5000)
    broker.requeue_leases([second.lease_id])
    assert [r[0] for r in journal.load()] == [first.lease_id, second.lease_id]
    broker.finish_leases([first.lease_id])
    assert [(r[0], r[4], r[5]) for r in journal.load()] == [
        (second.lease_id, [m.id for m in second.order], [1, 1])]
    broker.finish_leases([second.lease_id])
    assert journal.load() == []
    # Nothing live: the file starts afresh (its key is all it holds) once the storage's
    # sync has covered the ends (and the FINs), as a durable broker's does.
    assert journal.take_sync_work() == str(journal.path)
    journal.synced()
    assert journal.load() == [] and journal.path.stat().st_size == records.PROLOGUE_SIZE
    # The cut is fsynced by the next sync, and then an idle journal asks for none.
    assert journal.take_sync_work() == str(journal.path)
    journal.synced()
    assert journal.take_sync_work() is None


def _a_lease_then_a_crash(tmp_path, clock, bodies: list[bytes]):
    """A durable broker on ``tmp_path`` (its lease journal restored) whose channel
    ``events/spark`` gets ``bodies``, all taken in one lease; then killed. The lease."""
    from broker.lease import LeaseJournal
    from .test_storage_recovery import crash, start

    broker = start(tmp_path, clock)
    broker.restore_leases(LeaseJournal(tmp_path / "leases.journal"))
    broker.create_channel("events", "spark")
    broker.multi_publish("events", bodies)
    session = broker.open_lease_session("driver")
    lease, _ = broker.reserve(session.session_id, "events", "spark", len(bodies), 5000)
    crash(broker)
    broker.lease_journal.close()
    return lease


def test_a_lease_kept_across_a_restart_and_then_finished_is_gone_from_the_journal(tmp_path):
    # The start rewrites the journal with the leases it keeps; the FIN of the last one must
    # still cut it, or the next start brings the finished lease back.
    from broker.clock import ManualClock
    from broker.lease import LeaseJournal
    from .test_storage_recovery import start

    clock = ManualClock()
    lease = _a_lease_then_a_crash(tmp_path, clock, [b"a", b"b"])

    broker = start(tmp_path, clock)
    journal = LeaseJournal(tmp_path / "leases.journal")
    assert broker.restore_leases(journal) == 1
    assert broker.finish_leases([lease.lease_id]) == (2, [])
    assert journal.load() == []


def test_a_lease_whose_messages_a_later_lease_took_is_not_kept_in_the_journal_by_a_start(
        tmp_path):
    # A lease kept by one start, whose message a later lease then took, is forgotten at
    # the next start (the later lease claims the message): the journal must forget it too,
    # or it outlives every later FIN and comes back whenever the message does.
    from broker.clock import ManualClock
    from broker.lease import LeaseJournal
    from .test_storage_recovery import crash, start

    clock = ManualClock()
    first = _a_lease_then_a_crash(tmp_path, clock, [b"a"])

    broker = start(tmp_path, clock)
    assert broker.restore_leases(LeaseJournal(tmp_path / "leases.journal")) == 1
    session = broker.open_lease_session("driver")
    second, _ = broker.reserve(session.session_id, "events", "spark", 1, 5000)
    crash(broker)
    broker.lease_journal.close()

    broker = start(tmp_path, clock)
    journal = LeaseJournal(tmp_path / "leases.journal")
    assert broker.restore_leases(journal) == 1
    assert [r[0] for r in journal.load()] == [second.lease_id]
    assert broker.finish_leases([second.lease_id]) == (1, [])
    assert journal.load() == []
    session = broker.open_lease_session("replay")
    assert broker.adopt_leases(session.session_id, [first.lease_id]) == (0, [first.lease_id])


def test_a_lease_kept_across_a_crash_still_answers_to_its_owner_alone(tmp_path):
    # Under auth a lease answers to the principal that made it; the journal keeps that
    # owner, so after kill -9 the owner's commit is let through and another's is not.
    from broker.clock import ManualClock
    from broker.lease import LeaseJournal
    from .test_storage_recovery import crash, start

    clock = ManualClock()
    broker = start(tmp_path, clock)
    broker.restore_leases(LeaseJournal(tmp_path / "leases.journal"))
    broker.create_channel("events", "spark")
    broker.multi_publish("events", [b"a", b"b"])
    session = broker.open_lease_session("driver", owner="alice")
    lease, _ = broker.reserve(session.session_id, "events", "spark", 2, 5000)
    crash(broker)
    broker.lease_journal.close()

    broker = start(tmp_path, clock)
    assert broker.restore_leases(LeaseJournal(tmp_path / "leases.journal")) == 1
    assert broker.lease_scope(lease.lease_id) == ("alice", "events", "spark")


def test_a_lease_larger_than_mem_queue_size_is_taken_back_whole_after_a_requeue_or_a_timeout(
        tmp_path):
    # A backlog spilled past --mem-queue-size: the messages a failed batch gives back stay
    # where a replay can take them all back, so it reads the same rows (not the few that
    # fit in memory and the rest later).
    from broker.clock import ManualClock
    from .test_storage_recovery import start

    clock = ManualClock()
    broker = start(tmp_path, clock, mem_queue_size=5)
    broker.create_channel("events", "spark")
    for i in range(3000):
        broker.publish("events", b"m%d" % i)
    session = broker.open_lease_session("driver")
    requeued, _ = broker.reserve(session.session_id, "events", "spark", 2000, 60_000)
    timed_out, _ = broker.reserve(session.session_id, "events", "spark", 1000, 1000)
    assert (len(requeued.order), len(timed_out.order)) == (2000, 1000)
    broker.requeue_leases([requeued.lease_id])
    clock.advance(2)
    broker.tick()
    replay = broker.open_lease_session("driver again")
    assert broker.adopt_leases(replay.session_id, [requeued.lease_id, timed_out.lease_id]) \
        == (3000, [])


def test_a_lease_larger_than_mem_queue_size_is_taken_back_whole_after_a_kill(tmp_path):
    # After kill -9 the start restores a kept lease's messages in memory at the front of
    # their channel, past --mem-queue-size: a replay takes every one back, not the few
    # the memory queue holds.
    from broker import Broker, Options
    from broker.clock import ManualClock
    from broker.lease import LeaseJournal
    from broker.storage import DiskStore

    def durable_broker() -> Broker:
        options = Options(data_path=str(tmp_path), mem_queue_size=5)
        broker = Broker(options, clock=clock)
        broker.storage = DiskStore(broker, options)
        broker.recover(broker.storage, LeaseJournal(tmp_path / "leases.journal"))
        return broker

    clock = ManualClock()
    broker = durable_broker()
    broker.create_channel("events", "spark")
    broker.multi_publish("events", [b"m%d" % i for i in range(3000)])
    session = broker.open_lease_session("driver")
    requeued, _ = broker.reserve(session.session_id, "events", "spark", 1000, 60_000)
    held, _ = broker.reserve(session.session_id, "events", "spark", 1000, 60_000)
    broker.requeue_leases([requeued.lease_id])
    broker.storage.flush()
    broker.storage.abandon()
    broker.lease_journal.close()

    broker = durable_broker()
    replay = broker.open_lease_session("driver again")
    assert broker.adopt_leases(replay.session_id, [requeued.lease_id, held.lease_id]) \
        == (2000, [])
    assert [m.id for m in broker.lease(held.lease_id).order] == [m.id for m in held.order]


def test_a_requeued_lease_of_a_deleted_topic_is_gone_from_the_journal_with_it(tmp_path):
    from broker.lease import LeaseJournal

    broker, _ = new_broker()
    for topic in ("events", "other"):
        broker.create_channel(topic, "spark")
        broker.multi_publish(topic, [b"a", b"b"])
    journal = LeaseJournal(tmp_path / "leases.journal")
    broker.restore_leases(journal)
    failed = broker.open_lease_session("driver")
    lease, _ = broker.reserve(failed.session_id, "events", "spark", 2, 5000)
    broker.close_lease_session(failed.session_id)
    live = broker.open_lease_session("other-driver")
    other, _ = broker.reserve(live.session_id, "other", "spark", 2, 5000)
    broker.delete_topic("events")              # gone at once, not only once asked for
    assert [r[0] for r in journal.load()] == [other.lease_id]
    replay = broker.open_lease_session("driver")
    assert broker.adopt_leases(replay.session_id, [lease.lease_id]) == (0, [lease.lease_id])
    assert [r[0] for r in journal.load()] == [other.lease_id]
