"""A deadline queue: the earliest deadline first, cancellation in O(1).

Used for in-flight and deferred messages. A message is cancelled (FIN, TOUCH,
requeue) by bumping its ``token``; its stale entry is dropped when it reaches
the top, and the heap is rebuilt when stale entries outnumber live ones, so a
FIN-heavy load with long timeouts cannot grow it without bound. Only due
entries are ever visited, never the whole queue.
"""

from __future__ import annotations

import heapq
import itertools
from typing import Iterator

from .message import Message


class DeadlineQueue:
    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Message, int]] = []
        self._seq = itertools.count()
        self._live = 0
        self._latest = float("-inf")  # no entry has a later deadline

    def __len__(self) -> int:
        return self._live

    def push(self, msg: Message, deadline: float) -> None:
        msg.deadline = deadline
        msg.token += 1
        entry = (deadline, next(self._seq), msg, msg.token)
        if deadline >= self._latest:
            # No earlier than every entry: appended, the heap stays ordered (O(1)).
            self._heap.append(entry)
            self._latest = deadline
        else:
            heapq.heappush(self._heap, entry)
        self._live += 1

    def push_many(self, msgs: list[Message], deadline: float) -> None:
        """Push messages sharing one deadline (a lease, a burst of deliveries)."""
        if deadline < self._latest:
            for msg in msgs:
                self.push(msg, deadline)
            return
        # Entries no earlier than every entry present keep the heap ordered when
        # appended, so a burst costs O(1) per message instead of O(log n).
        seq = self._seq
        entries = []
        for msg in msgs:
            msg.deadline = deadline
            msg.token += 1
            entries.append((deadline, next(seq), msg, msg.token))
        self._heap.extend(entries)
        self._live += len(entries)
        self._latest = deadline

    def cancel(self, msg: Message) -> None:
        """Void ``msg``'s entry; the caller knows it is in this queue."""
        msg.token += 1
        self._live -= 1
        if len(self._heap) > 1024 and len(self._heap) > 4 * self._live:
            self._compact()

    def cancel_many(self, msgs: list[Message]) -> None:
        """Void the entries of ``msgs``, all in this queue."""
        for msg in msgs:
            msg.token += 1
        self._live -= len(msgs)
        if len(self._heap) > 1024 and len(self._heap) > 4 * self._live:
            self._compact()

    def pop_due(self, now: float) -> Iterator[Message]:
        """Yield, and remove, every message whose deadline is at or before ``now``."""
        heap = self._heap
        while heap and heap[0][0] <= now:
            _, _, msg, token = heapq.heappop(heap)
            if token == msg.token:
                msg.token += 1
                self._live -= 1
                yield msg

    def next_deadline(self) -> float | None:
        heap = self._heap
        while heap and heap[0][3] != heap[0][2].token:
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def live(self) -> list[Message]:
        return [entry[2] for entry in self._heap if entry[3] == entry[2].token]

    def clear(self) -> list[Message]:
        live = [entry[2] for entry in self._heap if entry[3] == entry[2].token]
        for msg in live:
            msg.token += 1
        self._heap.clear()
        self._live = 0
        self._latest = float("-inf")
        return live

    def _compact(self) -> None:
        self._heap = [entry for entry in self._heap if entry[3] == entry[2].token]
        heapq.heapify(self._heap)
