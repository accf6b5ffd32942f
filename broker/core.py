"""The broker's core: topics, channels, consumers and leases, and nothing of any wire.

One asyncio event loop owns an instance; every method is synchronous and quick,
so no locks are needed. The servers translate requests into these calls and
call ``tick`` often (see ``TICK_INTERVAL``) so that timed-out and deferred
messages move within a bounded lag of their deadline.
"""

from __future__ import annotations

import logging
import secrets
import time
from itertools import repeat
from typing import TYPE_CHECKING, Callable, Iterable, Sequence

from . import deadletter
from .channel import Channel
from .clock import Clock
from .consumer import Consumer
from .dedupe import Deduplicator, content_digest
from .errors import (InvalidMessage, InvalidRequest, LeaseNotFound, MessageTooBig,
                     StorageFailed, TooManyChannels, TooManyTopics, TopicNotFound,
                     WrongBroker)
from .lease import (RESERVE_STEP_BYTES, Lease, LeaseJournal, LeaseSession, RememberedLease,
                    Reservation)
from .message import IdFactory, Message, Published
from .names import check_channel_name, check_topic_name, is_ephemeral
from .options import Options
from .stats import TopicStats
from .storage.store import MemoryStore
from .topic import Topic

if TYPE_CHECKING:
    from .storage.store import DiskStore, Store

# A listener hears of topics and channels appearing and going away:
# ``listener(event, topic, channel)`` with event one of "topic_created",
# "topic_deleted", "channel_created", "channel_deleted" (channel is None for
# topic events). It runs on the core's loop and must be quick and not raise.
Listener = Callable[[str, str, "str | None"], None]

log = logging.getLogger("pynsqd")

# Seconds between ticks: the most a timeout or a deferred message can lag.
TICK_INTERVAL = 0.01
# FINed leases' messages freed per tick: a million freed at once would hold the loop,
# and the FIN's answer, for tens of milliseconds.
FREED_PER_TICK = 100_000


class Broker:
    def __init__(self, options: Options | None = None, clock: Clock | None = None) -> None:
        self.options = options or Options()
        self.clock = clock or Clock()
        self.topics: dict[str, Topic] = {}
        # Channels of every topic, kept by Topic as it makes and drops them (--max-channels).
        self.channel_count = 0
        # Message ids: this broker's node id in each (BrokerApp settles the default's
        # port once gRPC is bound), a sequence from the wall clock.
        self.new_id = IdFactory(self.options.node_id_for(self.options.grpc_address),
                                start=self.clock.wall_ns() // 1000)
        self.start_time = int(time.time())
        # Names this instance (it changes on restart): a lease made elsewhere is not here.
        self.instance_id = secrets.token_hex(8)
        # Names this broker across restarts and moves (``identity.py``): a durable broker's
        # comes from its data path (BrokerApp), a memory-only one's is its instance's.
        self.identity = f"n{self.new_id.node_id}-{self.instance_id}"
        # pynsqd --workers: each worker's own addresses ({"grpc", "tcp", "http"}), in
        # worker order, shown by /info and the gRPC Info call; empty for a single broker.
        self.workers: tuple[dict[str, str], ...] = ()
        self._sessions: dict[str, LeaseSession] = {}
        self._leases: dict[str, Lease] = {}
        # Leases requeued or timed out, by their messages' ids, for a replay to adopt.
        # Each is kept while one of its messages waits in its channel (LeaseClaims).
        self._requeued: dict[str, RememberedLease] = {}
        self._finished: list[list[Message]] = []  # FINed leases' messages, freed by tick
        # With --data-path: the leases written down, so they outlive a restart (BrokerApp).
        self.lease_journal: LeaseJournal | None = None
        self.dedupe = Deduplicator(self.options.dedupe_window / 1000,
                                   self.options.dedupe_capacity, clock=self.clock)
        # Where durable topics live: memory only, or a DiskStore (BrokerApp sets it
        # when --data-path is given, before any topic exists).
        self.storage: "Store" = MemoryStore(self.options.max_memory_bytes)
        # Channels with in-flight or deferred messages: all that a tick looks at.
        self.timed_channels: set[Channel] = set()
        self.listeners: list[Listener] = []  # e.g. the nsqlookupd registration
        # True while a durable start rebuilds topics and channels from its data path: the
        # log says they are restored (an operator reading "created" at a restart would
        # think data was lost); listeners hear them made all the same.
        self.restoring = False

    # -- publishing -------------------------------------------------------
    def publish(self, topic: str, body: bytes, *, defer_ms: int = 0, producer_id: str = "",
                sequence: int = 0, ttl_ms: int = 0) -> str:
        """PUB, or DPUB when ``defer_ms`` > 0. Returns the message id."""
        return self.multi_publish(topic, [body], defer_ms=[defer_ms], producer_id=producer_id,
                                  sequence=sequence, ttl_ms=[ttl_ms] if ttl_ms else ())[0]

    def multi_publish(self, topic: str, bodies: Iterable[bytes], *,
                      defer_ms: Sequence[int] = (), producer_id: str = "",
                      sequence: int = 0, ttl_ms: Sequence[int] = ()) -> list[str]:
        """MPUB: every body is checked before any is accepted.

        ``defer_ms`` is empty or gives each body its own defer; ``ttl_ms``
        likewise gives each its time to live (0 or empty: the topic's). With a
        ``producer_id``, a repeat of an accepted (producer_id, sequence) within
        the de-duplication window publishes nothing and returns the first ids if
        its topic, bodies, defers and ttls are the same, and raises
        ``ProducerConflict`` if they differ.
        """
        bodies = list(bodies)
        defers = list(defer_ms)
        ttls = list(ttl_ms)
        digest = b""
        if producer_id:
            digest = content_digest(topic, bodies, defers, ttls)
            ids = self.dedupe.seen(producer_id, sequence, digest)
            if ids is not None:
                return ids
        if not bodies:
            raise InvalidMessage("MPUB: no messages")
        size = self._check_bodies(bodies)
        if defers and len(defers) != len(bodies):
            raise InvalidRequest(f"{len(defers)} defers for {len(bodies)} messages: give one "
                                 f"per message or none")
        for d in defers:
            self.check_delay(d, "DPUB defer")
        if ttls and len(ttls) != len(bodies):
            raise InvalidRequest(f"{len(ttls)} ttls for {len(bodies)} messages: give one "
                                 f"per message or none")
        for ttl in ttls:
            deadletter.check_ttl_ms(ttl)
        t = self.get_or_create_topic(topic)
        now = self.clock.wall_ns()
        expires = None
        if ttls or t.ttl_ms:
            expires = [deadletter.expires_at(now, ttl or t.ttl_ms)
                       for ttl in ttls or repeat(0, len(bodies))]
        # The messages as columns: storage writes them so, and queues make Message
        # objects only of those they keep in memory.
        run = Published(self.new_id.many_raw(len(bodies)), bodies, now, expires, size=size)
        entry = (self.dedupe.entry(producer_id, sequence, run.ids[0], len(run), digest)
                 if producer_id else None)
        self.storage.published(t, run, defers, producer=entry.encode() if entry else None)
        if not any(defers):
            t.publish(run)
        else:
            for msg, d in zip(run.messages(), defers):
                t.publish_deferred([msg], d / 1000)
        if entry is not None:
            self.dedupe.remember(entry, t.name)
        return run.ids

    def _check_bodies(self, bodies: list[bytes]) -> int:
        """Their bytes, once each is known to be 1 to max-msg-size bytes."""
        limit = self.options.max_msg_size
        lengths = list(map(len, bodies))
        if min(lengths) and max(lengths) <= limit:  # (in C: the usual case)
            return sum(lengths)
        for i, body in enumerate(bodies):
            if not body:
                raise InvalidMessage(f"message {i}: empty body" if len(bodies) > 1 else "empty body")
            if len(body) > limit:
                where = f"message {i}: " if len(bodies) > 1 else ""
                raise MessageTooBig(f"{where}body of {len(body)} bytes is over the "
                                    f"max-msg-size of {limit} bytes")
        raise AssertionError("a body failed the check above")

    # -- limits: every server checks ranges through these ----------------
    def check_delay(self, delay_ms: float, what: str) -> None:
        """A DPUB defer or REQ delay must be 0 to ``max-req-timeout``."""
        limit = self.options.max_req_timeout
        if delay_ms < 0 or delay_ms > limit:
            raise InvalidRequest(f"{what} {delay_ms:.0f} ms out of range: must be 0 to "
                                 f"{limit} ms (max-req-timeout)")

    def clamp_delay(self, delay_ms: int) -> int:
        """NSQ's TCP REQ: a delay out of range is clamped into it, not refused."""
        return min(max(delay_ms, 0), self.options.max_req_timeout)

    def check_rdy(self, count: int) -> None:
        limit = self.options.max_rdy_count
        if count < 0 or count > limit:
            raise InvalidRequest(f"RDY {count} out of range: must be 0 to {limit} (max-rdy-count)")

    # -- consuming --------------------------------------------------------
    def msg_timeout(self, requested_ms: int = 0) -> float:
        """Seconds: the consumer's own timeout (at most max-msg-timeout) or the default."""
        opts = self.options
        if requested_ms < 0:
            raise InvalidRequest(f"msg_timeout {requested_ms} ms must not be negative")
        if requested_ms > opts.max_msg_timeout:
            raise InvalidRequest(f"msg_timeout {requested_ms} ms is over the max-msg-timeout "
                                 f"of {opts.max_msg_timeout} ms")
        return (requested_ms or opts.msg_timeout) / 1000

    def subscribe(self, consumer: Consumer, topic: str, channel: str) -> Channel:
        check_topic_name(topic)
        check_channel_name(channel)
        ch = self._get_or_create_channel(topic, channel)
        ch.add_consumer(consumer)
        return ch

    # -- leases -----------------------------------------------------------
    def open_lease_session(self, client_id: str = "", session_id: str = "",
                           grace_ms: int = 0, owner: str = "") -> LeaseSession:
        """A new lease session, or ``session_id`` resumed if it is detached and within
        its grace period (``session.resumed`` says which).

        ``grace_ms``: how long the session keeps its leases once its stream drops;
        0 means the broker's msg-timeout; capped by max-msg-timeout. ``owner``: who
        opened it (the servers' auth principal), kept on each lease it makes.
        """
        old = self._sessions.get(session_id) if session_id else None
        if old is not None:
            old.detached_at = None
            old.resumed = True
            old.stream += 1
            return old
        grace = min(grace_ms or self.options.msg_timeout, self.options.max_msg_timeout) / 1000
        session = LeaseSession(client_id, grace, owner)
        self._sessions[session.session_id] = session
        return session

    def session_owner(self, session_id: str) -> str | None:
        """The owner of a lease session, or None when there is no such session."""
        session = self._sessions.get(session_id)
        return session.owner if session is not None else None

    def lease_scope(self, lease_id: str) -> tuple[str, str, str] | None:
        """(owner, topic, channel) of a lease held or remembered, else None."""
        lease = self._leases.get(lease_id)
        if lease is not None and lease.channel is not None:
            return lease.owner, lease.channel.topic.name, lease.channel.name
        old = self._requeued.get(lease_id)
        if old is not None:
            return old.owner, old.channel.topic.name, old.channel.name
        return None

    def detach_lease_session(self, session_id: str, stream: int | None = None) -> None:
        """The session's stream dropped: keep its leases for its grace period.

        ``stream``: which of its streams dropped; a stream replaced by a resume
        (the old one may end late, say behind a black-holing proxy) detaches nothing.
        """
        session = self._sessions.get(session_id)
        if session is None or (stream is not None and stream != session.stream):
            return
        if session.grace <= 0:
            self.close_lease_session(session_id)
        else:
            session.detached_at = self.clock.monotonic()

    def close_lease_session(self, session_id: str) -> None:
        """End a session now: requeue its leases, remembered for adoption."""
        session = self._sessions.pop(session_id, None)
        if session is None:
            return
        leases = list(session.leases.values())
        if leases:
            log.info("lease session %s ended: requeueing %d lease(s)", session.client_id,
                     len(leases))
            self.requeue_leases([lease.lease_id for lease in leases])

    def reserve(self, session_id: str, topic: str, channel: str, max_messages: int,
                msg_timeout_ms: int = 0, max_bytes: int = 0) -> tuple[Lease | None, int]:
        """Take up to ``max_messages`` ready messages (and, if ``max_bytes`` > 0, no more
        body bytes than that, but at least one message) into a new lease, in one go.

        Returns (lease or None when nothing was ready, depth left behind). A server
        reserves with ``begin_reserve`` and ``reserve_step`` instead, yielding between steps.
        """
        reservation = self.begin_reserve(session_id, topic, channel, max_messages,
                                         msg_timeout_ms, max_bytes)
        while self.reserve_step(reservation):
            pass
        return self.reserve_result(reservation)

    def begin_reserve(self, session_id: str, topic: str, channel: str, max_messages: int,
                      msg_timeout_ms: int = 0, max_bytes: int = 0,
                      finish: Iterable[str] = ()) -> Reservation:
        """Check a reserve and take its first step (see ``reserve``); ``reserve_step``
        takes the next ones, each bounded, and ``reserve_result`` gives what it made.
        Between steps the loop serves others: the lease is registered with its session
        from the first step on, so a session that ends meanwhile requeues it.

        ``finish``: leases to FIN first, as ``finish_leases`` does (its answer is the
        reservation's ``finished``), once the reserve is known valid and before any
        message is taken: what of them was requeued and waits is not leased again."""
        session = self._sessions.get(session_id)
        if session is None:
            raise LeaseNotFound(f"lease session {session_id!r} does not exist (it ended)")
        if max_messages <= 0:
            raise InvalidRequest(f"max_messages {max_messages} must be positive")
        if max_bytes < 0:
            raise InvalidRequest(f"max_bytes {max_bytes} must not be negative")
        check_topic_name(topic)
        check_channel_name(channel)
        ch = self._get_or_create_channel(topic, channel)
        finished = self.finish_leases(finish) if finish else (0, [])
        lease = Lease(session, msg_timeout=self.msg_timeout(msg_timeout_ms))
        lease.channel = ch
        reservation = Reservation(lease, ch, max_messages, max_bytes,
                                  max(RESERVE_STEP_BYTES, self.options.max_msg_size))
        reservation.finished = finished
        if reservation.step():
            session.leases[lease.lease_id] = lease
            self._leases[lease.lease_id] = lease
        return reservation

    def reserve_step(self, reservation: Reservation) -> bool:
        """Take the next step of ``reservation``; False once it is over (full, nothing
        more ready, or its lease ended meanwhile: session closed, channel deleted)."""
        if reservation.done:
            return False
        lease = reservation.lease
        if self._leases.get(lease.lease_id) is not lease or reservation.channel.deleted:
            reservation.done = True
            return False
        reservation.step()
        return not reservation.done

    def reserve_result(self, reservation: Reservation) -> tuple[Lease | None, int]:
        """(the lease, or None when nothing was ready; the depth left behind)."""
        lease = reservation.lease
        if not lease.order:
            return None, reservation.channel.depth
        if self._leases.get(lease.lease_id) is not lease:
            raise LeaseNotFound(f"lease session {lease.session.session_id!r} ended while its "
                                f"reserve was in progress: the messages taken are requeued")
        if self._journaled(reservation.channel):
            # Written before the answer: the deliveries (attempts), then the lease itself.
            self.storage.flush()
            try:
                self.lease_journal.made(lease)
            except StorageFailed:
                # Not written, so not made: its messages go back as they came.
                reservation.channel.release(lease)
                self._forget_lease(lease.lease_id)
                lease.let_go()
                raise
        return lease, reservation.channel.depth

    def _journaled(self, channel: Channel) -> bool:
        return (self.lease_journal is not None and not is_ephemeral(channel.topic.name)
                and not channel.ephemeral)

    def recover(self, storage: "DiskStore", journal: LeaseJournal) -> int:
        """A durable broker's start: its topics from ``storage``, with the messages of the
        leases ``journal`` kept waiting in memory (a replay takes every one back), then
        those leases. Returns how many leases were kept."""
        leases = journal.load()
        storage.recover(leased=LeaseJournal.leased_ids(leases))
        return self.restore_leases(journal, leases)

    def restore_leases(self, journal: LeaseJournal, leases: "list[tuple] | None" = None) -> int:
        """At start (after storage recovery): remember every lease ``journal`` kept (or
        ``leases``, what it loaded), as if requeued, claiming those of its messages back
        in their channel; from now on leases are written to it. Returns how many leases
        were kept."""
        kept = []
        in_channel: dict[Channel, set[str]] = {}
        for lease_id, topic, channel, timeout, ids, attempts, owner in (
                journal.load() if leases is None else leases):
            t = self.topics.get(topic)
            ch = t.channels.get(channel) if t is not None else None
            if ch is None:
                continue
            if ch not in in_channel:
                in_channel[ch] = {m.id for m in ch.waiting()}
            here = [i for i in ids if i in in_channel[ch]]
            if not here:
                continue
            remembered = RememberedLease(ch, ids, timeout, attempts, lease_id, owner=owner)
            self._requeued[lease_id] = remembered
            ch.lease_claims.claim(remembered, here)
            kept.append(((lease_id, topic, channel, timeout, ids, attempts, owner), remembered))
        # A lease made later may claim every message an earlier one kept: the earlier one
        # is then forgotten (``forget_remembered``, while no journal is open to note it), so
        # the rewritten journal must not keep it either, or it outlives every later FIN and
        # a later start whose messages came back (a power loss took their FIN) remembers it.
        kept = [record for record, remembered in kept
                if self._requeued.get(record[0]) is remembered]
        journal.open(kept)
        self.lease_journal = journal
        if kept:
            log.info("lease journal: %d lease(s) kept across the restart, for a replay to "
                     "adopt or a commit to FIN", len(kept))
        return len(kept)

    def _journal_gone(self, lease_id: str) -> None:
        if self.lease_journal is not None:
            self.lease_journal.gone(lease_id, self._live_leases)

    def _live_leases(self) -> list:
        return [*self._leases.values(), *self._requeued.values()]

    def adopt_leases(self, session_id: str, lease_ids: Iterable[str]) -> tuple[int, list[str]]:
        """Make ``session_id`` the holder of leases planned by an earlier session.

        A live lease changes hands. A lease requeued (its session ended) or timed
        out takes back those of its messages still waiting in the channel, under
        the same id, so that a batch replayed after a restart reads what it read
        before. Returns (messages now held, leases with nothing to adopt).
        """
        session = self._sessions.get(session_id)
        if session is None:
            raise LeaseNotFound(f"lease session {session_id!r} does not exist (it ended)")
        count, missing = 0, []
        for lease_id in lease_ids:
            lease = self._held_or_reclaimed(lease_id)
            if lease is None:
                missing.append(lease_id)
                continue
            lease.session.leases.pop(lease_id, None)
            lease.session = session
            session.leases[lease_id] = lease
            count += len(lease.in_flight)
        return count, missing

    def _held_or_reclaimed(self, lease_id: str) -> Lease | None:
        """The lease if it still holds messages, else one rebuilt from what it is
        remembered to have held, with those of its messages still waiting."""
        lease = self._leases.get(lease_id)
        if lease is not None and lease.in_flight:
            return lease
        if lease is not None:  # every message timed out
            self._forget_lease(lease_id, remember=True)
        old = self._requeued.pop(lease_id, None)
        if old is None:
            return None
        old.channel.lease_claims.release(old)
        if old.channel.deleted:
            self._journal_gone(lease_id)
            return None
        session = lease.session if lease is not None else LeaseSession("adopted")
        lease = Lease(session, msg_timeout=old.msg_timeout)
        lease.lease_id = lease_id
        lease.owner = old.owner
        lease.channel = old.channel
        taken = old.channel.reclaim(lease, old.ids)
        if not taken:
            self._journal_gone(lease_id)
            return None
        # Keep the original order so each partition's slice stays what it was, and the
        # attempts it read then, so the replay's rows are the failed run's, every column.
        lease.order = taken
        lease.first_attempts = dict(zip(old.ids, old.attempts))
        self._leases[lease_id] = lease
        if self._journaled(lease.channel):
            # Written again, last, with what it took back: after a restart it claims those
            # messages over a lease that held them in between (the journal's order decides),
            # and leaves that lease the ones it did not take back.
            try:
                self.lease_journal.made(lease)
            except StorageFailed as err:
                log.error("%s; after a restart an earlier order of the leases applies", err)
        return lease

    def _remember(self, lease: Lease) -> None:
        if lease.channel is None or not lease.order or lease.channel.deleted:
            self._journal_gone(lease.lease_id)
            return
        remembered = lease.remembered()
        self._requeued[lease.lease_id] = remembered
        # It claims those of its messages back in the channel (not since taken by others).
        lease.channel.lease_claims.claim(
            remembered, [m.id for m in lease.order if m.consumer is None or m.consumer is lease])
        if not remembered.live:
            self.forget_remembered(remembered)

    def forget_remembered(self, remembered: RememberedLease) -> None:
        """None of ``remembered``'s messages waits in its channel any more."""
        if self._requeued.get(remembered.lease_id) is remembered:
            del self._requeued[remembered.lease_id]
            self._journal_gone(remembered.lease_id)

    def lease(self, lease_id: str, broker_id: str = "") -> Lease:
        held = self._leases.get(lease_id)
        if held is not None and held.in_flight:
            return held  # made here, or by an earlier instance and kept across its restart
        if broker_id and broker_id != self.instance_id:
            raise WrongBroker(f"lease {lease_id!r} was made by broker instance {broker_id}, "
                              f"but this is {self.instance_id} (another broker, or this one "
                              f"restarted): its messages are not here")
        lease = self._leases.get(lease_id)
        if lease is None or not lease.in_flight:
            self._forget_lease(lease_id, remember=True)
            raise LeaseNotFound(f"lease {lease_id!r} does not exist: it was finished, "
                                f"requeued, timed out, or its session ended")
        return lease

    def finish_leases(self, lease_ids: Iterable[str]) -> tuple[int, list[str]]:
        """FIN the leases; one requeued or timed out first takes back what of it still
        waits in the channel (its batch was committed: it must not be read again)."""
        count, missing = 0, []
        for lease_id in lease_ids:
            lease = self._held_or_reclaimed(lease_id)
            if lease is None:
                missing.append(lease_id)
                continue
            count += lease.channel.finish_all(lease)
            self._finished.append(lease.let_go())
            self._forget_lease(lease_id)
            self._journal_gone(lease_id)
        self.storage.flush()  # an acknowledged FIN is written before the answer
        return count, missing

    def requeue_leases(self, lease_ids: Iterable[str]) -> tuple[int, list[str]]:
        """REQ the leases, remembered by ids for a later adoption or FIN."""
        def requeue(channel: Channel, lease: Lease) -> int:
            count = len(lease.in_flight)
            channel.release(lease)
            return count

        return self._each_lease(lease_ids, requeue, drop=True)

    def touch_leases(self, lease_ids: Iterable[str]) -> tuple[int, list[str]]:
        return self._each_lease(lease_ids, Channel.touch_all, drop=False)

    def _each_lease(self, lease_ids: Iterable[str], action: Callable[[Channel, Lease], int],
                    drop: bool) -> tuple[int, list[str]]:
        """Apply ``action`` to each lease; unknown or emptied leases are reported missing."""
        count, missing = 0, []
        for lease_id in lease_ids:
            lease = self._leases.get(lease_id)
            if lease is None or lease.channel is None or lease.channel.deleted \
                    or not lease.in_flight:
                missing.append(lease_id)
                self._forget_lease(lease_id, remember=True)
                continue
            count += action(lease.channel, lease)
            if drop:
                self._forget_lease(lease_id, remember=True)
        return count, missing

    def lease_emptied(self, lease: Lease) -> None:
        """``lease``'s channel was emptied (or deleted) while it held messages: it is over
        at once (gone from the lease journal too), with nothing to take back."""
        lease.let_go()
        self._forget_lease(lease.lease_id, remember=True)

    def _forget_lease(self, lease_id: str, remember: bool = False) -> None:
        lease = self._leases.pop(lease_id, None)
        if lease is not None:
            lease.session.leases.pop(lease_id, None)
            if remember:
                self._remember(lease)

    def _tick_leases(self, now: float) -> None:
        for session in [s for s in self._sessions.values() if s.detached_at is not None]:
            if now - session.detached_at >= session.grace:
                self.close_lease_session(session.session_id)
        # A lease all of whose messages timed out holds nothing: remember its ids only.
        for lease_id in [i for i, lease in self._leases.items() if not lease.in_flight]:
            self._forget_lease(lease_id, remember=True)

    # -- admin ------------------------------------------------------------
    def topic(self, name: str) -> Topic:
        check_topic_name(name)
        try:
            return self.topics[name]
        except KeyError:
            raise TopicNotFound(f"topic {name} does not exist") from None

    def channel(self, topic: str, channel: str) -> Channel:
        check_channel_name(channel)
        return self.topic(topic).channel(channel)

    def get_or_create_topic(self, name: str, ttl_ms: int = 0, *, bounded: bool = True
                            ) -> Topic:
        """The topic ``name``, made if need be (with ``ttl_ms`` as its ttl, written with
        it: a topic made is made with its settings, or not at all).

        A client's topic is refused past ``--max-topics``; ``bounded=False`` is for the
        broker's own (a restart restoring what it accepted, a dead-letter topic), which
        must not fail for a count a client reached."""
        t = self.topics.get(name)
        if t is None:
            check_topic_name(name)
            most = self.options.max_topics
            if bounded and most and len(self.topics) >= most:
                raise TooManyTopics(f"topic {name} not made: the broker has {len(self.topics)} "
                                    f"topics, the most --max-topics allows (delete topics, or "
                                    f"raise --max-topics)")
            t = Topic(self, name)
            t.ttl_ms = ttl_ms
            self.storage.topic_created(t)
            self.topics[name] = t
            self._notify("topic_created", name, None)
        return t

    def create_topic(self, name: str, *, ttl_ms: int | None = None) -> Topic:
        """Create ``name`` if need be; a ``ttl_ms`` given sets the topic's default ttl."""
        check_topic_name(name)
        if ttl_ms is not None:
            deadletter.check_ttl_ms(ttl_ms)
        if name not in self.topics:
            return self.get_or_create_topic(name, ttl_ms or 0)
        t = self.topics[name]
        deadletter.configure_topic(t, ttl_ms)
        return t

    def _get_or_create_channel(self, topic: str, channel: str) -> Channel:
        """A client's channel, made if need be with its topic: one past ``--max-channels``
        is refused before its topic is made, so a refusal makes nothing."""
        t = self.topics.get(topic)
        if t is None:
            self.check_room_for_channel(topic, channel)
            t = self.get_or_create_topic(topic)
        return t.get_or_create_channel(channel)

    def check_room_for_channel(self, topic: str, channel: str) -> None:
        """Refuse one channel more than ``--max-channels`` over every topic."""
        most = self.options.max_channels
        if most and self.channel_count >= most:
            raise TooManyChannels(
                f"channel {topic}/{channel} not made: the broker has {self.channel_count} "
                f"channels over all its topics, the most --max-channels allows (delete "
                f"channels or topics, or raise --max-channels)")

    def create_channel(self, topic: str, channel: str, *, max_attempts: int | None = None,
                       dead_letter_topic: str = "") -> Channel:
        """Create the channel if need be; settings given (not None / "") are set."""
        check_channel_name(channel)
        check_topic_name(topic)
        deadletter.check_channel_settings(topic, max_attempts, dead_letter_topic)
        ch = self._get_or_create_channel(topic, channel)
        deadletter.configure_channel(ch, max_attempts, dead_letter_topic)
        return ch

    def delete_topic(self, name: str) -> None:
        t = self.topic(name)
        self.storage.topic_deleted(t)  # its files go first, or nothing changes
        del self.topics[name]
        t.close()
        self.dedupe.forget_topic(name)
        self._notify("topic_deleted", name, None)

    def delete_channel(self, topic: str, channel: str) -> None:
        check_channel_name(channel)
        self.topic(topic).delete_channel(channel)

    # -- time and stats ---------------------------------------------------
    def tick(self) -> None:
        now = self.clock.monotonic()
        for ch in list(self.timed_channels):
            if ch.deleted or not ch.tick(now):
                self.timed_channels.discard(ch)
        if self._leases or self._sessions:
            self._tick_leases(now)
        if self._finished:
            self._free_finished(FREED_PER_TICK)

    def _free_finished(self, budget: int) -> None:
        """Drop up to ``budget`` of the FINed leases' messages, the last FINed first."""
        finished = self._finished
        while finished and budget > 0:
            msgs = finished[-1]
            if len(msgs) > budget:
                del msgs[-budget:]
                return
            budget -= len(msgs)
            finished.pop()

    def stats(self, topic: str | None = None, channel: str | None = None) -> list[TopicStats]:
        self.storage.flush()  # every FIN counted in stats is written
        if topic:
            return [self.topic(topic).stats(channel or None)]
        return [t.stats() for _, t in sorted(self.topics.items())]

    # -- what the core's parts report ------------------------------------
    def on_channel_created(self, channel: Channel) -> None:
        self._notify("channel_created", channel.topic.name, channel.name)

    def on_channel_deleted(self, channel: Channel) -> None:
        # Its leases are over, in the lease journal too (nothing of them waits anywhere).
        for lease_id, lease in list(self._leases.items()):
            if lease.channel is channel:
                self._forget_lease(lease_id)
                self._journal_gone(lease_id)
        for lease_id, old in list(self._requeued.items()):
            if old.channel is channel:
                del self._requeued[lease_id]
                self._journal_gone(lease_id)
        self._notify("channel_deleted", channel.topic.name, channel.name)

    def _notify(self, event: str, topic: str, channel: str | None) -> None:
        # nsqd's INFO lines, one per change (never per message).
        what, _, how = event.partition("_")
        if self.restoring and how == "created":
            how = "restored"
        log.info("%s(%s): %s", what.upper(), f"{topic}/{channel}" if channel else topic, how)
        for listener in self.listeners:
            try:
                listener(event, topic, channel)
            except Exception:  # a listener's bug must not fail a publish or an admin call
                log.exception("listener failed on %s %s/%s", event, topic, channel)

    def on_consumer_evicted(self, consumer: Consumer) -> None:
        if consumer.on_evicted is not None:
            consumer.on_evicted()
