"""Sequences the storage model test (``test_storage_model.py``) found, replayed step by
step as hypothesis printed them, shrunk by hand: each fails on the bug it found, whatever
sequences the model test's derandomized run explores after an edit of its file."""

from __future__ import annotations

import pytest

from . import test_storage_model
from .test_storage_model import StorageModel


class Draws:
    """What ``data.draw`` answers in a rule that takes ``data``: the values given, in turn."""

    def __init__(self, *values: int) -> None:
        self.values = list(values)

    def draw(self, strategy) -> int:
        return self.values.pop(0)


@pytest.fixture
def state(monkeypatch):
    monkeypatch.setattr(test_storage_model, "event", lambda *_: None)  # hypothesis's, in a run
    state = StorageModel()
    yield state
    state.teardown()


def check(state: StorageModel) -> None:
    state.check_the_leases()
    state.check_everything_pending()


def test_a_lease_forgotten_at_a_start_is_not_remembered_after_a_power_loss(state):
    # The first lease is kept by a start, a second takes its message, and the next start
    # keeps the second, which claims that message: the first is forgotten. The second is
    # committed, and a power loss takes the FIN (not synced): the message is back, and so
    # was the first lease, which the journal had kept.
    state.a_topic_with_two_channels_and_a_backlog(count=1)
    state.sync()
    state.take_a_batch(count=1, topic="a")
    state.restart(crash=True)
    check(state)
    state.take_a_batch(count=1, topic="a")
    state.restart(crash=True)
    check(state)
    state.commit_a_batch(data=Draws(0))
    check(state)
    state.power_loss()
    check(state)


def test_a_lease_made_before_the_last_sync_is_remembered_after_a_power_loss(state):
    # The lease journal was fsynced only when rewritten (at a start): a power loss after
    # the logs' sync kept the lease's deliveries but took the lease, so the replay of its
    # batch found nothing and read other rows. It is fsynced with the logs now.
    state.a_topic_with_two_channels_and_a_backlog(count=3)
    state.take_a_batch(count=2, topic="a")
    lease_id = state.past_leases[-1]
    state.sync()
    state.power_loss()
    check(state)
    assert lease_id in state.broker._requeued
    state.replay(lease_id)          # the same two messages, with their first attempts
    check(state)


def test_a_lease_made_after_the_last_sync_is_not_remembered_after_a_power_loss(state):
    state.a_topic_with_two_channels_and_a_backlog(count=3)
    state.sync()
    state.take_a_batch(count=2, topic="a")
    lease_id = state.past_leases[-1]
    state.power_loss()
    check(state)
    assert lease_id not in state.broker._requeued
    state.replay(lease_id)          # nothing: the lease is unknown, its messages wait
    check(state)


def test_the_last_lease_committed_after_the_last_sync_is_remembered_after_a_power_loss(state):
    # The journal started afresh at the last lease's end: a power loss that took the FIN
    # (not synced) brought the messages back but not the lease, so the planner's FIN of the
    # committed batch, sent again, found nothing and the batch was read twice. It starts
    # afresh only after a sync covers the end now.
    state.a_topic_with_two_channels_and_a_backlog(count=2)
    state.take_a_batch(count=2, topic="a")
    lease_id = state.past_leases[-1]
    state.sync()
    state.commit_a_batch(data=Draws(0))
    check(state)
    state.power_loss()
    check(state)
    assert lease_id in state.broker._requeued
    state.commit_a_batch(data=Draws(0))    # the FIN sent again finds the two messages
    check(state)


def test_a_lease_adopted_after_a_later_lease_gave_its_message_back_claims_it_after_a_kill(state):
    # A later lease took one of a remembered lease's messages and gave it back; the replay
    # of the first took all of its messages back. The journal held the first lease before
    # the later one, so after kill -9 the later one claimed that message and a replay of
    # the first read two of its three rows. An adopted lease is written again, last, now.
    state.a_topic_with_two_channels_and_a_backlog(count=3)
    state.take_a_batch(count=3, topic="a")
    first = state.past_leases[-1]
    state.give_back_a_batch(data=Draws(0))
    state.take_a_batch(count=1, topic="a")
    state.give_back_a_batch(data=Draws(0))
    state.replay_a_batch(data=Draws(0))
    state.restart(crash=True)
    check(state)
    assert state.broker._requeued[first].live == 3
    state.replay(first)             # all three, in their order, with their first attempts
    check(state)


def dedupe_records_on_disk(state: StorageModel, topic: str) -> int:
    from pathlib import Path

    from broker.storage import records

    return sum(record.kind == records.DEDUPE
               for path in (Path(state._tmp.name) / "topics" / f"t-{topic}").glob("*.log")
               for record in records.scan_file(path.read_bytes(), str(path)))


def test_the_copies_of_a_dedupe_entry_do_not_multiply_with_crashes_inside_its_window(state):
    # A file's live de-duplication entries are carried to the current file when it goes;
    # a kill before its deletion leaves both copies, and each start tracked (so carried
    # again) every copy it read: three times as many records at each crash, 2 entries
    # became 567 copies in six. Each entry is tracked once now, in its newest file.
    for i in range(6):
        state.a_producer_retries_after_the_file_of_its_batch_is_gone("p", 3 + i % 2,
                                                                    crash=True)
        check(state)
    state.sync()                    # what was reclaimed is deleted
    live = len(state.produced)
    assert live == 2
    assert dedupe_records_on_disk(state, "c") <= 2 * live   # one copy, and one whose file goes


def test_a_compacted_lease_journal_keeps_the_order_its_leases_were_made_in(state, monkeypatch):
    # A compaction (here at every end of a lease) rewrote the journal with the leases held
    # first and the remembered ones after: a remembered lease then came after a later one
    # holding one of its messages, and claimed it at the next start, so the later lease was
    # lost. It keeps the journal's own order now.
    from broker.lease import LeaseJournal

    monkeypatch.setattr(LeaseJournal, "COMPACT_MIN_BYTES", 0)
    monkeypatch.setattr(LeaseJournal, "COMPACT_RATIO", 0)
    state.a_topic_with_two_channels_and_a_backlog(count=3)
    state.take_a_batch(count=3, topic="a")
    state.give_back_a_batch(data=Draws(0))     # remembered, its three waiting
    state.take_a_batch(count=1, topic="a")     # a later lease holds the first of them
    later = state.past_leases[-1]
    state.take_a_batch(count=1, topic="a")
    state.commit(state.past_leases[-1])       # an end: the journal is rewritten
    check(state)
    state.restart(crash=True)
    check(state)
    assert state.broker._requeued[later].live == 1   # its message, for its replay
