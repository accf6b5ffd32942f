"""A topic's log on disk: numbered segment files that roll at ``max_bytes_per_file``.

Appends go to the newest segment; bodies are read back with ``pread``. Each
segment counts the message copies still pending in it (``hold``/``release``);
segments are deleted oldest first once nothing in them or before them is
pending, so a FIN record never outlives the message it finished.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

from . import records

log = logging.getLogger("pynsqd")

# A pending message on disk only: (segment << OFFSET_BITS) | offset of its record.
OFFSET_BITS = 40
# A drained topic rolls its current file once it is this big, so the file can be deleted.
ROLL_WHEN_DRAINED = 1 << 20
# Bytes read at once when a message waiting on disk comes up.
READ_AHEAD = 256 << 10


def location(seg: int, offset: int) -> int:
    return (seg << OFFSET_BITS) | offset


def split(loc: int) -> tuple[int, int]:
    return loc >> OFFSET_BITS, loc & ((1 << OFFSET_BITS) - 1)


class TopicLog:
    def __init__(self, directory: Path, max_bytes: int) -> None:
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max(max_bytes, 1024)
        self.refs: dict[int, int] = {}
        self._readers: dict[int, int] = {}
        self._read_ahead: dict[int, tuple[int, int, bytes]] = {}
        self.current = 0
        self._fd = -1
        self._size = 0
        self.dirty = False

    def segment_numbers(self) -> list[int]:
        return sorted(int(p.stem) for p in self.dir.glob("*.log") if p.stem.isdigit())

    def path(self, seg: int) -> Path:
        return self.dir / f"{seg:08d}.log"

    def start_appending(self) -> None:
        """Append to a new segment after every existing one (never to a possibly torn tail)."""
        existing = self.segment_numbers()
        self._roll((existing[-1] if existing else 0) + 1)

    def _roll(self, seg: int) -> None:
        if self._fd >= 0:
            os.fsync(self._fd)
            os.close(self._fd)
        self.current = seg
        self._fd = os.open(self.path(seg), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._size = os.fstat(self._fd).st_size
        self.refs.setdefault(seg, 0)

    def append(self, data: bytes) -> tuple[int, int]:
        """Write ``data`` (whole records); return (segment, offset) where it starts."""
        if self._size and self._size + len(data) > self.max_bytes:
            self._roll(self.current + 1)
        offset = self._size
        written = os.write(self._fd, data)
        while written < len(data):  # a short write: finish it
            written += os.write(self._fd, data[written:])
        self._size += len(data)
        self.dirty = True
        return self.current, offset

    def sync(self) -> None:
        if self._fd >= 0:
            os.fsync(self._fd)

    def read_pub(self, loc: int) -> tuple[int, int, bytes]:
        """(id, publish ns, body) of the PUB record at ``loc``. Reads ahead: messages
        waiting on disk come up in log order, so one read serves those that follow."""
        found = self._read_ahead.pop(loc, None)
        if found is not None:
            return found
        seg, offset = split(loc)
        fd = self._readers.get(seg)
        if fd is None:
            fd = self._readers[seg] = os.open(self.path(seg), os.O_RDONLY)
        block = os.pread(fd, READ_AHEAD, offset)
        _, _, length, _ = records.HEADER.unpack_from(block)
        if len(block) < records.HEADER_SIZE + length:
            block = os.pread(fd, records.HEADER_SIZE + length, offset)
        self._read_ahead = records.pubs_in(block, location(seg, offset))
        found = self._read_ahead.pop(loc, None)
        if found is None:
            raise records.DamagedRecord(f"{self.path(seg)}: the record at offset {offset} "
                                        f"fails its check")
        return found

    def hold(self, seg: int, count: int = 1) -> None:
        self.refs[seg] = self.refs.get(seg, 0) + count

    def release(self, seg: int, count: int = 1) -> None:
        left = self.refs.get(seg, 0) - count
        self.refs[seg] = left
        if left <= 0:
            if (seg == self.current and self._size >= ROLL_WHEN_DRAINED
                    and all(n <= 0 for n in self.refs.values())):
                # Everything is finished: start a new file so this one can go too.
                self._roll(self.current + 1)
            self.reclaim()

    def reclaim(self) -> None:
        """Delete the oldest segments that hold nothing pending."""
        for seg in sorted(self.refs):
            if seg >= self.current or self.refs[seg] > 0:
                return
            del self.refs[seg]
            fd = self._readers.pop(seg, None)
            if fd is not None:
                os.close(fd)
            try:
                self.path(seg).unlink()
            except FileNotFoundError:
                pass

    def close(self) -> None:
        if self._fd >= 0:
            os.fsync(self._fd)
            os.close(self._fd)
            self._fd = -1
        for fd in self._readers.values():
            os.close(fd)
        self._readers.clear()

    def destroy(self) -> None:
        self.close()
        shutil.rmtree(self.dir, ignore_errors=True)
