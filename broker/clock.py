"""Time, behind a seam the tests can turn by hand.

The core never reads the system clock directly: deadlines use ``monotonic()``
seconds, publish timestamps use ``wall_ns()``. ``ManualClock`` lets unit tests
move time forward without sleeping.
"""

from __future__ import annotations

import time


class Clock:
    """The real clock."""

    def monotonic(self) -> float:
        return time.monotonic()

    def wall_ns(self) -> int:
        return time.time_ns()


class ManualClock(Clock):
    """A clock that moves only when told to."""

    def __init__(self, start: float = 1000.0, wall_start_ns: int = 1_700_000_000 * 10**9) -> None:
        self._now = start
        self._wall_offset_ns = wall_start_ns - int(start * 1e9)

    def monotonic(self) -> float:
        return self._now

    def wall_ns(self) -> int:
        return self._wall_offset_ns + int(self._now * 1e9)

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a clock does not go backwards")
        self._now += seconds
