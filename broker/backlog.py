"""Ready messages in order, at most ``limit`` of them in memory.

Past the limit a durable message waits on disk only: its log location goes
into an ``OnDisk`` run (8 bytes a message, 2 more for its delivery count once a
message of the run has been delivered before) and it is read back when it comes
up. Messages not on disk (``#ephemeral`` topics) stay in memory. Messages put
back at the front (a consumer gone, a lease's rest) stay in memory up to the
limit and the read-ahead allowance, and wait on disk past that.

With a ``fetch`` (a running broker), a run is read ahead of the cursor without
waiting for the disk, ``READ_AHEAD`` messages at a time: what was read goes in memory
ahead of the run when the run comes up, and the next ones are asked for at
once (so at most twice ``READ_AHEAD`` are in memory on top of ``limit``).
``popleft`` never waits for the disk: while the next messages are being read
it returns None, and ``wake`` is called when they arrive. ``popleft(wait=False)``
reads the next one at once instead (a lease must not come back empty while
messages wait).
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from collections import deque
from itertools import accumulate, islice, repeat
from operator import attrgetter
from typing import Callable, Iterable, Iterator

from .message import Message, Published

_LOC, _ATTEMPTS = attrgetter("loc"), attrgetter("attempts")
_NOTHING = object()  # what a backlog never holds
# Messages of a run read from disk at once, ahead of the cursor.
READ_AHEAD = 1024
# Messages in memory past the limit that are still kept when put back at the front.
SLACK = READ_AHEAD


class ReadLater(Exception):
    """Raised by a loader: the disk could not be read just now (a passing error, not
    damage). The message stays queued where it is; ``popleft`` returns None and sets
    ``stalled``: whoever pops tries again in ``retry_in`` seconds."""

    def __init__(self, what: str, retry_in: float) -> None:
        super().__init__(f"{what}: reading from disk failed; retried in {retry_in:.2f}s")
        self.retry_in = retry_in


class OnDisk:
    """A run of messages that wait on disk only: their locations, in queue order,
    and those of the next ones already read back (``loaded``)."""

    __slots__ = ("locs", "attempts", "start", "loaded", "base", "reading", "gone", "sync")

    def __init__(self, locs: Iterable[int] = (), attempts: Iterable[int] | None = None) -> None:
        self.locs = array("q", locs)
        # Each one's delivery count, once one of them has any (None: all 0).
        self.attempts: array | None = None
        if attempts is not None:
            self.attempts = array("H", attempts)
            if not any(self.attempts):
                self.attempts = None
        self.start = 0
        # Read back, for the positions from ``start`` on (None: to read again at once).
        self.loaded: deque[Message | None] = deque()
        self.base = 0           # positions cut off the front of ``locs``
        self.reading = False    # a read is under way
        self.gone = False       # no longer in its backlog
        self.sync = False       # reading ahead failed: read on the spot from now on

    def __len__(self) -> int:
        return len(self.locs) - self.start

    def pop(self) -> tuple[int, int]:
        """The next location and its delivery count, taken off the run."""
        start = self.start
        loc = self.locs[start]
        attempts = self.attempts[start] if self.attempts is not None else 0
        self._advance(1)
        return loc, attempts

    def append(self, loc: int, attempts: int = 0) -> None:
        if attempts and self.attempts is None:
            self.attempts = array("H", bytes(2 * len(self.locs)))
        self.locs.append(loc)
        if self.attempts is not None:
            self.attempts.append(attempts)

    def extend(self, locs: "array | list[int]", attempts: "array | None" = None) -> None:
        if attempts is not None and self.attempts is None and any(attempts):
            self.attempts = array("H", bytes(2 * len(self.locs)))
        self.locs.extend(locs)
        if self.attempts is not None:
            self.attempts.extend(attempts if attempts is not None
                                 else array("H", bytes(2 * len(locs))))

    def attempts_of(self, start: int, count: int) -> "array | None":
        """Delivery counts of the ``count`` positions from ``start`` (None: all 0)."""
        if self.attempts is None:
            return None
        return self.attempts[start:start + count]

    def take(self, count: int) -> array:
        """The next ``count`` locations, taken off the run."""
        taken = self.locs[self.start:self.start + count]
        self._advance(count)
        return taken

    def _advance(self, count: int) -> None:
        self.start += count
        if self.start > 4096 and self.start * 2 > len(self.locs):
            del self.locs[:self.start]
            if self.attempts is not None:
                del self.attempts[:self.start]
            self.base += self.start
            self.start = 0

    def remaining(self) -> array:
        return self.locs[self.start:]

    def remaining_attempts(self) -> "array | None":
        return self.attempts_of(self.start, len(self))


Entry = Message | OnDisk
# In a run's ``loaded``: read again after failing its check, and lost (damaged on disk).
_LOST = Message("", b"", 0)
Loader = Callable[[int], "Message | None"]
# (locations, done, cached_only) -> whether a read was started; ``done`` gets the
# messages read (None for one that failed its check) or None if the read failed,
# later or at once (before the fetcher returns: the page cache held them). With
# ``cached_only`` nothing starts unless it can be read at once.
Fetcher = Callable[[array, Callable[["list[Message | None] | None"], None], bool], bool]


class Backlog:
    def __init__(self, limit: int | None, load: Loader, fetch: Fetcher | None = None,
                 wake: Callable[[], None] | None = None) -> None:
        self.limit = limit                   # None: everything in memory
        self._load = load
        self._fetch = fetch
        self._wake = wake
        self._items: deque[Entry] = deque()
        # How many wait, in memory and on disk (``len``): an attribute the channel reads
        # at every FIN, where ``__len__`` and ``__bool__`` would each be a Python call.
        self.count = 0
        self._in_memory = 0
        self._ahead: OnDisk | None = None    # the run read ahead last
        # A read from disk failed for now: nothing more is read from disk until whoever
        # pops clears it (after a back-off) and pops again.
        self.stalled = False

    def __len__(self) -> int:
        return self.count

    def __bool__(self) -> bool:
        return self.count > 0

    @property
    def in_memory(self) -> int:
        """Messages queued in memory (not those of a run read ahead of their turn)."""
        return self._in_memory

    @property
    def bodies_in_memory(self) -> int:
        """Messages whose body is in memory: queued, and read ahead of their turn.
        At most ``limit`` + ``SLACK`` + twice ``READ_AHEAD``."""
        ahead = self._ahead
        return self._in_memory + (len(ahead.loaded) if ahead is not None and not ahead.gone
                                  else 0)

    def append(self, msg: Message) -> None:
        limit = self.limit
        if limit is None or self._in_memory < limit or not msg.loc:
            self._items.append(msg)
            self._in_memory += 1
        else:
            self._spill(msg.loc, msg.attempts)
        self.count += 1

    def extend(self, msgs: Iterable[Message]) -> None:
        """``append`` each, in bulk: what fits under the limit goes in memory, the rest
        waits on disk (those not on disk stay in memory)."""
        msgs = msgs if type(msgs) is list else list(msgs)
        n = len(msgs)
        limit = self.limit
        room = n if limit is None else min(max(limit - self._in_memory, 0), n)
        if room:
            self._items.extend(msgs if room == n else msgs[:room])
            self._in_memory += room
            self.count += room
        if room == n:
            return
        rest = msgs[room:]
        locs = array("q", map(_LOC, rest))
        if not all(locs):  # some are not on disk: they stay in memory, in their place
            for msg in rest:
                self.append(msg)
            return
        attempts = array("H", map(_ATTEMPTS, rest))
        self.extend_on_disk(locs, attempts if any(attempts) else None)

    def extend_published(self, run: Published) -> None:
        """``extend`` with a publish's messages, making ``Message`` objects only of
        those kept in memory; the rest are queued by location at once."""
        n = len(run)
        limit = self.limit
        room = n if limit is None or not run.runs else min(max(limit - self._in_memory, 0), n)
        if room:
            self._items.extend(run.messages(0, room))
            self._in_memory += room
            self.count += room
        if room < n:
            self.extend_on_disk(run.locations(room, n))

    def extend_on_disk(self, locs: "array | list[int]", attempts: "array | None" = None
                       ) -> None:
        """Queue messages known by location only (read back when they come up), with
        their delivery counts (None: all 0)."""
        if not len(locs):
            return
        items = self._items
        if items and type(items[-1]) is OnDisk:
            items[-1].extend(locs, attempts)
        else:
            items.append(OnDisk(locs, attempts))
        self.count += len(locs)

    def _spill(self, loc: int, attempts: int) -> None:
        items = self._items
        if items and type(items[-1]) is OnDisk:
            items[-1].append(loc, attempts)
        else:
            items.append(OnDisk((loc,), (attempts,) if attempts else None))

    def push_front(self, msgs: list[Message], keep: bool = False) -> None:
        """Put messages back ahead of the rest (held ones that come back); past the limit
        and the read-ahead allowance, those on disk wait there, unless ``keep``."""
        limit = self.limit
        room = len(msgs) if limit is None or keep else limit + SLACK - self._in_memory
        if room < len(msgs):
            front: list[Entry] = list(msgs[:max(room, 0)])
            run = None
            for msg in msgs[len(front):]:
                if not msg.loc:
                    front.append(msg)
                    run = None
                    continue
                if run is None:
                    run = OnDisk()
                    front.append(run)
                run.append(msg.loc, msg.attempts)
            self._items.extendleft(reversed(front))
            self._in_memory += sum(1 for item in front if type(item) is not OnDisk)
        else:
            self._items.extendleft(reversed(msgs))
            self._in_memory += len(msgs)
        self.count += len(msgs)

    def popleft(self, wait: bool = True) -> Message | None:
        """The next message; None when empty or, if ``wait``, while the next one is
        being read from disk. A message damaged on disk is skipped (the loader logs it)."""
        items = self._items
        while items:
            head = items[0]
            if type(head) is not OnDisk:
                items.popleft()
                self._in_memory -= 1
                self.count -= 1
                return head
            if not head:
                items.popleft()
                head.gone = True
                continue
            if head.loaded:
                try:
                    self._take_in(head)
                except ReadLater:
                    self.stalled = True
                    return None
                continue
            if self.stalled:  # a read failed: the next waits for its back-off
                return None
            if not head.sync and self._fetch is not None:
                # A lease (not ``wait``) takes what the page cache holds, in bulk.
                self._read_ahead(head, cached_only=not wait)
                if head.loaded:  # read at once (the page cache had them)
                    continue
                if wait and not head.sync:
                    return None
            # Read on the spot: no reading ahead, or it failed, or a lease is waiting
            # (a read under way for these positions is then read again).
            try:
                msg = self._load(head.locs[head.start])
            except ReadLater:
                self.stalled = True
                return None
            _, attempts = head.pop()
            self.count -= 1
            if not head:
                items.popleft()
                head.gone = True
            if msg is not None:
                msg.attempts = attempts
                return msg
        return None

    def popleft_in_memory(self, limit: int, max_bytes: int = 0) -> list[Message]:
        """Up to ``limit`` messages off the front, as long as they are in memory: it stops
        at the first that waits on disk (``popleft`` reads that one). With ``max_bytes``
        > 0 it also stops after the message whose body takes their bodies to
        ``max_bytes``. In bulk, for a lease or a pump taking many at once."""
        items = self._items
        head = list(islice(items, limit))
        kinds = list(map(type, head))
        if OnDisk in kinds:
            head = head[:kinds.index(OnDisk)]
        if max_bytes and head:
            ends = list(accumulate([len(msg.body) for msg in head]))
            if ends[-1] >= max_bytes:
                head = head[:bisect_left(ends, max_bytes) + 1]
        if len(head) == len(items):
            items.clear()
        else:  # popped in C: ``popleft`` called until ``len(head)`` are gone
            deque(islice(iter(items.popleft, _NOTHING), len(head)), 0)
        self._in_memory -= len(head)
        self.count -= len(head)
        return head

    def _take_in(self, run: OnDisk) -> None:
        """Put what was read ahead of ``run`` (now the head) in memory before it."""
        loaded = run.loaded
        msgs: list[Message] | deque[Message | None] = loaded
        # (``all``: a Message is always true; ``None in`` compares each with None, a tenth
        # of a read-back message's instructions)
        if not all(loaded):  # failed its check: read again, the loader logs a loss
            locs = run.locs[run.start:run.start + len(loaded)]
            for i, loc in enumerate(locs):
                if loaded[i] is None:  # ReadLater leaves the rest to read next time
                    loaded[i] = self._load(loc) or _LOST
            msgs = [m for m in loaded if m is not _LOST]
            self.count -= len(loaded) - len(msgs)
        attempts = run.attempts_of(run.start, len(loaded))
        if attempts is not None:
            for msg, count in zip(loaded, attempts):
                if msg is not _LOST:
                    msg.attempts = count
        run.loaded = deque()
        run.take(len(loaded))
        items = self._items
        items.extendleft(reversed(msgs))
        self._in_memory += len(msgs)
        if not run:
            del items[len(msgs)]
            run.gone = True
        else:  # the next ones are read while these go
            self._read_ahead(run)

    def _read_ahead(self, run: OnDisk, cached_only: bool = False) -> None:
        """Ask for the next messages of ``run`` (after those read or being read); with
        ``cached_only``, only if the page cache holds them (nothing else starts)."""
        if run.reading or run.gone or run.sync:
            return
        first = run.start + len(run.loaded)
        count = min(READ_AHEAD - len(run.loaded), len(run.locs) - first)
        if count <= 0:
            return
        locs = run.locs[first:first + count]
        at = run.base + first
        self._ahead = run

        def done(msgs: "list[Message | None] | None") -> None:
            run.reading = False
            if run.gone:
                return
            if msgs is None:
                run.sync = True
            elif (at == run.base + run.start + len(run.loaded)
                  and run.locs[at - run.base:at - run.base + len(locs)] == locs):
                run.loaded.extend(msgs)
            # else: read on the spot or moved meanwhile; read again when it comes up
            if (not fetching and self._items and self._items[0] is run
                    and self._wake is not None):
                self._wake()

        run.reading = fetching = True
        started = self._fetch(locs, done, cached_only)
        fetching = False
        if not started:  # (``sync`` was False: checked above)
            run.reading = False
            run.sync = not cached_only

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
            self.count -= len(found)
        return found

    def take_all(self) -> list[Entry]:
        """Everything, in order, leaving the backlog empty."""
        items = list(self._items)
        for item in items:
            if type(item) is OnDisk:
                item.gone = True
        self._items.clear()
        self.count = self._in_memory = 0
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
                attempts = item.remaining_attempts()
                yield from zip(item.remaining(), attempts if attempts is not None
                               else repeat(0))
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
                for msg in item.loaded:
                    if msg is not None and msg.loc in moved:
                        msg.loc = moved[msg.loc]
            elif item.loc in moved:
                item.loc = moved[item.loc]

    def on_disk(self) -> Iterator[int]:
        """Where each message that waits on disk only is."""
        for item in self._items:
            if type(item) is OnDisk:
                yield from item.remaining()
