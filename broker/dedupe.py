"""Idempotent publishing: remember what each (producer id, sequence) published.

A writer that may replay a request (Spark re-running a micro-batch or a task)
names each MPUB with a producer id (it must name the writer: query, sink or
call, batch, partition) and a sequence number. The broker keeps one entry per
accepted request for ``window`` seconds of wall-clock time, at most
``capacity`` entries (oldest first out; ``--dedupe-window`` and
``--dedupe-capacity``): the first message id, the count, and a digest of the
topic, bodies, defers and ttls. An entry dies with its topic. A repeat with the same content
publishes nothing and gets the first ids back; a repeat with other content is
a ``ProducerConflict`` naming the producer, never a silent success.

Entries encode to bytes (``Entry.encode``) so storage can keep them with the
topic's log, and ``restore`` puts them back after a restart; expiry uses the
wall clock so an entry means the same after a restart.
"""

from __future__ import annotations

import hashlib
import struct
from collections import OrderedDict
from dataclasses import dataclass
from typing import Iterable, Sequence

from .clock import Clock
from .errors import ProducerConflict
from .message import id_run

DEFAULT_WINDOW_S = 600.0
DEFAULT_CAPACITY = 1_000_000
DIGEST_SIZE = 16

# at (wall ns), first id, count, sequence, digest, then the producer id (utf-8).
_HEAD = struct.Struct(f"<qQIQ{DIGEST_SIZE}s")


def content_digest(topic: str, bodies: Sequence[bytes], defers: Sequence[int],
                   ttls: Sequence[int] = ()) -> bytes:
    """A digest of what one request publishes: topic, each body, each defer, each ttl."""
    h = hashlib.blake2b(digest_size=DIGEST_SIZE)
    h.update(topic.encode())
    h.update(struct.pack("<I", len(bodies)))
    for body in bodies:
        h.update(struct.pack("<I", len(body)))
        h.update(body)
    if any(defers):
        h.update(struct.pack(f"<{len(defers)}I", *defers))
    if any(ttls):
        h.update(b"ttl")
        h.update(struct.pack(f"<{len(ttls)}Q", *ttls))
    return h.digest()


@dataclass(frozen=True)
class Entry:
    """What one accepted request published."""

    producer_id: str
    sequence: int
    at_ns: int
    first_id: int
    count: int
    digest: bytes

    @property
    def ids(self) -> list[str]:
        # A request's ids are one run: the core stamps them in one go.
        return id_run(self.first_id, self.count)

    def encode(self) -> bytes:
        return _HEAD.pack(self.at_ns, self.first_id, self.count, self.sequence,
                          self.digest) + self.producer_id.encode()

    @classmethod
    def decode(cls, payload: bytes) -> "Entry":
        at_ns, first_id, count, sequence, digest = _HEAD.unpack_from(payload)
        return cls(payload[_HEAD.size:].decode(), sequence, at_ns, first_id, count, digest)


class Deduplicator:
    def __init__(self, window: float = DEFAULT_WINDOW_S, capacity: int = DEFAULT_CAPACITY,
                 clock: Clock | None = None) -> None:
        self.window = window
        self.capacity = capacity
        self.clock = clock or Clock()
        # (producer id, sequence) -> (at ns, first id, count, digest, topic): a tuple costs
        # less than an Entry, and the window may hold a million of them (the topic is the
        # Topic's own name, one string shared by all its entries).
        self._seen: OrderedDict[tuple[str, int], tuple[int, int, int, bytes, str]] = \
            OrderedDict()

    def __len__(self) -> int:
        return len(self._seen)

    def seen(self, producer_id: str, sequence: int, digest: bytes) -> list[str] | None:
        """The ids first answered for this request if it is a repeat of the same content.

        Raises ``ProducerConflict`` if the same request published other content.
        """
        self._expire()
        entry = self._seen.get((producer_id, sequence))
        if entry is None:
            return None
        _, first_id, count, first_digest, _ = entry
        if first_digest != digest:
            raise ProducerConflict(
                f"producer {producer_id!r} sequence {sequence} already published other "
                f"content ({count} message(s)) within the de-duplication window: a replay "
                f"must publish the same rows in the same order, and each writer needs its "
                f"own producer name")
        return Entry(producer_id, sequence, 0, first_id, count, digest).ids

    def entry(self, producer_id: str, sequence: int, first_id: str, count: int,
              digest: bytes) -> Entry:
        return Entry(producer_id, sequence, self.clock.wall_ns(), int(first_id, 16), count,
                     digest)

    def remember(self, entry: Entry, topic: str = "") -> None:
        key = (entry.producer_id, entry.sequence)
        self._seen[key] = (entry.at_ns, entry.first_id, entry.count, entry.digest, topic)
        self._seen.move_to_end(key)
        while len(self._seen) > self.capacity:
            self._seen.popitem(last=False)

    def is_live(self, payload: bytes) -> bool:
        """Whether an encoded entry is still inside the window (storage keeps only these)."""
        at_ns = _HEAD.unpack_from(payload)[0]
        return self.clock.wall_ns() - at_ns <= self.window * 1e9

    def restore(self, payload: bytes, topic: str = "") -> None:
        """Put back an entry of ``topic`` read from storage at start; an expired one is
        ignored."""
        if self.is_live(payload):
            self.remember(Entry.decode(payload), topic)

    def restore_all(self, payloads: Iterable[bytes], topic: str = "") -> None:
        for payload in payloads:
            self.restore(payload, topic)

    def forget_topic(self, topic: str) -> int:
        """Drop the entries of ``topic`` (deleted): a replay into a topic made anew under
        its name publishes. Returns how many were dropped."""
        gone = [key for key, entry in self._seen.items() if entry[4] == topic]
        for key in gone:
            del self._seen[key]
        return len(gone)

    def _expire(self) -> None:
        seen = self._seen
        oldest = self.clock.wall_ns() - self.window * 1e9
        while seen:
            key, (at_ns, *_) = next(iter(seen.items()))
            if at_ns >= oldest:
                return
            del seen[key]
