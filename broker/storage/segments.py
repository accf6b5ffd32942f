"""A topic's log on disk: numbered segment files that roll at ``max_bytes_per_file``.

Appends go to the newest segment; each segment opens with a ``STATE`` record
(the topic's channels as the log stood), so a segment needs nothing older to
be understood. Bodies are read back with ``pread``. Each segment counts the
message copies still pending in it (``hold``/``release``); segments are deleted
oldest first once nothing in them or before them is pending, so a FIN record
never outlives the message it finished.

An append that fails (ENOSPC, EIO, a short write) is cut back off the file,
so the file ends where the last whole append ended; the caller gets the error.
"""

from __future__ import annotations

import logging
import os
import zlib
from pathlib import Path
from typing import Callable, Sequence

from ..message import Message
from . import fileops, records
from .records import EXPIRES

log = logging.getLogger("pynsqd")

# A pending message on disk: (segment << OFFSET_BITS) | offset of its record.
OFFSET_BITS = 40
# The largest --max-bytes-per-file: a file may pass it by one append, and every offset
# in it must fit in OFFSET_BITS.
MAX_FILE = 1 << (OFFSET_BITS - 1)
# A drained topic rolls its current file once it is this big, so the file can be deleted.
ROLL_WHEN_DRAINED = 1 << 20
# Bytes read at once when a message waiting on disk comes up.
READ_AHEAD = 256 << 10


class _WouldWait(Exception):
    """A read on the event loop found its bytes not in the page cache."""


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
        self.max_bytes = max(max_bytes, 1024)
        self.state = state                  # the STATE record a new segment opens with
        self.refs: dict[int, int] = {}
        self.sizes: dict[int, int] = {}     # bytes of each segment on disk
        self._readers: dict[int, int] = {}
        self._read_ahead: dict[int, tuple[int, int, bytes, int]] = {}
        self.current = 0
        self._fd = -1
        self._size = 0
        self.dirty = False
        self.retired: list[int] = []        # rolled-over fds, to fsync and close off the loop
        self.deleted: list[Path] = []       # reclaimed segments, to unlink off the loop
        self.on_reclaim: Callable[[int], None] | None = None
        self.appended = 0                   # bytes appended since the start (STATEs aside)

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

    def _roll(self, seg: int) -> None:
        fd = self.files.open(str(self.path(seg)), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        try:
            self._write_all(fd, 0, self.state())
        except OSError:
            self.files.close(fd)
            self.files.unlink(str(self.path(seg)))
            raise
        if self._fd >= 0:
            self.retired.append(self._fd)
        self.current, self._fd = seg, fd
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

    def append(self, data: bytes) -> int:
        """Write ``data`` (whole records) in one go; return the location where it starts."""
        if self._size and self._size + len(data) > self.max_bytes:
            self._roll(self.current + 1)
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

    def read_pub(self, loc: int) -> tuple[int, int, bytes, int]:
        """(id, publish ns, body, expires) of the PUB record at ``loc``. Reads ahead: messages
        waiting on disk come up in log order, so one read serves those that follow."""
        found = self._read_ahead.pop(loc, None)
        if found is not None:
            return found
        seg, offset = split(loc)
        fd = self._readers.get(seg)
        if fd is None:
            fd = self._readers[seg] = self.files.open(str(self.path(seg)), os.O_RDONLY)
        block = self.files.pread(fd, READ_AHEAD, offset)
        if len(block) >= records.HEADER_SIZE:
            _, _, length, _ = records.HEADER.unpack_from(block)
            if len(block) < records.HEADER_SIZE + length:
                block = self.files.pread(fd, records.HEADER_SIZE + length, offset)
        self._read_ahead = records.pubs_in(block, location(seg, offset))
        found = self._read_ahead.pop(loc, None)
        if found is None:
            raise records.DamagedRecord(f"{self.path(seg)}: the record at offset {offset} "
                                        f"fails its check")
        return found

    def read_messages(self, locs: "Sequence[int]") -> "list[Message | None]":
        """The messages whose PUB (or MOVE) records are at ``locs`` (None for one that
        fails its check). Touches nothing of this log but its files' names, so it can
        run in a thread: it opens, reads ahead ``READ_AHEAD`` bytes at a time, closes."""
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
            return self._parse(locs, read)
        finally:
            for fd in opened.values():
                files.close(fd)

    def read_cached(self, locs: "Sequence[int]") -> "list[Message | None] | None":
        """``read_messages`` on the event loop, when the page cache holds every record
        asked for: None as soon as a read would wait for the disk (then nothing was read).
        It reads with this log's own open files."""
        files, readers = self.files, self._readers

        def read(seg: int, size: int, offset: int) -> bytes:
            fd = readers.get(seg)
            if fd is None:
                fd = readers[seg] = files.open(str(self.path(seg)), os.O_RDONLY)
            block = files.pread_cached(fd, size, offset)
            if block is None:
                raise _WouldWait
            if len(block) < size:  # the file's end, or only part of the range is cached
                header = records.HEADER_SIZE
                if len(block) < header or len(block) < header + records.HEADER.unpack_from(
                        block)[2]:
                    raise _WouldWait  # the thread reads it (and tells damage from a miss)
            return block

        try:
            return self._parse(locs, read)
        except _WouldWait:
            return None

    @staticmethod
    def _parse(locs: "Sequence[int]", read: Callable[[int, int, int], bytes]
               ) -> "list[Message | None]":
        out: list[Message | None] = []
        block, block_loc, size = b"", 0, 0
        message_at, header = records.message_at, records.HEADER_SIZE
        unpack, crc32, seed = records.PUB_CHECK.unpack_from, zlib.crc32, records.PUB_SEED
        magic_ok, pub, body_at = records.MAGIC_NUMBER, records.PUB, records.PUB_BODY_AT
        append = out.append
        for loc in locs:
            rel = loc - block_loc
            # The common case: a PUB with no expiry, whole in the block read.
            if 0 <= rel and rel + body_at <= size:
                magic, kind, length, crc, raw_id, ts, flags = unpack(block, rel)
                start = rel + header
                stop = start + length
                if (magic == magic_ok and kind == pub and not flags & EXPIRES
                        and stop <= size and crc32(block[start:stop], seed) == crc):
                    # The id's 8 bytes in hex are the message's id.
                    msg = Message(raw_id.hex(), block[rel + body_at:stop], ts)
                    msg.loc = loc
                    append(msg)
                    continue
            found = message_at(block, rel) if 0 <= rel < size else None
            if found is None:
                seg, offset = split(loc)
                block, block_loc = read(seg, READ_AHEAD, offset), loc
                if len(block) >= header:
                    length = records.HEADER.unpack_from(block)[2]
                    if len(block) < header + length:
                        block = read(seg, header + length, offset)
                size = len(block)
                found = message_at(block, 0)
            if found is None:
                append(None)
                continue
            msg_id, ts, body, expires = found
            msg = Message(msg_id, body, ts)
            msg.loc = loc
            msg.expires = expires
            append(msg)
        return out

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
            if self.on_reclaim is not None:
                self.on_reclaim(seg)
            self.deleted.append(self.path(seg))

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
