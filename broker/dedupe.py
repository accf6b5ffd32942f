"""Idempotent publishing: remember which (producer id, sequence) were accepted.

A writer that may replay a request (Spark re-running a micro-batch or a task)
names each request with a producer id and a sequence number. The broker keeps
what it answered to each pair for ``window`` seconds, and at most ``capacity``
pairs (oldest first out); a repeat inside the window publishes nothing and gets
the same ids back. With ``--data-path`` the window survives a restart: each
entry is written (``encode``) with the MPUB it names and ``restore``d on start.
"""

from __future__ import annotations

import json
from collections import OrderedDict

from .clock import Clock

DEFAULT_WINDOW_S = 600.0
DEFAULT_CAPACITY = 1_000_000


class Deduplicator:
    def __init__(self, window: float = DEFAULT_WINDOW_S, capacity: int = DEFAULT_CAPACITY,
                 clock: Clock | None = None) -> None:
        self.clock = clock or Clock()
        self.window = window
        self.capacity = capacity
        self._seen: OrderedDict[tuple[str, int], tuple[float, list[str]]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._seen)

    def seen(self, producer_id: str, sequence: int, now: float) -> list[str] | None:
        """The ids first answered for this request, if it is a repeat."""
        self._expire(now)
        entry = self._seen.get((producer_id, sequence))
        return None if entry is None else entry[1]

    def remember(self, producer_id: str, sequence: int, ids: list[str], now: float) -> None:
        self._seen[(producer_id, sequence)] = (now, ids)
        while len(self._seen) > self.capacity:
            self._seen.popitem(last=False)

    def _expire(self, now: float) -> None:
        seen = self._seen
        while seen:
            key, (at, _) = next(iter(seen.items()))
            if now - at <= self.window:
                return
            del seen[key]

    # -- persisted with the topic log ---------------------------------------
    def encode(self, producer_id: str, sequence: int, ids: list[str]) -> bytes:
        """The entry ``remember`` will keep for this request, as bytes for the log
        (stamped with wall-clock time, so its age survives a restart)."""
        return json.dumps([producer_id, sequence, self.clock.wall_ns(), ids]).encode()

    def restore(self, payload: bytes) -> None:
        """Remember an entry read back from the log, if it is still in the window."""
        producer_id, sequence, wall_ns, ids = json.loads(payload)
        age = (self.clock.wall_ns() - wall_ns) / 1e9
        if age <= self.window:
            self.remember(producer_id, sequence, ids, self.clock.monotonic() - max(0.0, age))

    def is_live(self, payload: bytes) -> bool:
        """Whether an entry is still inside the window (so its log record must be kept)."""
        wall_ns = json.loads(payload)[2]
        return (self.clock.wall_ns() - wall_ns) / 1e9 <= self.window
