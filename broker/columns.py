"""Messages as packed columns (Arrow's little-endian layout), for lease fetches.

``encode`` runs in the broker; ``decode`` turns a frame back into rows for
clients without Arrow. The Spark reader builds Arrow arrays from the buffers
directly (``spark_connector.fetch``).
"""

from __future__ import annotations

import sys
from array import array
from itertools import accumulate
from typing import NamedTuple

from .api import broker_pb2 as pb
from .message import Message

_LITTLE = sys.byteorder == "little"


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


def encode(msgs: list[Message]) -> pb.MessageColumns:
    bodies = [m.body for m in msgs]
    return pb.MessageColumns(
        count=len(msgs),
        ids="".join(m.id for m in msgs).encode(),
        bodies=b"".join(bodies),
        body_offsets=_packed("i", accumulate((len(b) for b in bodies), initial=0)),
        timestamps=_packed("q", [m.timestamp for m in msgs]),
        attempts=_packed("i", [m.attempts for m in msgs]))


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
