"""A message as one channel sees it.

The topic stamps the id, body and publish timestamp once; each channel gets its
own ``Message`` (sharing the body), since attempts and in-flight state are per
channel.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    from .consumer import Consumer


# attempts stops counting here (NSQ's wire field is a uint16).
MAX_ATTEMPTS = 65535


class Message:
    __slots__ = ("id", "body", "timestamp", "attempts", "consumer", "deadline", "token",
                 "loc", "expires")

    def __init__(self, id: str, body: bytes, timestamp: int, attempts: int = 0) -> None:
        self.id = id
        self.body = body
        self.timestamp = timestamp          # publish time, ns since the epoch
        self.attempts = attempts            # deliveries so far
        self.consumer: Optional["Consumer"] = None  # holder while in flight
        self.deadline = 0.0                 # in-flight or deferred deadline (monotonic s)
        self.token = 0                      # changes whenever a queued deadline is void
        self.loc = 0                        # where its record is on disk (0: nowhere)
        self.expires = 0                    # never delivered from then on (wall ns; 0: never)

    def delivered(self) -> None:
        """Count one more delivery."""
        if self.attempts < MAX_ATTEMPTS:
            self.attempts += 1

    def copy(self) -> "Message":
        msg = Message(self.id, self.body, self.timestamp, self.attempts)
        msg.loc = self.loc
        msg.expires = self.expires
        return msg

    def __repr__(self) -> str:
        return f"Message(id={self.id!r}, attempts={self.attempts}, body={self.body[:32]!r})"


# An id carries its broker's node id in its low bits, as nsqd's GUIDs do: brokers
# of a fleet with different node ids never hand out the same id.
NODE_ID_BITS = 10
MAX_NODE_ID = (1 << NODE_ID_BITS) - 1
_ID_STEP = 1 << NODE_ID_BITS


def id_run(first: int, count: int) -> list[str]:
    """The ``count`` ids one broker hands out in a row from ``first`` (one MPUB's)."""
    return [f"{n:016x}" for n in range(first, first + count * _ID_STEP, _ID_STEP)]


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
        start = self._next
        self._next = end = start + count * _ID_STEP
        return [f"{n:016x}" for n in range(start, end, _ID_STEP)]  # id_run, without a call

    def advance_past(self, msg_id: str) -> None:
        """Never hand out ``msg_id`` or anything below it (used after recovery)."""
        after = ((int(msg_id, 16) >> NODE_ID_BITS) + 1) << NODE_ID_BITS | self.node_id
        self._next = max(self._next, after)


def check_node_id(node_id: int) -> None:
    if not 0 <= node_id <= MAX_NODE_ID:
        raise ValueError(f"node-id must be 0 to {MAX_NODE_ID}, got {node_id}")
