"""A model-based crash test of durable storage.

Hypothesis drives a durable broker (the core on a manual clock, its data path
in a temporary directory, ``--mem-queue-size`` 3 and 1 KB segments so that
messages spill and files roll and go) through random sequences of topic and
channel create/delete (durable and ``#ephemeral``), PUB/MPUB/DPUB, deliveries
under RDY, FIN, REQ with and without delay, TOUCH, timeouts, EMPTY,
pause/unpause, reads of spilled messages that arrive late (or never), syncs,
and restarts: clean (``close``), crash (the store is abandoned with no flush,
fsync or close; only what ``write(2)`` put in the files is there for the next
start) and power loss (``tests/faultfs.py`` cuts each file back to what was
fsynced). A plain in-memory model is the oracle: after every step, each
channel's and topic's pending messages (ids, attempts, deferral times) are
exactly the model's; after a restart every acknowledged, un-FINed message of
each durable channel is pending again, and nothing FINed or sent before a
channel existed comes back; after a power loss the broker is exactly the model
as it stood at the last completed sync.

A long run (``PYNSQ_MODEL_EXAMPLES=1000``, about three minutes here) found that
a broker restarted after a kill never fsynced what the killed one had written:
a power loss after the new broker's next sync lost it. The first sync after a
start now fsyncs every file found; 10,000 sequences (about twelve minutes)
then passed.

It also reaches what passes and what breaks: a crash right after a call was
answered (a publish, a channel created or deleted, a pause, an empty, a topic deleted:
what the answer acknowledged must be back, though the event-loop pass never ended),
reads of spilled messages that fail (EMFILE, EIO from ``tests/faultfs.py``: nothing is
lost, they are read later), fsyncs that fail (publishes are refused; a power loss then
brings back the last completed sync, so nothing it covered may have been deleted), a
damaged byte in a record that decides which channels own messages (it costs nothing),
and a topic with more durable channels than a 64-bit mask.

At the suite's budget the run is deterministic (``derandomize``): the same sequences
every time, each planted storage bug among them found. ``PYNSQ_MODEL_EXAMPLES`` sets
how many sequences to try, at random (a longer run finds what the fixed ones do not).
"""

from __future__ import annotations

import copy
import errno
import os
import tempfile
from pathlib import Path
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (RuleBasedStateMachine, initialize, invariant, precondition,
                                 rule)

from broker import Broker, Options
from broker.backlog import OnDisk
from broker.clock import ManualClock
from broker.errors import StorageFailed
import broker.storage.store as store_module
from broker.storage import DiskStore, records
from broker.storage.store import SCAN_BLOCK

from .corekit import Recorder
from .faultfs import FaultyFiles

LONG_RUN = os.environ.get("PYNSQ_MODEL_EXAMPLES")
EXAMPLES = int(LONG_RUN or "150")
if LONG_RUN:   # as long as it takes, past the suite's per-test timeout
    pytestmark = pytest.mark.timeout(0)
TOPICS = ["a", "b", "e#ephemeral"]
CHANNELS = ["x", "y", "z#ephemeral"]
MSG_TIMEOUT = 60.0
MANY_CHANNELS = 66
DOUBLED = {records.STATE, records.CHANNEL, records.TOPIC, records.FLUSH, records.EMPTY,
           records.CONFIG}


@dataclass
class Pending:
    body: bytes
    attempts: int = 0
    until: float | None = None        # deferred until (monotonic), else ready
    in_flight: bool = False
    deadline: float = 0.0


@dataclass
class ChannelModel:
    ephemeral: bool
    paused: bool = False
    pending: dict[str, Pending] = field(default_factory=dict)


@dataclass
class TopicModel:
    ephemeral: bool
    paused: bool = False
    channels: dict[str, ChannelModel] = field(default_factory=dict)
    held: dict[str, Pending] = field(default_factory=dict)


def durable(name: str) -> bool:
    return not name.endswith("#ephemeral")


class StorageModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self._tmp = tempfile.TemporaryDirectory(prefix="pynsq-model-")
        self.clock = ManualClock()
        self.model: dict[str, TopicModel] = {}
        self.counter = 0
        self.fins = 0
        # The file system keeps what was fsynced through a power loss, and the
        # model as it stood at the last completed sync is what must come back.
        self.files = FaultyFiles()
        self.synced: dict[str, TopicModel] = {}
        self.damaged: set[tuple[Path, int]] = set()   # (file, offset) of damaged records
        self.start()

    # -- the broker ---------------------------------------------------------
    def start(self) -> None:
        store_module.SCAN_BLOCK = 211  # records straddle the blocks a start reads
        self.files.heal()              # faults left unused are not the start's
        self.mid_pass = False
        # Syncs happen when a rule says so (not on the real clock's timeout).
        options = Options(data_path=self._tmp.name, mem_queue_size=3, max_bytes_per_file=1024,
                          sync_every=1 << 30, sync_timeout=1 << 30)
        self.broker = Broker(options, clock=self.clock)
        self.store = DiskStore(self.broker, options, self.files)
        self.broker.storage = self.store
        self.store.recover()
        # Messages waiting on disk are read ahead without waiting on the loop: from
        # the page cache at once (while ``page_cache_hot``), else by the reader thread;
        # here those reads wait until the rule that lets them arrive (so they arrive
        # late, or never).
        self.reads: list = []
        self.page_cache_hot = False
        self.store.read_ahead = self.read_ahead
        self.consumers: dict[tuple[str, str], Recorder] = {}
        self.seen: dict[tuple[str, str], int] = {}

    def read_ahead(self, topic, locs, done, cached_only=False) -> bool:
        if self.page_cache_hot:  # the store's own: ``done`` runs before it returns
            return DiskStore.read_ahead(self.store, topic, locs, done, cached_only)
        topic_log = self.store.logs.get(topic.name)
        if topic_log is None or cached_only:
            return False
        self.reads.append((topic_log, locs, done))
        return True

    def end_of_pass(self) -> None:
        """What the event loop does after each request: write queued records (unless
        the broker is to be killed before the pass ends)."""
        if not self.mid_pass:
            self.store.flush()
        self.observe_deliveries()

    def teardown(self) -> None:
        store_module.SCAN_BLOCK = SCAN_BLOCK
        self.store.abandon()
        self._tmp.cleanup()

    # -- model helpers --------------------------------------------------------
    def topic_model(self, topic: str) -> TopicModel:
        t = self.model.get(topic)
        if t is None:
            t = self.model[topic] = TopicModel(ephemeral=not durable(topic))
        return t

    def channel_model(self, topic: str, channel: str) -> ChannelModel:
        t = self.topic_model(topic)
        c = t.channels.get(channel)
        if c is None:
            c = t.channels[channel] = ChannelModel(ephemeral=not durable(channel))
            self.flush_model(t)
        return c

    def flush_model(self, t: TopicModel) -> None:
        if t.paused or not t.channels or not t.held:
            return
        now = self.clock.monotonic()
        for c in t.channels.values():
            for msg_id, p in t.held.items():
                until = p.until if p.until is not None and p.until > now else None
                c.pending[msg_id] = Pending(p.body, until=until)
        t.held.clear()

    def observe_deliveries(self) -> None:
        """Check and record what the broker handed to consumers."""
        for key, consumer in self.consumers.items():
            new = consumer.received[self.seen[key]:]
            self.seen[key] = len(consumer.received)
            t = self.model[key[0]]
            c = t.channels[key[1]]
            for msg in new:
                p = c.pending.get(msg.id)
                assert p is not None, f"{msg.id} delivered on {key} but not pending there"
                assert not p.in_flight and p.until is None, f"{msg.id} was not ready on {key}"
                p.in_flight, p.deadline = True, self.clock.monotonic() + MSG_TIMEOUT
                p.attempts = min(p.attempts + 1, 65535)
                assert msg.attempts == p.attempts
                assert msg.body == p.body
            if new:  # RDY bounds what a consumer holds after being handed more
                assert len(consumer.in_flight) <= consumer.rdy

    # -- rules --------------------------------------------------------------
    @initialize(count=st.integers(0, 12))
    def a_topic_with_two_channels_and_a_backlog(self, count: int) -> None:
        for channel in ("x", "y"):
            self.create_channel("a", channel)
            self.set_rdy_on(("a", channel), 2)
        if count:
            self.publish("a", count, 0)

    @rule(topic=st.sampled_from(TOPICS))
    def create_topic(self, topic: str) -> None:
        self.broker.get_or_create_topic(topic)
        self.topic_model(topic)
        self.end_of_pass()

    @rule(topic=st.sampled_from(TOPICS), channel=st.sampled_from(CHANNELS))
    def create_channel(self, topic: str, channel: str) -> None:
        self.broker.create_channel(topic, channel)
        self.channel_model(topic, channel)
        self.end_of_pass()

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def delete_channel(self, data) -> None:
        pairs = [(t, c) for t, m in self.model.items() for c in m.channels]
        if not pairs:
            return
        topic, channel = data.draw(st.sampled_from(sorted(pairs)))
        self.broker.delete_channel(topic, channel)
        self.consumers.pop((topic, channel), None)
        del self.model[topic].channels[channel]
        if self.model[topic].ephemeral and not self.model[topic].channels:
            del self.model[topic]
        self.end_of_pass()

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def delete_topic(self, data) -> None:
        topic = data.draw(st.sampled_from(sorted(self.model)))
        self.broker.delete_topic(topic)
        for key in [k for k in self.consumers if k[0] == topic]:
            del self.consumers[key]
        del self.model[topic]
        self.synced.pop(topic, None)   # its directory is renamed away at once
        self.end_of_pass()

    @rule(topic=st.sampled_from(TOPICS), count=st.integers(1, 6),
          defer_s=st.sampled_from([0, 0, 0, 5, 90]))
    def publish(self, topic: str, count: int, defer_s: int) -> None:
        bodies = []
        for _ in range(count):
            self.counter += 1
            bodies.append(f"m{self.counter}-".encode() * (4 + self.counter % 20))
        t = self.topic_model(topic)   # the topic is made even if the publish is refused
        try:
            ids = self.broker.multi_publish(topic, bodies, defer_ms=[defer_s * 1000] * count
                                            if defer_s else ())
        except StorageFailed:
            assert self.store.failed, "a publish refused while the data path syncs"
            self.end_of_pass()
            return
        until = self.clock.monotonic() + defer_s if defer_s else None
        for msg_id, body in zip(ids, bodies):
            if t.paused or not t.channels:
                t.held[msg_id] = Pending(body, until=until)
            else:
                for c in t.channels.values():
                    c.pending[msg_id] = Pending(body, until=until)
        self.end_of_pass()

    @precondition(lambda self: any(m.channels for m in self.model.values()))
    @rule(data=st.data(), rdy=st.integers(0, 5))
    def set_rdy(self, data, rdy: int) -> None:
        pairs = sorted((t, c) for t, m in self.model.items() for c in m.channels)
        self.set_rdy_on(data.draw(st.sampled_from(pairs)), rdy)

    def set_rdy_on(self, key: tuple[str, str], rdy: int) -> None:
        consumer = self.consumers.get(key)
        if consumer is None:
            consumer = Recorder(self.broker)
            self.broker.subscribe(consumer, *key)
            self.consumers[key] = consumer
            self.seen[key] = 0
        self.broker.channel(*key).set_rdy(consumer, rdy)
        self.end_of_pass()

    @precondition(lambda self: self.consumers)
    @rule(data=st.data())
    def consume(self, data) -> None:
        """Take what is ready on one channel and FIN part of it."""
        key = data.draw(st.sampled_from(sorted(self.consumers)))
        consumer = self.consumers[key]
        channel = self.broker.channel(*key)
        channel.set_rdy(consumer, 5)
        self.end_of_pass()
        # One draw whatever is in flight: what was delivered may differ between runs of
        # the same steps (reads from disk finish on another thread), and hypothesis wants
        # the same draws for the same steps.
        fin_bits = data.draw(st.integers(0, 2**32 - 1))
        for i, msg_id in enumerate(sorted(consumer.in_flight)):
            if fin_bits >> (i % 32) & 1:
                channel.finish(consumer, msg_id)
                self.fins += 1
                del self.model[key[0]].channels[key[1]].pending[msg_id]
        self.end_of_pass()

    def _held_message(self, data):
        held = sorted((k, msg_id) for k, c in self.consumers.items() for msg_id in c.in_flight)
        pick = data.draw(st.integers(0, 2**16 - 1))  # the same draw however many are held
        if not held:
            return None, None
        key, msg_id = held[pick % len(held)]
        return key, msg_id

    @rule(data=st.data())
    def fin(self, data) -> None:
        key, msg_id = self._held_message(data)
        if key is None:
            return
        self.broker.channel(*key).finish(self.consumers[key], msg_id)
        del self.model[key[0]].channels[key[1]].pending[msg_id]
        self.end_of_pass()

    @rule(data=st.data(), delay=st.sampled_from([0, 0, 3, 200]))
    def req(self, data, delay: int) -> None:
        key, msg_id = self._held_message(data)
        if key is None:
            return
        self.broker.channel(*key).requeue(self.consumers[key], msg_id, delay)
        p = self.model[key[0]].channels[key[1]].pending[msg_id]
        p.in_flight = False
        p.until = self.clock.monotonic() + delay if delay else None
        self.end_of_pass()

    @rule(data=st.data())
    def touch(self, data) -> None:
        key, msg_id = self._held_message(data)
        if key is None:
            return
        self.broker.channel(*key).touch(self.consumers[key], msg_id)
        self.model[key[0]].channels[key[1]].pending[msg_id].deadline = \
            self.clock.monotonic() + MSG_TIMEOUT
        self.end_of_pass()

    @rule(seconds=st.sampled_from([1, 4, 30, 61, 100]))
    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)
        now = self.clock.monotonic()
        for t in self.model.values():
            for p in t.held.values():
                if p.until is not None and p.until <= now:
                    p.until = None
            for c in t.channels.values():
                for p in c.pending.values():
                    if p.in_flight and p.deadline <= now:
                        p.in_flight = False
                    if p.until is not None and p.until <= now:
                        p.until = None
        # The broker's consumers lose their timed-out messages at the tick.
        self.broker.tick()
        self.store.tick()
        self.end_of_pass()

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def empty(self, data) -> None:
        topic = data.draw(st.sampled_from(sorted(self.model)))
        t = self.model[topic]
        channel = data.draw(st.sampled_from([None, *sorted(t.channels)]))
        if channel is None:
            self.broker.topic(topic).empty()
            t.held.clear()
        else:
            self.broker.channel(topic, channel).empty()
            t.channels[channel].pending.clear()
        self.end_of_pass()

    @precondition(lambda self: self.model)
    @rule(data=st.data(), paused=st.booleans())
    def pause(self, data, paused: bool) -> None:
        topic = data.draw(st.sampled_from(sorted(self.model)))
        t = self.model[topic]
        channel = data.draw(st.sampled_from([None, *sorted(t.channels)]))
        target = self.broker.topic(topic) if channel is None else \
            self.broker.channel(topic, channel)
        target.pause() if paused else target.unpause()
        if channel is None:
            t.paused = paused
            self.flush_model(t)
        else:
            t.channels[channel].paused = paused
        self.end_of_pass()

    @rule(hot=st.booleans())
    def page_cache(self, hot: bool) -> None:
        """Whether messages read back are in the page cache (read at once, on the loop)
        or must wait for the disk (read by the reader thread, arriving later)."""
        self.page_cache_hot = hot

    @precondition(lambda self: self.reads)
    @rule()
    def disk_reads_arrive(self) -> None:
        """The storage's reader thread hands over what it read. All of it: the order
        the channels asked in follows the broker's set of timed channels, which is not
        the same from one run of a sequence to the next."""
        reads, self.reads = self.reads, []
        for topic_log, locs, done in reads:
            try:
                msgs = topic_log.read_messages(locs)
            except OSError:  # the file went meanwhile (its messages are gone)
                msgs = None
            done(msgs)
        self.end_of_pass()

    @rule(crash=st.booleans())
    def restart(self, crash: bool) -> None:
        event(f"restart after {self.counter} published, {self.fins} FINs by consume")
        if crash:
            self.store.abandon()
        else:
            self.store.close()   # fsyncs everything
        self.start()
        self.model = self.as_restarted(self.model)
        if not crash:
            self.synced = copy.deepcopy(self.model)
        self.check_everything_pending()

    @rule()
    def sync(self) -> None:
        """An fsync of the data path completes (every --sync-every or --sync-timeout)."""
        self.store.wait_synced()
        assert not self.store.failed
        self.synced = copy.deepcopy(self.model)

    @rule()
    def power_loss(self) -> None:
        """The machine loses power: each file keeps what was fsynced. What the README
        promises: the broker starts, and its state is exactly the model's at the last
        completed sync (each acknowledged message pending then, with its attempts and
        deferral, is back; nothing FINed or emptied before it returns; nothing published
        after it is there). A topic deleted since stays deleted (a rename, which this
        file system keeps), and one created since is there, empty."""
        event(f"power loss after {self.counter} published")
        self.store.abandon()
        self.files.power_loss(self._tmp.name)
        self.start()
        model = copy.deepcopy(self.synced)
        for name, t in self.model.items():
            if name not in model and not t.ephemeral:
                model[name] = TopicModel(ephemeral=False)
        self.model = self.as_restarted(model)
        self.synced = copy.deepcopy(self.model)
        self.check_everything_pending()

    @rule(data=st.data(), op=st.sampled_from(["publish", "create", "delete", "pause",
                                              "empty", "delete_topic"]))
    def killed_right_after_an_answer(self, data, op: str) -> None:
        """The broker is killed after a call was answered, before its event-loop pass
        ends: what the answer acknowledged is on disk (a PUB, a channel created or
        deleted, a pause, an empty); a delivery the pass made, with its count, is not."""
        received = {key: len(c.received) for key, c in self.consumers.items()}
        self.mid_pass = True
        if op == "publish":
            self.publish(data.draw(st.sampled_from(TOPICS)), data.draw(st.integers(1, 4)),
                         data.draw(st.sampled_from([0, 5])))
        elif op == "create":   # durable: an ephemeral one's FLUSH waits for the pass
            self.create_channel(data.draw(st.sampled_from(TOPICS)),
                                data.draw(st.sampled_from(["x", "y"])))
        elif op == "delete" and any(t.channels for t in self.model.values()):
            self.delete_channel(data)
        elif op == "pause" and self.model:
            self.pause_durably(data)
        elif op == "empty" and self.model:
            self.empty(data)
        elif op == "delete_topic" and self.model:
            self.delete_topic(data)
        for key, count in received.items():   # deliveries of this pass: not counted
            if key in self.consumers:
                c = self.model[key[0]].channels[key[1]]
                for msg in self.consumers[key].received[count:]:
                    if msg.id in c.pending:
                        c.pending[msg.id].attempts -= 1
        event(f"killed right after {op}")
        self.store.abandon()
        self.start()
        self.model = self.as_restarted(self.model)
        self.check_everything_pending()

    def pause_durably(self, data) -> None:
        """``pause``, but no unpause of a topic whose channels are all ephemeral while it
        holds messages (where they go is written at the end of the pass)."""
        topic = data.draw(st.sampled_from(sorted(self.model)))
        t = self.model[topic]
        paused = data.draw(st.booleans())
        channel = data.draw(st.sampled_from([None, *sorted(t.channels)]))
        if channel is None and not paused and t.held and t.channels and \
                all(c.ephemeral for c in t.channels.values()):
            paused = True
        target = self.broker.topic(topic) if channel is None else \
            self.broker.channel(topic, channel)
        target.pause() if paused else target.unpause()
        if channel is None:
            t.paused = paused
            self.flush_model(t)
        else:
            t.channels[channel].paused = paused
        self.end_of_pass()

    @precondition(lambda self: self.consumers)
    @rule(data=st.data(), err=st.sampled_from([errno.EMFILE, errno.EIO]),
          times=st.integers(1, 6))
    def reads_fail(self, data, err: int, times: int) -> None:
        """The next reads of messages waiting on disk fail (too many open files, an I/O
        error) while a consumer asks for more and reads under way arrive: not damage.
        Nothing is lost; they are read again later."""
        self.files.fail("pread", err, times=times)
        self.consume(data)
        if self.reads:
            self.disk_reads_arrive()
        event("reads failed")

    @rule(then_power_loss=st.booleans())
    def a_sync_fails(self, then_power_loss: bool) -> None:
        """Every fsync of a sync fails: publishes are refused until one succeeds. Then
        the power goes (what the last completed sync covered is back: nothing of it was
        deleted after the failed one), or the next sync succeeds."""
        self.files.fail("fsync", errno.EIO)
        self.store.wait_synced()
        self.files.heal()
        if self.store.failed:
            event("a sync failed")
        if then_power_loss:
            self.power_loss()
        else:
            self.sync()

    @rule(data=st.data())
    def killed_with_a_damaged_record(self, data) -> None:
        """The broker is killed, and one byte of a record that decides which channels own
        messages (STATE, CHANNEL, TOPIC, FLUSH, EMPTY, CONFIG) is damaged on disk, in
        one copy of the two: the start finds everything as it was."""
        self.store.abandon()
        candidates = []
        for path in sorted(Path(self._tmp.name).rglob("*.log")):
            for r in records.scan(path.read_bytes(), str(path)):
                size = records.HEADER_SIZE + len(r.payload)
                # Not the twin of one damaged before: one byte, one copy.
                if r.kind in DOUBLED and not {(path, r.offset - size),
                                              (path, r.offset + size)} & self.damaged:
                    candidates.append((path, r))
        if candidates:
            path, record = data.draw(st.sampled_from(candidates))
            raw = bytearray(path.read_bytes())
            at = record.offset + records.HEADER_SIZE + len(record.payload) // 2
            if not len(record.payload):
                at = record.offset + records.HEADER_SIZE - 1   # its CRC
            raw[at] ^= 0xFF
            path.write_bytes(bytes(raw))
            self.damaged.add((path, record.offset))
            event(f"damaged a record of kind {record.kind}")
        self.start()
        self.model = self.as_restarted(self.model)
        self.check_everything_pending()

    @precondition(lambda self: "b" not in self.model or len(self.model["b"].channels) < 8)
    @rule()
    def a_topic_with_many_durable_channels(self) -> None:
        """More durable channels than a 64-bit mask has bits (and than 63, a limit
        recovery once had)."""
        for i in range(MANY_CHANNELS):
            self.create_channel("b", f"c{i:02d}")
        event("a topic with many durable channels")

    def as_restarted(self, model: dict[str, TopicModel]) -> dict[str, TopicModel]:
        """What a restart makes of ``model``: nothing ephemeral, nothing in flight, and
        deferrals due by now ready."""
        now = self.clock.monotonic()
        for name in [n for n, t in model.items() if t.ephemeral]:
            del model[name]
        for t in model.values():
            for name in [n for n, c in t.channels.items() if c.ephemeral]:
                del t.channels[name]
            pendings = list(t.held.values())
            for c in t.channels.values():
                pendings += c.pending.values()
            for p in pendings:
                p.in_flight = False
                if p.until is not None and p.until <= now:
                    p.until = None
        return model

    # -- the oracle ---------------------------------------------------------
    def pending_in_broker(self, backlog, deferred, in_flight, topic_name):
        """id -> (attempts, deferred until or None, in flight) of what the broker holds."""
        out: dict[str, tuple[int, float | None, bool]] = {}
        store = self.store
        for item in backlog._items:
            if type(item) is OnDisk:
                attempts = item.remaining_attempts() or [0] * len(item)
                for loc, count in zip(item.remaining(), attempts):
                    with self.files.suspended():  # the oracle's reads never fail
                        msg_id, *_ = store.logs[topic_name].read_pub(loc)
                    out[f"{msg_id:016x}"] = (count, None, False)
            else:
                out[item.id] = (item.attempts, None, False)
        for msg in deferred.live():
            out[msg.id] = (msg.attempts, msg.deadline, False)
        for loc, count, until in deferred.on_disk():  # waiting on disk only
            with self.files.suspended():  # the oracle's reads never fail
                msg_id, *_ = store.logs[topic_name].read_pub(loc)
            out[f"{msg_id:016x}"] = (count, until, False)
        for msg in in_flight:
            out[msg.id] = (msg.attempts, None, True)
        return out

    @invariant()
    def check_each_file_is_held_by_exactly_its_pending_copies(self) -> None:
        from broker.storage.segments import segment_of
        for name, topic_log in self.store.logs.items():
            topic = self.broker.topics[name]
            counted: dict[int, int] = {}
            for source in [topic, *topic.channels.values()]:
                for loc, _, _ in source.copies():
                    counted[segment_of(loc)] = counted.get(segment_of(loc), 0) + 1
            assert {s: n for s, n in topic_log.refs.items() if n} == counted, name

    @invariant()
    def check_everything_pending(self) -> None:
        assert set(self.broker.topics) == set(self.model)
        for name, t in self.model.items():
            topic = self.broker.topics[name]
            assert topic.paused == t.paused
            assert set(topic.channels) == set(t.channels)
            held = self.pending_in_broker(topic._held, topic._held_later, [], name)
            assert set(held) == set(t.held), f"held in {name}"
            for msg_id, p in t.held.items():
                if p.until is not None:
                    assert held[msg_id][1] == pytest.approx(p.until, abs=1e-3)
            for cname, c in t.channels.items():
                channel = topic.channels[cname]
                assert channel.paused == c.paused
                got = self.pending_in_broker(channel._ready, channel._deferred,
                                             channel._in_flight.live(), name)
                assert set(got) == set(c.pending), f"pending in {name}/{cname}"
                for msg_id, p in c.pending.items():
                    attempts, until, in_flight = got[msg_id]
                    assert in_flight == p.in_flight, msg_id
                    if not in_flight:
                        assert attempts == p.attempts, (name, cname, msg_id)
                    if p.until is None:
                        assert until is None, msg_id
                    else:
                        assert until == pytest.approx(p.until, abs=1e-3), msg_id


StorageModel.TestCase.settings = settings(
    max_examples=EXAMPLES, stateful_step_count=50, deadline=None, database=None,
    derandomize=not LONG_RUN,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
test_storage_survives_any_sequence_of_operations_and_restarts = StorageModel.TestCase
