"""The record format of a topic's log, and a scanner that survives damage.

Every record is ``[magic 2][type 1][length 4][crc32 4][payload]`` (big-endian);
the CRC covers type and payload. A scan that meets a bad magic, a bad CRC or a
record cut short logs it, and resynchronises on the next magic that starts a
valid record, so everything valid before and after the damage is kept.
"""

from __future__ import annotations

import logging
import struct
import zlib
from dataclasses import dataclass
from typing import Iterator

log = logging.getLogger("pynsqd")

MAGIC = b"\xa5\x5a"
HEADER = struct.Struct(">2sBII")          # magic, type, payload length, crc32
HEADER_SIZE = HEADER.size

PUB, FIN, DEFER, ATTEMPTS, EMPTY = 1, 2, 3, 4, 5

# PUB: topic epoch, id, publish ns, deliver-at wall ns (0: at once), then the body.
PUB_HEAD = struct.Struct(">IQqq")
# DEFER / ATTEMPTS / EMPTY name a channel (length-prefixed) and a message.
ID_AT = struct.Struct(">Qqh")             # id, deliver-at wall ns, attempts
# FIN names a channel and the ids it finished (one record for many FINs).
MAX_PAYLOAD = 64 << 20


def encode(kind: int, payload: bytes) -> bytes:
    crc = zlib.crc32(payload, zlib.crc32(bytes((kind,))))
    return HEADER.pack(MAGIC, kind, len(payload), crc) + payload


def pub(epoch: int, msg_id: int, timestamp: int, deliver_at: int, body: bytes) -> bytes:
    return encode(PUB, PUB_HEAD.pack(epoch, msg_id, timestamp, deliver_at) + body)


def channel_event(kind: int, channel: str, msg_id: int = 0, deliver_at: int = 0,
                  attempts: int = 0) -> bytes:
    name = channel.encode()
    return encode(kind, bytes((len(name),)) + name + ID_AT.pack(msg_id, deliver_at, attempts))


def fins(channel: str, msg_ids: list[int]) -> bytes:
    name = channel.encode()
    return encode(FIN, bytes((len(name),)) + name + struct.pack(f">{len(msg_ids)}Q", *msg_ids))


class DamagedRecord(Exception):
    """A record that fails its check."""


def pubs_in(block: bytes, first_loc: int) -> dict[int, tuple[int, int, bytes]]:
    """loc -> (id, publish ns, body) for the valid PUB records at the start of ``block``
    (read at location ``first_loc``), up to the first record it cuts or that is damaged."""
    out: dict[int, tuple[int, int, bytes]] = {}
    pos, size = 0, len(block)
    unpack_head, unpack_pub, crc32 = HEADER.unpack_from, PUB_HEAD.unpack_from, zlib.crc32
    pub_seed = crc32(bytes((PUB,)))
    view = memoryview(block)
    while pos + HEADER_SIZE <= size:
        magic, kind, length, crc = unpack_head(block, pos)
        start, stop = pos + HEADER_SIZE, pos + HEADER_SIZE + length
        if magic != MAGIC or stop > size:
            break
        if kind == PUB:
            if crc32(view[start:stop], pub_seed) != crc:
                break
            _, msg_id, ts, _ = unpack_pub(block, start)
            out[first_loc + pos] = (msg_id, ts, block[start + PUB_HEAD.size:stop])
        pos = stop
    return out


@dataclass(slots=True)
class Record:
    kind: int
    offset: int                 # of the record's header in its file
    payload: memoryview

    def pub(self) -> tuple[int, int, int, int]:
        """(epoch, id, timestamp, deliver_at)."""
        return PUB_HEAD.unpack_from(self.payload)

    def fins(self) -> tuple[str, tuple[int, ...]]:
        """(channel, ids finished)."""
        n = self.payload[0]
        channel = bytes(self.payload[1:1 + n]).decode()
        count = (len(self.payload) - 1 - n) // 8
        return channel, struct.unpack_from(f">{count}Q", self.payload, 1 + n)

    def channel_event(self) -> tuple[str, int, int, int]:
        """(channel, id, deliver_at, attempts)."""
        n = self.payload[0]
        channel = bytes(self.payload[1:1 + n]).decode()
        msg_id, deliver_at, attempts = ID_AT.unpack_from(self.payload, 1 + n)
        return channel, msg_id, deliver_at, attempts


def scan(data: bytes, where: str) -> Iterator[Record]:
    """The valid records of ``data``, logging what is skipped and where."""
    view = memoryview(data)
    pos, size, damaged_at = 0, len(data), None
    while pos + HEADER_SIZE <= size:
        magic, kind, length, crc = HEADER.unpack_from(data, pos)
        start, stop = pos + HEADER_SIZE, pos + HEADER_SIZE + length
        if (magic == MAGIC and length <= MAX_PAYLOAD and stop <= size
                and zlib.crc32(view[start:stop], zlib.crc32(bytes((kind,)))) == crc):
            if damaged_at is not None:
                log.warning("%s: skipped %d damaged byte(s) at offset %d", where,
                            pos - damaged_at, damaged_at)
                damaged_at = None
            yield Record(kind, pos, view[start:stop])
            pos = stop
            continue
        if damaged_at is None:
            damaged_at = pos
        nxt = data.find(MAGIC, pos + 1)
        pos = nxt if nxt >= 0 else size
    if damaged_at is not None or pos < size:
        skipped_from = damaged_at if damaged_at is not None else pos
        log.warning("%s: %d byte(s) at offset %d are a damaged or torn record; skipped",
                    where, size - skipped_from, skipped_from)
