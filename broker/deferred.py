"""Messages that wait for a time (REQ with a delay, DPUB), at most ``limit`` of them in memory.

The first ``limit`` wait as messages in a ``DeadlineQueue``; past that a durable
message waits as its log location, delivery count and due time only, packed into
one integer on a heap (about 60 bytes), and is read back from disk once due, as
a ready message waiting on disk. Messages not on disk (``#ephemeral`` topics)
always wait in memory.
"""

from __future__ import annotations

import heapq
from typing import Iterator

from .message import Message
from .pqueue import DeadlineQueue

_LOC_BITS = 64
_ATTEMPTS_BITS = 16
_LOC_MASK = (1 << _LOC_BITS) - 1
_ATTEMPTS_MASK = (1 << _ATTEMPTS_BITS) - 1
_DUE_SHIFT = _LOC_BITS + _ATTEMPTS_BITS


def _pack(deadline: float, loc: int, attempts: int) -> int:
    # Due time in microseconds first, so the heap orders by it.
    return (int(deadline * 1e6) << _DUE_SHIFT) | (attempts << _LOC_BITS) | loc


def _unpack(entry: int) -> tuple[float, int, int]:
    """(deadline, loc, attempts)"""
    return ((entry >> _DUE_SHIFT) / 1e6, entry & _LOC_MASK,
            (entry >> _LOC_BITS) & _ATTEMPTS_MASK)


class Deferred:
    def __init__(self, limit: int | None) -> None:
        self.limit = limit                  # None: everything in memory
        self._queue = DeadlineQueue()
        self._on_disk: list[int] = []       # a heap of packed (due, attempts, loc)

    def __len__(self) -> int:
        return len(self._queue) + len(self._on_disk)

    def __bool__(self) -> bool:
        return bool(self._queue) or bool(self._on_disk)

    @property
    def in_memory(self) -> int:
        return len(self._queue)

    def push(self, msg: Message, deadline: float) -> None:
        limit = self.limit
        if limit is None or len(self._queue) < limit or not msg.loc:
            self._queue.push(msg, deadline)
        else:
            heapq.heappush(self._on_disk, _pack(deadline, msg.loc, msg.attempts))

    def push_on_disk(self, loc: int, attempts: int, deadline: float) -> None:
        """Wait for a message known by its location only."""
        heapq.heappush(self._on_disk, _pack(deadline, loc, attempts))

    def pop_due(self, now: float) -> tuple[list[Message], list[tuple[int, int]]]:
        """Remove what is due at ``now``: the messages in memory, and (loc, attempts)
        of those waiting on disk."""
        msgs = list(self._queue.pop_due(now))
        heap, due = self._on_disk, []
        if heap:
            bound = (int(now * 1e6) + 1) << _DUE_SHIFT
            while heap and heap[0] < bound:
                _, loc, attempts = _unpack(heapq.heappop(heap))
                due.append((loc, attempts))
        return msgs, due

    def live(self) -> list[Message]:
        """The messages waiting in memory."""
        return self._queue.live()

    def on_disk(self) -> Iterator[tuple[int, int, float]]:
        """(loc, attempts, deadline) of each message waiting on disk only."""
        for entry in self._on_disk:
            deadline, loc, attempts = _unpack(entry)
            yield loc, attempts, deadline

    def clear(self) -> tuple[list[Message], list[int]]:
        """Drop everything: the messages that were in memory, and the locations of those
        on disk."""
        locs = [loc for loc, _, _ in self.on_disk()]
        self._on_disk = []
        return self._queue.clear(), locs

    def relocate(self, moved: dict[int, int]) -> None:
        """Records copied elsewhere in the log (old -> new location)."""
        for msg in self._queue.live():
            if msg.loc in moved:
                msg.loc = moved[msg.loc]
        heap = self._on_disk
        for i, entry in enumerate(heap):
            new = moved.get(entry & _LOC_MASK)
            if new:  # the due time, first in the entry, is kept: the heap stays ordered
                heap[i] = (entry & ~_LOC_MASK) | new
