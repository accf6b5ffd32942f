"""The record format of a topic's log, and a scanner that survives damage.

Every record is ``[magic 2][type 1][length 4][check 4][payload]`` (big-endian);
the check is the CRC-32 of type and payload XOR the file's key. A scan that meets a
bad magic, a bad check or a record cut short logs it, and resynchronises on the
next magic that starts a valid record, so everything valid before and after the
damage is kept.

Client bytes never pass for a record. Each file begins with its key: a random
32-bit number, chosen when the file is made, in a ``KEY`` record written three
times (checked without a key; ``prologue``). A message body can hold bytes laid
out as any record, but a publisher never sees a key, so a record it crafts checks
against the file's key only by a 1-in-2**32 guess, for each place a resync tries
it: damage that sends a scan into a body finds the next record the broker wrote,
not one a client planted. A file without a key (written before keys) is read as
before, with key 0; a start always appends to a new file, so such files only age
out.

Records that decide which channels own messages (``STATE``, ``CHANNEL``, ``TOPIC``,
``FLUSH``, ``EMPTY``, ``CONFIG``) are written twice in a row: one damaged byte costs
one copy, not the channels' messages. Messages carry their own checksums: a damaged
one costs that message.

Record types, and what recovery does with each (in log order):

- ``STATE``: first record of every segment: the topic's paused state and its
  durable channels (name, paused) as the log stood before this segment;
- ``CHANNEL``: a durable channel created, deleted, paused or unpaused;
- ``TOPIC``: the topic paused or unpaused;
- ``PUB``: a message; it went to every durable channel the log names at that
  point, or, flagged ``HELD``, waits in the topic for channels;
- ``BATCH``: the messages of one MPUB under one checksum, each as a ``PUB`` of
  them would be (what a damaged byte costs is the whole batch: an MPUB is
  accepted or refused whole, and so it is kept or lost whole). A message of a
  batch is located by the batch's offset plus its index in the batch: a batch
  is longer than its count of messages, so no two locations meet;
- ``FLUSH``: every held message went to the durable channels named now;
- ``FIN`` / ``DEFER`` / ``ATTEMPTS`` / ``EMPTY``: one channel's (``""``: the
  topic's held messages) finished ids, deferral, delivery counts, emptying;
- ``DEDUPE``: an opaque de-duplication entry, written with the MPUB it names;
- ``MOVE``: a message copied out of an old segment so the segment can go: it is
  pending in exactly the channels it names (``""``: held by the topic), with
  their attempts and deliver-at times;
- ``CONFIG``: a channel's (``""``: the topic's) settings as JSON (dead letters,
  ttl); the latest one counts, and every segment repeats them after its STATE.

A BATCH is ``[flags 1][count 4]``, then its columns: the ids (8 bytes each), the
publish times (ns, 8 each), the body lengths (4 each), the deliver-at times
(wall ns, 8 each) if flagged ``DEFERS``, the expiries (wall ns, 8 each) if
flagged ``EXPIRES``, then the bodies one after the other; a message's slots in
the columns are at its index. Columns cost a few C calls per batch to write and
to read, where a record per message costs a header and a checksum each.

A PUB flagged ``EXPIRES`` carries the message's expiry (wall ns) before its body;
so does a MOVE whose copy count has its ``MOVE_EXPIRES`` bit set.
"""

from __future__ import annotations

import logging
import secrets
import struct
import sys
from array import array
from binascii import unhexlify
from dataclasses import dataclass
from itertools import accumulate
from typing import Callable, Iterable, Iterator

from .checksum import crc32

log = logging.getLogger("pynsqd")

MAGIC = b"\xa5\x5a"
HEADER = struct.Struct(">2sBII")          # magic, type, payload length, crc32
HEADER_SIZE = HEADER.size

PUB, FIN, DEFER, ATTEMPTS, EMPTY, CHANNEL, TOPIC, STATE, FLUSH, DEDUPE, MOVE, CONFIG, BATCH = \
    range(1, 14)
# A file's key (``prologue``); the lease journal's records (``broker.lease``); a topic's
# record of its files: each file's ROLL (after its STATE), the FORWARD an older file gets
# when the log rolls on to a new one, and FILE_GONE when a file is deleted.
KEY, LEASE_MADE, LEASE_GONE, ROLL, FORWARD, FILE_GONE = 14, 15, 16, 17, 18, 19
ROLL_BODY = struct.Struct(">IIQ")         # oldest file kept, this file, the next message id
FORWARD_BODY = struct.Struct(">IQ")       # the next file, the next message id
FILE_GONE_BODY = struct.Struct(">I")
# The check of a record starts from the CRC-32 of its type byte: each type's, made once.
_KIND_SEEDS = [crc32(bytes((kind,))) for kind in range(256)]
CREATE, DELETE, PAUSE, UNPAUSE = 1, 2, 3, 4

HELD, EXPIRES, DEFERS = 1, 2, 4
# PUB: id, publish ns, deliver-at wall ns (0: at once), flags, [expires-at wall ns
# if EXPIRES], then the body.
PUB_HEAD = struct.Struct(">QqqB")
PUB_EXPIRES = struct.Struct(">q")
ID_AT = struct.Struct(">QqI")             # DEFER: id, deliver-at wall ns, attempts
ID_ATTEMPTS = struct.Struct(">QI")
MAX_PAYLOAD = 64 << 20
# Ids per FIN record and entries per ATTEMPTS record: far below MAX_PAYLOAD.
MAX_IDS_PER_RECORD = 1 << 16


def encode(kind: int, payload: bytes, key: int = 0) -> bytes:
    """A record, checked under ``key`` (a file's: see ``seal``; 0: no key)."""
    crc = crc32(payload, _KIND_SEEDS[kind])
    return HEADER.pack(MAGIC, kind, len(payload), crc ^ key) + payload


KEY_VERSION = 1
_KEY_BODY = struct.Struct(">BI")          # version, key
KEY_RECORD_SIZE = HEADER_SIZE + _KEY_BODY.size
KEY_COPIES = 3
PROLOGUE_SIZE = KEY_COPIES * KEY_RECORD_SIZE


def new_key() -> int:
    """A file's key: random, never 0 (0 is a file without a key)."""
    return secrets.randbits(32) or 1


def prologue(key: int) -> bytes:
    """What a file with ``key`` begins with: its KEY record, three times (one damaged
    byte costs one copy)."""
    return encode(KEY, _KEY_BODY.pack(KEY_VERSION, key)) * KEY_COPIES


def seal(data: "bytes | bytearray", key: int) -> "bytes | bytearray":
    """``data`` (whole records, checked without a key) as a file with ``key`` holds
    them: each record's check XOR the key."""
    if not key or not data:
        return data
    length, crc = _CHECK.unpack_from(data, 3)
    size = len(data)
    if HEADER_SIZE + length == size:  # one record: a PUB, the usual append
        return b"".join((data[:7], _CRC.pack(crc ^ key), memoryview(data)[HEADER_SIZE:]))
    out = bytearray(data)
    pos, unpack, pack = 0, _CHECK.unpack_from, _CRC.pack_into
    while pos < size:
        length, crc = unpack(out, pos + 3)
        pack(out, pos + 7, crc ^ key)
        pos += HEADER_SIZE + length
    return out


_CHECK = struct.Struct(">II")             # a header's length and check
_CRC = struct.Struct(">I")


def file_key(head: bytes) -> tuple[int, int] | None:
    """(key, where its records start) of a file that begins with ``head`` (its first
    ``PROLOGUE_SIZE`` bytes or more): a file written before keys is (0, 0); None when
    every copy of its KEY record is damaged (then ``recover_key``)."""
    looks_keyed = False
    for at in range(0, PROLOGUE_SIZE, KEY_RECORD_SIZE):
        if at + KEY_RECORD_SIZE > len(head):
            break
        magic, kind, length, crc = HEADER.unpack_from(head, at)
        if magic == MAGIC and kind == KEY:
            looks_keyed = True
            payload = head[at + HEADER_SIZE:at + KEY_RECORD_SIZE]
            if length == _KEY_BODY.size and crc32(payload, _KEY_SEED) == crc:
                version, key = _KEY_BODY.unpack(payload)
                if version == KEY_VERSION and key:
                    return key, PROLOGUE_SIZE
    return None if looks_keyed else (0, 0)


def recover_key(data: bytes, at: int = PROLOGUE_SIZE) -> int | None:
    """The key of a file whose KEY records are all damaged, from the record the broker
    wrote after them (the STATE, written twice: both copies must give the same key, and
    hold the same bytes); None if that fails too."""
    keys = []
    for _ in range(2):
        if at + HEADER_SIZE > len(data):
            return None
        magic, kind, length, crc = HEADER.unpack_from(data, at)
        stop = at + HEADER_SIZE + length
        if magic != MAGIC or length > MAX_PAYLOAD or stop > len(data):
            return None
        keys.append((crc32(data[at + HEADER_SIZE:stop], _KIND_SEEDS[kind]) ^ crc,
                     bytes(data[at + 2:stop])))
        at = stop
    (first, a), (second, b) = keys
    return first if first and first == second and a == b else None


def twice(kind: int, payload: bytes) -> bytes:
    """A record that decides which channels own messages, written twice in a row: one
    damaged byte costs one copy, and replaying the other does the same (each such
    record is idempotent)."""
    record = encode(kind, payload)
    return record + record


def _name(channel: str) -> bytes:
    name = channel.encode()
    return bytes((len(name),)) + name


def pub(msg_id: int, timestamp: int, deliver_at: int, held: bool, body: bytes,
        expires: int = 0, key: int = 0) -> bytes:
    flags = (HELD if held else 0) | (EXPIRES if expires else 0)
    head = PUB_HEAD.pack(msg_id, timestamp, deliver_at, flags)
    if expires:
        head += PUB_EXPIRES.pack(expires)
    return encode(PUB, head + body, key)


# A PUB's head with the id as its 8 raw bytes.
_PUB_HEAD_RAW_ID = struct.Struct(">8sqqB")


def pubs(ids: list[str], timestamps: list[int], bodies: list[bytes], deliver_ats: list[int],
         expires: list[int], held: bool) -> tuple[bytes, list[int]]:
    """The PUB records of several messages (ids given as 16 hex digits, as messages carry
    them), joined, and where each starts in the result: the same bytes as ``pub`` for each,
    made in one pass; how brokers before BATCH records wrote an MPUB (a start reads such
    logs as it always did)."""
    raw = bytes.fromhex("".join(ids))
    pack_head, pack_header = _PUB_HEAD_RAW_ID.pack, HEADER.pack
    pack_expires, seed = PUB_EXPIRES.pack, _SEEDS[PUB]
    flags = HELD if held else 0
    parts: list[bytes] = []
    starts: list[int] = []
    at = 0
    for i, (ts, body, deliver_at, expiry) in enumerate(zip(timestamps, bodies, deliver_ats,
                                                          expires)):
        starts.append(at)
        if expiry:
            head = (pack_head(raw[8 * i:8 * i + 8], ts, deliver_at, flags | EXPIRES)
                    + pack_expires(expiry))
        else:
            head = pack_head(raw[8 * i:8 * i + 8], ts, deliver_at, flags)
        length = len(head) + len(body)
        parts += (pack_header(MAGIC, PUB, length, crc32(body, crc32(head, seed))), head, body)
        at += HEADER_SIZE + length
    return b"".join(parts), starts


BATCH_HEAD = struct.Struct(">BI")         # flags, count
_STAMP = struct.Struct(">q")              # one value of a column of times
_SWAP = sys.byteorder == "little"         # the columns' integers are big-endian on disk


def _column(typecode: str, values: Iterable[int]) -> bytes:
    """``values`` as big-endian integers of ``typecode``'s size, in one C pass."""
    column = array(typecode, values)
    if _SWAP:
        column.byteswap()
    return column.tobytes()


Ids = list[str] | bytes     # as messages carry them (16 hex digits), or 8 raw bytes each
Stamps = list[int] | int    # each one's, or one for all


def _raw(ids: Ids) -> bytes:
    """Ids as the log stores them: 8 big-endian bytes each."""
    return ids if isinstance(ids, bytes) else bytes.fromhex("".join(ids))


def batch(ids: Ids, timestamps: Stamps, bodies: list[bytes],
          deliver_ats: list[int] | None, expires: list[int] | None, held: bool,
          key: int = 0) -> bytes:
    """One BATCH record of several messages (ids given as 16 hex digits, as messages carry
    them, or as their 8 raw bytes each; ``timestamps``: each one's, or one for all);
    ``deliver_ats`` and ``expires``: None when every one is 0; checked under ``key``."""
    flags = ((HELD if held else 0) | (DEFERS if deliver_ats else 0)
             | (EXPIRES if expires else 0))
    raw = _raw(ids)
    n = len(raw) // 8
    parts = [BATCH_HEAD.pack(flags, n), raw,
             _STAMP.pack(timestamps) * n if isinstance(timestamps, int)
             else _column("q", timestamps), _column("I", list(map(len, bodies)))]
    if deliver_ats:
        parts.append(_column("q", deliver_ats))
    if expires:
        parts.append(_column("q", expires))
    parts += bodies
    return encode(BATCH, b"".join(parts), key)


def publish(ids: Ids, timestamps: Stamps, bodies: list[bytes],
            deliver_ats: list[int] | None, expires: list[int] | None, held: bool,
            key: int = 0) -> tuple[bytes, list[tuple[int, int]]]:
    """The records of one publish: a PUB for one message, else BATCH records, as few as
    hold them (one, unless they pass MAX_PAYLOAD; a message too large to share one goes
    in a PUB); with where each record starts in the result and how many messages it
    holds (1: a PUB; a BATCH holds more). ``ids`` and ``timestamps`` as ``batch`` takes
    them; checked under ``key`` (made so, not sealed after: ``seal`` costs a PUB a tenth
    of its instructions)."""
    raw = _raw(ids)
    n = len(raw) // 8
    if n == 1:
        return pub(int.from_bytes(raw, "big"),
                   timestamps if isinstance(timestamps, int) else timestamps[0],
                   deliver_ats[0] if deliver_ats else 0, held,
                   bodies[0], expires[0] if expires else 0, key), [(0, 1)]
    per_message = 20 + (8 if deliver_ats else 0) + (8 if expires else 0)
    if per_message * n + sum(map(len, bodies)) <= MAX_PAYLOAD - BATCH_HEAD.size:
        return batch(raw, timestamps, bodies, deliver_ats, expires, held, key), [(0, n)]
    parts: list[bytes] = []
    starts: list[tuple[int, int]] = []
    first, at = 0, 0
    while first < n:
        last, size = first, BATCH_HEAD.size
        while last < n and size + per_message + len(bodies[last]) <= MAX_PAYLOAD:
            size += per_message + len(bodies[last])
            last += 1
        last = max(last, first + 1)   # a body fits a record by itself (MAX_BODY)
        cut = slice(first, last)
        part, inner = publish(raw[8 * first:8 * last],
                              timestamps if isinstance(timestamps, int) else timestamps[cut],
                              bodies[cut], deliver_ats[cut] if deliver_ats else None,
                              expires[cut] if expires else None, held, key)
        starts += [(at + offset, count) for offset, count in inner]
        parts.append(part)
        at += len(part)
        first = last
    return b"".join(parts), starts


@dataclass(slots=True)
class Batch:
    """A BATCH record's columns, read in one pass: message ``i``'s id is
    ``raw[8i:8i+8]`` (big-endian), published at ``timestamps[i]``, its body
    ``data[bounds[i]:bounds[i + 1]]``."""
    held: bool
    raw: bytes
    timestamps: array
    bounds: "range | list[int]"
    data: bytes
    deliver_ats: array | None
    expires: array | None
    body_size: int = 0          # the length of every body, when they are all as long
    # The publish time of every one, when they share it (an MPUB's: one number for all
    # the messages read back, not one each); None when they differ.
    stamp: int | None = None

    def __len__(self) -> int:
        return len(self.timestamps)

    def raw_ids(self) -> array:
        """The ids as numbers."""
        out = array("Q", self.raw)
        if _SWAP:
            out.byteswap()
        return out


def read_batch(data: "bytes | memoryview", start: int, stop: int) -> Batch:
    """The columns of the BATCH payload at ``data[start:stop]`` (checked already);
    ``DamagedRecord`` if they do not add up to it."""
    flags, n = BATCH_HEAD.unpack_from(data, start)
    pos = start + BATCH_HEAD.size
    at = pos + 8 * n
    columns: list[array | None] = []
    for typecode, size, present in (("q", 8, True), ("I", 4, True), ("q", 8, flags & DEFERS),
                                    ("q", 8, flags & EXPIRES)):
        if not present:
            columns.append(None)
            continue
        column = array(typecode)
        column.frombytes(data[at:at + n * size])
        if _SWAP:
            column.byteswap()
        columns.append(column)
        at += n * size
    timestamps, lengths, deliver_ats, expires = columns
    # Columns whose values are all the same, told by their bytes (no number made of each).
    stamps, sizes = pos + 8 * n, pos + 16 * n
    body_size = (lengths[0] if n and bytes(data[sizes:sizes + 4]) * n
                 == data[sizes:sizes + 4 * n] else 0)
    stamp = (timestamps[0] if n and bytes(data[stamps:stamps + 8]) * n
             == data[stamps:stamps + 8 * n] else None)
    # Bodies all as long (the usual MPUB): their bounds are a range, no list to make.
    bounds: "range | list[int]" = (range(at, at + n * body_size + 1, body_size) if body_size
                                   else list(accumulate(lengths, initial=at)))
    if at > stop or bounds[-1] != stop or len(timestamps) != n:
        raise DamagedRecord(f"a batch of {n} messages whose columns do not fill it")
    return Batch(bool(flags & HELD), bytes(data[pos:pos + 8 * n]), timestamps, bounds,
                 data, deliver_ats, expires, body_size, stamp)


def fins(channel: str, msg_ids: list[int]) -> list[bytes]:
    return [encode(FIN, _name(channel) + struct.pack(f">{len(chunk)}Q", *chunk))
            for chunk in _chunks(msg_ids)]


def attempts(channel: str, entries: list[tuple[int, int]]) -> list[bytes]:
    return [encode(ATTEMPTS, _name(channel) + b"".join(ID_ATTEMPTS.pack(*e) for e in chunk))
            for chunk in _chunks(entries)]


def fins_of(channel: str, msg_ids: list[str]) -> bytes:
    """FIN records of ids given as 16 hex digits (as messages carry them)."""
    name = _name(channel)
    # (``unhexlify``: ``bytes.fromhex`` looks for spaces between each pair of digits)
    return b"".join(encode(FIN, name + unhexlify("".join(chunk)))
                    for chunk in _chunks(msg_ids))


def attempts_of(channel: str, msg_ids: list[str], counts: list[int]) -> bytes:
    """ATTEMPTS records of ids given as 16 hex digits, with their delivery counts."""
    name, out = _name(channel), []
    for first in range(0, len(msg_ids), MAX_IDS_PER_RECORD):
        chunk = msg_ids[first:first + MAX_IDS_PER_RECORD]
        some = counts[first:first + MAX_IDS_PER_RECORD]
        if some.count(some[0]) == len(some):
            # One count for all (a pass's first deliveries, the usual case): the entries,
            # id then count, spelled in hex between the ids and turned to bytes at once.
            count = f"{some[0]:08x}"
            out.append(encode(ATTEMPTS, name + unhexlify(count.join(chunk) + count)))
            continue
        ids = unhexlify("".join(chunk))
        values = array("I", some)
        if sys.byteorder == "little":
            values.byteswap()
        raw = values.tobytes()
        entries = bytearray(len(ids) // 8 * ID_ATTEMPTS.size)
        for i in range(8):  # interleave: 8 bytes of id, then 4 of count, per entry
            entries[i::ID_ATTEMPTS.size] = ids[i::8]
        for i in range(4):
            entries[8 + i::ID_ATTEMPTS.size] = raw[i::4]
        out.append(encode(ATTEMPTS, name + bytes(entries)))
    return b"".join(out)


def defer(channel: str, msg_id: int, deliver_at: int, attempts: int) -> bytes:
    return encode(DEFER, _name(channel) + ID_AT.pack(msg_id, deliver_at, attempts))


def empty(channel: str) -> bytes:
    return twice(EMPTY, _name(channel))


def channel_op(op: int, channel: str) -> bytes:
    return twice(CHANNEL, bytes((op,)) + _name(channel))


def topic_op(op: int) -> bytes:
    return twice(TOPIC, bytes((op,)))


def state(paused: bool, channels: dict[str, bool]) -> bytes:
    parts = [bytes((int(paused),))]
    for name, channel_paused in channels.items():
        parts.append(bytes((int(channel_paused),)) + _name(name))
    return twice(STATE, b"".join(parts))


def roll(oldest: int, seg: int, next_id: int) -> bytes:
    """A new file's record of the log: the oldest file kept when it was made, its number,
    and the id the next message will have (every message in it has that id or a later)."""
    return twice(ROLL, ROLL_BODY.pack(oldest, seg, next_id))


def forward(seg: int, next_id: int) -> bytes:
    """Written at the end of a file when the log rolls on to file ``seg``."""
    return twice(FORWARD, FORWARD_BODY.pack(seg, next_id))


def file_gone(seg: int) -> bytes:
    return twice(FILE_GONE, FILE_GONE_BODY.pack(seg))


def flush() -> bytes:
    return twice(FLUSH, b"")


def dedupe(payload: bytes, key: int = 0) -> bytes:
    return encode(DEDUPE, payload, key)


MOVE_HEAD = struct.Struct(">QqH")         # id, publish ns, number of copies
MOVE_EXPIRES = 0x8000                     # in the count: an expiry follows the head
COPY_AT = struct.Struct(">Iq")            # attempts, deliver-at wall ns (0: at once)


# The most durable channels a topic may have: a MOVE counts a message's copies in 15 bits.
MAX_CHANNELS = MOVE_EXPIRES - 1
# The largest body a record holds: a MOVE of it to every channel fits in MAX_PAYLOAD.
MAX_BODY = MAX_PAYLOAD - MOVE_HEAD.size - PUB_EXPIRES.size - MAX_CHANNELS * (1 + 64 + COPY_AT.size)


def move(msg_id: int, timestamp: int, copies: list[tuple[str, int, int]], body: bytes,
         expires: int = 0) -> bytes:
    """A PUB-like record: ``copies`` are (channel or "" for held, attempts, deliver_at)."""
    parts = [MOVE_HEAD.pack(msg_id, timestamp, len(copies) | (MOVE_EXPIRES if expires else 0))]
    if expires:
        parts.append(PUB_EXPIRES.pack(expires))
    for channel, attempts, deliver_at in copies:
        parts.append(_name(channel) + COPY_AT.pack(attempts, deliver_at))
    return encode(MOVE, b"".join(parts) + body)


def config(channel: str, settings: bytes) -> bytes:
    return twice(CONFIG, _name(channel) + settings)


def _chunks(items: list) -> Iterator[list]:
    for start in range(0, len(items), MAX_IDS_PER_RECORD):
        yield items[start:start + MAX_IDS_PER_RECORD]


class DamagedRecord(Exception):
    """A record that fails its check."""


def message_at(block: bytes, pos: int, key: int = 0) -> tuple[str, int, bytes, int] | None:
    """(hex id, publish ns, body, expires) of the PUB or MOVE record at ``pos`` of
    ``block`` (of a file with ``key``); None if it is not one, fails its check or is
    cut by the block's end."""
    if pos + HEADER_SIZE > len(block):
        return None
    magic, kind, length, crc = HEADER.unpack_from(block, pos)
    start = pos + HEADER_SIZE
    stop = start + length
    if magic != MAGIC or stop > len(block) or kind not in (PUB, MOVE):
        return None
    view = memoryview(block)[start:stop]
    if crc32(view, _SEEDS[kind]) != crc ^ key:
        return None
    if kind == MOVE:
        msg_id, ts, _, body, expires = Record(MOVE, pos, view).move()
        return f"{msg_id:016x}", ts, body, expires
    ts, _, flags = _PUB_REST.unpack_from(block, start + 8)
    body_at, expires = start + PUB_HEAD.size, 0
    if flags & EXPIRES:
        expires, = PUB_EXPIRES.unpack_from(block, body_at)
        body_at += PUB_EXPIRES.size
    return block[start:start + 8].hex(), ts, block[body_at:stop], expires


_PUB_REST = struct.Struct(">qqB")          # PUB_HEAD after the id
_SEEDS = {kind: crc32(bytes((kind,))) for kind in (PUB, MOVE, BATCH)}
_KEY_SEED = crc32(bytes((KEY,)))
BATCH_SEED = _SEEDS[BATCH]
# A PUB's header and head in one go, the CRC's seed, and where its body starts.
PUB_WHOLE = struct.Struct(HEADER.format + PUB_HEAD.format[1:])
PUB_SEED = _SEEDS[PUB]
PUB_BODY_AT = PUB_WHOLE.size
# The fields of a PUB's header and head that reading it back checks or keeps: the magic
# as a number, type, length, crc32, the id's 8 bytes, publish ns, flags.
PUB_CHECK = struct.Struct(">HBII8sq8xB")
MAGIC_NUMBER = int.from_bytes(MAGIC, "big")


@dataclass(slots=True)
class Record:
    kind: int
    offset: int                 # of the record's header in its file
    payload: memoryview

    def pub(self) -> tuple[int, int, int, int]:
        """(id, timestamp, deliver_at, flags)."""
        return PUB_HEAD.unpack_from(self.payload)

    def _channel(self, at: int = 0) -> tuple[str, int]:
        n = self.payload[at]
        return bytes(self.payload[at + 1:at + 1 + n]).decode(), at + 1 + n

    def fins(self) -> tuple[str, tuple[int, ...]]:
        channel, pos = self._channel()
        count = (len(self.payload) - pos) // 8
        return channel, struct.unpack_from(f">{count}Q", self.payload, pos)

    def attempts(self) -> tuple[str, list[tuple[int, int]]]:
        channel, pos = self._channel()
        return channel, [ID_ATTEMPTS.unpack_from(self.payload, at)
                         for at in range(pos, len(self.payload), ID_ATTEMPTS.size)]

    def defer(self) -> tuple[str, int, int, int]:
        """(channel, id, deliver_at, attempts)."""
        channel, pos = self._channel()
        return (channel, *ID_AT.unpack_from(self.payload, pos))

    def channel(self) -> str:
        return self._channel()[0]

    def move(self) -> tuple[int, int, list[tuple[str, int, int]], bytes, int]:
        """(id, timestamp, [(channel, attempts, deliver_at)], body, expires)."""
        msg_id, ts, count = MOVE_HEAD.unpack_from(self.payload)
        pos, copies, expires = MOVE_HEAD.size, [], 0
        if count & MOVE_EXPIRES:
            expires, = PUB_EXPIRES.unpack_from(self.payload, pos)
            pos += PUB_EXPIRES.size
        for _ in range(count & ~MOVE_EXPIRES):
            channel, pos = self._channel(pos)
            attempts, deliver_at = COPY_AT.unpack_from(self.payload, pos)
            pos += COPY_AT.size
            copies.append((channel, attempts, deliver_at))
        return msg_id, ts, copies, bytes(self.payload[pos:]), expires

    def batch(self) -> Batch:
        return read_batch(self.payload, 0, len(self.payload))

    def config(self) -> tuple[str, bytes]:
        channel, pos = self._channel()
        return channel, bytes(self.payload[pos:])

    def channel_op(self) -> tuple[int, str]:
        return self.payload[0], self._channel(1)[0]

    def state(self) -> tuple[bool, dict[str, bool]]:
        paused = bool(self.payload[0])
        channels: dict[str, bool] = {}
        pos = 1
        while pos < len(self.payload):
            channel_paused = bool(self.payload[pos])
            name, pos = self._channel(pos + 1)
            channels[name] = channel_paused
        return paused, channels


def scan(data: bytes, where: str, base: int = 0, rest: list[int] | None = None,
         damaged: Callable[[int, bytes], None] | None = None, key: int = 0
         ) -> Iterator[Record]:
    """The valid records of ``data`` (read at offset ``base`` of a file whose key is
    ``key``: its prologue is not part of ``data``), logging
    what is skipped and where (and handing each damaged span, with its offset, to
    ``damaged``). With ``rest``, ``data`` is one block of a longer file: a record it
    cuts short at its end is not damage; the offset in ``data`` where the unread part
    starts is appended to ``rest``."""
    view = memoryview(data)
    pos, size, damaged_at = 0, len(data), None

    def skipped(upto: int) -> None:
        log.warning("%s: skipped %d damaged byte(s) at offset %d", where, upto - damaged_at,
                    base + damaged_at)
        if damaged is not None:
            damaged(base + damaged_at, bytes(data[damaged_at:upto]))

    while pos < size:
        if pos + HEADER_SIZE > size:
            break
        magic, kind, length, crc = HEADER.unpack_from(data, pos)
        start, stop = pos + HEADER_SIZE, pos + HEADER_SIZE + length
        if rest is not None and magic == MAGIC and length <= MAX_PAYLOAD and stop > size:
            break  # the next block has the rest of it
        if (magic == MAGIC and length <= MAX_PAYLOAD and stop <= size
                and crc32(view[start:stop], _KIND_SEEDS[kind]) == crc ^ key):
            if damaged_at is not None:
                skipped(pos)
                damaged_at = None
            yield Record(kind, base + pos, view[start:stop])
            pos = stop
            continue
        if damaged_at is None:
            damaged_at = pos
        nxt = data.find(MAGIC, pos + 1)
        pos = nxt if nxt >= 0 else size
    if rest is not None:
        if damaged_at is not None:
            skipped(pos)
        rest.append(pos)
    elif damaged_at is not None or pos < size:
        skipped_from = damaged_at if damaged_at is not None else pos
        log.warning("%s: %d byte(s) at offset %d are a damaged or torn record; skipped",
                    where, size - skipped_from, base + skipped_from)
        if damaged is not None:
            damaged(base + skipped_from, bytes(data[skipped_from:]))


def scan_file(data: bytes, where: str,
              damaged: Callable[[int, bytes], None] | None = None) -> Iterator[Record]:
    """The valid records of a whole file's ``data``, under the key it begins with."""
    found = file_key(data)
    if found is None:
        key = recover_key(data)
        if key is None:
            log.error("%s: every copy of the file's key is damaged, and the record after "
                      "them too: its %d byte(s) cannot be checked and are skipped", where,
                      len(data))
            if damaged is not None:
                damaged(0, bytes(data))
            return iter(())
        found = key, PROLOGUE_SIZE
    key, start = found
    return scan(bytes(data[start:]), where, start, None, damaged, key)


def batch_count(span: bytes) -> int:
    """The messages a damaged BATCH record held, as its count says when that is a count
    the record could hold (else 1)."""
    if len(span) >= HEADER_SIZE + BATCH_HEAD.size:
        _, n = BATCH_HEAD.unpack_from(span, HEADER_SIZE)
        if 0 < n <= (len(span) - HEADER_SIZE - BATCH_HEAD.size) // 21:
            return n
    return 1


def damaged_kind(span: bytes) -> tuple[int, str] | None:
    """(type, channel or "") of the one record a damaged span holds, when its header
    survived (a damaged payload, the usual case), else None. The channel is read from
    the payload of the records that start with one, and may be garbled."""
    if len(span) < HEADER_SIZE:
        return None
    magic, kind, length, _ = HEADER.unpack_from(span)
    if magic != MAGIC or HEADER_SIZE + length != len(span):
        return None
    channel = ""
    if kind in (FIN, ATTEMPTS, DEFER, EMPTY, CONFIG) and length:
        n = span[HEADER_SIZE]
        channel = span[HEADER_SIZE + 1:HEADER_SIZE + 1 + n].decode("ascii", "replace")
    return kind, channel
