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
