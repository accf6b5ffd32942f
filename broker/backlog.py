"""Ready messages in order, at most ``limit`` of them in memory.

Past the limit a durable message waits on disk only: its log location goes
into an ``OnDisk`` run (8 bytes a message) and it is read back when it comes
up. Messages delivered before (``attempts`` > 0) or not on disk stay in memory,
so nothing a consumer saw loses its count.
"""

from __future__ import annotations

from array import array
from collections import deque
from typing import Callable, Iterable, Iterator

from .message import Message


class OnDisk:
    """A run of messages that wait on disk only: their locations, in queue order."""

    __slots__ = ("locs", "start")

    def __init__(self, locs: Iterable[int] = ()) -> None:
        self.locs = array("q", locs)
        self.start = 0

    def __len__(self) -> int:
        return len(self.locs) - self.start

    def pop(self) -> int:
        loc = self.locs[self.start]
        self.start += 1
        if self.start > 4096 and self.start * 2 > len(self.locs):
            del self.locs[:self.start]
            self.start = 0
        return loc

    def remaining(self) -> array:
        return self.locs[self.start:]


Entry = Message | OnDisk
Loader = Callable[[int], "Message | None"]


class Backlog:
    def __init__(self, limit: int | None, load: Loader) -> None:
        self.limit = limit                   # None: everything in memory
        self._load = load
        self._items: deque[Entry] = deque()
        self._len = 0
        self._in_memory = 0

    def __len__(self) -> int:
        return self._len

    def __bool__(self) -> bool:
        return self._len > 0

    @property
    def in_memory(self) -> int:
        return self._in_memory

    def append(self, msg: Message) -> None:
        limit = self.limit
        if limit is None or self._in_memory < limit or not msg.loc or msg.attempts:
            self._items.append(msg)
            self._in_memory += 1
        else:
            self._spill(msg.loc)
        self._len += 1

    def extend(self, msgs: Iterable[Message]) -> None:
        for msg in msgs:
            self.append(msg)

    def extend_on_disk(self, locs: "array | list[int]") -> None:
        """Queue messages known by location only; up to the limit are read in now."""
        i, limit = 0, self.limit
        while i < len(locs) and (limit is None or self._in_memory < limit):
            msg = self._load(locs[i])
            i += 1
            if msg is not None:
                self._items.append(msg)
                self._in_memory += 1
                self._len += 1
        if i < len(locs):
            rest = locs[i:]
            items = self._items
            if items and type(items[-1]) is OnDisk:
                items[-1].locs.extend(rest)
            else:
                items.append(OnDisk(rest))
            self._len += len(rest)

    def _spill(self, loc: int) -> None:
        items = self._items
        if items and type(items[-1]) is OnDisk:
            items[-1].locs.append(loc)
        else:
            items.append(OnDisk((loc,)))

    def push_front(self, msgs: list[Message]) -> None:
        """Put messages back ahead of the rest (held ones that come back)."""
        self._items.extendleft(reversed(msgs))
        self._in_memory += len(msgs)
        self._len += len(msgs)

    def popleft(self) -> Message | None:
        """The next message (read back from disk if need be); None when empty. A
        message damaged on disk is skipped (the loader logs it)."""
        items = self._items
        while items:
            head = items[0]
            if type(head) is not OnDisk:
                items.popleft()
                self._in_memory -= 1
                self._len -= 1
                return head
            loc = head.pop()
            if not head:
                items.popleft()
            self._len -= 1
            msg = self._load(loc)
            if msg is not None:
                return msg
        return None

    def messages(self) -> Iterator[Message]:
        """The messages held in memory, in order."""
        return (m for m in self._items if type(m) is not OnDisk)

    def take_ids(self, wanted: set[str]) -> dict[str, Message]:
        """Remove the in-memory messages whose id is in ``wanted``; return them by id."""
        found: dict[str, Message] = {}
        keep: deque[Entry] = deque()
        for item in self._items:
            if type(item) is not OnDisk and item.id in wanted:
                found[item.id] = item
            else:
                keep.append(item)
        if found:
            self._items = keep
            self._in_memory -= len(found)
            self._len -= len(found)
        return found

    def take_all(self) -> list[Entry]:
        """Everything, in order, leaving the backlog empty."""
        items = list(self._items)
        self._items.clear()
        self._len = self._in_memory = 0
        return items

    def oldest_location(self) -> int:
        """The smallest log location queued here (0: none)."""
        locs = [m.loc for m in self.messages() if m.loc]
        locs += [item.locs[item.start] for item in self._items if type(item) is OnDisk]
        return min(locs, default=0)

    def copies(self) -> Iterator[tuple[int, int]]:
        """(log location, attempts) of each queued durable message."""
        for item in self._items:
            if type(item) is OnDisk:
                for loc in item.remaining():
                    yield loc, 0
            elif item.loc:
                yield item.loc, item.attempts

    def relocate(self, moved: dict[int, int]) -> None:
        """Messages whose records were copied elsewhere in the log: old -> new location."""
        for item in self._items:
            if type(item) is OnDisk:
                locs = item.locs
                for i in range(item.start, len(locs)):
                    new = moved.get(locs[i])
                    if new:
                        locs[i] = new
            elif item.loc in moved:
                item.loc = moved[item.loc]

    def on_disk(self) -> Iterator[int]:
        """Where each message that waits on disk only is."""
        for item in self._items:
            if type(item) is OnDisk:
                yield from item.remaining()
