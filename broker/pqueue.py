"""A deadline queue: the earliest deadline first, cancellation in O(1).

Used for in-flight and deferred messages. A message is cancelled (FIN, TOUCH,
requeue) by bumping its ``token``; its stale entry is dropped when it reaches
the top, and the queue is rebuilt when stale entries outnumber live ones, so a
FIN-heavy load with long timeouts cannot grow it without bound. Only due
entries are ever visited, never the whole queue.

Deadlines mostly come in order (in flight: now plus the same timeout), so an
entry no earlier than the last one queued in order joins a run kept in order,
and leaves it from the front in O(1); only the others go to a heap. With a
thousand consumers each FINing one message at a time, the top's stale entries
leave one by one: from a heap that was a log-time pop each.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from operator import attrgetter, eq
from typing import Iterator

from .message import Message


class DeadlineQueue:
    """Entries are ``(deadline, seq, msg, token)``, or for messages pushed together
    ``(deadline, seq, [msgs], [tokens])``: one entry, not one per message (a lease of
    100,000 messages would otherwise allocate 100,000 tuples, and wake the cyclic GC
    over every message the broker holds). An entry's message is live while its
    token is the message's."""

    def __init__(self, compact_above: int = 1024) -> None:
        self._compact_above = compact_above  # rebuild past this many entries' messages
        self._run: deque[tuple] = deque()  # entries in deadline order
        self._heap: list[tuple] = []       # the entries that came out of order
        self._seq = itertools.count()
        self._live = 0
        self._slots = 0  # messages the entries name, live or stale

    def __len__(self) -> int:
        return self._live

    def push(self, msg: Message, deadline: float) -> None:
        msg.deadline = deadline
        msg.token += 1
        entry = (deadline, next(self._seq), msg, msg.token)
        run = self._run
        if not run or deadline >= run[-1][0]:
            run.append(entry)   # in order (O(1))
        else:
            heapq.heappush(self._heap, entry)
        self._live += 1
        self._slots += 1

    def _add(self, entry: tuple) -> None:
        run = self._run
        if not run or entry[0] >= run[-1][0]:
            run.append(entry)   # in order (O(1))
        else:
            heapq.heappush(self._heap, entry)

    def _first(self) -> tuple | None:
        """The entry with the earliest deadline (None: no entry)."""
        run, heap = self._run, self._heap
        if heap and (not run or heap[0] < run[0]):
            return heap[0]
        return run[0] if run else None

    def _pop_first(self) -> tuple:
        run, heap = self._run, self._heap
        if heap and (not run or heap[0] < run[0]):
            return heapq.heappop(heap)
        return run.popleft()

    def push_many(self, msgs: list[Message], deadline: float) -> None:
        """Push messages sharing one deadline (a lease) as one entry: O(log n) in all."""
        if len(msgs) < 2:
            # One (a consumer with RDY 1 or 2): a single entry is cheaper to make,
            # to void and to drop.
            if msgs:
                self.push(msgs[0], deadline)
            return
        tokens = []
        for msg in msgs:
            msg.deadline = deadline
            msg.token += 1
            tokens.append(msg.token)
        self._add((deadline, next(self._seq), list(msgs), tokens))
        self._live += len(msgs)
        self._slots += len(msgs)

    def cancel(self, msg: Message) -> None:
        """Void ``msg``'s entry; the caller knows it is in this queue."""
        msg.token += 1
        self._live -= 1
        if self._slots > self._compact_above and self._slots > 4 * self._live:
            self._compact()

    def cancel_many(self, msgs: list[Message]) -> None:
        """``cancel`` each of ``msgs`` (FINs read together, a lease FINed or touched whole).
        Entries left with no live message at the top go at once: messages are mostly
        FINed in the order they were sent, which is the order of their deadlines."""
        for msg in msgs:
            msg.token += 1
        self._live -= len(msgs)
        at = 0
        run, heap = self._run, self._heap
        while True:   # (``_first`` and ``_pop_first`` inline: this runs at every FIN)
            if heap and (not run or heap[0] < run[0]):
                first, in_run = heap[0], False
            elif run:
                first, in_run = run[0], True
            else:
                break
            group = first[2]
            if type(group) is not list:
                if first[3] == group.token:
                    break   # live
                self._slots -= 1
            else:
                if group == msgs[at:at + len(group)]:
                    # The next of ``msgs`` are this entry's: it is void, known without
                    # asking each message (comparing lists of the same objects compares
                    # pointers).
                    at += len(group)
                elif first[3][-1] == group[-1].token or _has_live(first):
                    break   # live (its last message answers at once, mostly: ``_has_live``)
                self._slots -= len(group)
            if in_run:
                run.popleft()
            else:
                heapq.heappop(heap)
        if self._slots > self._compact_above and self._slots > 4 * self._live:
            self._compact()

    def pop_due(self, now: float) -> Iterator[Message]:
        """Yield, and remove, every message whose deadline is at or before ``now``."""
        while (first := self._first()) is not None and first[0] <= now:
            _, _, msg, token = self._pop_first()
            if type(msg) is list:
                self._slots -= len(msg)
                for m, t in zip(msg, token):
                    if t == m.token:
                        m.token += 1
                        self._live -= 1
                        yield m
                continue
            self._slots -= 1
            if token == msg.token:
                msg.token += 1
                self._live -= 1
                yield msg

    def next_deadline(self) -> float | None:
        while (first := self._first()) is not None and not _has_live(first):
            self._slots -= _size(self._pop_first())
        return first[0] if first is not None else None

    def live(self) -> list[Message]:
        return [m for entries in (self._run, self._heap) for entry in entries
                for m in _live_of(entry)]

    def clear(self) -> list[Message]:
        live = self.live()
        for msg in live:
            msg.token += 1
        self._run.clear()
        self._heap.clear()
        self._live = 0
        self._slots = 0
        return live

    def _compact(self) -> None:
        self._run = deque(_live_entries(self._run))   # still in order
        heap = _live_entries(self._heap)
        heapq.heapify(heap)
        self._heap = heap
        self._slots = self._live


_token = attrgetter("token")


def _live_entries(entries) -> list[tuple]:
    """``entries`` with their stale messages left out, in the same order."""
    out = []
    for entry in entries:
        if type(entry[2]) is not list:
            if entry[3] == entry[2].token:
                out.append(entry)
            continue
        kept = [m for m, t in zip(entry[2], entry[3]) if t == m.token]
        if kept:
            out.append((entry[0], entry[1], kept, [m.token for m in kept]))
    return out


def _size(entry: tuple) -> int:
    return len(entry[2]) if type(entry[2]) is list else 1


def _has_live(entry: tuple) -> bool:
    # A lease's messages leave together, and a consumer's batch mostly in order, so
    # its last message answers at once in practice.
    if type(entry[2]) is list:
        msgs, tokens = entry[2], entry[3]
        return tokens[-1] == msgs[-1].token or any(map(eq, tokens, map(_token, msgs)))
    return entry[3] == entry[2].token


def _live_of(entry: tuple) -> list[Message]:
    if type(entry[2]) is list:
        return [m for m, t in zip(entry[2], entry[3]) if t == m.token]
    return [entry[2]] if entry[3] == entry[2].token else []
