"""Storage: makes the core's durable topics survive a restart, clean or not.

What is where under ``--data-path``:

- ``metadata.json``: topics, channels, paused state, written atomically on
  every change;
- ``topics/t-NAME/NNNNNNNN.log``: the topic's log — a PUB record per message
  (written before the publish is acknowledged), and per-channel FIN, DEFER,
  ATTEMPTS and EMPTY records;
- ``LOCK``: held by the running broker, so a second one is refused.

Recovery replays each log: a message is pending in every channel that existed
when it was published (the topic's channel *epoch*) until a FIN for that
channel; pending messages are queued again, deferred ones keep their deliver-at
time. ``#ephemeral`` topics and channels never reach the disk.

Durability of writes: records are written with ``os.write`` before the reply
(a killed process loses nothing the kernel has); FIN/DEFER records are batched
until the end of the event-loop pass; ``fsync`` runs off the event loop every
``--sync-every`` messages or ``--sync-timeout``, which bounds what a power
loss can take.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

from ..message import Message
from ..options import Options
from . import metadata, records
from .segments import TopicLog, location, split

if TYPE_CHECKING:
    from ..channel import Channel
    from ..core import Broker
    from ..topic import Topic

log = logging.getLogger("pynsqd")


class DataPathLocked(RuntimeError):
    """Another broker holds the data path."""


class Storage:
    def __init__(self, broker: "Broker", options: Options) -> None:
        self.broker = broker
        self.options = options
        self.path = Path(options.data_path)
        self.path.mkdir(parents=True, exist_ok=True)
        self._lock_fd = self._lock()
        self.logs: dict[str, TopicLog] = {}
        self._pending_records: dict[str, list[bytes]] = {}
        self._fins: dict[tuple[str, str], list[int]] = {}  # (topic, channel) -> ids
        self._unsynced = 0
        self._last_sync = time.monotonic()
        self._syncing: asyncio.Future | None = None
        self._restoring = False

    # -- the lock ---------------------------------------------------------
    def _lock(self) -> int:
        fd = os.open(self.path / "LOCK", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise DataPathLocked(f"data path {self.path} is in use by another pynsqd "
                                 f"(its LOCK file is held)") from None
        return fd

    # -- topics' logs -----------------------------------------------------
    def _dir(self, name: str) -> Path:
        # A prefix keeps names such as "." and ".." from being paths.
        return self.path / "topics" / f"t-{name}"

    def _log(self, topic: "Topic") -> TopicLog:
        topic_log = self.logs.get(topic.name)
        if topic_log is None:
            topic_log = self.logs[topic.name] = TopicLog(self._dir(topic.name),
                                                         self.options.max_bytes_per_file)
            topic_log.start_appending()
        return topic_log

    @staticmethod
    def _durable_channels(topic: "Topic") -> list["Channel"]:
        return [c for c in topic.channels.values() if not c.ephemeral]

    # -- hooks from the core ----------------------------------------------
    def published(self, topic: "Topic", msgs: list[Message], defers: list[int], *,
                  producer: bytes | None = None) -> None:
        if topic.ephemeral:
            return
        topic_log = self._log(topic)
        now_ns = time.time_ns()
        parts = [records.pub(topic.epoch, int(m.id, 16), m.timestamp,
                             now_ns + d * 1_000_000 if d else 0, m.body)
                 for m, d in zip(msgs, defers or [0] * len(msgs))]
        seg, offset = topic_log.append(b"".join(parts))
        for msg, part in zip(msgs, parts):
            msg.loc = location(seg, offset)
            offset += len(part)
        held = topic.paused or not topic.channels
        copies = 1 if held else len(self._durable_channels(topic))
        topic_log.hold(seg, copies * len(msgs))
        self._unsynced += len(msgs)

    def held_flushed(self, topic: "Topic", msgs: list[Message]) -> None:
        if topic.ephemeral:
            return
        topic_log = self._log(topic)
        extra = len(self._durable_channels(topic)) - 1
        for msg in msgs:
            if msg.loc:
                if extra >= 0:
                    topic_log.hold(split(msg.loc)[0], extra)
                else:
                    topic_log.release(split(msg.loc)[0])

    def finished(self, channel: "Channel", msg: Message) -> None:
        if channel.ephemeral or channel.topic.ephemeral or not msg.loc:
            return
        if not self._fins and not self._pending_records:
            self._flush_soon()
        self._fins.setdefault((channel.topic.name, channel.name), []).append(int(msg.id, 16))
        self._log(channel.topic).release(split(msg.loc)[0])

    def deferred(self, channel: "Channel", msg: Message, delay: float) -> None:
        if channel.ephemeral or channel.topic.ephemeral or not msg.loc:
            return
        self._record(channel.topic, records.channel_event(
            records.DEFER, channel.name, int(msg.id, 16), time.time_ns() + int(delay * 1e9),
            msg.attempts))

    def dropped(self, topic: "Topic", channel: "Channel | None",
                msgs: list["Message | int"]) -> None:
        if topic.ephemeral or (channel is not None and channel.ephemeral):
            return
        self._record(topic, records.channel_event(records.EMPTY,
                                                  channel.name if channel else ""))
        topic_log = self._log(topic)
        for item in msgs:
            loc = item if type(item) is int else item.loc
            if loc:
                topic_log.release(split(loc)[0])

    def topic_deleted(self, topic: "Topic") -> None:
        self._pending_records.pop(topic.name, None)
        self._fins = {k: v for k, v in self._fins.items() if k[0] != topic.name}
        topic_log = self.logs.pop(topic.name, None)
        if topic_log is not None:
            topic_log.destroy()

    def metadata_changed(self) -> None:
        if self._restoring:
            return
        topics = []
        for topic in self.broker.topics.values():
            if topic.ephemeral:
                continue
            topics.append({"name": topic.name, "paused": topic.paused, "epoch": topic.epoch,
                           "channels": [{"name": c.name, "paused": c.paused,
                                         "created_epoch": c.created_epoch}
                                        for c in self._durable_channels(topic)]})
        metadata.write_atomically(self.path / "metadata.json", {"version": 1, "topics": topics})

    def load(self, topic: "Topic", loc: int) -> Message | None:
        """A message that waited on disk only, read back (None: damaged on disk since)."""
        topic_log = self._log(topic)
        try:
            msg_id, ts, body = topic_log.read_pub(loc)
        except records.DamagedRecord as err:
            log.error("%s: the message is lost", err)
            topic_log.release(split(loc)[0])
            return None
        msg = Message(f"{msg_id:016x}", body, ts)
        msg.loc = loc
        return msg

    def _record(self, topic: "Topic", data: bytes) -> None:
        """Queue a FIN/DEFER/... record; all queued ones go out in one write per topic
        at the end of this event-loop pass."""
        if not self._pending_records and not self._fins:
            self._flush_soon()
        self._pending_records.setdefault(topic.name, []).append(data)

    def _flush_soon(self) -> None:
        if self._restoring:
            return
        try:
            asyncio.get_running_loop().call_soon(self.flush)
        except RuntimeError:  # no loop (shutting down): close() flushes
            pass

    # -- time -------------------------------------------------------------
    def tick(self) -> None:
        """Write batched records; start an fsync when one is due."""
        self.flush()
        now = time.monotonic()
        due = (self._unsynced >= max(1, self.options.sync_every)
               or now - self._last_sync >= self.options.sync_timeout / 1000)
        if due and self._syncing is None and any(t.dirty for t in self.logs.values()):
            dirty = [t for t in self.logs.values() if t.dirty]
            for t in dirty:
                t.dirty = False
            self._unsynced = 0
            self._last_sync = now
            loop = asyncio.get_running_loop()
            self._syncing = loop.run_in_executor(None, _sync_all, dirty)
            self._syncing.add_done_callback(self._synced)

    def _synced(self, future: asyncio.Future) -> None:
        self._syncing = None
        if future.exception() is not None:
            log.error("fsync failed: %s", future.exception())

    def flush(self) -> None:
        # FINs go first: a DEFER or EMPTY queued after them must not be undone by them.
        fins, self._fins = self._fins, {}
        for (topic, channel), ids in fins.items():
            self._pending_records.setdefault(topic, []).insert(0, records.fins(channel, ids))
        for name, parts in self._pending_records.items():
            topic_log = self.logs.get(name)
            if topic_log is not None and parts:
                topic_log.append(b"".join(parts))
        self._pending_records.clear()

    # -- start and stop ---------------------------------------------------
    def recover(self) -> None:
        """Restore topics, channels and every pending message from the data path."""
        started = time.monotonic()
        self._restoring = True
        restored = 0
        try:
            for entry in metadata.read(self.path / "metadata.json")["topics"]:
                topic = self.broker.get_or_create_topic(entry["name"])
                for c in entry["channels"]:
                    channel = topic.get_or_create_channel(c["name"])
                    channel.created_epoch = c["created_epoch"]
                    channel.paused = c["paused"]
                topic.epoch = entry["epoch"]
                topic.paused = entry["paused"]
                restored += self._replay(topic)
        finally:
            self._restoring = False
        self.metadata_changed()
        log.info("data path %s: restored %d topic(s) and %d pending message(s) in %.2fs",
                 self.path, len(self.broker.topics), restored, time.monotonic() - started)

    def _replay(self, topic: "Topic") -> int:
        directory = self._dir(topic.name)
        topic_log = TopicLog(directory, self.options.max_bytes_per_file)
        channels = {c.name: c for c in self._durable_channels(topic)}
        pending: dict[str, dict[int, list[int]]] = {name: {} for name in channels}
        held: dict[int, list[int]] = {}
        max_id = 0
        for seg in topic_log.segment_numbers():
            data = topic_log.path(seg).read_bytes()
            found = records.scan(data, str(topic_log.path(seg)))
            for record in found:
                if record.kind == records.PUB:
                    epoch, msg_id, _, deliver_at = record.pub()
                    max_id = max(max_id, msg_id)
                    entry = [location(seg, record.offset), 0, deliver_at]
                    targets = [n for n, c in channels.items() if c.created_epoch <= epoch]
                    for name in targets:
                        pending[name][msg_id] = list(entry)
                    if not targets:
                        held[msg_id] = entry
                    continue
                if record.kind == records.FIN:
                    name, ids = record.fins()
                    finished = pending.get(name, {})
                    for msg_id in ids:
                        finished.pop(msg_id, None)
                    continue
                name, msg_id, deliver_at, attempts = record.channel_event()
                if record.kind == records.EMPTY:
                    (pending.get(name, {}) if name else held).clear()
                elif record.kind in (records.DEFER, records.ATTEMPTS):
                    entry = pending.get(name, {}).get(msg_id)
                    if entry is not None:
                        entry[1] = attempts
                        if record.kind == records.DEFER:
                            entry[2] = deliver_at
        self.logs[topic.name] = topic_log
        topic_log.start_appending()
        if max_id:
            self.broker.new_id.advance_past(f"{max_id:016x}")
        for entries in [*pending.values(), held]:
            for loc, _, _ in entries.values():
                topic_log.hold(split(loc)[0])
        now_ns = time.time_ns()
        for name, entries in pending.items():
            channels[name].restore(self._messages(topic, entries, now_ns))
        topic.restore_held(self._messages(topic, held, now_ns))
        topic_log.reclaim()
        return sum(len(e) for e in pending.values()) + len(held)

    def _messages(self, topic: "Topic", entries: dict[int, list[int]], now_ns: int):
        """(ready: Message or disk location, deferred: (Message, seconds left))."""
        ready: list[Message | int] = []
        deferred: list[tuple[Message, float]] = []
        in_memory = self.options.mem_queue_size
        for loc, attempts, deliver_at in entries.values():
            if deliver_at <= now_ns and not attempts and len(ready) >= in_memory:
                ready.append(loc)
                continue
            msg = self.load(topic, loc)
            if msg is None:
                continue
            msg.attempts = attempts
            if deliver_at > now_ns:
                deferred.append((msg, (deliver_at - now_ns) / 1e9))
            else:
                ready.append(msg)
        return ready, deferred

    def close(self) -> None:
        """Clean shutdown: attempts and deferral of everything pending, then fsync."""
        now_ns, now = time.time_ns(), time.monotonic()
        for topic in self.broker.topics.values():
            if topic.ephemeral:
                continue
            for channel in self._durable_channels(topic):
                ready, in_flight, deferred = channel.pending()
                for msg in in_flight + [m for m in ready if type(m) is not int]:
                    if msg.loc and msg.attempts:
                        self._record(topic, records.channel_event(
                            records.ATTEMPTS, channel.name, int(msg.id, 16), 0, msg.attempts))
                for msg in deferred:
                    if msg.loc:
                        self._record(topic, records.channel_event(
                            records.DEFER, channel.name, int(msg.id, 16),
                            now_ns + int((msg.deadline - now) * 1e9), msg.attempts))
        self.flush()
        self.metadata_changed()
        for topic_log in self.logs.values():
            topic_log.close()
        self.logs.clear()
        os.close(self._lock_fd)


def _sync_all(logs: list[TopicLog]) -> None:
    for topic_log in logs:
        topic_log.sync()
