"""A model-based crash test of dead letters: nothing past max_attempts is ever gone.

Hypothesis drives a durable broker (manual clock, real data path, ``--mem-queue-size``
2 and 1 KB segments so messages spill and files roll) whose channel ``a/x`` has
``max_attempts`` 2 and dead-letters to ``a.dead``, through random PUBs, deliveries,
FINs, REQs, timeouts and clean or crash restarts. The oracle, after every step: each
published message is FINed on ``a/x``, still pending there, or in ``a.dead`` —
never gone; nothing is delivered on ``a/x`` more than twice; a message is in
``a.dead`` only after its second delivery (a crash may leave it there twice).
"""

from __future__ import annotations

import os
import tempfile

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from broker import Broker, Options
from broker.backlog import OnDisk
from broker.clock import ManualClock
from broker.storage import DiskStore

from .corekit import Recorder

EXAMPLES = int(os.environ.get("PYNSQ_MODEL_EXAMPLES", "25"))
MAX_ATTEMPTS = 2


def pending_ids(store: DiskStore, topic: str, channel) -> list[str]:
    ids = []
    for item in channel._ready._items:
        if type(item) is OnDisk:
            ids += [f"{store.logs[topic].read_pub(loc)[0]:016x}" for loc in item.remaining()]
        else:
            ids.append(item.id)
    ids += [m.id for m in channel._deferred.live()]
    ids += [f"{store.logs[topic].read_pub(loc)[0]:016x}"
            for loc, _, _ in channel._deferred.on_disk()]
    ids += [m.id for m in channel._in_flight.live()]
    return ids


class DeadLetterModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self._tmp = tempfile.TemporaryDirectory(prefix="pynsq-dlmodel-")
        self.clock = ManualClock()
        self.published: set[str] = set()
        self.finished: set[str] = set()
        self.deliveries: dict[str, int] = {}    # on a/x, counted by the consumer
        self.counter = 0
        self.start()
        self.broker.create_channel("a", "x", max_attempts=MAX_ATTEMPTS)
        self.broker.create_channel("a.dead", "audit")
        self.pass_ends()

    def start(self) -> None:
        options = Options(data_path=self._tmp.name, mem_queue_size=2, max_bytes_per_file=1024)
        self.broker = Broker(options, clock=self.clock)
        self.store = DiskStore(self.broker, options)
        self.broker.storage = self.store
        self.store.recover()
        self.consumer = Recorder(self.broker, msg_timeout_ms=10_000)
        self.seen = 0

    def teardown(self) -> None:
        self.store.abandon()
        self._tmp.cleanup()

    def pass_ends(self) -> None:
        self.store.flush()
        for msg in self.consumer.received[self.seen:]:
            self.deliveries[msg.id] = self.deliveries.get(msg.id, 0) + 1
        self.seen = len(self.consumer.received)

    @property
    def channel(self):
        return self.broker.channel("a", "x")

    @rule(count=st.integers(1, 4))
    def publish(self, count: int) -> None:
        bodies = []
        for _ in range(count):
            self.counter += 1
            bodies.append(f"m{self.counter}".encode() * (1 + self.counter % 5))
        self.published.update(self.broker.multi_publish("a", bodies))
        self.pass_ends()

    @rule(rdy=st.integers(0, 3))
    def set_rdy(self, rdy: int) -> None:
        if self.consumer.channel is None:
            self.broker.subscribe(self.consumer, "a", "x")
        self.channel.set_rdy(self.consumer, rdy)
        self.pass_ends()

    @rule(data=st.data(), fin=st.booleans(), delay=st.sampled_from([0, 0, 5]))
    def fin_or_req(self, data, fin: bool, delay: int) -> None:
        # One fixed-range draw whatever is in flight (what was delivered may differ
        # between runs of the same steps; hypothesis wants the same draws).
        pick = data.draw(st.integers(0, 2**16 - 1))
        held = sorted(self.consumer.in_flight)
        if not held:
            return
        msg_id = held[pick % len(held)]
        if fin:
            self.channel.finish(self.consumer, msg_id)
            self.finished.add(msg_id)
        else:
            self.channel.requeue(self.consumer, msg_id, delay)
        self.pass_ends()

    @rule(seconds=st.sampled_from([1, 6, 11]))
    def advance(self, seconds: int) -> None:
        self.clock.advance(seconds)
        self.broker.tick()
        self.store.tick()
        self.pass_ends()

    @rule(crash=st.booleans())
    def restart(self, crash: bool) -> None:
        if crash:
            self.store.abandon()
        else:
            self.store.close()
        self.start()

    @invariant()
    def nothing_past_max_attempts_is_gone(self) -> None:
        pending = set(pending_ids(self.store, "a", self.channel))
        dead = pending_ids(self.store, "a.dead", self.broker.channel("a.dead", "audit"))
        gone = self.published - self.finished - pending - set(dead)
        assert not gone, f"lost: {sorted(gone)}"
        assert all(n <= MAX_ATTEMPTS for n in self.deliveries.values()), self.deliveries
        for msg_id in dead:
            assert msg_id not in self.finished, f"{msg_id} FINed and dead-lettered"
            # a crash can take back the attempts record, so the count may be lower
            assert self.deliveries.get(msg_id, 0) >= 1, f"{msg_id} dead-lettered undelivered"


DeadLetterModel.TestCase.settings = settings(
    max_examples=EXAMPLES, stateful_step_count=40, deadline=None, database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
test_dead_letters_are_never_lost_across_any_sequence_and_restarts = DeadLetterModel.TestCase
