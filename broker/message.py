"""A message as one channel sees it.

The topic stamps the id, body and publish timestamp once; each channel gets its
own ``Message`` (sharing the body), since attempts and in-flight state are per
channel.
"""

from __future__ import annotations

import sys
import time
from array import array
from functools import lru_cache
from itertools import count, repeat
from typing import TYPE_CHECKING, Iterable, Optional, Sequence

if TYPE_CHECKING:
    from .consumer import Consumer


# attempts stops counting here (NSQ's wire field is a uint16).
MAX_ATTEMPTS = 65535


class Message:
    __slots__ = ("id", "body", "timestamp", "attempts", "consumer", "deadline", "token",
                 "loc", "expires")

    def __init__(self, id: str, body: bytes, timestamp: int, attempts: int = 0,
                 loc: int = 0, expires: int = 0) -> None:
        self.id = id
        self.body = body
        self.timestamp = timestamp          # publish time, ns since the epoch
        self.attempts = attempts            # deliveries so far
        self.consumer: Optional["Consumer"] = None  # holder while in flight
        self.deadline = 0.0                 # in-flight or deferred deadline (monotonic s)
        self.token = 0                      # changes whenever a queued deadline is void
        self.loc = loc                      # where its record is on disk (0: nowhere)
        self.expires = expires              # never delivered from then on (wall ns; 0: never)

    def delivered(self) -> None:
        """Count one more delivery."""
        if self.attempts < MAX_ATTEMPTS:
            self.attempts += 1

    def copy(self) -> "Message":
        return Message(self.id, self.body, self.timestamp, self.attempts, self.loc,
                       self.expires)

    def __repr__(self) -> str:
        return f"Message(id={self.id!r}, attempts={self.attempts}, body={self.body[:32]!r})"


_new = object.__new__


def made(ids: Sequence[str], bodies: Iterable[bytes], timestamps: Iterable[int],
         locs: Iterable[int], expires: Iterable[int] | None = None) -> list[Message]:
    """Messages never delivered, ``ids``, ``bodies``, ``timestamps``, ``locs`` (and
    ``expires``; None: none expire) in step: what ``Message(id, body, timestamp, 0, loc,
    expires)`` makes of each, built in bulk: no ``__init__`` frame per message (the
    larger part of making one), every slot set in one loop."""
    msgs = list(map(_new, repeat(Message, len(ids))))
    if expires is None:  # (the usual case: one iterator fewer to step through)
        for msg, msg_id, body, timestamp, at in zip(msgs, ids, bodies, timestamps, locs):
            msg.id = msg_id
            msg.body = body
            msg.timestamp = timestamp
            msg.attempts = 0
            msg.consumer = None
            msg.deadline = 0.0
            msg.token = 0
            msg.loc = at
            msg.expires = 0
        return msgs
    for msg, msg_id, body, timestamp, at, expiry in zip(
            msgs, ids, bodies, timestamps, locs, expires):
        msg.id = msg_id
        msg.body = body
        msg.timestamp = timestamp
        msg.attempts = 0
        msg.consumer = None
        msg.deadline = 0.0
        msg.token = 0
        msg.loc = at
        msg.expires = expiry
    return msgs


def read_back(ids: Sequence[str], bodies: Sequence[bytes], timestamps: Iterable[int],
              loc: int, expires: Iterable[int] | None = None) -> list[Message]:
    """Messages read back from the log, never delivered: ``made`` at locations ``loc``,
    ``loc + 1``, ..."""
    return made(ids, bodies, timestamps, count(loc), expires)


# An id carries its broker's node id in its low bits, as nsqd's GUIDs do: brokers
# of a fleet with different node ids never hand out the same id.
NODE_ID_BITS = 10
MAX_NODE_ID = (1 << NODE_ID_BITS) - 1
_ID_STEP = 1 << NODE_ID_BITS


_SWAP = sys.byteorder == "little"
_ORDER = sys.byteorder  # of an array's numbers in memory


@lru_cache(maxsize=256)
def runs_of(count: int) -> tuple[int, int]:
    """(1, 1, ... and 0, 1, 2, ...) as numbers of ``count`` 64-bit digits, as an array
    of ``count`` locations in memory reads: ``first * ones + steps`` is the run
    ``first``, ``first + 1``, ... (no digit carries into the next below 2**63)."""
    return (int.from_bytes((1).to_bytes(8, _ORDER) * count, _ORDER),
            int.from_bytes(array("q", range(count)).tobytes(), _ORDER))


# The longest run ``consecutive`` makes from one number (so ``runs_of`` caches numbers of
# at most this many digits, whatever an MPUB's size).
RUN = 1024


def consecutive(first: int, count: int) -> array:
    """The locations ``first`` to ``first + count - 1`` as an array, made from one number
    per ``RUN`` (setting an array's items one by one costs a few hundred instructions each)."""
    locs = array("q")
    for at in range(0, count, RUN):
        n = min(RUN, count - at)
        ones, steps = runs_of(n)
        locs.frombytes(((first + at) * ones + steps).to_bytes(8 * n, _ORDER))
    return locs


def raw_id_run(first: int, count: int) -> bytes:
    """The ``count`` ids one broker hands out in a row from ``first``, as 8 big-endian
    bytes each (as the log stores them), made in one C pass."""
    ids = array("Q", list(range(first, first + count * _ID_STEP, _ID_STEP)))  # (a list: faster)
    if _SWAP:
        ids.byteswap()
    return ids.tobytes()


def hex_ids(raw: bytes) -> list[str]:
    """Ids given as 8 big-endian bytes each, as 16 lower-case hex digits each (in C:
    a space every 8 bytes, then split)."""
    return raw.hex(" ", 8).split(" ") if raw else []


def id_run(first: int, count: int) -> list[str]:
    """The ``count`` ids one broker hands out in a row from ``first`` (one MPUB's)."""
    return hex_ids(raw_id_run(first, count))


class IdFactory:
    """16 lower-case hex characters (64 bits), unique and increasing per broker.

    An id is a sequence number shifted left by ``NODE_ID_BITS``, with the
    broker's node id (0..1023, ``--node-id``) in the low bits: two brokers with
    different node ids never make the same id. The sequence starts from the
    wall clock in microseconds, so ids stay unique and increasing across
    restarts as long as the broker publishes under a million messages per
    second on average (recovery moves it past every id on disk besides). 54
    bits of sequence last until the year 2540.
    """

    def __init__(self, node_id: int = 0, start: int | None = None) -> None:
        check_node_id(node_id)
        sequence = start if start is not None else time.time_ns() // 1000
        self._next = sequence << NODE_ID_BITS | node_id

    @property
    def node_id(self) -> int:
        return self._next & MAX_NODE_ID

    @node_id.setter
    def node_id(self, node_id: int) -> None:
        """From now on put ``node_id`` into every id (ids keep increasing)."""
        check_node_id(node_id)
        self._next = ((self._next >> NODE_ID_BITS) + 1) << NODE_ID_BITS | node_id

    def __call__(self) -> str:
        n = self._next
        self._next = n + _ID_STEP
        return f"{n:016x}"

    def many(self, count: int) -> list[str]:
        """``count`` ids in a row (one MPUB's)."""
        return hex_ids(self.many_raw(count))

    def many_raw(self, count: int) -> bytes:
        """``count`` ids in a row, as 8 big-endian bytes each (``hex_ids`` spells them)."""
        start = self._next
        self._next = start + count * _ID_STEP
        return raw_id_run(start, count)

    def advance_past(self, msg_id: str) -> None:
        """Never hand out ``msg_id`` or anything below it (used after recovery)."""
        after = ((int(msg_id, 16) >> NODE_ID_BITS) + 1) << NODE_ID_BITS | self.node_id
        self._next = max(self._next, after)


def check_node_id(node_id: int) -> None:
    if not 0 <= node_id <= MAX_NODE_ID:
        raise ValueError(f"node-id must be 0 to {MAX_NODE_ID}, got {node_id}")


class Published:
    """One publish's messages as columns: what storage writes in one go, and what each
    queue makes ``Message`` objects of, only for those it keeps in memory (those that
    wait on disk only are queued by location, in bulk)."""

    __slots__ = ("raw_ids", "ids", "bodies", "timestamp", "expires", "size", "runs")

    def __init__(self, raw_ids: bytes, bodies: Sequence[bytes], timestamp: int,
                 expires: Sequence[int] | None = None, ids: list[str] | None = None,
                 size: int | None = None) -> None:
        self.raw_ids = raw_ids              # 8 big-endian bytes each
        self.ids = ids if ids is not None else hex_ids(raw_ids)
        self.bodies = bodies
        self.timestamp = timestamp          # publish time of each, ns since the epoch
        self.expires = expires              # each one's expiry (wall ns); None: none expire
        self.size = sum(map(len, bodies)) if size is None else size  # body bytes
        # Where they are on disk, as runs (first location, count) in order; empty: nowhere.
        self.runs: list[tuple[int, int]] = []

    @classmethod
    def of(cls, msg: Message) -> "Published":
        """A message that exists already (a dead letter's copy), as a publish of its own."""
        return cls(bytes.fromhex(msg.id), [msg.body], msg.timestamp,
                   [msg.expires] if msg.expires else None, [msg.id])

    def __len__(self) -> int:
        return len(self.ids)

    def messages(self, start: int = 0, stop: int | None = None) -> list[Message]:
        """Messages ``start`` to ``stop``, each made anew (a queue's own)."""
        stop = len(self.ids) if stop is None else stop
        expires = self.expires
        runs = self.runs
        # In one run (one record), their locations are a range: no array made to be read
        # back at once (an array's item costs a few hundred instructions to set).
        locs: Iterable[int] = (repeat(0) if not runs else
                               range(runs[0][0] + start, runs[0][0] + stop) if len(runs) == 1
                               else self.locations(start, stop))
        if stop - start < 2:  # (a PUB's: one ``__init__`` costs less than ``made``'s loop)
            return list(map(Message, self.ids[start:stop], self.bodies[start:stop],
                            repeat(self.timestamp), repeat(0), locs,
                            repeat(0) if expires is None else expires[start:stop]))
        return made(self.ids[start:stop], self.bodies[start:stop], repeat(self.timestamp),
                    locs, None if expires is None else expires[start:stop])

    def locations(self, start: int = 0, stop: int | None = None) -> array:
        """Where messages ``start`` to ``stop`` are on disk (stored: ``runs`` is set)."""
        stop = len(self.ids) if stop is None else stop
        runs = self.runs
        if len(runs) == 1:
            return consecutive(runs[0][0] + start, stop - start)
        locs = array("q")
        for first, count in runs:
            locs += consecutive(first, count)
        return locs[start:stop]
