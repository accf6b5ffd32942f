"""A topic's log on disk: numbered segment files that roll at ``max_bytes_per_file``.

Appends go to the newest segment; each segment opens with its key (a random
number mixed into every record's check, so no bytes a client chose pass for a
record: ``records.prologue``), then a ``STATE`` record
(the topic's channels as the log stood), so a segment needs nothing older to
be understood. Bodies are read back with ``pread`` (``Reader``: a message of a
BATCH record is found through the log's index of its batches, one pair of
numbers per MPUB, kept per segment in memory). Each segment counts the
message copies still pending in it (``hold``/``release``); segments are deleted
oldest first once nothing in them or before them is pending, so a FIN record
never outlives the message it finished.

An append that fails (ENOSPC, EIO, a short write) is cut back off the file,
so the file ends where the last whole append ended; the caller gets the error.
"""

from __future__ import annotations

import logging
import os
import sys
from array import array
from bisect import bisect_right
from itertools import islice, repeat
from pathlib import Path
from struct import unpack_from
from typing import Callable, Sequence

from ..message import Message, read_back, runs_of
from . import fileops, records
from .checksum import crc32
from .records import EXPIRES

log = logging.getLogger("pynsqd")
# Segments tracked up to which a FIN looks for the oldest holding messages (``oldest_holder``).
FEW_SEGMENTS = 8

# A pending message on disk: (segment << OFFSET_BITS) | offset of its record (of a BATCH's
# message: the batch's offset plus the message's index in it).
OFFSET_BITS = 40
# The largest --max-bytes-per-file: a file may pass it by one append, and every offset
# in it must fit in OFFSET_BITS.
MAX_FILE = 1 << (OFFSET_BITS - 1)
# The smallest --max-bytes-per-file: a file holds at least a record's framing and the
# STATE record a segment opens with.
MIN_FILE = 1024
# A drained topic rolls its current file once it is this big, so the file can be deleted.
ROLL_WHEN_DRAINED = 1 << 20
# Bytes read at once when a message waiting on disk comes up.
READ_AHEAD = 256 << 10


class _WouldWait(Exception):
    """A read on the event loop found its bytes not in the page cache."""


_OFFSET_MASK = (1 << OFFSET_BITS) - 1
_ORDER = sys.byteorder  # of an array's numbers in memory


def location(seg: int, offset: int) -> int:
    return (seg << OFFSET_BITS) | offset


def segment_of(loc: int) -> int:
    return loc >> OFFSET_BITS


def split(loc: int) -> tuple[int, int]:
    return loc >> OFFSET_BITS, loc & ((1 << OFFSET_BITS) - 1)


class TopicLog:
    def __init__(self, directory: Path, max_bytes: int, files: fileops.Files,
                 state: Callable[[], bytes]) -> None:
        self.dir = directory
        self.files = files
        self.max_bytes = max(max_bytes, MIN_FILE)
        self.state = state                  # the STATE record a new segment opens with
        self.refs: dict[int, int] = {}
        self.sizes: dict[int, int] = {}     # bytes of each segment on disk
        self.keys: dict[int, int] = {}      # each segment's key (0: written before keys)
        self.key = 0                        # the current segment's
        self._readers: dict[int, int] = {}
        # read_message's and read_cached's: each keeps the block it read last. A block
        # holds whole appends only (they are made on the event loop, as these reads),
        # and what was appended never changes, so a block read stays true.
        self._reader: Reader | None = None
        self._cached_reader: Reader | None = None
        # segment -> (offsets, counts) of its BATCH records, in log order: where the
        # message at a location is read from (see ``Reader``)
        self.batches: dict[int, tuple[array, array]] = {}
        self.current = 0
        self._fd = -1
        self._size = 0
        self.dirty = False
        self.retired: list[int] = []        # rolled-over fds, to fsync and close off the loop
        self.deleted: list[Path] = []       # reclaimed segments, to unlink off the loop
        self.on_reclaim: Callable[[int], None] | None = None
        self.appended = 0                   # bytes appended since the start (STATEs aside)
        self.next_id: Callable[[], int] = lambda: 0   # the id the next message will have

    def segment_numbers(self) -> list[int]:
        return sorted(int(name[:-4]) for name in self.files.listdir(str(self.dir))
                      if name.endswith(".log") and name[:-4].isdigit())

    def path(self, seg: int) -> Path:
        return self.dir / f"{seg:08d}.log"

    def start_appending(self) -> None:
        """Append to a new segment after every existing one (never to a possibly torn tail)."""
        self.files.mkdir(str(self.dir))
        existing = self.segment_numbers()
        self._roll((existing[-1] if existing else 0) + 1)

    def _roll(self, seg: int, next_id: int | None = None) -> None:
        """Start segment ``seg``; ``next_id``: the id of the first message to go in it
        (default: the next the broker will give)."""
        fd = self.files.open(str(self.path(seg)), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        key = records.new_key()
        next_id = self.next_id() if next_id is None else next_id
        oldest = min([s for s in self.sizes if s != seg] or [seg])
        try:
            self._write_all(fd, 0, records.prologue(key) + records.seal(
                self.state() + records.roll(oldest, seg, next_id), key))
        except OSError:
            self.files.close(fd)
            self.files.unlink(str(self.path(seg)))
            raise
        if self._fd >= 0:
            # The old file says where the log went on: a lost newest file is then known.
            try:
                self._write_all(self._fd, self._size, records.seal(
                    records.forward(seg, next_id), self.key))
                self._size = self.sizes[self.current] = self.files.size(self._fd)
            except OSError as err:
                log.warning("%s: could not note the roll to file %d in file %d: %s",
                            self.dir, seg, self.current, err)
            self.retired.append(self._fd)
        self.current, self._fd, self.key = seg, fd, key
        self.keys[seg] = key
        self._size = self.sizes[seg] = self.files.size(fd)
        self.refs.setdefault(seg, 0)
        self.dirty = True

    def _write_all(self, fd: int, size: int, data: bytes) -> None:
        """Write ``data`` at the end of ``fd`` (now ``size`` bytes long), or leave the
        file as it was and raise."""
        written = 0
        try:
            while written < len(data):
                n = self.files.write(fd, memoryview(data)[written:])
                if n <= 0:
                    raise OSError(f"write returned {n}")
                written += n
        except OSError:
            if written:
                try:
                    self.files.truncate(fd, size)
                except OSError as err:
                    log.error("%s: could not cut a failed write back off: %s (recovery "
                              "will skip the torn record)", self.dir, err)
            raise

    def append(self, data: bytes, ids: bytes | None = None, key: int = 0) -> int:
        """Write ``data`` (whole records, checked under ``key``: the current file's
        ``self.key``, or 0 for none; ``ids``: of the messages it publishes, 8 bytes each)
        in one go, checked under the key of the file it goes to; return the location
        where it starts."""
        if self._size and self._size + len(data) > self.max_bytes:
            self._roll(self.current + 1, int.from_bytes(ids[:8], "big") if ids else None)
        if key != self.key:  # (a check XOR key XOR self.key is the check XOR self.key)
            data = records.seal(data, key ^ self.key)
        offset = self._size
        try:
            self._write_all(self._fd, offset, data)
        finally:
            self._size = self.sizes[self.current] = self.files.size(self._fd)
        self.dirty = True
        self.appended += len(data)
        return location(self.current, offset)

    @property
    def disk_bytes(self) -> int:
        return sum(self.sizes.values())

    def bytes_from(self, seg: int) -> int:
        """Bytes of segment ``seg`` and every newer one: what a copy in ``seg`` pins."""
        return sum(size for s, size in self.sizes.items() if s >= seg)

    def freed_by(self, seg: int) -> int:
        """Bytes deleted once ``seg`` (the oldest) holds nothing: it and the newer
        segments that hold nothing either, up to the first that does."""
        freed = 0
        for s in sorted(self.sizes):
            if s < seg:
                continue
            if s != seg and (s >= self.current or self.refs.get(s, 0) > 0):
                break
            freed += self.sizes[s]
        return freed

    def take_sync_work(self) -> tuple[int, list[int], list[Path]]:
        """(fd to fsync, retired fds to fsync and close, files to delete) for the
        storage thread; what was handed over is no longer this log's business."""
        work = (self._fd if self.dirty else -1, self.retired, self.deleted)
        self.dirty = False
        self.retired, self.deleted = [], []
        return work

    def add_batch(self, loc: int, count: int) -> None:
        """A BATCH record of ``count`` messages was written at ``loc``."""
        seg, offset = split(loc)
        index = self.batches.get(seg)
        if index is None:
            index = self.batches[seg] = (array("q"), array("I"))
        index[0].append(offset)
        index[1].append(count)

    def record_offset(self, loc: int) -> int:
        """The offset in its file of the record holding the message at ``loc`` (a BATCH
        holds several)."""
        found = Reader(self.batches, self._pread, self.keys)._batch_at(loc)
        return split(found[0] if found is not None else loc)[1]

    def _pread(self, seg: int, size: int, offset: int) -> bytes:
        fd = self._readers.get(seg)
        if fd is None:
            fd = self._readers[seg] = self.files.open(str(self.path(seg)), os.O_RDONLY)
        return self.files.pread(fd, size, offset)

    def read_message(self, loc: int) -> "Message | None":
        """The message whose record (PUB, MOVE, or a BATCH's) is at ``loc``; None if it
        fails its check. Reads ahead: messages waiting on disk come up in log order, so
        one read serves those that follow."""
        if self._reader is None:
            self._reader = Reader(self.batches, self._pread, self.keys)
        return self._reader.messages((loc,))[0]

    def read_many(self, locs: "Sequence[int]") -> "list[Message | None]":
        """``read_message`` of each of ``locs`` at once (runs of a batch built in bulk)."""
        if self._reader is None:
            self._reader = Reader(self.batches, self._pread, self.keys)
        return self._reader.messages(locs)

    def read_pub(self, loc: int) -> tuple[int, int, bytes, int]:
        """(id, publish ns, body, expires) of the message at ``loc``; ``DamagedRecord``
        if its record fails its check."""
        msg = self.read_message(loc)
        if msg is None:
            seg, offset = split(loc)
            raise records.DamagedRecord(f"{self.path(seg)}: the record at offset {offset} "
                                        f"fails its check")
        return int(msg.id, 16), msg.timestamp, msg.body, msg.expires

    def read_messages(self, locs: "Sequence[int]") -> "list[Message | None]":
        """The messages whose records are at ``locs`` (None for one that fails its
        check). Touches nothing of this log but its files' names and its index of
        batches, so it can run in a thread: it opens, reads ahead ``READ_AHEAD`` bytes
        at a time, closes."""
        files, opened = self.files, {}

        def read(seg: int, size: int, offset: int) -> bytes:
            fd = opened.get(seg)
            if fd is None:
                for old in opened.values():
                    files.close(old)
                opened.clear()
                fd = opened[seg] = files.open(str(self.path(seg)), os.O_RDONLY)
            return files.pread(fd, size, offset)

        try:
            return Reader(self.batches, read, self.keys).messages(locs)
        finally:
            for fd in opened.values():
                files.close(fd)

    def read_cached(self, locs: "Sequence[int]") -> "list[Message | None] | None":
        """``read_messages`` on the event loop, when the page cache holds every record
        asked for: None as soon as a read would wait for the disk (then nothing was read).
        It reads with this log's own open files, and keeps the block read last for the
        next call (a read-ahead asks for the locations that follow the last one's)."""
        if self._cached_reader is None:
            self._cached_reader = Reader(self.batches, self._pread_cached, self.keys)
        try:
            return self._cached_reader.messages(locs)
        except _WouldWait:
            return None

    def _pread_cached(self, seg: int, size: int, offset: int) -> bytes:
        fd = self._readers.get(seg)
        if fd is None:
            fd = self._readers[seg] = self.files.open(str(self.path(seg)), os.O_RDONLY)
        block = self.files.pread_cached(fd, size, offset)
        if block is None:
            raise _WouldWait
        if len(block) < size:  # the file's end, or only part of the range is cached
            header = records.HEADER_SIZE
            if len(block) < header or len(block) < header + records.HEADER.unpack_from(
                    block)[2]:
                raise _WouldWait  # the thread reads it (and tells damage from a miss)
        return block

    def oldest_holder(self) -> tuple[int, bool] | None:
        """The oldest segment holding pending messages (each message pending is in it or a
        later one), and whether it alone holds any; None when none does, or when more than
        ``FEW_SEGMENTS`` are tracked (a long backlog's: looking at each would cost a FIN
        more than comparing its messages' locations)."""
        if len(self.refs) > FEW_SEGMENTS:
            return None
        held = [seg for seg, count in self.refs.items() if count > 0]
        return (min(held), len(held) == 1) if held else None

    def hold(self, seg: int, count: int = 1) -> None:
        self.refs[seg] = self.refs.get(seg, 0) + count

    def release(self, seg: int, count: int = 1) -> None:
        left = self.refs.get(seg, 0) - count
        self.refs[seg] = left
        if left <= 0:
            if (seg == self.current and self._size >= ROLL_WHEN_DRAINED
                    and all(n <= 0 for n in self.refs.values())):
                # Everything is finished: start a new file so this one can go too.
                try:
                    self._roll(self.current + 1)
                except OSError as err:
                    log.error("%s: could not start a new segment: %s", self.dir, err)
            self.reclaim()

    def reclaim(self) -> None:
        """Mark the oldest segments that hold nothing pending for deletion."""
        for seg in sorted(self.refs):
            if seg >= self.current or self.refs[seg] > 0:
                return
            del self.refs[seg]
            self.sizes.pop(seg, None)
            fd = self._readers.pop(seg, None)
            if fd is not None:
                self.files.close(fd)
            self.batches.pop(seg, None)
            self.keys.pop(seg, None)
            if self.on_reclaim is not None:
                self.on_reclaim(seg)
            self.deleted.append(self.path(seg))

    def close_readers(self) -> None:
        """Close the files opened to read (reopened when next read): a start reads every
        topic's messages, and keeps no more open than serving does."""
        for fd in self._readers.values():
            self.files.close(fd)
        self._readers = {}

    def abandon(self) -> None:
        """Close every descriptor and write nothing more (what a killed process leaves)."""
        for fd in [self._fd, *self.retired, *self._readers.values()]:
            if fd >= 0:
                self.files.close(fd)
        self._fd = -1
        self.retired, self._readers = [], {}

    def close(self) -> None:
        """fsync and close everything; delete what was reclaimed."""
        if self._fd >= 0:
            self.files.fsync(self._fd)
        for fd in self.retired:
            self.files.fsync(fd)
        for path in self.deleted:
            self.files.unlink(str(path))
        self.deleted = []
        self.abandon()


def _messages(batch: records.Batch, first: int, count: int, loc: int) -> list[Message]:
    """Messages ``first`` to ``first + count`` of ``batch``, the first at ``loc``: the ids
    split and the bodies cut in one pass each."""
    ids = batch.raw[8 * first:8 * (first + count)].hex(" ", 8).split(" ")
    data, size = batch.data, batch.body_size
    if size:  # bodies all as long (a format of ``count`` fields of that size, cached)
        bodies = unpack_from(f"{size}s" * count, data, batch.bounds[first])
    else:
        bounds = batch.bounds[first:first + count + 1]
        bodies = [data[start:stop] for start, stop in zip(bounds, islice(bounds, 1, None))]
    # Made with their locations (and expiries) at once: no pass over them after.
    expires = batch.expires
    stamp = batch.stamp
    return read_back(ids, bodies, batch.timestamps[first:first + count] if stamp is None
                     else repeat(stamp), loc,
                     None if expires is None else expires[first:first + count])


def _follow_on(locs: "Sequence[int]", j: int, count: int, loc: int) -> bool:
    """Whether ``locs[j:j + count]`` are ``loc``, ``loc + 1``, ... in turn. Of an array
    of locations, checked without an int object per location: its slice read as one
    number (``count`` 64-bit digits) is ``loc`` times 1, 1, ... plus 0, 1, 2, ... (no
    digit carries into the next: a location is under 2**63)."""
    if type(locs) is not array or locs.typecode != "q":
        return list(locs[j:j + count]) == list(range(loc, loc + count))
    ones, steps = runs_of(count)
    return int.from_bytes(memoryview(locs)[j:j + count], _ORDER) == loc * ones + steps


class Reader:
    """Messages by location, from blocks of a log read ``READ_AHEAD`` bytes at a time
    with ``read(segment, size, offset)``: locations asked for in log order cost one read
    per block, and a BATCH record one check and one pass over its columns for all of its
    messages. ``batches`` is the log's index of BATCH records: segment -> (offsets,
    counts), each in log order; ``keys`` each segment's key (none: 0)."""

    def __init__(self, batches: dict[int, tuple[array, array]],
                 read: Callable[[int, int, int], bytes],
                 keys: "dict[int, int] | None" = None) -> None:
        self.batches = batches
        self.read = read
        self.keys = {} if keys is None else keys
        self.block, self.block_loc, self.size = b"", 0, 0
        # The batch read last: its location, count and columns (None: it fails its check).
        self.batch_loc, self.batch_n = -1, 0
        self.batch: records.Batch | None = None

    def messages(self, locs: "Sequence[int] | tuple[int, ...]") -> "list[Message | None]":
        out: list[Message | None] = []
        append = out.append
        batch_loc, batch_n, batch = self.batch_loc, self.batch_n, self.batch
        j, total = 0, len(locs)
        while j < total:
            loc = locs[j]
            i = loc - batch_loc
            if not 0 <= i < batch_n:
                found = self._batch_at(loc) if self.batches else None
                if found is None:
                    append(self._record_at(loc))
                    j += 1
                    continue
                batch_loc, batch_n = found
                batch = self._read_batch(batch_loc)
                self.batch_loc, self.batch_n, self.batch = batch_loc, batch_n, batch
                i = loc - batch_loc
            # The run of locations that follow one another in this batch (the usual
            # case: a read-ahead asks for whole batches), built in bulk.
            count = min(batch_n - i, total - j)
            if count > 1 and locs[j + count - 1] != loc + count - 1 or (
                    count > 2 and not _follow_on(locs, j, count, loc)):
                count = 1
                while j + count < total and i + count < batch_n and (
                        locs[j + count] == loc + count):
                    count += 1
            j += count
            if batch is None:
                out += [None] * count
                continue
            out += _messages(batch, i, count, loc)
        return out

    def _batch_at(self, loc: int) -> tuple[int, int] | None:
        """(location, count) of the BATCH record holding the message at ``loc``."""
        index = self.batches.get(loc >> OFFSET_BITS)
        if index is None:
            return None
        starts, counts = index
        offset = loc & _OFFSET_MASK
        i = bisect_right(starts, offset) - 1
        if i >= 0 and offset - starts[i] < counts[i]:
            return loc - offset + starts[i], counts[i]
        return None

    def _record(self, loc: int) -> int:
        """Where the record at ``loc`` starts in ``self.block``, read first unless the
        block holds all of it (or all there is of it)."""
        rel, header = loc - self.block_loc, records.HEADER_SIZE
        if 0 <= rel and rel + header <= self.size and (
                rel + header + records.HEADER.unpack_from(self.block, rel)[2] <= self.size):
            return rel
        seg, offset = split(loc)
        block = self.read(seg, READ_AHEAD, offset)
        if len(block) >= header:
            length = records.HEADER.unpack_from(block)[2]
            if len(block) < header + length <= header + records.MAX_PAYLOAD:
                block = self.read(seg, header + length, offset)
        self.block, self.block_loc, self.size = block, loc, len(block)
        return 0

    def _read_batch(self, loc: int) -> records.Batch | None:
        rel = self._record(loc)
        block = self.block
        if rel + records.HEADER_SIZE > self.size:
            return None
        magic, kind, length, crc = records.HEADER.unpack_from(block, rel)
        start = rel + records.HEADER_SIZE
        stop = start + length
        if (magic != records.MAGIC or kind != records.BATCH or stop > self.size
                or crc32(memoryview(block)[start:stop], records.BATCH_SEED)
                != crc ^ self.keys.get(loc >> OFFSET_BITS, 0)):
            return None
        try:
            return records.read_batch(block, start, stop)
        except records.DamagedRecord:
            return None

    def _record_at(self, loc: int) -> "Message | None":
        """The message of the PUB or MOVE record at ``loc``."""
        block, size, header = self.block, self.size, records.HEADER_SIZE
        rel = loc - self.block_loc
        key = self.keys.get(loc >> OFFSET_BITS, 0)
        # The common case: a PUB with no expiry, whole in the block read.
        if 0 <= rel and rel + records.PUB_BODY_AT <= size:
            magic, kind, length, crc, raw_id, ts, flags = records.PUB_CHECK.unpack_from(block, rel)
            start = rel + header
            stop = start + length
            if (magic == records.MAGIC_NUMBER and kind == records.PUB and not flags & EXPIRES
                    and stop <= size
                    and crc32(memoryview(block)[start:stop], records.PUB_SEED) == crc ^ key):
                # The id's 8 bytes in hex are the message's id.
                msg = Message(raw_id.hex(), block[rel + records.PUB_BODY_AT:stop], ts)
                msg.loc = loc
                return msg
        found = records.message_at(block, rel, key) if 0 <= rel < size else None
        if found is None:
            rel = self._record(loc)
            found = records.message_at(self.block, rel, key)
        if found is None:
            return None
        msg_id, ts, body, expires = found
        msg = Message(msg_id, body, ts)
        msg.loc = loc
        msg.expires = expires
        return msg
