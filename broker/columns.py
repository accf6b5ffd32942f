"""Messages as packed columns (Arrow's little-endian layout), for lease fetches.

``frames`` runs in the broker; ``decode`` turns a frame back into rows for
clients without Arrow. The Spark reader builds Arrow arrays from the buffers
directly (``spark_connector.fetch``).
"""

from __future__ import annotations

import sys
from array import array
from bisect import bisect_right
from itertools import accumulate
from operator import attrgetter
from typing import Iterator, NamedTuple

from .api import broker_pb2 as pb
from .message import Message

_LITTLE = sys.byteorder == "little"
_ID, _BODY = attrgetter("id"), attrgetter("body")
_TIMESTAMP, _ATTEMPTS = attrgetter("timestamp"), attrgetter("attempts")


def _packed(typecode: str, values) -> bytes:
    a = array(typecode, values)
    if not _LITTLE:
        a.byteswap()
    return a.tobytes()


def _unpacked(typecode: str, data: bytes) -> array:
    a = array(typecode, data)
    if not _LITTLE:
        a.byteswap()
    return a


def frames(msgs: list[Message], max_messages: int, max_bytes: int,
           attempts: list[int] | None = None) -> Iterator[pb.MessageColumns]:
    """``msgs`` in order, as frames of at most ``max_messages`` messages and
    ``max_bytes`` of bodies (a larger body goes alone in its frame). ``attempts``:
    each message's attempts to report, if not its own count."""
    n, start = len(msgs), 0
    while start < n:
        part = msgs[start:start + max_messages]
        # ends[i]: bytes before part[i], the frame's body offsets as they are (a list
        # first: a part's total may pass what an int32 holds, the frame's cannot).
        ends = list(accumulate(map(len, map(_BODY, part)), initial=0))
        if ends[-1] > max_bytes:
            stop = max(1, bisect_right(ends, max_bytes) - 1)
            part, ends = part[:stop], ends[:stop + 1]
        yield _frame(part, array("i", ends),
                     None if attempts is None else attempts[start:start + len(part)])
        start += len(part)


def _frame(msgs: list[Message], offsets: array,
           attempts: list[int] | None = None) -> pb.MessageColumns:
    if not _LITTLE:
        offsets.byteswap()
    return pb.MessageColumns(
        count=len(msgs),
        ids="".join(map(_ID, msgs)).encode(),
        bodies=b"".join(map(_BODY, msgs)),
        body_offsets=offsets.tobytes(),
        timestamps=_packed("q", map(_TIMESTAMP, msgs)),
        attempts=_packed("i", map(_ATTEMPTS, msgs) if attempts is None else attempts))


class Row(NamedTuple):
    id: str
    body: bytes
    timestamp: int
    attempts: int


def decode(frame: pb.MessageColumns) -> list[Row]:
    ids = frame.ids.decode()
    offsets = _unpacked("i", frame.body_offsets)
    timestamps = _unpacked("q", frame.timestamps)
    attempts = _unpacked("i", frame.attempts)
    return [Row(ids[16 * i:16 * i + 16], frame.bodies[offsets[i]:offsets[i + 1]],
                timestamps[i], attempts[i]) for i in range(frame.count)]
