"""A topic: stamps each published message and copies it to every channel.

While a topic has no channel, or is paused, messages wait in the topic itself
(``holds``) and flow to the channels once there are some and it is unpaused, as
in nsqd. A deferred publish keeps its delay while it waits. What the topic
holds is bounded in memory as a channel's backlog is.
"""

from __future__ import annotations

import logging
from itertools import chain
from typing import TYPE_CHECKING, Iterable, Iterator, Sequence

from .backlog import Backlog, OnDisk
from .channel import Channel
from .deferred import Deferred
from .errors import ChannelNotFound, TooManyChannels
from .message import Message, Published
from .names import check_channel_name, is_ephemeral
from .stats import LatencySample, TopicStats

log = logging.getLogger("pynsqd")

if TYPE_CHECKING:
    from .core import Broker


class Topic:
    def __init__(self, broker: "Broker", name: str) -> None:
        self.broker = broker
        self.name = name
        self.ephemeral = is_ephemeral(name)
        self.paused = False
        self.channels: dict[str, Channel] = {}
        self._store = broker.storage
        # Held for later channels: ready ones, and deferred ones until their
        # deliver-at (monotonic seconds).
        self._held = Backlog(self._store.spill_limit, self._load)
        self._held_later = Deferred(self._store.spill_limit)
        self.message_count = 0
        self.message_bytes = 0
        self.ttl_ms = 0                     # default ttl of its messages (0: none)

    @property
    def depth(self) -> int:
        return len(self._held) + len(self._held_later)

    @property
    def holds(self) -> bool:
        """Whether a message published now waits in the topic for channels."""
        return self.paused or not self.channels

    def _load(self, loc: int) -> Message | None:
        return self._store.load(self, loc)

    def publish(self, run: Published) -> None:
        """A publish's messages, ready at once: each queue makes its own ``Message``
        objects, of those it keeps in memory only."""
        self.message_count += len(run)
        self.message_bytes += run.size
        if self.holds:
            self._held.extend_published(run)
            return
        for channel in list(self.channels.values()):
            channel.put_published(run)

    def publish_deferred(self, msgs: list[Message], delay: float) -> None:
        """Messages of a DPUB (or of an MPUB with defers), ready ``delay`` seconds from
        now (0: at once)."""
        self.message_count += len(msgs)
        self.message_bytes += sum(len(m.body) for m in msgs)
        if self.holds:
            if delay > 0:
                until = self.broker.clock.monotonic() + delay
                for m in msgs:
                    self._held_later.push(m, until)
            else:
                self._held.extend(msgs)
            return
        self._copy_to_channels(msgs, delay)

    def _copy_to_channels(self, msgs: list[Message], delay: float) -> None:
        channels = list(self.channels.values())
        for i, channel in enumerate(channels):
            # The last channel takes the originals; the others get copies.
            batch = msgs if i == len(channels) - 1 else [m.copy() for m in msgs]
            if delay > 0:
                for m in batch:
                    channel.put_deferred(m, delay)
            else:
                channel.put_many(batch)

    def _flush_held(self) -> None:
        if self.holds or not self.depth:
            return
        in_memory = self._held.in_memory == len(self._held)
        held = self._held.take_all()
        later_msgs = self._held_later.live()
        later_on_disk = list(self._held_later.on_disk())
        self._held_later.clear()
        if in_memory:   # no run on disk: one run of messages, as it is
            runs, msgs, on_disk = [held] if held else [], held, iter(())
        else:
            runs = _runs(held)
            msgs = [m for run in runs if type(run) is list for m in run]
            # Read by the store only when it counts them (several channels).
            on_disk = (loc for run in runs if type(run) is OnDisk for loc in run.remaining())
        if later_on_disk:
            on_disk = chain(on_disk, (loc for loc, _, _ in later_on_disk))
        self._store.held_flushed(self, msgs + later_msgs if later_msgs else msgs, on_disk)
        for run in runs:
            if type(run) is list:
                self._copy_to_channels(run, 0.0)
                continue
            locs, attempts = run.remaining(), run.remaining_attempts()
            for channel in self.channels.values():
                channel.put_on_disk(locs, attempts)
        now = self.broker.clock.monotonic()
        for m in later_msgs:
            self._copy_to_channels([m], max(0.0, m.deadline - now))
        for loc, attempts, until in later_on_disk:
            for channel in self.channels.values():
                if until > now:
                    channel.put_deferred_on_disk(loc, attempts, until - now)
                else:  # due while held: ready at once, as a message in memory would be
                    channel.put_on_disk((loc,), (attempts,))

    def restore_held(self, ready: list[Message], on_disk: Sequence[int],
                     deferred: list[tuple[Message, float]],
                     on_disk_attempts: Sequence[int] | None = None,
                     deferred_on_disk: Iterable[tuple[int, int, float]] = (),
                     front: list[Message] | None = None) -> None:
        """Hold messages recovered from disk until this topic has a channel (as
        ``Channel.restore`` takes them)."""
        if front:
            self._held.push_front(front, keep=True)
        self._held.extend(ready)
        self._held.extend_on_disk(on_disk, on_disk_attempts)
        now = self.broker.clock.monotonic()
        for m, delay in deferred:
            self._held_later.push(m, now + delay)
        for loc, attempts, delay in deferred_on_disk:
            self._held_later.push_on_disk(loc, attempts, now + delay)

    def copies(self) -> Iterator[tuple[int, int, float]]:
        """(log location, attempts, deferred until or 0) of every durable message held."""
        for loc, attempts in self._held.copies():
            yield loc, attempts, 0.0
        for msg in self._held_later.live():
            if msg.loc:
                yield msg.loc, msg.attempts, msg.deadline
        yield from self._held_later.on_disk()

    def relocate(self, moved: dict[int, int]) -> None:
        """Records copied elsewhere in the log (old -> new location)."""
        self._held.relocate(moved)
        self._held_later.relocate(moved)

    def channel(self, name: str) -> Channel:
        try:
            return self.channels[name]
        except KeyError:
            raise ChannelNotFound(f"channel {self.name}/{name} does not exist") from None

    def get_or_create_channel(self, name: str, *, bounded: bool = True) -> Channel:
        """The channel ``name``, made if need be: past ``--max-channels-per-topic`` or
        ``--max-channels`` a client's is refused (``bounded=False``: a restart restoring
        what it accepted)."""
        channel = self.channels.get(name)
        if channel is None:
            check_channel_name(name)
            if bounded:
                self._check_room_for_channel(name)
            channel = Channel(self, name)
            self._store.channel_created(channel)  # written first, or nothing changes
            self.channels[name] = channel
            self.broker.channel_count += 1
            self.broker.on_channel_created(channel)
            self._flush_held()
        return channel

    def _check_room_for_channel(self, name: str) -> None:
        most = self.broker.options.max_channels_per_topic
        if most and len(self.channels) >= most:
            raise TooManyChannels(
                f"channel {self.name}/{name} not made: topic {self.name} has "
                f"{len(self.channels)} channels, the most --max-channels-per-topic allows "
                f"(delete channels, or raise --max-channels-per-topic)")
        self.broker.check_room_for_channel(self.name, name)

    def delete_channel(self, name: str) -> None:
        channel = self.channel(name)
        self._store.channel_deleted(channel)  # written first, or nothing changes
        del self.channels[name]
        self.broker.channel_count -= 1
        for consumer in channel.close():
            self.broker.on_consumer_evicted(consumer)
        self.broker.on_channel_deleted(channel)
        if self.ephemeral and not self.channels:
            self.broker.delete_topic(self.name)

    def pause(self) -> None:
        log.info("TOPIC(%s): pausing", self.name)
        self._set_paused(True)

    def unpause(self) -> None:
        log.info("TOPIC(%s): unpausing", self.name)
        self._set_paused(False)
        self._flush_held()

    def _set_paused(self, paused: bool) -> None:
        was, self.paused = self.paused, paused
        try:
            self._store.topic_changed(self)  # written first, or nothing changes
        except BaseException:
            self.paused = was
            raise

    def empty(self) -> None:
        """Drop what the topic holds for later channels (channels keep theirs)."""
        log.info("TOPIC(%s): emptying", self.name)
        self._store.emptying(self, None)  # written first, or nothing changes
        self._drop_held()

    def _drop_held(self) -> None:
        later, later_on_disk = self._held_later.clear()
        msgs = [*self._held.messages(), *later]
        on_disk = [*self._held.on_disk(), *later_on_disk]
        self._held.take_all()
        self._store.dropped(self, None, msgs, on_disk)

    def close(self) -> None:
        for name in list(self.channels):
            channel = self.channels.pop(name)
            self.broker.channel_count -= 1
            for consumer in channel.close():
                self.broker.on_consumer_evicted(consumer)
        self._drop_held()

    def stats(self, channel: str | None = None) -> TopicStats:
        channels = [c for n, c in sorted(self.channels.items()) if channel is None or n == channel]
        latency = LatencySample()
        for c in self.channels.values():
            latency.extend(c.latency)
        return TopicStats(name=self.name, depth=self.depth, message_count=self.message_count,
                          message_bytes=self.message_bytes, paused=self.paused,
                          channels=[c.stats() for c in channels],
                          e2e_processing_latency=latency.percentiles(),
                          on_disk_count=(len(self._held) - self._held.in_memory
                                         + len(self._held_later) - self._held_later.in_memory),
                          memory_count=self._held.bodies_in_memory + self._held_later.in_memory,
                          disk_bytes=self._store.disk_bytes(self),
                          rewritten_bytes=self._store.rewritten_bytes(self),
                          disk_read_errors=self._store.read_errors(self), ttl_ms=self.ttl_ms)


def _runs(held: list) -> "list[list[Message] | OnDisk]":
    """Held items in order as runs: lists of messages in memory, and runs on disk."""
    runs: list[list[Message] | OnDisk] = []
    batch: list[Message] = []
    for item in held:
        if type(item) is not OnDisk:
            batch.append(item)
            continue
        if batch:
            runs.append(batch)
            batch = []
        runs.append(item)
    if batch:
        runs.append(batch)
    return runs
