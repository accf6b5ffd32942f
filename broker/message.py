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
                 "delivered_at", "loc", "expires")

    def __init__(self, id: str, body: bytes, timestamp: int, attempts: int = 0) -> None:
        self.id = id
        self.body = body
        self.timestamp = timestamp          # publish time, ns since the epoch
        self.attempts = attempts            # deliveries so far
        self.consumer: Optional["Consumer"] = None  # holder while in flight
        self.deadline = 0.0                 # in-flight or deferred deadline (monotonic s)
        self.token = 0                      # changes whenever a queued deadline is void
        self.delivered_at = 0.0
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


class IdFactory:
    """16 lower-case hex characters (64 bits), unique and increasing.

    Starts from the wall clock in microseconds, so ids stay unique across
    restarts as long as the broker publishes under a million messages per
    second on average.
    """

    def __init__(self, start: int | None = None) -> None:
        self._next = start if start is not None else time.time_ns() // 1000

    def __call__(self) -> str:
        n = self._next
        self._next = n + 1
        return f"{n:016x}"

    def many(self, count: int) -> list[str]:
        """``count`` ids in a row (one MPUB's)."""
        start = self._next
        self._next = start + count
        return [f"{n:016x}" for n in range(start, start + count)]

    def advance_past(self, msg_id: str) -> None:
        """Never hand out ``msg_id`` or anything below it (used after recovery)."""
        self._next = max(self._next, int(msg_id, 16) + 1)
