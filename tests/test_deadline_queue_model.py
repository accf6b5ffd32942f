"""The deadline queue of in-flight and deferred messages, against a plain dict:
single pushes and whole groups (a lease), cancels one by one and in bulk, due
messages popped, compaction on the way; nothing live is lost or popped twice."""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from broker.message import Message
from broker.pqueue import DeadlineQueue

POOL = 10
deadlines = st.integers(0, 20).map(float)
some = st.sets(st.integers(0, POOL - 1), max_size=POOL)


class QueueModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.msgs = [Message(f"{i:016x}", b"x", 0) for i in range(POOL)]
        self.queue = DeadlineQueue(compact_above=1)  # compacts at every chance
        self.oracle: dict[int, float] = {}  # queued message -> its deadline

    @rule(i=st.integers(0, POOL - 1), deadline=deadlines)
    def push(self, i, deadline):
        if i not in self.oracle:
            self.queue.push(self.msgs[i], deadline)
            self.oracle[i] = deadline

    @rule(chosen=some, deadline=deadlines)
    def push_many(self, chosen, deadline):
        group = sorted(i for i in chosen if i not in self.oracle)
        self.queue.push_many([self.msgs[i] for i in group], deadline)
        self.oracle.update((i, deadline) for i in group)

    @rule(i=st.integers(0, POOL - 1))
    def cancel(self, i):
        if i in self.oracle:
            self.queue.cancel(self.msgs[i])
            del self.oracle[i]

    @rule(chosen=some)
    def cancel_many(self, chosen):
        group = [i for i in chosen if i in self.oracle]
        self.queue.cancel_many([self.msgs[i] for i in group])
        for i in group:
            del self.oracle[i]

    @rule(now=deadlines)
    def pop_due(self, now):
        popped = [self.msgs.index(m) for m in self.queue.pop_due(now)]
        due = {i for i, d in self.oracle.items() if d <= now}
        assert sorted(popped) == sorted(due)  # each due message once, no other
        assert [self.oracle[i] for i in popped] == sorted(self.oracle[i] for i in popped)
        for i in popped:
            del self.oracle[i]

    @rule()
    def clear(self):
        assert sorted(self.msgs.index(m) for m in self.queue.clear()) == sorted(self.oracle)
        self.oracle.clear()

    @invariant()
    def agrees(self):
        assert len(self.queue) == len(self.oracle)
        assert sorted(self.msgs.index(m) for m in self.queue.live()) == sorted(self.oracle)
        assert self.queue.next_deadline() == min(self.oracle.values(), default=None)


QueueModel.TestCase.settings = settings(max_examples=200, stateful_step_count=40,
                                        deadline=None)
test_deadline_queue_agrees_with_a_dict_of_deadlines = QueueModel.TestCase


def _slots_held(queue: DeadlineQueue) -> int:
    """Messages the queue's entries hold, live or stale (what its memory grows with)."""
    return sum(len(e[2]) if type(e[2]) is list else 1 for e in [*queue._run, *queue._heap])


def _messages(n: int, start: int = 0) -> list[Message]:
    return [Message(f"{i:016x}", b"x", 0) for i in range(start, start + n)]


def test_finished_messages_do_not_pile_up_whatever_was_popped_or_pushed_as_a_lease():
    """The docstring's bound: stale entries are dropped once they outnumber live ones
    four to one, for single messages after many were popped due, and for the messages
    of leases FINed one by one."""
    queue = DeadlineQueue()
    popped = _messages(10_000)
    for i, msg in enumerate(popped):
        queue.push(msg, float(i))
    assert len(list(queue.pop_due(10_000.0))) == 10_000
    singles = _messages(10_000, 10_000)
    for msg in singles:
        queue.push(msg, 1e6)
    for msg in singles[1:]:
        queue.cancel(msg)
    assert len(queue) == 1 and _slots_held(queue) < 4 * 1024

    leases = DeadlineQueue()
    groups = [_messages(100, 100 * g) for g in range(100)]
    for group in groups:
        leases.push_many(group, 1e6)
    for group in groups:
        for msg in group[1:]:
            leases.cancel(msg)
    assert len(leases) == 100 and _slots_held(leases) < 4 * 1024
    assert sorted(m.id for m in leases.live()) == sorted(g[0].id for g in groups)


def test_cancelling_a_few_among_many_live_messages_does_not_rebuild_the_queue():
    """Cancelling is O(1): the whole queue is rebuilt only when stale entries outnumber
    live ones four to one, not whenever it is large, nor after a lease was popped due."""
    queue = DeadlineQueue()
    live = _messages(2000)
    for msg in live:
        queue.push(msg, 1e6)
    run = queue._run
    queue.cancel_many(live[:10])
    queue.cancel(live[10])
    assert queue._run is run and len(queue) == 1989

    queue = DeadlineQueue()
    queue.push_many(_messages(600), 1.0)
    singles = _messages(300, 600)
    for msg in singles:
        queue.push(msg, 1e6)
    assert len(list(queue.pop_due(1.0))) == 600
    run = queue._run
    queue.cancel(singles[0])
    assert queue._run is run and len(queue) == 299
