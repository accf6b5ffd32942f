"""Storage: what the core calls so that durable topics survive a restart.

The core always has a ``Store``: ``MemoryStore`` (no ``--data-path``: nothing
to write) or ``DiskStore``. What is where under ``--data-path``:

- ``topics/t-NAME/NNNNNNNN.log``: the topic's log (see ``records``): its
  channels and paused state, a PUB per message (written before the publish
  is acknowledged), and per-channel FIN, DEFER, ATTEMPTS and EMPTY records;
- ``LOCK``: held by the running broker, so a second one is refused.

Recovery replays each log in order: a message is pending in exactly the durable
channels the log names when it went to the topic's channels (at its PUB, or
at the FLUSH of the topic's hold), until a FIN, an EMPTY or the channel's
deletion; deferred ones keep their deliver-at time and every message its
``attempts``. ``#ephemeral`` topics and channels never reach the disk. A start
reads everything before it writes anything, so a start that fails leaves the
data path as it was.

Writes: a PUB, and the record of an admin call (topic or channel created or
deleted, pause, empty, settings), is written with ``write(2)`` before the reply,
together with every record queued before it (one ordered buffer per topic, so
nothing is reordered); an admin call whose record cannot be written fails and
changes nothing. Other records are written at the end of the event-loop pass (a
channel's FINs and delivery counts of a pass in one record each). fsync,
closing rolled files and deletes run in one storage thread, every
``--sync-every`` messages or ``--sync-timeout``; the first sync after a start
also fsyncs every file found (what a killed broker wrote but never fsynced).
Messages that wait on disk only are read back in a reader thread of their own,
ahead of their channel's cursor (``Backlog``). A write that fails is cut
back off the file and the publisher gets ``StorageFailed``; after a failed
fsync every publish is refused until a sync succeeds, and no file is deleted
until what replaced it is synced. A read that fails (EMFILE, EIO) is retried
after a back-off (``ReadLater``); only a record that fails its check is lost.
"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import json
import logging
import os
import time
from array import array
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Sequence

from .. import deadletter
from ..backlog import ReadLater
from ..errors import AdminFailed, InvalidChannel, QueueFull, StorageFailed
from ..message import Message, Published
from ..options import Options
from . import fileops, records
from .replay import Replay
from .segments import OFFSET_BITS, TopicLog, segment_of

if TYPE_CHECKING:
    from ..channel import Channel
    from ..core import Broker
    from ..topic import Topic

log = logging.getLogger("pynsqd")

# The oldest segment of a topic is copied out (its pending messages written anew)
# when this few copies still hold it and newer segments exist, so one old
# message (a long deferral, a stuck consumer) cannot keep every later file;
# only once that count has not fallen for this long (seconds): a file its
# consumers are reading through drains by itself.
RELOCATE_AT_MOST = 1024
RELOCATE_AFTER = 1.0
# ... and only when what the copy writes is at most 1/RELOCATE_GAIN of the bytes it lets
# go (the file and the drained ones after it). Each byte of the log is let go once, so
# the bytes copied stay under 1/(RELOCATE_GAIN - 2) of all other bytes written (a half),
# and a file is kept only while over a quarter of it is pending: an idle backlog, which
# would let go of nothing, is never copied round and round.
RELOCATE_GAIN = 4
# Bytes of a log file read at once at start.
SCAN_BLOCK = 4 << 20
# A start reads a channel's share of --mem-queue-size into memory only when it is at least
# this many messages (fewer are not worth a read per channel: read ahead when consumed).
RESTORE_MIN_SHARE = 64
# Of the open-file limit, what durable topics may not take (each keeps its log file open):
# an eighth, and at least this many, for connections, listeners and brief opens.
FD_RESERVE_SHARE = 8
FD_RESERVE_MIN = 64
# After a read of messages waiting on disk fails (EMFILE, EIO, ...), its channel waits
# this long before the next try, doubling up to READ_RETRY_MAX while reads fail.
READ_RETRY_FIRST = 0.05
READ_RETRY_MAX = 5.0


class DataPathLocked(RuntimeError):
    """Another broker holds the data path."""


class DataPathUnwritable(OSError):
    """A start could not write to the data path (full, read-only, no permission)."""


class _SyncFailed(Exception):
    """An fsync failed: what it covered is kept to be synced (and deleted) again."""

    def __init__(self, first: OSError, retired: list[int], deleted: list[Path]) -> None:
        super().__init__(str(first))
        self.first, self.retired, self.deleted = first, retired, deleted


class Store:
    """What the core tells storage. This base keeps nothing (memory only)."""

    spill_limit: int | None = None     # ready messages kept in memory; None: all

    def published(self, topic: "Topic", run: Published, defers: list[int],
                  producer: bytes | None = None) -> None:
        """Before ``run``'s messages are queued (and setting where they are on disk, its
        ``runs``); raises ``StorageFailed`` to refuse them."""

    def load(self, topic: "Topic", loc: int) -> Message | None:
        raise AssertionError("a memory-only broker has nothing on disk")

    def read_ahead(self, topic: "Topic", locs: Sequence[int],
                   done: Callable[[list[Message | None] | None], None],
                   cached_only: bool = False) -> bool:
        """Read the messages at ``locs`` without waiting for the disk on the event loop;
        ``done`` gets them (None for one that fails its check; None for all if the read
        failed), on the loop: at once, before this returns, when the page cache holds
        them, else from a thread (unless ``cached_only``). False: cannot (no running
        loop, or not in the page cache with ``cached_only``), read them with ``load``."""
        return False

    def delivered(self, channel: "Channel", msgs: Iterable[Message]) -> None: ...
    def finished(self, channel: "Channel", msgs: list[Message],
                 ids: list[str] | None = None) -> None:
        """``msgs`` were FINed (``ids``: their ids in order, when the caller has them)."""
    def deferred(self, channel: "Channel", msg: Message, delay: float) -> None: ...
    def emptying(self, topic: "Topic", channel: "Channel | None") -> None:
        """Before the channel (None: the topic's hold) is emptied by a call; raises
        ``StorageFailed`` to refuse it (then nothing may change)."""

    def dropped(self, topic: "Topic", channel: "Channel | None", msgs: list[Message],
                on_disk: list[int]) -> None:
        """Queued messages dropped: in memory, and waiting on disk only."""

    def held_flushed(self, topic: "Topic", msgs: list[Message], on_disk: Iterable[int]) -> None:
        """What the topic held went to each of its channels (``on_disk``: the log
        locations of what waits on disk only, an iterator read at most once)."""

    # Admin changes: called before the change is made in memory (with the state it
    # makes: a channel not yet in its topic, ``paused`` already set, ...); each raises
    # ``StorageFailed`` when its record cannot be written, and the caller changes nothing.
    def topic_created(self, topic: "Topic") -> None: ...
    def topic_deleted(self, topic: "Topic") -> None: ...
    def topic_changed(self, topic: "Topic") -> None: ...
    def channel_created(self, channel: "Channel") -> None: ...
    def channel_deleted(self, channel: "Channel") -> None: ...
    def channel_changed(self, channel: "Channel") -> None: ...
    def config_changed(self, topic: "Topic", channel: "Channel | None") -> None:
        """The topic's (``channel`` None) or a channel's settings changed."""

    def read_errors(self, topic: "Topic") -> int:
        """Reads of the topic's messages waiting on disk that failed and were retried."""
        return 0
    def flush(self) -> None:
        """Write what is queued (FINs, deliveries, metadata changes) before the broker
        answers a call that reports or acknowledges it."""

    def tick(self) -> None: ...
    def close(self) -> None: ...

    def disk_bytes(self, topic: "Topic") -> int:
        """Bytes of the topic's files on disk."""
        return 0

    def rewritten_bytes(self, topic: "Topic") -> int:
        """Bytes of the topic's pending messages copied to the end of its log since the
        start (so that an old file could go)."""
        return 0

    def pinned_bytes(self, channel: "Channel", oldest: Callable[[], int]) -> int:
        """Bytes on disk kept for ``channel``, whose oldest message is at ``oldest()``
        (called only by a store that logs the channel's topic: it walks the channel)."""
        return 0


class MemoryStore(Store):
    """No ``--data-path``: nothing to write, and nowhere to spill. With
    ``max_memory_bytes``, a publish that would queue more body bytes (each
    channel's copy counted) is refused, as by a full queue."""

    def __init__(self, max_memory_bytes: int = 0) -> None:
        self.limit = max_memory_bytes
        self.queued_bytes = 0

    def published(self, topic: "Topic", run: Published, defers: list[int],
                  producer: bytes | None = None) -> None:
        if not self.limit:
            return
        copies = 1 if topic.holds else len(topic.channels)
        incoming = run.size * copies
        if self.queued_bytes + incoming > self.limit:
            raise QueueFull(f"PUB to {topic.name} refused: the broker holds "
                            f"{self.queued_bytes} bytes of queued messages, and "
                            f"{incoming} more would pass max-memory-bytes ({self.limit}); "
                            f"retry once consumers catch up")
        self.queued_bytes += incoming

    def finished(self, channel: "Channel", msgs: list[Message],
                 ids: list[str] | None = None) -> None:
        if self.limit:
            self.queued_bytes -= sum(len(m.body) for m in msgs)

    def dropped(self, topic: "Topic", channel: "Channel | None", msgs: list[Message],
                on_disk: list[int]) -> None:
        if self.limit:
            self.queued_bytes -= sum(len(m.body) for m in msgs)

    def held_flushed(self, topic: "Topic", msgs: list[Message], on_disk: Iterable[int]) -> None:
        if self.limit:
            self.queued_bytes += sum(len(m.body) for m in msgs) * (len(topic.channels) - 1)


@dataclass
class _Batch:
    """FINs (ids) or deliveries (messages) of one channel, gathered into one record."""
    kind: int
    channel: str
    entries: list = field(default_factory=list)
    finishes: int = 0           # the store's FINs counted when the batch was made

    def encode(self, finishes: int) -> bytes:
        """The batch's records; ``finishes``: the store's FINs counted now."""
        if self.kind == records.FIN:
            return records.fins_of(self.channel, self.entries)
        # Messages delivered, with their count as it is now; a FINed one has no
        # location any more and needs none, and is looked for only if a FIN came since
        # the batch was made (a pass's deliveries are written before their FINs come).
        # (Comprehensions: on Python 3.11 a map of an attrgetter makes a tuple per
        # call, twice their cost.)
        held = ([msg for msg in self.entries if msg.loc] if finishes != self.finishes
                else self.entries)
        return records.attempts_of(self.channel, [msg.id for msg in held],
                                   [msg.attempts for msg in held])


@dataclass
class _Change:
    """A record that changes the topic's channels or paused state; ``apply``
    updates what the log says once the record is written."""
    data: bytes
    apply: Callable[["_Logged"], None]


@dataclass
class _Logged:
    """The topic's state as its log says it (what a new segment's STATE records)."""
    paused: bool = False
    channels: dict[str, bool] = field(default_factory=dict)
    config: dict[str, bytes] = field(default_factory=dict)  # "" or channel -> settings

    def record(self) -> bytes:
        return records.state(self.paused, self.channels) + b"".join(
            records.config(name, data) for name, data in self.config.items()
            if not name or name in self.channels)


Queued = bytes | _Batch | _Change



def lock_data_path(path: "str | os.PathLike[str]") -> int:
    """Hold ``PATH/LOCK`` (the open descriptor, kept for the holder's life): a second
    pynsqd on the same data path is refused, naming it."""
    fd = os.open(Path(path) / "LOCK", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise DataPathLocked(f"data path {path} is in use by another pynsqd "
                             f"(its LOCK file is held)") from None
    return fd

class DiskStore(Store):
    def __init__(self, broker: "Broker", options: Options,
                 files: fileops.Files | None = None) -> None:
        self.broker = broker
        self.options = options
        self.files = files or fileops.current
        self.spill_limit = options.mem_queue_size
        self._leased: dict[str, dict[str, set[int]]] = {}   # see ``recover``
        self.path = Path(options.data_path)
        self.files.mkdir(str(self.path))
        self._lock_fd = self._lock()
        self.logs: dict[str, TopicLog] = {}
        self._logged: dict[str, _Logged] = {}
        self._queued: dict[str, list[Queued]] = {}
        # The FIN and ATTEMPTS batches of each channel that later ones join, by topic:
        # only batches are queued after them (anything else closes them), so one
        # record per channel and kind carries all of a run of passes' deliveries.
        self._open: dict[str, dict[tuple[int, "Channel"], _Batch]] = {}
        self._finishes = 0      # calls of ``finished`` that took a location away
        self._dedupe: dict[str, dict[int, list[bytes]]] = {}
        # topic -> (its oldest segment, copies holding it, since when) while few hold it
        self._oldest: dict[str, tuple[int, int, float]] = {}
        # topic -> (segment, copies, bytes a copy would write) of a copy found not worth it
        self._not_worth: dict[str, tuple[int, int, int]] = {}
        self.rewritten: Counter[str] = Counter()  # topic -> bytes copied to the log's end
        self._unsynced = 0
        self._last_sync = time.monotonic()
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="pynsq-storage")
        self._sync: Future | None = None
        # Messages waiting on disk are read back here, ahead of their channel's cursor
        # (a thread of its own: a read never waits behind an fsync).
        self._reader = ThreadPoolExecutor(1, thread_name_prefix="pynsq-read")
        self._new_dirs: list[str] = []
        # Files found at start: fsynced by the first sync, since a broker killed before
        # its last sync may have left writes in them that were never fsynced.
        self._found: list[str] = []
        self._syncing_found: list[str] = []
        self._flush_scheduled = False
        self._restoring = False
        self._write_failed = False
        self.failed: str | None = None      # why publishes are refused (a failed fsync)
        # What a failed sync covered: fsynced (and deleted) by the next one.
        self._sync_retired: list[int] = []
        self._sync_deleted: list[Path] = []
        # Reads of messages waiting on disk that failed, by topic, and when to try again.
        self._read_errors: Counter[str] = Counter()
        self._read_backoff: dict[str, float] = {}   # topic -> seconds, while reads fail

    # -- the lock ---------------------------------------------------------
    def _lock(self) -> int:
        return lock_data_path(self.path)

    # -- topics' logs -----------------------------------------------------
    def _dir(self, name: str) -> Path:
        # A prefix keeps names such as "." and ".." from being paths.
        return self.path / "topics" / f"t-{name}"

    def _new_log(self, name: str) -> TopicLog:
        logged = self._logged.setdefault(name, _Logged())
        topic_log = TopicLog(self._dir(name), self.options.max_bytes_per_file, self.files,
                             logged.record)
        topic_log.on_reclaim = lambda seg: self._segment_reclaimed(name, seg)
        topic_log.next_id = lambda: self.broker.new_id._next
        return topic_log

    def _durable(self, channel: "Channel") -> bool:
        return not (channel.ephemeral or channel.topic.ephemeral)

    def _queue(self, topic: "Topic", item: Queued) -> None:
        if topic.ephemeral or self._restoring:
            return
        self._queued.setdefault(topic.name, []).append(item)
        self._open.pop(topic.name, None)
        self._flush_soon()

    def _queue_batch(self, channel: "Channel", kind: int, entries: list) -> None:
        if self._restoring:
            return
        name = channel.topic.name
        batches = self._open.setdefault(name, {})
        batch = batches.get((kind, channel))
        if batch is None:
            batch = batches[(kind, channel)] = _Batch(kind, channel.name, [], self._finishes)
            self._queued.setdefault(name, []).append(batch)
            self._flush_soon()
        batch.entries += entries

    # -- what the core tells ----------------------------------------------
    def published(self, topic: "Topic", run: Published, defers: list[int],
                  producer: bytes | None = None) -> None:
        if topic.ephemeral:
            return
        if self.failed:
            raise StorageFailed(f"PUB to {topic.name} refused: the data path cannot be "
                                f"synced ({self.failed}); retry later")
        topic_log = self.logs[topic.name]
        n = len(run)
        expires = run.expires
        limit = self.options.max_disk_bytes
        if limit:
            used = sum(t.disk_bytes for t in self.logs.values())
            incoming = (run.size + n * (records.HEADER_SIZE + records.PUB_HEAD.size)
                        + (records.PUB_EXPIRES.size * (n - expires.count(0))
                           if expires else 0))
            if used + incoming > limit:
                raise StorageFailed(f"PUB to {topic.name} refused: the data path holds {used} "
                                    f"bytes, and {incoming} more would pass max-disk-bytes "
                                    f"({limit}); retry once consumers catch up")
        now_ns = self.broker.clock.wall_ns()
        held = topic.holds
        deliver_ats = [now_ns + d * 1_000_000 if d else 0 for d in defers] if any(defers) \
            else None
        # An MPUB's messages under one checksum: message i is at its record's location + i.
        # Made under the file's key (no pass to seal them); what was queued is sealed.
        key = topic_log.key
        data, runs = records.publish(run.raw_ids, run.timestamp, run.bodies, deliver_ats,
                                     expires if expires and any(expires) else None, held,
                                     key)
        queued, prefix = self._encode_queued(topic.name)
        try:
            if prefix or producer is not None:
                data = b"".join((records.seal(prefix, key) if prefix else b"", data,
                                 records.dedupe(producer, key) if producer is not None
                                 else b""))
            loc = topic_log.append(data, run.raw_ids, key)
        except OSError as err:
            log.error("%s: a publish could not be written: %s", topic_log.dir, err)
            raise StorageFailed(f"PUB to {topic.name} failed: the data path could not take "
                                f"it ({err.strerror or err}); nothing was accepted") from None
        self._written(topic.name, queued)
        loc += len(prefix)
        run.runs = [(loc + start, count) for start, count in runs]
        for start, count in runs:
            if count > 1:
                topic_log.add_batch(loc + start, count)
        seg = segment_of(loc)
        topic_log.hold(seg, (1 if held else len(topic.channels)) * n)
        if producer is not None:
            self._dedupe.setdefault(topic.name, {}).setdefault(seg, []).append(producer)
        self._unsynced += n

    def load(self, topic: "Topic", loc: int) -> Message | None:
        """A message that waited on disk only, read back (None: its record fails its
        check, the one case that loses it). A read that fails (EMFILE, EIO, ...) is no
        verdict on the message: ``ReadLater`` is raised, it stays pending and is read
        again after a back-off."""
        name = topic.name
        topic_log = self.logs[name]
        try:
            msg = topic_log.read_message(loc)
        except OSError as err:
            raise ReadLater(name, self._read_failed(name, topic_log, err)) from None
        if msg is None:
            seg = segment_of(loc)
            log.error("%s: the record at offset %d fails its check: a message of it is lost",
                      topic_log.path(seg), topic_log.record_offset(loc))
            topic_log.release(seg)
            return None
        if name in self._read_backoff:
            self._read_works(name, topic_log)
        return msg

    def _load_all(self, topic: "Topic", locs: array) -> "list[Message | None]":
        """``load`` of each of ``locs`` (in log order), read in bulk."""
        name = topic.name
        topic_log = self.logs[name]
        try:
            msgs = topic_log.read_many(locs)
        except OSError as err:
            raise ReadLater(name, self._read_failed(name, topic_log, err)) from None
        for loc, msg in zip(locs, msgs):
            if msg is None:
                seg = segment_of(loc)
                log.error("%s: the record at offset %d fails its check: a message of it is "
                          "lost", topic_log.path(seg), topic_log.record_offset(loc))
                topic_log.release(seg)
        return msgs

    def _read_failed(self, name: str, topic_log: TopicLog, err: OSError) -> float:
        """A read failed: count it, and say how long to wait before the next (doubling
        from READ_RETRY_FIRST up to READ_RETRY_MAX while reads keep failing)."""
        self._read_errors[name] += 1
        backoff = min(self._read_backoff.get(name, READ_RETRY_FIRST / 2) * 2, READ_RETRY_MAX)
        self._read_backoff[name] = backoff
        log.warning("%s: reading messages waiting on disk failed: %s; they stay pending, "
                    "read again in %.2fs (%d failed reads so far)", topic_log.dir, fileops.describe(err),
                    backoff, self._read_errors[name])
        return backoff

    def _read_works(self, name: str, topic_log: TopicLog) -> None:
        del self._read_backoff[name]
        log.warning("%s: reading messages waiting on disk works again", topic_log.dir)

    def read_errors(self, topic: "Topic") -> int:
        return self._read_errors.get(topic.name, 0)

    def read_ahead(self, topic: "Topic", locs: Sequence[int],
                   done: Callable[[list[Message | None] | None], None],
                   cached_only: bool = False) -> bool:
        topic_log = self.logs.get(topic.name)
        if topic_log is None:
            return False
        # What the page cache holds (a streaming consumer's messages, written moments
        # ago) costs a memory copy: read it here, and spare the thread's hand-offs.
        try:
            msgs = topic_log.read_cached(locs)
        except OSError as err:
            if not isinstance(err, FileNotFoundError):  # else: deleted
                self._read_failed(topic.name, topic_log, err)
            done(None)
            return True
        if msgs is not None:
            done(msgs)
            return True
        if cached_only:
            return False
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return False

        def arrived(future: Future) -> None:
            err = future.exception()
            if isinstance(err, OSError) and not isinstance(err, FileNotFoundError):
                self._read_failed(topic.name, topic_log, err)  # (FileNotFound: deleted)
            done(None if err is not None else future.result())

        def finished(future: Future) -> None:
            try:
                loop.call_soon_threadsafe(arrived, future)
            except RuntimeError:  # the loop is closed: nobody waits any more
                pass

        try:
            self._reader.submit(topic_log.read_messages, locs).add_done_callback(finished)
        except RuntimeError:  # shut down
            return False
        return True

    def delivered(self, channel: "Channel", msgs: list[Message]) -> None:
        if self._durable(channel):
            self._queue_batch(channel, records.ATTEMPTS, msgs)

    def finished(self, channel: "Channel", msgs: list[Message],
                 ids: list[str] | None = None) -> None:
        locs = [msg.loc for msg in msgs]
        # (``all``: a truth test of each, where ``0 in`` makes a comparison of each)
        if not all(locs):  # some were never on disk (ephemeral, or already FINed)
            msgs = [m for m, loc in zip(msgs, locs) if loc]
            locs = [loc for loc in locs if loc]
            ids = None
        if not locs:
            return
        if self._durable(channel):
            self._queue_batch(channel, records.FIN, [msg.id for msg in msgs] if ids is None
                              else ids)
        for msg in msgs:
            msg.loc = 0  # gone: no delivery count is written for it any more
        self._finishes += 1
        topic_log = self.logs[channel.topic.name]
        # Each message FINed is pending in a file holding some: the oldest such or a later
        # one. While one file alone holds any (a consumer that keeps up), every message is
        # in it, with no look at their locations; while several do (a backlog read from
        # its oldest file), they all are in the oldest when the largest location is
        # (comparing the locations, two-digit numbers, is a third of what storage does for
        # a FIN).
        holder = topic_log.oldest_holder()
        if holder is not None and (holder[1] or max(locs) >> OFFSET_BITS == holder[0]):
            topic_log.release(holder[0], len(locs))
            return
        first, last = min(locs) >> OFFSET_BITS, max(locs) >> OFFSET_BITS
        if first == last:
            topic_log.release(first, len(locs))
            return
        for seg, count in Counter(loc >> OFFSET_BITS for loc in locs).items():
            topic_log.release(seg, count)

    def deferred(self, channel: "Channel", msg: Message, delay: float) -> None:
        if msg.loc and self._durable(channel):
            at = self.broker.clock.wall_ns() + int(delay * 1e9)
            self._queue(channel.topic, records.defer(channel.name, int(msg.id, 16), at,
                                                     msg.attempts))

    def dropped(self, topic: "Topic", channel: "Channel | None", msgs: list[Message],
                on_disk: list[int]) -> None:
        if topic.ephemeral:
            return
        topic_log = self.logs.get(topic.name)
        if topic_log is not None:
            for loc in [*(m.loc for m in msgs if m.loc), *on_disk]:
                topic_log.release(segment_of(loc))

    def held_flushed(self, topic: "Topic", msgs: list[Message], on_disk: Iterable[int]) -> None:
        if topic.ephemeral:
            return
        self._queue(topic, records.flush())
        extra = len(topic.channels) - 1
        if extra <= 0:  # one channel takes over the topic's own hold on each message
            return
        topic_log = self.logs[topic.name]
        per_segment = Counter(map(segment_of, [m.loc for m in msgs if m.loc]))
        per_segment.update(map(segment_of, on_disk))
        for seg, count in per_segment.items():
            topic_log.hold(seg, count * extra)

    def disk_bytes(self, topic: "Topic") -> int:
        topic_log = self.logs.get(topic.name)
        return topic_log.disk_bytes if topic_log is not None else 0

    def rewritten_bytes(self, topic: "Topic") -> int:
        return self.rewritten.get(topic.name, 0)

    def pinned_bytes(self, channel: "Channel", oldest: Callable[[], int]) -> int:
        topic_log = self.logs.get(channel.topic.name)
        if topic_log is None:
            return 0
        loc = oldest()
        return topic_log.bytes_from(segment_of(loc)) if loc else 0

    def max_topics(self) -> int:
        """The durable topics the open-file limit lets this broker hold and restart: each
        keeps one file open; ``FD_RESERVE`` of the limit is kept for everything else
        (connections, listeners, the files a start or a read opens for a moment)."""
        limit = fileops.open_file_limit()
        return max(1, limit - max(FD_RESERVE_MIN, limit // FD_RESERVE_SHARE))

    def topic_created(self, topic: "Topic") -> None:
        if topic.ephemeral or self._restoring:
            return
        if len(self.logs) >= self.max_topics():
            raise AdminFailed(
                f"topic {topic.name} could not be created: this broker holds "
                f"{len(self.logs)} durable topics, the most its open-file limit "
                f"({fileops.open_file_limit()}, `ulimit -n`) lets it keep open and restart "
                f"(one file each, and a reserve for connections); raise the limit (e.g. "
                f"`ulimit -n 65536` before starting) or delete topics; nothing was changed")
        topic_log = self._new_log(topic.name)
        settings = deadletter.settings_of(topic, None)
        if settings:  # made with its settings (a ttl): written in the first file's one write
            self._logged[topic.name].config[""] = json.dumps(settings, sort_keys=True).encode()
        try:
            topic_log.start_appending()
        except OSError as err:
            self._logged.pop(topic.name, None)
            if not topic_log.segment_numbers():  # leave no directory a start would restore
                self.files.rmtree(str(topic_log.dir))
            log.error("%s: topic %s could not be created: %s", topic_log.dir, topic.name, err)
            raise AdminFailed(f"topic {topic.name} could not be created: the data path "
                                f"could not take it ({fileops.describe(err)}); nothing was "
                                f"changed") from None
        self.logs[topic.name] = topic_log
        self._new_dirs.append(str(topic_log.dir.parent))

    def topic_deleted(self, topic: "Topic") -> None:
        topic_log = self.logs.get(topic.name)
        if topic_log is not None:
            # A rename is atomic: the topic is gone from the next start even if the
            # deletion of its files (in the storage thread) never ends. One that fails
            # refuses the deletion: the topic would be back at the next start.
            trash = self.path / "topics" / f"trash-{time.time_ns()}"
            try:
                self.files.rename(str(topic_log.dir), str(trash))
            except OSError as err:
                log.error("%s: topic %s could not be deleted: %s", topic_log.dir,
                          topic.name, err)
                raise AdminFailed(f"topic {topic.name} could not be deleted: the data path "
                                    f"could not take it ({err.strerror or err}); nothing was "
                                    f"changed") from None
            self._new_dirs.append(str(trash.parent))
            fds = [topic_log._fd, *topic_log.retired, *topic_log._readers.values()]
            self._executor.submit(_close_and_remove, self.files, fds, trash)
        self._queued.pop(topic.name, None)
        self._open.pop(topic.name, None)
        self._logged.pop(topic.name, None)
        self._dedupe.pop(topic.name, None)
        self._oldest.pop(topic.name, None)   # a topic made anew under the name starts over
        self._not_worth.pop(topic.name, None)
        self.rewritten.pop(topic.name, None)
        self._read_backoff.pop(topic.name, None)
        self.logs.pop(topic.name, None)

    def _write_change(self, topic: "Topic", what: str, change: _Change) -> None:
        """Write an admin change's record now, after what is queued before it, so that
        the call is answered only once it is written; raise ``StorageFailed`` (and write
        nothing) when it cannot be."""
        if topic.ephemeral or self._restoring:
            return
        topic_log = self.logs.get(topic.name)
        if topic_log is None:
            return
        queued, prefix = self._encode_queued(topic.name)
        try:
            topic_log.append(prefix + change.data)
        except OSError as err:
            log.error("%s: %s failed: %s", topic_log.dir, what, err)
            raise AdminFailed(f"{what} failed: the data path could not take its record "
                                f"({err.strerror or err}); nothing was changed") from None
        self._written(topic.name, queued)
        change.apply(self._logged[topic.name])

    def topic_changed(self, topic: "Topic") -> None:
        paused = topic.paused

        def apply(logged: _Logged) -> None:
            logged.paused = paused

        self._write_change(topic, f"{'pause' if paused else 'unpause'} of topic {topic.name}",
                           _Change(records.topic_op(records.PAUSE if paused
                                                    else records.UNPAUSE), apply))

    def channel_created(self, channel: "Channel") -> None:
        if self._durable(channel):
            topic, name = channel.topic, channel.name
            durable = 0 if self._restoring else sum(not c.ephemeral
                                                    for c in topic.channels.values())
            if durable >= records.MAX_CHANNELS:
                raise InvalidChannel(f"channel {topic.name}/{name} refused: the topic has "
                                     f"{durable} durable channels, the most its log holds")
            self._write_change(topic, f"creation of channel {topic.name}/{name}",
                               _Change(records.channel_op(records.CREATE, name),
                                       lambda logged: logged.channels.setdefault(name, False)))

    def channel_deleted(self, channel: "Channel") -> None:
        if self._durable(channel):
            name = channel.name

            def apply(logged: _Logged) -> None:
                logged.channels.pop(name, None)
                logged.config.pop(name, None)

            self._write_change(channel.topic, f"deletion of channel {channel.topic.name}/{name}",
                               _Change(records.channel_op(records.DELETE, name), apply))

    def channel_changed(self, channel: "Channel") -> None:
        if self._durable(channel):
            name, paused = channel.name, channel.paused

            def apply(logged: _Logged) -> None:
                if name in logged.channels:
                    logged.channels[name] = paused

            op = records.PAUSE if paused else records.UNPAUSE
            self._write_change(channel.topic, f"{'pause' if paused else 'unpause'} of channel "
                               f"{channel.topic.name}/{name}",
                               _Change(records.channel_op(op, name), apply))

    def config_changed(self, topic: "Topic", channel: "Channel | None") -> None:
        if channel is not None and not self._durable(channel):
            return
        name = channel.name if channel is not None else ""
        data = json.dumps(deadletter.settings_of(topic, channel), sort_keys=True).encode()

        def apply(logged: _Logged) -> None:
            logged.config[name] = data

        self._write_change(topic, f"settings of {topic.name}/{name}" if name else
                           f"settings of topic {topic.name}",
                           _Change(records.config(name, data), apply))

    def emptying(self, topic: "Topic", channel: "Channel | None") -> None:
        if channel is not None and not self._durable(channel):
            return
        name = channel.name if channel is not None else ""
        self._write_change(topic, f"empty of {topic.name}/{name}" if name else
                           f"empty of topic {topic.name}",
                           _Change(records.empty(name), lambda logged: None))

    # -- writing what is queued -------------------------------------------
    def _encode_queued(self, name: str) -> tuple[list[Queued], bytes]:
        queued = self._queued.get(name) or []
        parts = []
        for item in queued:
            if type(item) is bytes:
                parts.append(item)
            elif type(item) is _Batch:
                parts.append(item.encode(self._finishes))
            else:
                parts.append(item.data)
        return queued, b"".join(parts)

    def _written(self, name: str, queued: list[Queued]) -> None:
        self._open.pop(name, None)
        logged = self._logged.get(name)
        for item in queued:
            if type(item) is _Change and logged is not None:
                item.apply(logged)
        if queued:
            del self._queued[name]

    def _flush_soon(self) -> None:
        if self._flush_scheduled or self._restoring:
            return
        try:
            asyncio.get_running_loop().call_soon(self.flush)
        except RuntimeError:  # no loop (tests of the core, shutting down): tick/close flush
            return
        self._flush_scheduled = True

    def flush(self) -> None:
        """Write every queued record, one append per topic."""
        self._flush_scheduled = False
        if not self._queued:
            return
        for name in list(self._queued):
            queued, data = self._encode_queued(name)
            topic_log = self.logs.get(name)
            if not data or topic_log is None:
                self._queued.pop(name, None)
                self._open.pop(name, None)
                continue
            try:
                topic_log.append(data)
            except OSError as err:
                if not self._write_failed:
                    log.error("%s: could not write FIN/REQ records: %s (kept; retried)",
                              topic_log.dir, err)
                self._write_failed = True
                continue
            self._write_failed = False
            self._written(name, queued)

    def _segment_reclaimed(self, name: str, seg: int) -> None:
        """A segment is about to go: note it (a start then knows the oldest file it
        should find), and keep its live de-duplication entries."""
        self._queued.setdefault(name, []).append(records.file_gone(seg))
        for payload in self._dedupe.get(name, {}).pop(seg, []):
            if self.broker.dedupe.is_live(payload):
                self._queued.setdefault(name, []).append(records.dedupe(payload))
                current = self.logs[name].current if name in self.logs else seg
                self._dedupe[name].setdefault(current, []).append(payload)

    def _relocate_stragglers(self) -> None:
        now = self.broker.clock.monotonic()
        for name, topic_log in list(self.logs.items()):
            topic_log.reclaim()  # a head file that never held a message (only a STATE)
            refs = topic_log.refs
            head = min(refs) if len(refs) >= 3 else -1
            count = refs.get(head, 0)
            if not (0 <= head < topic_log.current and 0 < count <= RELOCATE_AT_MOST):
                self._oldest.pop(name, None)
                continue
            seen = self._oldest.get(name)
            if seen is None or seen[0] != head or count < seen[1]:
                self._oldest[name] = (head, count, now)  # still draining: wait and see
                continue
            if now - seen[2] < RELOCATE_AFTER:
                continue
            known = self._not_worth.get(name)
            if (known is not None and known[:2] == (head, count)
                    and known[2] * RELOCATE_GAIN > topic_log.freed_by(head)):
                continue  # the same copies, and still not enough to let go of
            del self._oldest[name]
            topic = self.broker.topics.get(name)
            if topic is not None:
                self._relocate(topic, topic_log, head)

    def _relocate(self, topic: "Topic", topic_log: TopicLog, seg: int) -> None:
        """Copy the messages still pending in ``seg`` to the end of the log (MOVE
        records naming where each copy is pending), so that ``seg`` can go."""
        now_ns, now = self.broker.clock.wall_ns(), self.broker.clock.monotonic()
        by_loc: dict[int, list[tuple[str, int, int]]] = {}
        count = 0
        sources = [(None if c.ephemeral else c.name, c.copies())
                   for c in topic.channels.values()]
        sources.append(("", topic.copies()))
        for name, copies in sources:
            for loc, attempts, until in copies:
                if segment_of(loc) != seg:
                    continue
                count += 1
                entry = by_loc.setdefault(loc, [])
                if name is not None:
                    at = now_ns + int((until - now) * 1e9) if until > now else 0
                    entry.append((name, attempts, at))
        if count != topic_log.refs.get(seg):
            log.warning("%s: segment %d: %d copies found, %s counted; not moved",
                        topic_log.dir, seg, count, topic_log.refs.get(seg))
            return
        try:
            parts = []
            for loc, entry in by_loc.items():
                msg_id, ts, body, expires = topic_log.read_pub(loc)
                parts.append(records.move(msg_id, ts, entry, body, expires))
            size = sum(map(len, parts))
            if size * RELOCATE_GAIN > topic_log.freed_by(seg):
                self._not_worth[topic.name] = (seg, count, size)
                return
            queued, prefix = self._encode_queued(topic.name)
            start = topic_log.append(prefix + b"".join(parts))
        except (OSError, records.DamagedRecord) as err:
            log.error("%s: could not move what segment %d holds: %s", topic_log.dir, seg, err)
            return
        self._written(topic.name, queued)
        self._not_worth.pop(topic.name, None)
        self.rewritten[topic.name] += size
        moved, loc = {}, start + len(prefix)
        for old, part in zip(by_loc, parts):
            moved[old] = loc
            loc += len(part)
        for channel in topic.channels.values():
            channel.relocate(moved)
        topic.relocate(moved)
        topic_log.hold(segment_of(start), count)
        topic_log.release(seg, count)

    # -- time -------------------------------------------------------------
    def tick(self) -> None:
        """Write queued records; start an fsync when one is due."""
        self.flush()
        self._relocate_stragglers()
        self._check_sync()
        now = time.monotonic()
        due = (self.failed is not None or self._unsynced >= max(1, self.options.sync_every)
               or now - self._last_sync >= self.options.sync_timeout / 1000)
        if due and self._sync is None:
            work = self._sync_work()
            if any(work):
                self._unsynced = 0
                self._last_sync = now
                self._start_sync(work)

    def _start_sync(self, work: tuple) -> None:
        self._syncing_found = work[4]
        self._sync = self._executor.submit(_sync_all, self.files, *work)

    def _sync_work(self) -> tuple[list[int], list[int], list[Path], list[str], list[str]]:
        fds, retired, deleted = [], [], []
        for topic_log in self.logs.values():
            fd, old, gone = topic_log.take_sync_work()
            if fd >= 0:
                fds.append(fd)
            retired += old
            deleted += gone
        dirs, self._new_dirs = self._new_dirs, []
        found, self._found = self._found, []
        # The lease journal is fsynced with the logs (by path, as files found at start
        # are): a power loss leaves the leases as they were at the last completed sync,
        # beside the messages they claim.
        journal = self.broker.lease_journal
        journal_path = journal.take_sync_work() if journal is not None else None
        if journal_path is not None:
            found.append(journal_path)
        # What a failed sync left goes first (its deletions after everything is synced).
        retired = self._sync_retired + retired
        deleted = self._sync_deleted + deleted
        self._sync_retired, self._sync_deleted = [], []
        return fds, retired, deleted, dirs, found

    def _check_sync(self) -> None:
        future = self._sync
        if future is None or not future.done():
            return
        self._sync = None
        err = future.exception()
        if isinstance(err, _SyncFailed):
            self._sync_retired += err.retired
            self._sync_deleted += err.deleted
            err = err.first
        if err is not None:
            if self.failed is None:
                log.error("fsync of the data path failed: %s; publishes are refused until "
                          "a sync succeeds", err)
            self.failed = str(err)
            for topic_log in self.logs.values():
                topic_log.dirty = True
            self._found = self._syncing_found + self._found
        elif self.failed is not None:
            log.warning("fsync of the data path succeeded again: publishes are accepted")
            self.failed = None
        if err is None and self.broker.lease_journal is not None:
            self.broker.lease_journal.synced()

    def wait_synced(self) -> None:
        """fsync everything written so far, now (tests, and close)."""
        self.flush()
        if self._sync is not None:
            self._sync.exception()
            self._check_sync()
        self._start_sync(self._sync_work())
        self._sync.exception()
        self._check_sync()

    # -- start and stop ---------------------------------------------------
    def recover(self, leased: "dict[str, dict[str, set[int]]] | None" = None) -> None:
        """Restore topics, channels and every pending message from the data path.
        Reads everything before it writes anything. ``leased``: topic -> channel -> ids
        of messages a kept lease may take back; those that wait are restored in memory,
        at the front of their channel (as a lease gives its messages back), past
        ``--mem-queue-size``, so a replay takes back every one."""
        started = time.monotonic()
        self._leased = leased or {}
        self._restoring = self.broker.restoring = True
        restored = 0
        topics_dir = self.path / "topics"
        names = sorted(self.files.listdir(str(topics_dir)))
        try:
            replays = [self._replay(d[2:]) for d in names if d.startswith("t-")]
            # A directory with no log file is a topic whose creation failed (answered
            # with an error): not restored.
            empty = [r for r in replays if not r[1].sizes]
            replays = [r for r in replays if r[1].sizes]
            for replay, topic_log in empty:
                self._logged.pop(replay.name, None)
                log.warning("%s: no log file: topic %s was never created; removed",
                            topic_log.dir, replay.name)
            logs = []
            while replays:  # each replay goes once its topic is built
                replay, topic_log = replays.pop(0)
                restored += self._restore(replay, topic_log)
                topic_log.close_readers()
                logs.append(topic_log)
        finally:
            self._restoring = self.broker.restoring = False
        opened: list[TopicLog] = []
        self._found = [str(topic_log.path(seg)) for topic_log in logs for seg in topic_log.sizes]
        topic_log = None
        try:
            for topic_log in logs:
                topic_log.start_appending()
                opened.append(topic_log)
            for topic_log in opened:
                topic_log.reclaim()  # files left behind with nothing pending
        except OSError as err:
            for done in opened:
                done.abandon()
                self.files.unlink(str(done.path(done.current)))
            where = topic_log.dir if topic_log is not None else self.path
            if err.errno in (errno.EMFILE, errno.ENFILE):
                raise DataPathUnwritable(
                    err.errno, f"cannot start: could not open a new log file in {where} "
                    f"({len(opened)} of {len(logs)} topics opened): {fileops.describe(err)}. "
                    f"A start keeps one file open per durable topic (nothing was changed)"
                    ) from err
            raise DataPathUnwritable(
                err.errno, f"cannot start: could not write a new log file in {where}: "
                f"{err.strerror or err}. A start writes one new file per topic (nothing "
                f"was changed): free space on the file system of {self.path} (or make it "
                f"writable) and start again") from err
        for _, topic_log in empty:
            self._executor.submit(self.files.rmtree, str(topic_log.dir))
        for d in names:
            if d.startswith("trash-"):
                self._executor.submit(self.files.rmtree, str(topics_dir / d))
        log.info("data path %s: restored %d topic(s) and %d pending message(s) in %.2fs",
                 self.path, len(logs), restored, time.monotonic() - started)

    def _replay(self, name: str) -> tuple[Replay, TopicLog]:
        """Read a topic's log: what is pending where (no change to anything)."""
        topic_log = self._new_log(name)
        replay = Replay(name)
        previous = None
        for seg in topic_log.segment_numbers():
            if previous is not None and seg != previous + 1:
                # Files go oldest first: one missing between two others was lost
                # (deleted by hand, a file system check), and what it held with it.
                log.error("%s: topic %s: log file(s) %s missing: the messages they held "
                          "are lost (durable channels before them: %s)", topic_log.dir, name,
                          ", ".join(topic_log.path(n).name for n in range(previous + 1, seg)),
                          ", ".join(sorted(replay.channels)) or "none")
            previous = seg
            topic_log.sizes[seg], topic_log.keys[seg] = self._scan_file(
                topic_log.path(seg), lambda r, seg=seg: replay.read(seg, r), replay.damaged)
        topic_log.batches = replay.batches
        self._missing_ends(name, topic_log, replay)
        if replay.damage:
            log.error("%s: topic %s: damaged records skipped (file and offset above): %s",
                      topic_log.dir, name, "; ".join(f"{count} {what}" for what, count
                                                     in sorted(replay.damage.items())))
        return replay, topic_log

    def _missing_ends(self, name: str, topic_log: TopicLog, replay: Replay) -> None:
        """Say so when the oldest or newest file of a topic's log is missing, from the
        log's record of its files: which files, and which messages they held (by id)."""
        present = sorted(topic_log.sizes)
        if not present:
            return
        first, last = present[0], present[-1]
        oldest_kept = replay.rolls.get(last, (0, 0))[0]
        expected = max(oldest_kept, replay.deleted_upto + 1)
        if oldest_kept and first > expected:
            upto = replay.rolls.get(first, (0, 0))[1]
            log.error("%s: topic %s: oldest log file(s) %s missing (neither found nor deleted "
                      "by the broker): the messages pending in them are lost: those with ids "
                      "before %016x (durable channels: %s)", topic_log.dir, name,
                      ", ".join(topic_log.path(n).name for n in range(expected, first)), upto,
                      ", ".join(sorted(replay.channels)) or "none")
        if last in replay.forwards:
            after, since = replay.forwards[last]
            log.error("%s: topic %s: newest log file %s (and any after it) missing: every "
                      "message published to the topic from id %016x on is lost, with the "
                      "FINs and changes written there", topic_log.dir, name,
                      topic_log.path(after).name, since)

    def _scan_file(self, path: Path, read: Callable[[records.Record], None],
                   damaged: Callable[[bytes], None] | None = None) -> tuple[int, int]:
        """Feed every valid record of a file to ``read``, a block at a time (a whole
        segment in memory at once would set the peak of a start); returns its size and
        its key."""
        fd = self.files.open(str(path), os.O_RDONLY)
        try:
            size = self.files.size(fd)
            key, pos = self._file_key(fd, path, size)
            if key is None:
                if damaged is not None:
                    damaged(b"")
                return size, 0
            carry, need = b"", SCAN_BLOCK
            while pos < size:
                chunk = self.files.pread(fd, max(SCAN_BLOCK, need), pos)
                if not chunk:
                    break  # shorter than it was
                block, base = carry + chunk, pos - len(carry)
                pos += len(chunk)
                rest: list[int] | None = [] if pos < size else None
                for record in records.scan(block, str(path), base, rest,
                                           damaged and (lambda _, span: damaged(span)), key):
                    read(record)
                carry, need = (block[rest[0]:] if rest else b""), SCAN_BLOCK
                if len(carry) >= records.HEADER_SIZE:  # a record longer than a block
                    need = records.HEADER_SIZE + records.HEADER.unpack_from(carry)[2] - len(carry)
            return size, key
        finally:
            self.files.close(fd)

    def _file_key(self, fd: int, path: Path, size: int) -> tuple[int | None, int]:
        """(key, where the records start) of an open log file; (None, size) when its key
        is lost (every copy damaged, and the STATE after them), and logged."""
        head = self.files.pread(fd, records.PROLOGUE_SIZE + records.HEADER_SIZE, 0)
        found = records.file_key(head)
        if found is not None:
            return found
        # Every KEY record damaged: the key again from the STATE the broker wrote after them.
        if len(head) == records.PROLOGUE_SIZE + records.HEADER_SIZE:
            length = records.HEADER.unpack_from(head, records.PROLOGUE_SIZE)[2]
            if length <= records.MAX_PAYLOAD:
                whole = self.files.pread(fd, 2 * (records.HEADER_SIZE + length), records.PROLOGUE_SIZE)
                key = records.recover_key(whole, 0)
                if key is not None:
                    log.warning("%s: every copy of the file's key is damaged; the key was "
                                "found again from the record after them", path)
                    return key, records.PROLOGUE_SIZE
        log.error("%s: every copy of the file's key is damaged, and the record after them "
                  "too: its %d byte(s) cannot be checked, and what they held is lost", path, size)
        return None, size

    def _restore(self, replay: Replay, topic_log: TopicLog) -> int:
        """Build the topic, its channels and their queues from a replay."""
        name = replay.name
        self.logs[name] = topic_log
        logged = self._logged[name]
        logged.paused = replay.topic_paused
        logged.channels = {c: replay.paused.get(c, False) for c in replay.channels}
        logged.config = {c: data for c, data in replay.config.items()
                         if not c or c in replay.channels}
        topic = self.broker.get_or_create_topic(name, bounded=False)  # accepted once: kept
        topic.paused = replay.topic_paused
        for channel_name in replay.channels:
            channel = topic.get_or_create_channel(channel_name, bounded=False)
            channel.paused = logged.channels[channel_name]
        for channel_name, data in logged.config.items():
            deadletter.restore_settings(topic, topic.channels.get(channel_name) if channel_name
                                        else None, json.loads(data))
        if replay.max_id:
            self.broker.new_id.advance_past(f"{replay.max_id:016x}")
        # Every file on disk is counted, even with nothing pending (left behind by a
        # crash before its deletion): files go oldest first, so no FIN record can be
        # deleted while an older file still holds the PUB it finished.
        for seg in topic_log.sizes:
            topic_log.hold(seg, 0)
        for seg, count in replay.copies_per_segment().items():
            topic_log.hold(seg, count)
        now_ns = self.broker.clock.wall_ns()
        leased = self._leased.get(name, {})
        # A start reads into memory at most --mem-queue-size of the topic's ready messages
        # in all, shared among its channels (the rest wait on disk as their locations, read
        # ahead as consumers come): its time is the log's, not channels x pending.
        share = self.spill_limit // max(1, len(replay.channels))
        if share < RESTORE_MIN_SHARE:
            share = 0  # too few to be worth a read per channel: read ahead when consumed
        for channel_name in replay.channels:
            keep = replay.locations(leased[channel_name]) if channel_name in leased else None
            plain = replay.ready_locations(channel_name) if keep is None else None
            topic.channels[channel_name].restore(
                *(self._ready_queues(topic, plain, share) if plain is not None else
                  self._queues(topic, replay.pending(channel_name), now_ns, keep, share)))
        topic.restore_held(*self._queues(topic, replay.pending(None), now_ns))
        # An entry is carried to the current file when its file goes, and a kill before that
        # file is deleted leaves both copies: each is tracked once, in the newest file that
        # holds it (the older ones go first), or every start would carry each copy again
        # and the copies would multiply with each crash inside the window.
        newest: dict[bytes, int] = {}
        for seg, payload in replay.dedupe:
            if newest.get(payload, -1) < seg:
                newest[payload] = seg
        for payload, seg in newest.items():
            self.broker.dedupe.restore(payload, topic.name)
            self._dedupe.setdefault(name, {}).setdefault(seg, []).append(payload)
        topic_log.reclaim()
        return replay.count()

    def _ready_queues(self, topic: "Topic", locs: array, limit: int) -> tuple:
        """``_queues`` of messages all ready with no delivery counted: the first ``limit``
        read into memory, the rest on disk, each part taken in one slice."""
        try:
            loaded = self._load_all(topic, locs[:limit])
        except ReadLater:  # a start that cannot read what it restores stops (the log says why)
            raise OSError(f"cannot start: reading the messages of topic {topic.name} "
                          f"under {self._dir(topic.name)} failed (nothing was changed); "
                          f"start again") from None
        ready = [msg for msg in loaded if msg is not None]
        return ready, locs[limit:], [], None, (), []

    def _queues(self, topic: "Topic", entries: Iterable[tuple[int, int, int]], now_ns: int,
                keep: "set[int] | None" = None, ready_limit: int | None = None
                ) -> tuple[list[Message], array, list[tuple[Message, float]], array | None,
                           Iterable[tuple[int, int, float]], list[Message]]:
        """What ``Channel.restore`` takes: ready in memory, ready on disk only, deferred in
        memory with seconds left, the delivery counts of those ready on disk only (None:
        all 0), (loc, attempts, seconds left) of those deferred on disk only, and those
        to keep in memory at the front whatever the limit: every ready one whose location
        is in ``keep`` (a kept lease's). At most ``ready_limit`` (default ``spill_limit``)
        others ready and ``spill_limit`` deferred are read into memory."""
        ready: list[Message] = []
        front: list[Message] = []
        on_disk = array("q")
        on_disk_attempts: array | None = None
        deferred: list[tuple[Message, float]] = []
        later_locs, later_attempts, later_delays = array("q"), array("H"), array("d")
        limit = self.spill_limit
        ready_limit = limit if ready_limit is None else ready_limit
        # What is read into memory is read in one go after: a run of locations costs one
        # read and one pass per batch record, not a read per message (a start with many
        # channels reads the same messages for each).
        load_locs, load_what = array("q"), []
        n_ready = n_deferred = 0
        for loc, attempts, deliver_at in entries:
            if deliver_at > now_ns:
                if n_deferred >= limit:
                    later_locs.append(loc)
                    later_attempts.append(attempts)
                    later_delays.append((deliver_at - now_ns) / 1e9)
                    continue
                n_deferred += 1
            elif (on_disk or n_ready >= ready_limit) and not (keep and loc in keep):
                if attempts and on_disk_attempts is None:
                    on_disk_attempts = array("H", bytes(2 * len(on_disk)))
                on_disk.append(loc)
                if on_disk_attempts is not None:
                    on_disk_attempts.append(attempts)
                continue
            elif not (keep and loc in keep):
                n_ready += 1
            load_locs.append(loc)
            load_what.append((attempts, deliver_at))
        try:
            loaded = self._load_all(topic, load_locs)
        except ReadLater:  # a start that cannot read what it restores stops (the log says why)
            raise OSError(f"cannot start: reading the messages of topic {topic.name} "
                          f"under {self._dir(topic.name)} failed (nothing was changed); "
                          f"start again") from None
        for loc, msg, (attempts, deliver_at) in zip(load_locs, loaded, load_what):
            if msg is None:
                continue
            msg.attempts = attempts
            if deliver_at > now_ns:
                deferred.append((msg, (deliver_at - now_ns) / 1e9))
            elif keep and loc in keep:
                front.append(msg)
            else:
                ready.append(msg)
        return (ready, on_disk, deferred, on_disk_attempts,
                zip(later_locs, later_attempts, later_delays), front)

    def abandon(self) -> None:
        """Let go of the data path writing nothing more: what ``kill -9`` leaves
        (the kernel keeps what was written). For crash tests."""
        self._reader.shutdown(wait=True)
        self._executor.shutdown(wait=True)
        for topic_log in self.logs.values():
            topic_log.abandon()
        self._close_unsynced()
        self.logs.clear()
        os.close(self._lock_fd)

    def _close_unsynced(self) -> None:
        for fd in self._sync_retired:
            try:
                self.files.close(fd)
            except OSError:
                pass
        self._sync_retired = []

    def close(self) -> None:
        """Clean shutdown: write what is queued, fsync, close."""
        try:
            self.wait_synced()
        except Exception as err:  # noqa: BLE001 - logged; closing goes on
            log.error("data path %s: final fsync failed: %s", self.path, err)
        self._reader.shutdown(wait=True)
        self._executor.shutdown(wait=True)
        for topic_log in self.logs.values():
            try:
                topic_log.close()
            except OSError as err:
                log.error("%s: %s", topic_log.dir, err)
        self._close_unsynced()
        self.logs.clear()
        os.close(self._lock_fd)


def _sync_all(files: fileops.Files, fds: list[int], retired: list[int],
              deleted: list[Path], dirs: list[str], found: list[str]) -> None:
    """fsync what was written, close rolled-over files, delete reclaimed ones; in
    the storage thread. The first failure is raised after trying everything."""
    failure: OSError | None = None
    for path in found:
        try:
            fd = files.open(path, os.O_RDONLY)
        except FileNotFoundError:
            continue  # reclaimed since
        except OSError as err:
            failure = failure or err
            continue
        try:
            files.fsync(fd)
        except OSError as err:
            failure = failure or err
        finally:
            files.close(fd)
    for fd in fds:
        try:
            files.fsync(fd)
        except OSError as err:
            failure = failure or err
    unsynced: list[int] = []
    for fd in retired:
        try:
            files.fsync(fd)
        except OSError as err:
            failure = failure or err
            unsynced.append(fd)  # kept open: the next sync tries it again
            continue
        files.close(fd)
    for path in dirs:
        try:
            files.fsync_dir(path)
        except OSError as err:
            failure = failure or err
    if failure is not None:
        # A file is deleted only once what replaced it (a MOVE, the FINs that freed it)
        # is known to be on disk: not after a failed fsync.
        raise _SyncFailed(failure, unsynced, deleted)
    for path in deleted:
        files.unlink(str(path))


def _close_and_remove(files: fileops.Files, fds: list[int], trash: Path | None) -> None:
    for fd in fds:
        if fd >= 0:
            try:
                files.close(fd)
            except OSError:
                pass
    if trash is not None:
        files.rmtree(str(trash))
