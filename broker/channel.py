"""A channel: one copy of a topic's stream, shared by its consumers.

Messages wait in ``_ready`` (in publish order), move in flight when handed to
a consumer (with a deadline), and leave on FIN. A deadline that passes, a REQ,
or the holder going away puts a message back; REQ with a delay parks it in the
deferred queue first. ``tick`` moves due in-flight and deferred messages and
touches only those that are due.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from bisect import bisect_right
from itertools import accumulate, chain, islice, repeat
from operator import attrgetter
from typing import TYPE_CHECKING, Iterable, Iterator, Sequence

from . import deadletter
from .backlog import Backlog, ReadLater
from .consumer import Consumer
from .deferred import Deferred
from .errors import NotInFlight
from .lease import LeaseClaims
from .message import MAX_ATTEMPTS, Message, Published
from .names import is_ephemeral
from .pqueue import DeadlineQueue
from .stats import ChannelStats, ClientStats, LatencySample

if TYPE_CHECKING:
    from .lease import Lease
    from .topic import Topic

_ID = attrgetter("id")
log = logging.getLogger("pynsqd")
# Messages a pass bounded by bytes takes off the ready queue at a time.
BYTES_CHUNK = 256
# Messages a consumer takes on its turn of the round-robin (fewer if its room or the
# messages run out). Two, not one: a consumer at RDY 2 (a thousand consumers sharing
# a few thousand in flight) then gets both in one write and FINs both in one read when
# messages are scarce, half the reads and writes of one at a time. Not its whole room:
# a burst would then go to one consumer at a high RDY while the others wait; in turns
# of two it is spread over at least half the consumers one at a time would reach.
# (``Channel._share``'s slices are written for two.)
TURN = 2


class Channel:
    def __init__(self, topic: "Topic", name: str) -> None:
        self.topic = topic
        self.name = name
        self.ephemeral = is_ephemeral(name)
        self.paused = False
        self.deleted = False
        self._broker = topic.broker
        # Requeued leases remembered by the messages of theirs still here (lease.py).
        self.lease_claims = LeaseClaims(topic.broker.forget_remembered)
        self._clock = topic.broker.clock
        self._store = topic.broker.storage
        # Past --mem-queue-size, a durable message waits on disk only.
        self._ready = Backlog(self._store.spill_limit, self._load, self._fetch, self._pump)
        self._in_flight = DeadlineQueue()
        self._deferred = Deferred(self._store.spill_limit)
        self._consumers: list[Consumer] = []
        # Each consumer's seat: the round-robin's order is the order they came in
        # (``_consumers``' order), and a seat never changes as others leave.
        self._seat: dict[Consumer, int] = {}
        self._seats = itertools.count()
        # Every consumer that may have room: a pass looks at these only, never at every
        # consumer (with thousands subscribed, a FIN gives room to one). A consumer leaves
        # when a pass finds it without room and comes back with whatever gives it room
        # (FIN, REQ, a timeout, RDY, unblocking).
        self._wanting: set[Consumer] = set()
        self._last_served = -1  # the seat of the consumer served last
        self.message_count = 0
        self.requeue_count = 0
        self.timeout_count = 0
        self.finish_count = 0
        self.latency = LatencySample()
        # Dead letters and expiry (see deadletter.py): None: the broker's --max-attempts.
        self.max_attempts: int | None = None
        self.dead_letter_topic = ""
        self.dead_letter_count = 0
        self.expired_count = 0
        self._retry: asyncio.TimerHandle | None = None   # the next read after a failed one

    # -- counts -----------------------------------------------------------
    @property
    def depth(self) -> int:
        return len(self._ready)

    @property
    def in_flight_count(self) -> int:
        return len(self._in_flight)

    @property
    def deferred_count(self) -> int:
        return len(self._deferred)

    @property
    def consumers(self) -> list[Consumer]:
        return list(self._consumers)

    # -- from the topic ---------------------------------------------------
    def _load(self, loc: int) -> Message | None:
        try:
            return self._store.load(self.topic, loc)
        except ReadLater as later:
            self._read_later(later.retry_in)
            raise

    def _read_later(self, delay: float) -> None:
        """A read from disk failed for now: pump again once the store's back-off ends
        (on the event loop's timer; without a running loop, at a tick)."""
        self._timers_started()
        if self._retry is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                return
            self._retry = loop.call_later(delay, self._retry_read)

    def _retry_read(self) -> None:
        self._retry = None
        if not self.deleted and self._ready.stalled:
            self._ready.stalled = False
            self._pump()

    def _fetch(self, locs, done, cached_only: bool = False) -> bool:
        return self._store.read_ahead(self.topic, locs, done, cached_only)

    def put_many(self, msgs: list[Message]) -> None:
        self.message_count += len(msgs)
        self._ready.extend(msgs)
        self._pump()

    def put_published(self, run: Published) -> None:
        """A publish's messages, in bulk (``Backlog.extend_published``)."""
        self.message_count += len(run)
        self._ready.extend_published(run)
        self._pump()

    def put_on_disk(self, locs: Sequence[int], attempts: Sequence[int] | None = None) -> None:
        """Queue messages that wait on disk only (from the topic's hold), with their
        delivery counts (None: all 0)."""
        before = len(self._ready)
        self._ready.extend_on_disk(locs, attempts)
        self.message_count += len(self._ready) - before
        self._pump()

    def restore(self, ready: list[Message], on_disk: Sequence[int],
                deferred: list[tuple[Message, float]],
                on_disk_attempts: Sequence[int] | None = None,
                deferred_on_disk: Iterable[tuple[int, int, float]] = (),
                front: list[Message] | None = None) -> None:
        """Queue messages recovered from disk: in memory, on disk only (with their
        delivery counts), and deferred (with the seconds they still wait), in memory
        and as (loc, attempts, seconds) on disk only; ``front``: ahead of the rest and
        in memory whatever the limit (a kept lease's, as a lease gives them back)."""
        self._ready.extend(ready)
        self._ready.extend_on_disk(on_disk, on_disk_attempts)
        now = self._clock.monotonic()
        for msg, delay in deferred:
            self._deferred.push(msg, now + delay)
        for loc, attempts, delay in deferred_on_disk:
            self._deferred.push_on_disk(loc, attempts, now + delay)
        if front:
            self._ready.push_front(front, keep=True)
        self._timers_started()

    def put_deferred_on_disk(self, loc: int, attempts: int, delay: float) -> None:
        """Defer a message that waits on disk only (from the topic's hold)."""
        self.message_count += 1
        self._deferred.push_on_disk(loc, attempts, self._clock.monotonic() + delay)
        self._timers_started()

    def put_deferred(self, msg: Message, delay: float) -> None:
        self.message_count += 1
        self._deferred.push(msg, self._clock.monotonic() + delay)
        self._timers_started()

    def _timers_started(self) -> None:
        """This channel has deadlines: the broker's tick must look at it."""
        self._broker.timed_channels.add(self)

    # -- consumers --------------------------------------------------------
    def add_consumer(self, consumer: Consumer) -> None:
        consumer.channel = self
        self._seat[consumer] = next(self._seats)
        self._consumers.append(consumer)
        self._wanting.add(consumer)
        self._pump()

    def remove_consumer(self, consumer: Consumer) -> None:
        """The consumer is gone: what it held goes back at once.

        nsqd lets such messages wait out their timeout; a consumer that has
        disconnected can never FIN them, so waiting only delays the pipeline.
        """
        if consumer in self._seat:
            self._consumers.remove(consumer)
            del self._seat[consumer]
            self._wanting.discard(consumer)
        self.release(consumer)
        if self.ephemeral and not self._consumers and not self.deleted:
            self.topic.delete_channel(self.name)

    def release(self, holder: Consumer) -> None:
        """Requeue everything ``holder`` has in flight, ahead of newer messages."""
        held = list(holder.in_flight.values())
        holder.in_flight.clear()
        for msg in held:
            self._in_flight.cancel(msg)
            msg.consumer = None
        self.requeue_count += len(held)
        self._ready.push_front(held, keep=holder.keeps_given_back)
        self._may_have_room(holder)
        self._pump()

    def wake(self, consumer: Consumer) -> None:
        """``consumer`` could not take messages (its transport was full) and now can."""
        self._may_have_room(consumer)
        self._pump()

    def _may_have_room(self, holder: Consumer) -> None:
        """``holder`` may have room now: the next pass looks at it (a consumer of this
        channel's round-robin; leases are not)."""
        if holder in self._seat:
            self._wanting.add(holder)

    def set_rdy(self, consumer: Consumer, count: int) -> None:
        self._broker.check_rdy(count)
        consumer.rdy = count
        self._may_have_room(consumer)
        self._pump()

    def take(self, holder: "Lease", limit: int, max_bytes: int = 0,
             at_least_one: bool = True) -> tuple[list[Message], int]:
        """Move up to ``limit`` ready messages in flight to ``holder`` at once; with
        ``max_bytes`` > 0, stop before their bodies pass it (taking one at least,
        unless ``at_least_one`` is False: a later step of a lease being filled).

        For holders outside the round-robin (leases): it ignores RDY and does not
        pump. Returns what it took, in order, and the size of their bodies.
        """
        if self.paused:
            return [], 0
        ready = self._ready
        taken: list[Message] = []
        size = 0
        now_ns = self._clock.wall_ns()
        while len(taken) < limit:
            # In bulk while they are in memory; one at a time from disk.
            msgs = ready.popleft_in_memory(limit - len(taken))
            if msgs:
                if not deadletter.all_deliverable(self, msgs, now_ns):
                    msgs = [m for m in msgs if not self._leaves(m, now_ns)]
            else:
                msg = self._next_ready(wait=False, now_ns=now_ns)
                if msg is None:
                    break
                msgs = [msg]
            lengths = [len(msg.body) for msg in msgs]
            more = sum(lengths)
            if max_bytes and size + more > max_bytes:
                # ends[i]: bytes taken before msgs[i]; keep those that end within max_bytes.
                ends = list(accumulate(lengths, initial=size))
                keep = max(0, bisect_right(ends, max_bytes) - 1)
                if not keep and not taken and at_least_one:
                    keep = 1
                ready.push_front(msgs[keep:])
                taken += msgs[:keep]
                size = ends[keep]
                break
            size += more
            taken += msgs
        self._hold_all(holder, taken)
        return taken, size

    def waiting(self) -> Iterator[Message]:
        """The ready messages held in memory (what ``reclaim`` can take back)."""
        return self._ready.messages()

    def reclaim(self, holder: "Lease", wanted: list[str]) -> list[Message]:
        """Take the messages with ids ``wanted`` back in flight to ``holder`` if they are
        still waiting in memory in this channel (not delivered elsewhere meanwhile); in
        ``wanted``'s order. Scans the ready queue once.
        """
        wanted_ids = set(wanted)
        if self.paused or not wanted_ids:
            return []
        found = self._ready.take_ids(wanted_ids)
        if not found:
            return []
        taken = [found[i] for i in wanted if i in found and not self._leaves(found[i])]
        self._hold_all(holder, taken)
        return taken

    def _hold_all(self, holder: "Lease", msgs: list[Message]) -> None:
        """Put ``msgs`` in flight to ``holder``, sharing one deadline."""
        for msg in msgs:
            # Message.delivered(), without a call per message (a lease takes thousands).
            if msg.attempts < MAX_ATTEMPTS:
                msg.attempts += 1
            msg.consumer = holder
        self._in_flight.push_many(msgs, self._clock.monotonic() + holder.msg_timeout)
        self._timers_started()
        holder.hold(msgs)
        holder.message_count += len(msgs)
        self._store.delivered(self, msgs)

    # -- FIN / REQ / TOUCH -----------------------------------------------
    def finish(self, consumer: Consumer, msg_id: str) -> None:
        self._held(consumer, msg_id, "FIN")
        self.finish_many(consumer, (msg_id,))

    def finish_many(self, consumer: Consumer, msg_ids: Iterable[str]) -> list[NotInFlight]:
        """FIN several messages, refilling the consumer once; returns the failures."""
        msg_ids = msg_ids if type(msg_ids) is list else list(msg_ids)
        finished = list(map(consumer.in_flight.pop, msg_ids, repeat(None)))
        failures = []
        ids: list[str] | None = msg_ids   # those of ``finished`` (keys they were held by)
        # (``all``: a Message is always true, and a truth test costs a tenth of the
        # comparison with None that ``None in`` makes of each)
        if not all(finished):  # some not held (a repeat of an id FINed above included)
            failures = [self._not_held(msg_id, "FIN")
                        for msg_id, msg in zip(msg_ids, finished) if msg is None]
            finished = [msg for msg in finished if msg is not None]
            ids = None
        self._finished(consumer, finished, ids)
        if consumer in self._seat:   # (``_may_have_room``, inline: at every FIN)
            self._wanting.add(consumer)
        if self._ready.count:   # (``_pump``'s first test, inline: most FINs find none ready)
            self._pump()
        return failures

    def _finished(self, holder: Consumer, msgs: list[Message],
                  ids: list[str] | None = None) -> None:
        """``msgs``, out of ``holder``'s hands, leave flight: counted, timed, told to the store
        (``ids``: their ids, in order, when the caller has them)."""
        self._in_flight.cancel_many(msgs)
        wall_ns = self._clock.wall_ns()
        # ``msg.consumer`` is left as it is: nothing reads it once a message is gone.
        self.latency.add_published(wall_ns, [msg.timestamp for msg in msgs])
        if self.lease_claims.by_id:
            self.lease_claims.left(map(_ID, msgs))
        holder.finish_count += len(msgs)
        self.finish_count += len(msgs)
        self._store.finished(self, msgs, ids)

    def finish_all(self, holder: "Lease") -> int:
        """FIN everything ``holder`` has in flight (a lease); returns how many."""
        held = holder.in_flight.pop_all()
        self._finished(holder, held)
        self._pump()
        return len(held)

    def touch_all(self, holder: Consumer) -> int:
        """TOUCH everything ``holder`` has in flight (a lease); returns how many."""
        held = list(holder.in_flight.values())
        self._in_flight.cancel_many(held)
        self._in_flight.push_many(held, self._clock.monotonic() + holder.msg_timeout)
        self._timers_started()
        return len(held)

    def requeue(self, consumer: Consumer, msg_id: str, delay: float = 0.0) -> None:
        self._broker.check_delay(delay * 1000, "REQ delay")
        msg = self._held(consumer, msg_id, "REQ")
        del consumer.in_flight[msg_id]
        self._in_flight.cancel(msg)
        msg.consumer = None
        consumer.requeue_count += 1
        self.requeue_count += 1
        self._may_have_room(consumer)
        if delay > 0:
            self._deferred.push(msg, self._clock.monotonic() + delay)
            self._timers_started()
            self._store.deferred(self, msg, delay)
        else:
            self._ready.append(msg)
        self._pump()

    def touch(self, consumer: Consumer, msg_id: str) -> None:
        msg = self._held(consumer, msg_id, "TOUCH")
        self._in_flight.cancel(msg)
        self._in_flight.push(msg, self._clock.monotonic() + consumer.msg_timeout)
        self._timers_started()

    def _held(self, consumer: Consumer, msg_id: str, command: str) -> Message:
        msg = consumer.in_flight.get(msg_id)
        if msg is None:
            raise self._not_held(msg_id, command)
        return msg

    def _not_held(self, msg_id: str, command: str) -> NotInFlight:
        return NotInFlight(command, msg_id,
                           f"{command} {msg_id}: message not in flight for this consumer "
                           f"on channel {self.topic.name}/{self.name}")

    # -- time -------------------------------------------------------------
    def tick(self, now: float) -> bool:
        """Requeue timed-out messages; release deferred messages that are due.
        Returns whether deadlines remain."""
        timed_out = list(self._in_flight.pop_due(now))
        kept: list[Message] = []    # a lease's: at the front, in memory (keeps_given_back)
        for msg in timed_out:
            holder = msg.consumer
            if holder is not None:
                holder.in_flight.pop(msg.id, None)
                self._may_have_room(holder)
            msg.consumer = None
            self.timeout_count += 1
            if holder is not None and holder.keeps_given_back:
                kept.append(msg)
            else:
                self._ready.append(msg)
        if kept:
            self._ready.push_front(kept, keep=True)
        due, due_on_disk = self._deferred.pop_due(now)
        self._ready.extend(due)
        if due_on_disk:
            locs, attempts = zip(*due_on_disk)
            self._ready.extend_on_disk(locs, attempts)
        stalled = self._ready.stalled and self._retry is None  # no loop's timer for it
        if stalled:
            self._ready.stalled = False
        if timed_out or due or due_on_disk or stalled:
            self._pump()
        return bool(self._in_flight) or bool(self._deferred) or self._ready.stalled

    # -- admin ------------------------------------------------------------
    def pause(self) -> None:
        log.info("CHANNEL(%s/%s): pausing", self.topic.name, self.name)
        self._set_paused(True)

    def unpause(self) -> None:
        log.info("CHANNEL(%s/%s): unpausing", self.topic.name, self.name)
        self._set_paused(False)
        self._pump()

    def _set_paused(self, paused: bool) -> None:
        was, self.paused = self.paused, paused
        try:
            self._store.channel_changed(self)  # written first, or nothing changes
        except BaseException:
            self.paused = was
            raise

    def empty(self) -> None:
        """Drop every queued, deferred and in-flight message (as nsqd does)."""
        log.info("CHANNEL(%s/%s): emptying", self.topic.name, self.name)
        self._store.emptying(self.topic, self)  # written first, or nothing changes
        self._drop_all()

    def _drop_all(self) -> None:
        in_flight = self._in_flight.clear()
        deferred, deferred_on_disk = self._deferred.clear()
        msgs = [*self._ready.messages(), *deferred, *in_flight]
        on_disk = [*self._ready.on_disk(), *deferred_on_disk]
        self._ready.take_all()
        # Every holder lets go, leases included (they are not in _consumers). A lease
        # that held some is over: none of its messages waits here to be taken back.
        leases = {}
        for msg in in_flight:
            holder = msg.consumer
            if holder is not None:
                holder.in_flight.pop(msg.id, None)
                msg.consumer = None
                self._may_have_room(holder)
                if holder.keeps_given_back:
                    leases[id(holder)] = holder
        for lease in leases.values():
            self._broker.lease_emptied(lease)
        self._store.dropped(self.topic, self, msgs, on_disk)
        self.lease_claims.clear()

    def close(self) -> list[Consumer]:
        """Forget everything; return the consumers that were attached."""
        self.deleted = True
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None
        consumers = list(self._consumers)
        self._consumers.clear()
        self._seat.clear()
        self._wanting.clear()
        self._drop_all()
        return consumers

    # -- delivery ---------------------------------------------------------
    def _pump(self) -> None:
        """Hand ready messages to the consumers with room, in turns of up to ``TURN``
        messages in round-robin order (after the consumer served last). A pass records
        what each consumer gets in flight, then hands it over as one batch. A pass takes
        no more body bytes than the smallest ``batch_bytes`` among them, so no batch
        passes its consumer's; when that stopped it, another pass follows once the
        batches are handed over (a transport may have blocked its consumer meanwhile)."""
        if self.paused or not self._ready.count or not self._consumers:
            return
        again = True
        while again and self._ready.count and not self.paused:
            again = self._pump_pass()

    def _pump_pass(self) -> bool:
        """One pass of ``_pump``; whether it stopped on bytes rather than on room."""
        open_, room, least, max_bytes = self._with_room(self._ready.count)
        if not open_:
            return False
        msgs = self._take_ready(room, max_bytes)
        if not msgs:
            return False
        batches = [(open_[0][0], msgs)] if len(self._consumers) == 1 \
            else self._share(msgs, open_, least)
        now = self._clock.monotonic()
        in_flight = self._in_flight
        for consumer, batch in batches:
            held = consumer.in_flight
            for msg in batch:
                if msg.attempts < MAX_ATTEMPTS:
                    msg.attempts += 1
                msg.consumer = consumer
                held[msg.id] = msg
            if len(batch) == 1:   # (many consumers with a little room each)
                in_flight.push(batch[0], now + consumer.msg_timeout)
            else:
                in_flight.push_many(batch, now + consumer.msg_timeout)
        self._timers_started()
        self._store.delivered(self, msgs)
        wanting = self._wanting
        for consumer, batch in batches:
            consumer.deliver_many(batch)
            # (``room() <= 0``, inline: once per consumer served)
            if consumer.closing or consumer.blocked \
                    or consumer.rdy <= len(consumer.in_flight):
                wanting.discard(consumer)
        return bool(max_bytes) and len(msgs) < room

    def _with_room(self, wanted: int) -> tuple[list[tuple[Consumer, int]], int, int, int]:
        """The consumers with room and how much each has, in round-robin order from the
        one after the consumer served last, no more of them than their first turns take
        ``wanted`` (the messages ready: those after would get none this pass); those
        found without room leave ``_wanting``. With them: their room in all, the least
        room among them, and the least ``batch_bytes`` among them (0: none bounded),
        counted on the way (a pass serves hundreds of consumers at a low RDY)."""
        wanting, seat = self._wanting, self._seat
        consumers = self._consumers
        if len(wanting) * 4 >= len(consumers):
            # Most of them (a channel whose consumers wait for messages): a walk in order.
            ordered = consumers
        else:
            # A few (those a FIN, a REQ or a timeout gave room): sorted by seat.
            ordered = sorted(wanting, key=seat.__getitem__)
        split = bisect_right(ordered, self._last_served, key=seat.__getitem__)
        open_, full = [], []
        turns = room = least = max_bytes = 0   # turns: what the first turns of ``open_`` take
        for consumer in chain(islice(ordered, split, None), islice(ordered, split)):
            # (``room()``, inline: once per consumer looked at)
            r = 0 if consumer.closing or consumer.blocked \
                else consumer.rdy - len(consumer.in_flight)
            if r > 0:
                if r < least or not open_:
                    least = r
                open_.append((consumer, r))
                room += r
                limit = consumer.batch_bytes
                if limit and (limit < max_bytes or not max_bytes):
                    max_bytes = limit
                turns += r if r < TURN else TURN
                if turns >= wanted:
                    break
            else:
                full.append(consumer)
        wanting.difference_update(full)
        return open_, room, least, max_bytes

    def _share(self, msgs: list[Message], open_: list[tuple[Consumer, int]], least: int
               ) -> list[tuple[Consumer, list[Message]]]:
        """Deal ``msgs`` (no more than the consumers' rooms hold in all) to ``open_``
        (each consumer with room and its room, in round-robin order; ``least``: the
        least room among them) in turns: on its turn a consumer takes the next ``TURN``
        messages, fewer if its room or the messages run out, and turns go round until
        the messages are dealt. Each consumer with its batch, in the order they were
        served."""
        k, count = len(open_), len(msgs)
        if k == 1:
            self._last_served = self._seat[open_[0][0]]
            return [(open_[0][0], msgs)]
        rounds, rest = divmod(count, TURN * k)
        if least >= TURN * rounds + min(TURN, rest):
            # No room runs out: ``rounds`` turns each, then the rest from the first, a
            # turn each; by slices. In the full rounds, turn t is messages 2t and 2t + 1
            # and goes to consumer t % k: consumer i's are every k-th of the turns'
            # first messages and of their second ones, from the i-th, interleaved.
            tail = TURN * k * rounds
            last = (rest - 1) // TURN if rest else k - 1
            self._last_served = self._seat[open_[last][0]]
            if not rounds:
                return [(consumer, msgs[TURN * i:TURN * i + TURN])
                        for i, (consumer, _) in enumerate(open_[:last + 1])]
            firsts, seconds = msgs[0:tail:2], msgs[1:tail:2]
            batches = []
            for i, (consumer, _) in enumerate(open_):
                batch: list[Message] = [msgs[0]] * (2 * rounds)
                batch[0::2] = firsts[i::k]
                batch[1::2] = seconds[i::k]
                if rest > TURN * i:
                    batch += msgs[tail + TURN * i:tail + TURN * i + TURN]
                batches.append((consumer, batch))
            return batches
        rooms = [r for _, r in open_]
        dealt: dict[int, list[Message]] = {}
        i = last = at = 0
        while at < count:
            r = rooms[i]
            if r > 0:
                take = r if r < TURN else TURN
                dealt.setdefault(i, []).extend(msgs[at:at + take])
                rooms[i] = r - take
                at += take
                last = i
            i = i + 1 if i + 1 < k else 0
        self._last_served = self._seat[open_[last][0]]
        return [(open_[i][0], batch) for i, batch in dealt.items()]

    def _take_ready(self, count: int, max_bytes: int) -> list[Message]:
        """Up to ``count`` messages off the ready queue, in order, stopping once their
        bodies reach ``max_bytes`` (0: no bound); those that must not be delivered
        leave on the way (see ``_leaves``). In bulk while they are in memory, one at a
        time from disk: the same messages as taking them one by one."""
        ready = self._ready
        now_ns = self._clock.wall_ns()
        taken: list[Message] = []
        size = 0
        while count > 0:
            # Bounded by bytes, a look at a chunk at a time: bodies usually stop a pass
            # well short of its room, and each look costs every message it looks at.
            msgs = (ready.popleft_in_memory(min(count, BYTES_CHUNK), max_bytes - size)
                    if max_bytes else ready.popleft_in_memory(count))
            if msgs:
                # Those leaving count towards neither ``count`` nor ``max_bytes``: the
                # next pass takes their place.
                if not deadletter.all_deliverable(self, msgs, now_ns):
                    msgs = [m for m in msgs if not self._leaves(m, now_ns)]
            else:
                msg = self._next_ready(wait=True, now_ns=now_ns)
                if msg is None:
                    break
                msgs = [msg]
            taken += msgs
            count -= len(msgs)
            if max_bytes:
                size += sum([len(msg.body) for msg in msgs])
                if size >= max_bytes:
                    break
        return taken

    def _next_ready(self, wait: bool = True, now_ns: int = 0) -> Message | None:
        """The next message to deliver (None: none, or, if ``wait``, not read from disk
        yet); on the way, those that must not be delivered (expired, or past
        max_attempts) leave the channel (see deadletter.py). ``now_ns``: the wall clock,
        read once by a caller taking many (0: read it)."""
        while True:
            msg = self._ready.popleft(wait)
            if msg is None or not self._leaves(msg, now_ns):
                return msg

    def _leaves(self, msg: Message, now_ns: int = 0) -> bool:
        """Whether ``msg`` (out of the ready queue) must not be delivered; if so it has
        left the channel, or waits to retry a dead letter that could not be written."""
        reason = deadletter.verdict(self, msg, now_ns or self._clock.wall_ns())
        if not reason:
            return False
        if not deadletter.remove(self, msg, reason):
            self._deferred.push(msg, self._clock.monotonic() + deadletter.RETRY_DELAY)
            self._timers_started()
        elif self.lease_claims:
            self.lease_claims.left((msg.id,))
        return True

    def stats(self) -> ChannelStats:
        return ChannelStats(
            name=self.name, depth=self.depth, in_flight_count=self.in_flight_count,
            deferred_count=self.deferred_count, message_count=self.message_count,
            requeue_count=self.requeue_count, timeout_count=self.timeout_count,
            finish_count=self.finish_count, paused=self.paused,
            dead_letter_count=self.dead_letter_count, expired_count=self.expired_count,
            max_attempts=deadletter.max_attempts(self),
            dead_letter_topic=deadletter.dead_letter_topic(self),
            clients=[ClientStats.of(c) for c in self._consumers],
            e2e_processing_latency=self.latency.percentiles(),
            on_disk_count=(len(self._ready) - self._ready.in_memory
                           + len(self._deferred) - self._deferred.in_memory),
            memory_count=self._ready.bodies_in_memory + self._deferred.in_memory,
            disk_bytes=self._store.pinned_bytes(self, self._oldest_location))

    def copies(self) -> Iterator[tuple[int, int, float]]:
        """(log location, attempts, deferred until or 0) of every durable message here."""
        for loc, attempts in self._ready.copies():
            yield loc, attempts, 0.0
        for msg in self._in_flight.live():
            if msg.loc:
                yield msg.loc, msg.attempts, 0.0
        for msg in self._deferred.live():
            if msg.loc:
                yield msg.loc, msg.attempts, msg.deadline
        yield from self._deferred.on_disk()

    def relocate(self, moved: dict[int, int]) -> None:
        """Records copied elsewhere in the log (old -> new location)."""
        self._ready.relocate(moved)
        self._deferred.relocate(moved)
        for msg in self._in_flight.live():
            if msg.loc in moved:
                msg.loc = moved[msg.loc]

    def _oldest_location(self) -> int:
        locs = [m.loc for q in (self._in_flight, self._deferred) for m in q.live() if m.loc]
        locs += [loc for loc, _, _ in self._deferred.on_disk()]
        oldest = self._ready.oldest_location()
        return min([*locs, oldest] if oldest else locs, default=0)
