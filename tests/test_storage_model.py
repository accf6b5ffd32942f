"""A model-based crash test of durable storage.

Hypothesis drives a durable broker (the core on a manual clock, its data path
in a temporary directory, ``--mem-queue-size`` 3 and 1 KB segments so that
messages spill and files roll and go) through random sequences of topic and
channel create/delete (durable and ``#ephemeral``), PUB/MPUB/DPUB, deliveries
under RDY, FIN, REQ with and without delay, TOUCH, timeouts, EMPTY,
pause/unpause, reads of spilled messages that arrive late (or never), syncs,
and restarts: clean (``close``), crash (the store is abandoned with no flush,
fsync or close; only what ``write(2)`` put in the files is there for the next
start) and power loss (``tests/faultfs.py`` cuts each log file, and the lease
journal, back to what was fsynced). A plain in-memory model is the oracle: after
every step, each channel's and topic's pending messages (ids, attempts, deferral
times) are exactly the model's; after a restart every acknowledged, un-FINed
message of each durable channel is pending again, and nothing FINed or sent
before a channel existed comes back; after a power loss the broker is exactly
the model as it stood at the last completed sync, its leases too (the journal is
fsynced with the logs: a lease made since is not remembered, one ended since is).

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

Leases, de-duplication and ttl too. A planner leases batches from channel ``s``
(``reserve``), commits them (FIN), gives them back (REQ) or lets them time out, and
replays them (adopts the lease), before and after restarts: a replay takes back exactly
those of the lease's messages still waiting in the channel, in its order, with the
attempts of its first delivery; the leases the broker holds and remembers are the
model's; nothing committed comes back and nothing acknowledged is lost across
``kill -9``. Producers publish with a producer id and sequence and repeat themselves:
within the window (before or after a restart) a repeat publishes nothing and answers
the first ids, other content is refused. Messages with a ttl (their own, or the
topic's from ``create_topic(ttl_ms=...)``, which outlives a restart) are never
delivered or leased past it on the manual clock; they may leave once expired, nothing
else may.

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
from broker.errors import ProducerConflict, StorageFailed
from broker.lease import LeaseJournal
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
LEASED = "s"                     # the channel leases read from (no consumer stream on it)
LEASE_TOPICS = ["a", "b"]
DEDUPE_WINDOW_S = 150
PRODUCERS = ["p", "q"]
DOUBLED = {records.STATE, records.CHANNEL, records.TOPIC, records.FLUSH, records.EMPTY,
           records.CONFIG}


@dataclass
class Pending:
    body: bytes
    attempts: int = 0
    until: float | None = None        # deferred until (monotonic), else ready
    in_flight: bool = False
    deadline: float = 0.0
    expires: int = 0                  # wall ns past which it is never delivered (0: never)
    lease: str | None = None          # the lease holding it, if one does
    claim: str | None = None          # the remembered lease a replay takes it back for


@dataclass
class LeaseModel:
    key: tuple[str, str]
    ids: list[str]                    # what it holds, or held when given back, in order
    first: dict[str, int]             # each message's attempts as first delivered to it
    made_ids: list[str]               # as it was made (what the lease journal says)
    held: bool = True                 # held, else given back (remembered while it claims one)
    deadline: float = 0.0


@dataclass
class Produced:
    topic: str
    bodies: list[bytes]
    ids: list[str]
    at_ns: int


@dataclass
class ChannelModel:
    ephemeral: bool
    paused: bool = False
    pending: dict[str, Pending] = field(default_factory=dict)


@dataclass
class TopicModel:
    ephemeral: bool
    paused: bool = False
    ttl_ms: int = 0
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
        self.crafted: set[str] = set()                 # ids of bodies that are records
        # Leases held or remembered, in the order they were made (the lease journal's).
        self.leases: dict[str, LeaseModel] = {}
        self.past_leases: list[str] = []
        # The leases as the lease journal's fsynced part holds them: as at the last start
        # or completed sync (after which it is cut back if none was live).
        self.synced_leases: dict[str, LeaseModel] = {}
        # (producer id, sequence) -> what it published, while the broker must remember it.
        self.produced: dict[tuple[str, int], Produced] = {}
        self.synced_produced: dict[tuple[str, int], Produced] = {}
        self.start()

    # -- the broker ---------------------------------------------------------
    def start(self) -> None:
        store_module.SCAN_BLOCK = 211  # records straddle the blocks a start reads
        self.files.heal()              # faults left unused are not the start's
        self.mid_pass = False
        # Syncs happen when a rule says so (not on the real clock's timeout).
        options = Options(data_path=self._tmp.name, mem_queue_size=3, max_bytes_per_file=1024,
                          sync_every=1 << 30, sync_timeout=1 << 30,
                          dedupe_window=DEDUPE_WINDOW_S * 1000)
        self.broker = Broker(options, clock=self.clock)
        self.store = DiskStore(self.broker, options, self.files)
        self.broker.storage = self.store
        self.broker.recover(self.store, LeaseJournal(Path(self._tmp.name) / "leases.journal",
                                                     self.files))
        self.session = self.broker.open_lease_session("planner").session_id
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

    def stop(self, crash: bool = True) -> None:
        """The broker stops: killed (nothing more written) or closed."""
        if crash:
            self.store.abandon()
        else:
            self.store.close()   # fsyncs everything
        self.broker.lease_journal.close()

    def teardown(self) -> None:
        store_module.SCAN_BLOCK = SCAN_BLOCK
        self.stop()
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
                c.pending[msg_id] = Pending(p.body, until=until, expires=p.expires)
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
                assert not self.expired(p), f"{msg.id} delivered on {key} past its ttl"
                p.in_flight, p.deadline = True, self.clock.monotonic() + MSG_TIMEOUT
                p.attempts = min(p.attempts + 1, 65535)
                assert msg.attempts == p.attempts
                assert msg.body == p.body
            if new:  # RDY bounds what a consumer holds after being handed more
                assert len(consumer.in_flight) <= consumer.rdy
        self.forget_what_expired()

    def expired(self, p: Pending) -> bool:
        return bool(p.expires) and p.expires <= self.clock.wall_ns()

    def forget_what_expired(self) -> None:
        """A message past its ttl leaves when the broker comes to deliver it (or before):
        the model lets go of those that have left."""
        for name, t in self.model.items():
            topic = self.broker.topics[name]
            for cname, c in t.channels.items():
                if any(self.expired(p) and not p.in_flight for p in c.pending.values()):
                    channel = topic.channels[cname]
                    there = self.pending_in_broker(channel._ready, channel._deferred,
                                                   channel._in_flight.live(), name)
                    for msg_id in [i for i, p in c.pending.items() if i not in there
                                   and self.expired(p) and not p.in_flight]:
                        del c.pending[msg_id]
            if any(self.expired(p) for p in t.held.values()):
                there = self.pending_in_broker(topic._held, topic._held_later, [], name)
                for msg_id in [i for i, p in t.held.items()
                               if i not in there and self.expired(p)]:
                    del t.held[msg_id]
        self.forget_unclaimed_leases()

    # -- rules --------------------------------------------------------------
    @initialize(count=st.integers(0, 12))
    def a_topic_with_two_channels_and_a_backlog(self, count: int) -> None:
        for channel in ("x", "y"):
            self.create_channel("a", channel)
            self.set_rdy_on(("a", channel), 2)
        self.create_channel("a", LEASED)
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
        for lease_id in [i for i, lease in self.leases.items() if lease.key == (topic, channel)]:
            del self.leases[lease_id]
        if self.model[topic].ephemeral and not self.model[topic].channels:
            del self.model[topic]
            self.topic_gone(topic)
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
        self.topic_gone(topic)
        self.end_of_pass()

    @rule(topic=st.sampled_from(TOPICS), count=st.integers(1, 6),
          defer_s=st.sampled_from([0, 0, 0, 5, 90]))
    def publish(self, topic: str, count: int, defer_s: int, ttl_s: int = 0) -> None:
        bodies = []
        for _ in range(count):
            self.counter += 1
            bodies.append(f"m{self.counter}-".encode() * (4 + self.counter % 20))
        t = self.topic_model(topic)   # the topic is made even if the publish is refused
        try:
            ids = self.broker.multi_publish(topic, bodies, defer_ms=[defer_s * 1000] * count
                                            if defer_s else (),
                                            ttl_ms=[ttl_s * 1000] * count if ttl_s else ())
        except StorageFailed:
            assert self.store.failed, "a publish refused while the data path syncs"
            self.end_of_pass()
            return
        self.published(t, ids, bodies, defer_s, ttl_s * 1000 or t.ttl_ms)
        self.end_of_pass()

    def published(self, t: TopicModel, ids: list[str], bodies: list[bytes], defer_s: int = 0,
                  ttl_ms: int = 0) -> None:
        until = self.clock.monotonic() + defer_s if defer_s else None
        expires = self.clock.wall_ns() + ttl_ms * 1_000_000 if ttl_ms else 0
        for msg_id, body in zip(ids, bodies):
            if t.paused or not t.channels:
                t.held[msg_id] = Pending(body, until=until, expires=expires)
            else:
                for c in t.channels.values():
                    c.pending[msg_id] = Pending(body, until=until, expires=expires)

    @rule(topic=st.sampled_from(TOPICS), count=st.integers(1, 4),
          defer_s=st.sampled_from([0, 0, 5]), ttl_s=st.sampled_from([10, 50, 200]))
    def publish_with_a_ttl(self, topic: str, count: int, defer_s: int, ttl_s: int) -> None:
        """Messages that live ``ttl_s`` seconds: never delivered past it, before or after
        a restart."""
        self.publish(topic, count, defer_s, ttl_s)

    @rule(topic=st.sampled_from(TOPICS), ttl_s=st.sampled_from([0, 20, 90]))
    def set_topic_ttl(self, topic: str, ttl_s: int) -> None:
        """``/topic/create?ttl=``: the topic's messages published from now on live
        ``ttl_s`` seconds (0: for ever); the setting outlives a restart."""
        self.broker.create_topic(topic, ttl_ms=ttl_s * 1000)
        self.topic_model(topic).ttl_ms = ttl_s * 1000
        self.end_of_pass()

    # -- de-duplication ---------------------------------------------------------
    @rule(topic=st.sampled_from(TOPICS), producer=st.sampled_from(PRODUCERS),
          sequence=st.integers(0, 2), count=st.integers(1, 2))
    def publish_as_a_producer(self, topic: str, producer: str, sequence: int,
                              count: int) -> None:
        bodies = [f"{producer}{sequence}:{topic}:{i}-".encode() * 5 for i in range(count)]
        self.publish_once(topic, bodies, producer, sequence)

    @precondition(lambda self: self.produced)
    @rule(data=st.data())
    def a_producer_retries(self, data) -> None:
        """A writer replays a request it sent before (same producer id, sequence and
        content)."""
        key = data.draw(st.sampled_from(sorted(self.produced)))
        self.publish_once(self.produced[key].topic, self.produced[key].bodies, *key)

    @rule(producer=st.sampled_from(PRODUCERS), sequence=st.integers(3, 4),
          crash=st.booleans())
    def a_producer_retries_after_the_file_of_its_batch_is_gone(self, producer: str,
                                                              sequence: int,
                                                              crash: bool) -> None:
        """A batch is published with a producer id, read and committed; later files take
        the place of its own, which is deleted; the broker restarts and the writer repeats
        the batch: still inside the window, it publishes nothing."""
        self.create_channel("c", LEASED)
        bodies = [f"{producer}{sequence}:c:{i}-".encode() * 5 for i in range(2)]
        self.publish_once("c", bodies, producer, sequence)
        for _ in range(2):
            self.take_a_batch("c", 6)
            for lease_id in [i for i, lease in self.leases.items()
                             if lease.key == ("c", LEASED) and lease.held]:
                self.commit(lease_id)
            self.publish("c", 6, 0)     # the next file
        self.store.tick()
        self.end_of_pass()
        self.restart(crash)
        self.publish_once("c", bodies, producer, sequence)

    def publish_once(self, topic: str, bodies: list[bytes], producer: str,
                     sequence: int) -> None:
        """What the de-duplication window promises: a repeat of a request accepted less
        than the window ago (before a restart too) publishes nothing and answers the first
        ids; other content under the same producer and sequence is refused."""
        first = self.produced.get((producer, sequence))
        if first is not None and \
                self.clock.wall_ns() - first.at_ns > DEDUPE_WINDOW_S * 1_000_000_000:
            first = None    # out of the window: forgotten
        same = first is not None and (first.topic, first.bodies) == (topic, bodies)
        try:
            ids = self.broker.multi_publish(topic, bodies, producer_id=producer,
                                            sequence=sequence)
        except ProducerConflict:
            assert first is not None and not same, f"{producer}/{sequence} refused as a conflict"
            self.end_of_pass()
            return
        except StorageFailed:
            assert self.store.failed and not same, "a publish refused while the data path syncs"
            self.topic_model(topic)
            self.end_of_pass()
            return
        if same:
            assert ids == first.ids, f"a repeat of {producer}/{sequence} published again"
            event("a repeated publish was dropped")
        else:
            assert first is None, f"{producer}/{sequence} with other content was published"
            t = self.topic_model(topic)
            self.published(t, ids, bodies, 0, t.ttl_ms)
            self.produced[(producer, sequence)] = Produced(topic, bodies, ids,
                                                           self.clock.wall_ns())
        self.end_of_pass()

    def topic_gone(self, name: str) -> None:
        """A topic was deleted: what its producers published is forgotten."""
        for produced in (self.produced, self.synced_produced):
            for key in [k for k, e in produced.items() if e.topic == name]:
                del produced[key]
        for lease_id in [i for i, lease in self.leases.items() if lease.key[0] == name]:
            del self.leases[lease_id]

    # -- leases ----------------------------------------------------------------
    @rule(topic=st.sampled_from(LEASE_TOPICS), count=st.integers(1, 6))
    def take_a_batch(self, topic: str, count: int) -> None:
        """A planner leases up to ``count`` ready messages of the channel."""
        c = self.channel_model(topic, LEASED)
        lease, _ = self.broker.reserve(self.session, topic, LEASED, count,
                                       int(MSG_TIMEOUT * 1000))
        self.end_of_pass()
        if lease is None:
            return
        now = self.clock.monotonic()
        model = LeaseModel((topic, LEASED), [m.id for m in lease.order], {}, [],
                           deadline=now + MSG_TIMEOUT)
        model.made_ids = list(model.ids)
        for msg in lease.order:
            p = c.pending.get(msg.id)
            assert p is not None, f"{msg.id} leased but not pending in {topic}/{LEASED}"
            assert not p.in_flight and p.until is None, f"{msg.id} leased but not ready"
            assert not self.expired(p), f"{msg.id} leased past its ttl"
            p.in_flight, p.lease, p.deadline = True, lease.lease_id, now + MSG_TIMEOUT
            p.attempts = min(p.attempts + 1, 65535)
            assert (msg.attempts, msg.body) == (p.attempts, p.body)
            model.first[msg.id] = p.attempts
        self.leases[lease.lease_id] = model
        self.past_leases.append(lease.lease_id)

    def _lease(self, data, held_only: bool = False) -> str | None:
        """A lease held or remembered (or, now and then, one long gone): one draw."""
        pick = data.draw(st.integers(0, 2**16 - 1))
        ids = [i for i, lease in self.leases.items() if lease.held or not held_only]
        if not held_only and pick % 5 == 4 and self.past_leases:
            ids = self.past_leases
        return ids[pick % len(ids)] if ids else None

    def taken_back(self, lease_id: str) -> list[str]:
        """What a commit or a replay of ``lease_id`` holds: what it holds now, or, given
        back, those of its messages that still wait in the channel, in its order."""
        lease = self.leases.get(lease_id)
        if lease is None:
            return []
        t = self.model.get(lease.key[0])
        c = t.channels.get(lease.key[1]) if t is not None else None
        if c is None:
            del self.leases[lease_id]
            return []
        if lease.held:
            held = [i for i in lease.ids if i in c.pending and c.pending[i].lease == lease_id]
            if held:
                return held
            lease.held = False      # emptied out of its hands
        for p in c.pending.values():
            if p.claim == lease_id:
                p.claim = None
        del self.leases[lease_id]
        if c.paused:
            return []
        waiting = [i for i in lease.ids if i in c.pending and not c.pending[i].in_flight
                   and c.pending[i].until is None]
        for msg_id in [i for i in waiting if self.expired(c.pending[i])]:
            del c.pending[msg_id]   # leaves on the way
        taken = [i for i in waiting if i in c.pending]
        if taken:
            now = self.clock.monotonic()
            for msg_id in taken:
                p = c.pending[msg_id]
                p.in_flight, p.lease, p.deadline = True, lease_id, now + MSG_TIMEOUT
                p.attempts = min(p.attempts + 1, 65535)
            lease.ids, lease.held, lease.deadline = taken, True, now + MSG_TIMEOUT
            self.leases[lease_id] = lease
        return taken

    @precondition(lambda self: self.past_leases)
    @rule(data=st.data())
    def commit_a_batch(self, data) -> None:
        """The planner FINs a lease (its batch is committed): what it holds, or what of
        it waits in the channel since it was given back, is gone for good."""
        lease_id = self._lease(data)
        if lease_id is not None:
            self.commit(lease_id)

    def commit(self, lease_id: str) -> None:
        key = self.leases[lease_id].key if lease_id in self.leases else None
        expected = self.taken_back(lease_id)
        count, missing = self.broker.finish_leases([lease_id])
        assert (count, missing) == (len(expected), [] if expected else [lease_id]), lease_id
        if expected:
            c = self.model[key[0]].channels[key[1]]
            for msg_id in expected:
                del c.pending[msg_id]
            del self.leases[lease_id]
        self.end_of_pass()

    @precondition(lambda self: any(lease.held for lease in self.leases.values()))
    @rule(data=st.data())
    def give_back_a_batch(self, data) -> None:
        """The planner requeues a lease (its batch failed): its messages wait at the front
        of the channel, remembered as the lease's for a replay."""
        lease_id = self._lease(data, held_only=True)
        lease = self.leases[lease_id]
        c = self.model[lease.key[0]].channels[lease.key[1]]
        held = [i for i in lease.ids if i in c.pending and c.pending[i].lease == lease_id]
        count, missing = self.broker.requeue_leases([lease_id])
        assert (count, missing) == (len(held), [] if held else [lease_id]), lease_id
        self.given_back(lease_id)
        self.end_of_pass()

    def given_back(self, lease_id: str) -> None:
        lease = self.leases[lease_id]
        lease.held = False
        c = self.model[lease.key[0]].channels[lease.key[1]]
        for msg_id in lease.ids:
            p = c.pending.get(msg_id)
            if p is not None and p.lease == lease_id:
                p.in_flight, p.lease, p.claim = False, None, lease_id
        self.forget_unclaimed_leases()

    @precondition(lambda self: any(lease.held for lease in self.leases.values()))
    @rule(data=st.data())
    def touch_a_batch(self, data) -> None:
        lease_id = self._lease(data, held_only=True)
        lease = self.leases[lease_id]
        c = self.model[lease.key[0]].channels[lease.key[1]]
        held = [i for i in lease.ids if i in c.pending and c.pending[i].lease == lease_id]
        count, missing = self.broker.touch_leases([lease_id])
        assert (count, missing) == (len(held), [] if held else [lease_id]), lease_id
        lease.deadline = self.clock.monotonic() + MSG_TIMEOUT
        for msg_id in held:
            c.pending[msg_id].deadline = lease.deadline
        if not held:
            self.given_back(lease_id)
        self.end_of_pass()

    @precondition(lambda self: self.past_leases)
    @rule(data=st.data())
    def replay_a_batch(self, data) -> None:
        """A planner replays a batch: it adopts the lease, which takes back exactly those
        of its messages still waiting in the channel (before or after a restart), in the
        same order, each with the attempts it had when the lease first held it."""
        lease_id = self._lease(data)
        if lease_id is not None:
            self.replay(lease_id)

    def replay(self, lease_id: str) -> None:
        expected = self.taken_back(lease_id)
        count, missing = self.broker.adopt_leases(self.session, [lease_id])
        assert (count, missing) == (len(expected), [] if expected else [lease_id]), lease_id
        if expected:
            lease = self.broker._leases[lease_id]
            first = self.leases[lease_id].first
            order = [m.id for m in lease.order]
            assert order == expected, f"lease {lease_id} took back {order}, not {expected}"
            attempts = lease.attempts_of(lease.order) or [m.attempts for m in lease.order]
            assert attempts == [first[i] for i in order], lease_id
            # The journal has it again, last, with what it took back: after a restart it
            # claims those, and a lease that held one of the others in between keeps it.
            self.leases[lease_id].made_ids = list(order)
            event("a lease replayed")
        self.end_of_pass()

    def a_batch_failed_or_not(self, topic: str, count: int, give_back: bool) -> str | None:
        """A batch leased from ``topic`` (None if nothing was ready), given back if
        ``give_back`` (its batch failed)."""
        made = len(self.past_leases)
        self.take_a_batch(topic, count)
        if len(self.past_leases) == made:
            return None
        lease_id = self.past_leases[-1]
        if give_back:
            self.broker.requeue_leases([lease_id])
            self.given_back(lease_id)
            self.end_of_pass()
        return lease_id

    @rule(topic=st.sampled_from(LEASE_TOPICS), count=st.integers(2, 6),
          give_back=st.booleans())
    def a_batch_replayed_after_a_crash(self, topic: str, count: int, give_back: bool) -> None:
        """A batch is leased (and failed: given back, or not), the broker is killed, and
        the planner replays the batch on the restarted broker: it reads the same messages."""
        lease_id = self.a_batch_failed_or_not(topic, count, give_back)
        if lease_id is None:
            return
        self.stop()
        self.start()
        self.restarted(self.model)
        self.replay(lease_id)

    @rule(topic=st.sampled_from(LEASE_TOPICS), count=st.integers(1, 6),
          give_back=st.booleans(), synced=st.booleans())
    def a_batch_replayed_after_a_power_loss(self, topic: str, count: int, give_back: bool,
                                            synced: bool) -> None:
        """A batch is leased (and failed, or not), the data path is synced (or not), the
        power goes, and the planner replays the batch: after a sync it reads the same rows;
        without one the lease is not remembered (nor are its deliveries), and the replay
        finds nothing."""
        lease_id = self.a_batch_failed_or_not(topic, count, give_back)
        if lease_id is None:
            return
        if synced:
            self.sync()
        self.power_loss()
        assert (lease_id in self.leases) == synced, lease_id
        self.replay(lease_id)

    def forget_unclaimed_leases(self) -> None:
        """A lease given back is remembered while one of its messages waits in the channel
        claimed by it (given back by no lease since)."""
        claimed = {p.claim for t in self.model.values() for c in t.channels.values()
                   for p in c.pending.values()}
        for lease_id in [i for i, lease in self.leases.items()
                         if not lease.held and i not in claimed]:
            del self.leases[lease_id]

    def leases_as_restarted(self) -> None:
        """After a restart every lease not FINed and not forgotten is remembered (the lease
        journal), as made: claiming its messages that wait in the channel, the latest made
        last."""
        for lease_id, lease in list(self.leases.items()):
            t = self.model.get(lease.key[0])
            c = t.channels.get(lease.key[1]) if t is not None else None
            if c is None:
                del self.leases[lease_id]
                continue
            lease.held, lease.ids = False, list(lease.made_ids)
            for msg_id in lease.ids:
                p = c.pending.get(msg_id)
                if p is not None and p.until is None:
                    p.claim = lease_id
        self.forget_unclaimed_leases()

    @precondition(lambda self: any(set(m.channels) - {LEASED} for m in self.model.values()))
    @rule(data=st.data(), rdy=st.integers(0, 5))
    def set_rdy(self, data, rdy: int) -> None:
        pairs = sorted((t, c) for t, m in self.model.items() for c in m.channels if c != LEASED)
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
        for lease_id, lease in list(self.leases.items()):
            if lease.held and lease.deadline <= now:   # timed out: given back
                self.given_back(lease_id)
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
            # A lease that held some of them holds nothing now, and nothing to take back.
            for lease_id in [i for i, lease in self.leases.items()
                             if lease.key == (topic, channel)]:
                del self.leases[lease_id]
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
        self.stop(crash)
        self.start()
        self.restarted(self.model)
        if not crash:
            self.synced = copy.deepcopy(self.model)
            self.synced_produced = copy.deepcopy(self.produced)

    @rule()
    def sync(self) -> None:
        """An fsync of the data path completes (every --sync-every or --sync-timeout)."""
        self.store.wait_synced()
        assert not self.store.failed
        self.synced = copy.deepcopy(self.model)
        self.synced_produced = copy.deepcopy(self.produced)
        self.synced_leases = copy.deepcopy(self.leases)

    @rule()
    def power_loss(self) -> None:
        """The machine loses power: each file keeps what was fsynced. What the README
        promises: the broker starts, and its state is exactly the model's at the last
        completed sync (each acknowledged message pending then, with its attempts and
        deferral, is back; nothing FINed or emptied before it returns; nothing published
        after it is there). A topic deleted since stays deleted (a rename, which this
        file system keeps), and one created since is there, empty."""
        event(f"power loss after {self.counter} published")
        self.stop()
        self.files.power_loss(self._tmp.name)
        self.start()
        model = copy.deepcopy(self.synced)
        for name, t in self.model.items():
            if name not in model and not t.ephemeral:
                model[name] = TopicModel(ephemeral=False)
        self.produced = copy.deepcopy(self.synced_produced)
        # The leases as the journal's last fsync left them (with the logs' last sync, or
        # the last start): one made since is not remembered, one ended since (its FIN
        # lost with the log's tail) is.
        self.leases = copy.deepcopy(self.synced_leases)
        self.restarted(model)
        if self.leases:
            event("a lease remembered across a power loss")
        self.synced = copy.deepcopy(self.model)
        self.synced_produced = copy.deepcopy(self.produced)

    @rule(data=st.data(), op=st.sampled_from(["publish", "create", "delete", "pause",
                                              "empty", "delete_topic", "produce", "lease",
                                              "commit", "give_back"]))
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
        elif op == "produce":
            self.publish_as_a_producer(data.draw(st.sampled_from(TOPICS)),
                                       data.draw(st.sampled_from(PRODUCERS)),
                                       data.draw(st.integers(0, 2)), data.draw(st.integers(1, 2)))
        elif op == "lease":
            self.take_a_batch(data.draw(st.sampled_from(LEASE_TOPICS)), data.draw(st.integers(1, 6)))
        elif op == "commit" and self.past_leases:
            self.commit_a_batch(data)
        elif op == "give_back" and any(lease.held for lease in self.leases.values()):
            self.give_back_a_batch(data)
        for key, count in received.items():   # deliveries of this pass: not counted
            if key in self.consumers:
                c = self.model[key[0]].channels[key[1]]
                for msg in self.consumers[key].received[count:]:
                    if msg.id in c.pending:
                        c.pending[msg.id].attempts -= 1
        event(f"killed right after {op}")
        self.stop()
        self.start()
        self.restarted(self.model)

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
        self.stop()
        candidates = []
        for path in sorted(Path(self._tmp.name).rglob("*.log")):
            for r in records.scan_file(path.read_bytes(), str(path)):
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
        self.restarted(self.model)

    @rule(topic=st.sampled_from(TOPICS), nest=st.integers(0, 2), pad=st.integers(0, 9))
    def publish_crafted(self, topic: str, nest: int, pad: int) -> None:
        """A body that is itself log records, as a publisher may craft them (it knows no
        key): the EMPTY and DELETE of every channel, a STATE naming none, a FIN and a PUB,
        nested ``nest`` deep in PUBs, after ``pad`` bytes."""
        inner = b"".join(records.empty(c) + records.channel_op(records.DELETE, c)
                         + records.fins(c, [1])[0] for c in CHANNELS)
        inner += records.state(False, {}) + records.empty("")
        for level in range(nest):
            inner = records.pub(level + 1, 1, 0, False, inner)
        self.counter += 1
        body = b"\x00" * pad + inner
        t = self.topic_model(topic)
        try:
            msg_id = self.broker.publish(topic, body)
        except StorageFailed:
            assert self.store.failed, "a publish refused while the data path syncs"
            self.end_of_pass()
            return
        self.published(t, [msg_id], [body])
        self.crafted.add(msg_id)
        self.end_of_pass()

    @rule(data=st.data(), field=st.sampled_from([2, 3, 6, 8, 10]))
    def killed_with_a_crafted_message_damaged(self, data, field: int) -> None:
        """The broker is killed and one bit of a crafted message's record header is
        flipped (its type, length or check): the start loses that message and nothing
        else, in no channel; the records inside its body are never read as records."""
        self.stop()
        found: dict[str, list[tuple[Path, int]]] = {}
        for path in sorted(Path(self._tmp.name).rglob("*.log")):
            for r in records.scan_file(path.read_bytes(), str(path)):
                if r.kind in (records.PUB, records.MOVE):
                    found.setdefault(bytes(r.payload[:8]).hex(), []).append((path, r.offset))
        leased = {i for lease in self.leases.values() for i in lease.ids}
        candidates = sorted(
            (msg_id, where[0]) for msg_id, where in found.items()
            if msg_id in self.crafted and len(where) == 1 and msg_id not in leased
            and any(msg_id in p for p in self.pendings_of(msg_id)))
        if candidates:
            msg_id, (path, offset) = data.draw(st.sampled_from(candidates))
            raw = bytearray(path.read_bytes())
            raw[offset + field] ^= 0x04
            path.write_bytes(bytes(raw))
            for model in (self.model, self.synced):
                for t in model.values():
                    t.held.pop(msg_id, None)
                    for c in t.channels.values():
                        c.pending.pop(msg_id, None)
            event("damaged the header of a crafted message")
        self.start()
        self.restarted(self.model)

    def pendings_of(self, msg_id: str) -> list[dict]:
        out = []
        for t in self.model.values():
            if not t.ephemeral:
                out += [t.held, *(c.pending for c in t.channels.values() if not c.ephemeral)]
        return out

    @precondition(lambda self: "b" not in self.model or len(self.model["b"].channels) < 8)
    @rule()
    def a_topic_with_many_durable_channels(self) -> None:
        """More durable channels than a 64-bit mask has bits (and than 63, a limit
        recovery once had)."""
        for i in range(MANY_CHANNELS):
            self.create_channel("b", f"c{i:02d}")
        event("a topic with many durable channels")

    def restarted(self, model: dict[str, TopicModel]) -> None:
        """The model after a start: ``model`` as restarted, what expired meanwhile gone,
        the leases remembered, and the broker checked against it."""
        self.model = self.as_restarted(model)
        for key in [k for k, e in self.produced.items() if not durable(e.topic)]:
            del self.produced[key]
        self.leases_as_restarted()
        self.forget_what_expired()
        self.check_everything_pending()
        # The start rewrote the journal with the leases it kept, and fsynced it.
        self.synced_leases = copy.deepcopy(self.leases)

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
                p.in_flight, p.lease, p.claim = False, None, None
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
    def check_the_leases(self) -> None:
        """The leases the broker holds, and those it remembers for a replay, are the
        model's."""
        held = {i for i, lease in self.broker._leases.items()
                if lease.in_flight and not lease.channel.deleted}
        remembered = {i for i, old in self.broker._requeued.items() if not old.channel.deleted}
        assert held == {i for i, lease in self.leases.items() if lease.held}, "held"
        expected = {i for i, lease in self.leases.items() if not lease.held}
        assert remembered == expected, f"remembered: {remembered} but {expected}"

    @invariant()
    def check_everything_pending(self) -> None:
        assert set(self.broker.topics) == set(self.model)
        # --max-channels' count: every channel made, dropped or restored is counted once.
        assert self.broker.channel_count == sum(len(t.channels) for t in self.model.values())
        for name, t in self.model.items():
            topic = self.broker.topics[name]
            assert topic.paused == t.paused
            assert topic.ttl_ms == t.ttl_ms, name
            assert set(topic.channels) == set(t.channels)
            held = self.pending_in_broker(topic._held, topic._held_later, [], name)
            # What is past its ttl may have left; nothing else may.
            gone = {i for i, p in t.held.items() if self.expired(p)}
            assert set(t.held) - gone <= set(held) <= set(t.held), f"held in {name}"
            for msg_id, p in t.held.items():
                if p.until is not None and msg_id in held:
                    assert held[msg_id][1] == pytest.approx(p.until, abs=1e-3)
            for cname, c in t.channels.items():
                channel = topic.channels[cname]
                assert channel.paused == c.paused
                got = self.pending_in_broker(channel._ready, channel._deferred,
                                             channel._in_flight.live(), name)
                gone = {i for i, p in c.pending.items() if self.expired(p) and not p.in_flight}
                assert set(c.pending) - gone <= set(got) <= set(c.pending), \
                    f"pending in {name}/{cname}"
                for msg_id, p in c.pending.items():
                    if msg_id not in got:
                        continue
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
