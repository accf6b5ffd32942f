"""A topic: stamps each published message and copies it to every channel.

While a topic has no channel, or is paused, messages wait in the topic itself
and flow to the channels once there are some and it is unpaused, as in nsqd.
A deferred publish keeps its delay while it waits.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

from .channel import Channel
from .errors import ChannelNotFound
from .message import Message
from .names import check_channel_name, is_ephemeral
from .stats import LatencySample, TopicStats

if TYPE_CHECKING:
    from .core import Broker


class Topic:
    def __init__(self, broker: "Broker", name: str) -> None:
        self.broker = broker
        self.name = name
        self.ephemeral = is_ephemeral(name)
        self.paused = False
        self.channels: dict[str, Channel] = {}
        # Counts changes to the set of channels: a durable message records the
        # epoch it was published in, so recovery knows which channels it went to.
        self.epoch = 0
        # (message, deliver-at monotonic seconds or 0) held for later channels
        self._held: deque[tuple[Message, float]] = deque()
        self.message_count = 0
        self.message_bytes = 0

    @property
    def depth(self) -> int:
        return len(self._held)

    def publish(self, msgs: list[Message], delay: float = 0.0) -> None:
        self.message_count += len(msgs)
        self.message_bytes += sum(len(m.body) for m in msgs)
        if self.paused or not self.channels:
            until = self.broker.clock.monotonic() + delay if delay > 0 else 0.0
            self._held.extend((m, until) for m in msgs)
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
        if self.paused or not self.channels or not self._held:
            return
        held, self._held = self._held, deque()
        self.broker.on_held_flushed(self, [m for m, _ in held])
        now = self.broker.clock.monotonic()
        ready = [m for m, until in held if until <= now]
        if ready:
            self._copy_to_channels(ready, 0.0)
        for m, until in held:
            if until > now:
                self._copy_to_channels([m], until - now)

    def restore_held(self, restored: tuple[list["Message | int"], list[tuple[Message, float]]]
                     ) -> None:
        """Hold messages recovered from disk until this topic has a channel."""
        ready, deferred = restored
        now = self.broker.clock.monotonic()
        load = self.broker.load_message
        msgs = (m if type(m) is not int else load(self, m) for m in ready)
        self._held.extend((m, 0.0) for m in msgs if m is not None)
        self._held.extend((m, now + delay) for m, delay in deferred)
        self._flush_held()

    def channel(self, name: str) -> Channel:
        try:
            return self.channels[name]
        except KeyError:
            raise ChannelNotFound(f"channel {self.name}/{name} does not exist") from None

    def get_or_create_channel(self, name: str) -> Channel:
        channel = self.channels.get(name)
        if channel is None:
            check_channel_name(name)
            self.epoch += 1
            channel = Channel(self, name)
            self.channels[name] = channel
            self.broker.on_channel_created(channel)
            self._flush_held()
        return channel

    def delete_channel(self, name: str) -> None:
        channel = self.channel(name)
        del self.channels[name]
        self.epoch += 1
        for consumer in channel.close():
            self.broker.on_consumer_evicted(consumer)
        self.broker.on_channel_deleted(channel)
        if self.ephemeral and not self.channels:
            self.broker.delete_topic(self.name)

    def pause(self) -> None:
        self.paused = True
        self.broker.on_metadata_changed()

    def unpause(self) -> None:
        self.paused = False
        self.broker.on_metadata_changed()
        self._flush_held()

    def empty(self) -> None:
        """Drop what the topic holds for later channels (channels keep theirs)."""
        dropped = [m for m, _ in self._held]
        self._held.clear()
        self.broker.on_dropped(self, None, dropped)

    def close(self) -> None:
        for name in list(self.channels):
            channel = self.channels.pop(name)
            for consumer in channel.close():
                self.broker.on_consumer_evicted(consumer)
        self._held.clear()

    def stats(self, channel: str | None = None) -> TopicStats:
        channels = [c for n, c in sorted(self.channels.items()) if channel is None or n == channel]
        latency = LatencySample()
        for c in self.channels.values():
            latency.extend(c.latency)
        return TopicStats(name=self.name, depth=self.depth, message_count=self.message_count,
                          message_bytes=self.message_bytes, paused=self.paused,
                          channels=[c.stats() for c in channels],
                          e2e_processing_latency=latency.percentiles())
