"""Leases: a batch of a channel's messages held in flight for a group of readers.

A reader that plans work on one process and reads it on others (Spark's driver
and executors) cannot use a consumer stream, since only the holder may FIN. A
lease is a holder that is not a connection: a session (one long-lived stream
from the planner) reserves a batch; any process may fetch the batch, slice by
slice, as often as it needs; the planner FINs, REQs or TOUCHes the batch by
lease id.

When the session's stream drops, the session is *detached*: it keeps its
leases for a grace period (about the message timeout) so the planner can
reconnect and resume it; when the grace period ends, every lease it holds is
requeued. A lease requeued that way, or one whose messages timed out, is
remembered by its messages' ids and attempts (never their bodies) so that a
planner replaying a batch can adopt it, and read the same rows, or FIN it once
the batch is known committed. It is remembered for as long as one of its
messages waits in the channel (``LeaseClaims``): bounded by the channel's
messages, not by a count of leases.
"""

from __future__ import annotations

import itertools
import logging
import os
import secrets
import struct
import sys
import zlib
from array import array
from collections.abc import MutableMapping
from dataclasses import dataclass
from operator import attrgetter
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Iterator

from .consumer import Consumer
from .errors import StorageFailed
from .message import Message
from .storage import fileops, records

if TYPE_CHECKING:
    from .channel import Channel

log = logging.getLogger("pynsqd")
_session_ids = itertools.count(1)
_ID, _ATTEMPTS = attrgetter("id"), attrgetter("attempts")


class HeldMessages(MutableMapping):
    """A lease's in-flight messages by id, as a consumer's dict holds them.

    A lease mostly leaves whole (FIN, REQ, TOUCH of the lease), so its messages are
    kept as a list; the dict by id, a third of a large reserve's cost, is built only
    when one message is looked up or leaves alone (its own timeout).
    """

    __slots__ = ("_list", "_by_id")

    def __init__(self) -> None:
        self._list: list[Message] = []
        self._by_id: dict[str, Message] | None = None

    def add(self, msgs: list[Message]) -> None:
        if self._by_id is None:
            self._list += msgs
        else:
            self._by_id.update(zip(map(_ID, msgs), msgs))

    def _dict(self) -> dict[str, Message]:
        if self._by_id is None:
            self._by_id = dict(zip(map(_ID, self._list), self._list))
            self._list = []
        return self._by_id

    def __len__(self) -> int:
        return len(self._list) if self._by_id is None else len(self._by_id)

    def __iter__(self) -> Iterator[str]:
        return map(_ID, self._list) if self._by_id is None else iter(self._by_id)

    def __getitem__(self, msg_id: str) -> Message:
        return self._dict()[msg_id]

    def __setitem__(self, msg_id: str, msg: Message) -> None:
        self._dict()[msg_id] = msg

    def __delitem__(self, msg_id: str) -> None:
        del self._dict()[msg_id]

    def values(self) -> list[Message]:  # type: ignore[override]
        return list(self._list) if self._by_id is None else list(self._by_id.values())

    def clear(self) -> None:
        self._list, self._by_id = [], None

    def pop_all(self) -> list[Message]:
        """Every message held, in the order taken (when none left alone), and now none."""
        held = self._list if self._by_id is None else list(self._by_id.values())
        self.clear()
        return held


class Lease(Consumer):
    """A holder outside any channel's round-robin; its messages are its in-flight."""

    keeps_given_back = True

    def __init__(self, session: "LeaseSession", *, msg_timeout: float) -> None:
        super().__init__(_ignore, msg_timeout=msg_timeout, client_id=session.client_id)
        self.in_flight: HeldMessages = HeldMessages()  # type: ignore[assignment]
        self.lease_id = secrets.token_hex(12)
        self.session = session
        self.owner = session.owner     # who may act on it, live or remembered (auth)
        self.order: list[Message] = []
        # A lease taken back after a requeue or a timeout: each message's attempts as
        # its first delivery to this lease counted them (what a replay must read again).
        self.first_attempts: dict[str, int] | None = None

    def hold(self, msgs: list[Message]) -> None:
        """``msgs`` are now in flight to this lease (the channel's ``take``, ``reclaim``)."""
        self.in_flight.add(msgs)

    def slice(self, partition: int, num_partitions: int) -> list[Message]:
        """This lease's messages for one partition, still held; fixed at reserve time."""
        held = self.in_flight
        if len(held) == len(self.order):
            # A lease never gains messages after it is made, and holds only messages of
            # ``order``: when none has left, every one is still held.
            return self.order[partition::num_partitions]
        return [m for m in self.order[partition::num_partitions] if held.get(m.id) is m]

    def attempts_of(self, msgs: list[Message]) -> list[int] | None:
        """The attempts a fetch reports for ``msgs`` (of this lease): as first delivered
        to it, so a replay reads the very rows the failed run read; None when that is
        each message's own count (the lease was never taken back)."""
        first = self.first_attempts
        if first is None:
            return None
        return [first.get(m.id, m.attempts) for m in msgs]

    def let_go(self) -> list[Message]:
        """The messages this lease was made of; it keeps none from now on (it is over).
        They point at it (``consumer``): kept, they and it would be a cycle that only a
        full collection frees."""
        order, self.order = self.order, []
        return order

    def remembered(self) -> "RememberedLease":
        assert self.channel is not None
        order = self.order
        attempts = self.attempts_of(order) or [m.attempts for m in order]
        return RememberedLease(self.channel, [m.id for m in order], self.msg_timeout,
                               attempts, self.lease_id, owner=self.owner)


@dataclass(eq=False)
class RememberedLease:
    """A lease no longer held (requeued or timed out): its channel, its messages' ids
    and the attempts each had when the lease first held it (never their bodies)."""

    channel: "Channel"
    ids: list[str]
    msg_timeout: float
    attempts: list[int]
    lease_id: str = ""
    live: int = 0  # how many of ``ids`` still wait in the channel, last held by this lease
    owner: str = ""  # who may act on it (auth): the session's owner


class LeaseClaims:
    """A channel's messages by the remembered lease that last held them.

    A remembered lease is kept only while one of its messages is still in the
    channel (not FINed, dead-lettered, expired or emptied) and was held by no lease
    remembered after it: so what the broker remembers is bounded by the messages
    the channel holds, never by a count of leases. ``forget`` is told of each
    remembered lease that no longer claims any message.
    """

    __slots__ = ("by_id", "_forget")

    def __init__(self, forget: "Callable[[RememberedLease], None]") -> None:
        # The claiming lease of each message id; read by the channel at every FIN (a
        # dict's truth test, where ``__bool__`` would be a Python call).
        self.by_id: dict[str, RememberedLease] = {}
        self._forget = forget

    def __bool__(self) -> bool:
        return bool(self.by_id)

    def __len__(self) -> int:
        return len(self.by_id)

    def claim(self, lease: RememberedLease, ids: "Iterable[str] | None" = None) -> None:
        """``lease`` claims ``ids`` (default: all of its own), messages still here."""
        by_id = self.by_id
        for msg_id in lease.ids if ids is None else ids:
            previous = by_id.get(msg_id)
            if previous is lease:
                continue
            by_id[msg_id] = lease
            lease.live += 1
            if previous is not None:
                self._one_less(previous)

    def release(self, lease: RememberedLease) -> None:
        """``lease`` is held again (adopted, FINed): it claims nothing now."""
        by_id = self.by_id
        for msg_id in lease.ids:
            if by_id.get(msg_id) is lease:
                del by_id[msg_id]
        lease.live = 0

    def left(self, msg_ids: Iterable[str]) -> None:
        """These messages left the channel."""
        pop = self.by_id.pop
        for msg_id in msg_ids:
            lease = pop(msg_id, None)
            if lease is not None:
                self._one_less(lease)

    def clear(self) -> None:
        leases = {id(lease): lease for lease in self.by_id.values()}
        self.by_id.clear()
        for lease in leases.values():
            lease.live = 0
            self._forget(lease)

    def _one_less(self, lease: RememberedLease) -> None:
        lease.live -= 1
        if lease.live <= 0:
            self._forget(lease)


class LeaseSession:
    def __init__(self, client_id: str = "", grace: float = 0.0, owner: str = "") -> None:
        self.session_id = f"{next(_session_ids)}-{secrets.token_hex(8)}"
        self.owner = owner    # the principal that opened it ("" without auth)
        self.client_id = client_id or f"lease-session-{self.session_id}"
        self.leases: dict[str, Lease] = {}
        self.grace = grace                    # seconds kept after the stream drops
        self.detached_at: float | None = None  # monotonic time the stream dropped
        self.resumed = False
        self.stream = 0  # counts the streams attached: only the latest detaches it


# A reserve fills its lease in steps of at most this many messages and body bytes (or
# one message of up to max-msg-size), yielding the event loop between steps: a large
# reserve, read back from disk, never holds the loop for long.
RESERVE_STEP_MESSAGES = 1000
RESERVE_STEP_BYTES = 1 << 20


class Reservation:
    """A reserve in progress: ``lease`` fills from ``channel`` step by step (the
    broker's ``reserve_step``) until it holds ``max_messages`` messages, or
    ``max_bytes`` of bodies (if > 0), or the channel has nothing more ready."""

    def __init__(self, lease: Lease, channel: "Channel", max_messages: int, max_bytes: int,
                 step_bytes: int = RESERVE_STEP_BYTES) -> None:
        self.lease = lease
        self.channel = channel
        self.messages_left = max_messages
        self.max_bytes = max_bytes
        self.bytes_left = max_bytes
        self.step_bytes = max(1, step_bytes)
        self.bytes = 0          # body bytes taken so far
        self.done = False
        # (messages finished, leases missing) of the leases FINed before it began.
        self.finished: tuple[int, list[str]] = (0, [])

    def step(self) -> int:
        """Take the next bounded part; returns how many messages it took. The first step
        takes one message at least, whatever its size; a later step takes only what fits."""
        first = not self.lease.order
        limit = min(self.messages_left, RESERVE_STEP_MESSAGES)
        cap = min(self.step_bytes, self.bytes_left) if self.max_bytes else self.step_bytes
        took, size = self.channel.take(self.lease, limit, cap, at_least_one=first)
        self.lease.order.extend(took)
        self.messages_left -= len(took)
        self.bytes += size
        self.bytes_left -= size
        if not took or self.messages_left <= 0 or (self.max_bytes and self.bytes_left <= 0):
            self.done = True
        return len(took)


def _ignore(msg: Message) -> None:
    pass


class LeaseJournal:
    """The leases of a durable broker, written to ``<data-path>/leases.journal``, so that
    a lease outlives a restart of the broker, clean or ``kill -9``.

    A lease is written when it is made (its channel, and each message's id and attempts
    as first delivered: never bodies), written again when a replay adopts it (what it
    took back; a load keeps the last record of a lease, in the last one's place, so a
    message is claimed by the lease that held it last), and marked gone when it is FINed
    or when none of its messages waits in its channel any more. After a restart every
    lease not gone is remembered as if requeued: a replay adopts it and reads the same rows, and a FIN of
    a batch Spark committed before the restart finds its messages. The file holds what
    is live, not history: it starts afresh once nothing is live, and is rewritten
    with what is live once what is gone outweighs it four times over, so it stays
    bounded by the leases in flight or remembered. Written with ``write`` before the
    broker answers (what ``kill -9`` leaves), and fsynced with the logs by the store's
    sync (``take_sync_work``): a power loss takes what the logs' last completed sync
    did not cover, no more, so the leases come back as they were at that sync, with
    the messages they claim. (A start and a rewrite fsync it at once.) It starts afresh
    (cut back to its key) after a sync that found nothing live, not at the last FIN.

    The file is framed as a topic's log is (``storage.records``): its key first, then
    one ``LEASE_MADE`` or ``LEASE_GONE`` record per change, each checked under the key,
    so a name a client chose never passes for a record. A damaged or torn record costs
    that record (one lease, or one lease's end) and the load resumes at the next one. A
    write that fails is cut back off the file and the Reserve that wanted it is refused
    (``StorageFailed``); a failed end is kept and written with the next write. A file
    written before keys (``u32 length, u8 kind, payload, u32 crc32``, read up to its first
    damaged record) is read as it was and rewritten in this framing at the start.
    """

    MADE, GONE = 1, 2   # kinds of the framing before keys
    _HEAD = struct.Struct("<IB")
    _CRC = struct.Struct("<I")
    # lease id, topic len, channel len, owner len, msg timeout ms, n; then topic, channel,
    # owner (who may act on the lease under auth), ids, attempts
    _MADE = struct.Struct("<24sHHHII")
    COMPACT_RATIO = 4
    COMPACT_MIN_BYTES = 1 << 20

    def __init__(self, path: "str | os.PathLike[str]",
                 files: "fileops.Files | None" = None) -> None:
        self.path = Path(path)
        self.files = fileops.current if files is None else files
        self._sizes: dict[str, int] = {}  # live lease id -> bytes of its MADE record
        self._live_bytes = 0
        self._dead_bytes = 0
        self._fd = -1
        self._size = 0                    # of the file, as written by whole records
        self._key = 0
        self._unwritten: list[bytes] = []  # GONE records a failed write left to write
        self._unsynced = False            # written or cut since its last fsync
        self._cut_when_synced = False     # nothing was live when the running sync took it

    # -- reading, at start ----------------------------------------------------
    def load(self) -> list[tuple[str, str, str, float, list[str], list[int], str]]:
        """The live leases on disk: (lease id, topic, channel, msg timeout s, ids,
        attempts), in the order they were made."""
        data = self._read()
        if not data:
            return []
        found = records.file_key(data)
        if found is None:  # every copy of its key damaged: found again from its records
            key = self._recover_key(data)
            found = (key, records.PROLOGUE_SIZE) if key is not None else None
        if found is None or not found[0]:
            return self._load_before_keys(data)
        key, start = found
        live: dict[str, tuple] = {}
        damaged = 0

        def count(_: int, __: bytes) -> None:
            nonlocal damaged
            damaged += 1

        for record in records.scan(data[start:], f"lease journal {self.path}", start, None,
                                   count, key):
            if record.kind == records.LEASE_MADE:
                try:
                    made = self._decode_made(bytes(record.payload))
                except (struct.error, UnicodeDecodeError, ValueError):
                    damaged += 1  # its check passed: written so by a broker at fault
                    continue
                live.pop(made[0], None)   # written again (adopted): its place is the last
                live[made[0]] = made
            elif record.kind == records.LEASE_GONE:
                live.pop(bytes(record.payload).decode(errors="replace"), None)
        if damaged:
            log.error("lease journal %s: %d damaged or torn span(s) skipped (offsets above): "
                      "a lease made there is lost (its messages are not), or one ended there "
                      "is kept and dropped if nothing of it waits", self.path, damaged)
        return list(live.values())

    def _read(self) -> bytes:
        try:
            fd = self.files.open(str(self.path), os.O_RDONLY)
        except FileNotFoundError:
            return b""
        try:
            size = self.files.size(fd)
            parts, pos = [], 0
            while pos < size:
                chunk = self.files.pread(fd, size - pos, pos)
                if not chunk:
                    break
                parts.append(chunk)
                pos += len(chunk)
            return b"".join(parts)
        finally:
            self.files.close(fd)

    @staticmethod
    def _recover_key(data: bytes) -> int | None:
        """The key of a journal whose KEY records are all damaged: the one its first
        record checks under, if the record after it (when there is one) agrees."""
        at = records.PROLOGUE_SIZE
        keys = []
        while len(keys) < 2 and at + records.HEADER_SIZE <= len(data):
            _, kind, length, crc = records.HEADER.unpack_from(data, at)
            stop = at + records.HEADER_SIZE + length
            if stop > len(data):
                return None
            keys.append(zlib.crc32(data[at + records.HEADER_SIZE:stop],
                                   zlib.crc32(bytes((kind,)))) ^ crc)
            at = stop
        return keys[0] if keys and keys[0] and len(set(keys)) == 1 else None

    def _load_before_keys(self, data: bytes) -> list[tuple]:
        """A journal written before keys: read up to its first damaged record."""
        live: dict[str, tuple] = {}
        pos, head, crc = 0, self._HEAD, self._CRC
        while pos + head.size <= len(data):
            length, kind = head.unpack_from(data, pos)
            end = pos + head.size + length
            if end + crc.size > len(data) or \
                    crc.unpack_from(data, end)[0] != zlib.crc32(data[pos + 4:end]):
                log.warning("lease journal %s: a torn or damaged record at byte %d; the "
                            "%d byte(s) from there are dropped", self.path, pos, len(data) - pos)
                break
            payload = data[pos + head.size:end]
            if kind == self.MADE:
                record = self._decode_made(payload)
                live[record[0]] = record
            elif kind == self.GONE:
                live.pop(payload.decode(), None)
            pos = end + crc.size
        return list(live.values())

    @staticmethod
    def leased_ids(leases: "Iterable[tuple]") -> dict[str, dict[str, set[int]]]:
        """topic -> channel -> ids (as numbers) of the messages of ``leases`` (``load``'s)."""
        out: dict[str, dict[str, set[int]]] = {}
        for _, topic, channel, _, ids, _, _ in leases:
            out.setdefault(topic, {}).setdefault(channel, set()).update(
                int(msg_id, 16) for msg_id in ids)
        return out

    def _decode_made(self, payload: bytes) -> tuple:
        lease_id, tlen, clen, olen, timeout_ms, n = self._MADE.unpack_from(payload)
        pos = self._MADE.size
        topic = payload[pos:pos + tlen].decode()
        channel = payload[pos + tlen:pos + tlen + clen].decode()
        owner = payload[pos + tlen + clen:pos + tlen + clen + olen].decode()
        pos += tlen + clen + olen
        text = payload[pos:pos + 16 * n].decode()
        ids = [text[i:i + 16] for i in range(0, 16 * n, 16)]
        attempts = array("H")
        attempts.frombytes(payload[pos + 16 * n:pos + 18 * n])
        if sys.byteorder != "little":
            attempts.byteswap()
        return (lease_id.decode(), topic, channel, timeout_ms / 1000, ids, attempts.tolist(),
                owner)

    # -- writing --------------------------------------------------------------
    def open(self, live: "Iterable[tuple[str, str, str, float, list[str], list[int], str]]") -> None:
        """Start the file afresh with ``live`` (the leases kept after a restart)."""
        try:
            self._rewrite([(record[0], self._encode_made(*record)) for record in live])
        except OSError as err:
            raise OSError(err.errno, f"cannot start: could not rewrite the lease journal "
                          f"{self.path}: {fileops.describe(err)} (it is as it was; free space "
                          f"or make it writable and start again)") from err

    def made(self, lease: "Lease") -> None:
        """Write ``lease`` down (made, or adopted: written again, with what it took back);
        ``StorageFailed`` (and the file as it was) if it cannot be."""
        assert lease.channel is not None
        record = self._encode_lease(lease)
        try:
            self._append([*self._unwritten, record])
        except OSError as err:
            raise StorageFailed(f"could not write the lease to {self.path}: "
                                f"{err.strerror or err} (its messages are given back; retry)"
                                ) from err
        self._unwritten = []
        before = self._sizes.pop(lease.lease_id, None)   # written again (adopted): dead now
        if before is not None:
            self._live_bytes -= before
            self._dead_bytes += before
        self._sizes[lease.lease_id] = len(record)
        self._live_bytes += len(record)

    def gone(self, lease_id: str, live: "Callable[[], Iterable[Lease | RememberedLease]]") -> None:
        """``lease_id`` is over; ``live()`` gives what is live, should the file be rewritten."""
        size = self._sizes.pop(lease_id, None)
        if size is None:
            return
        self._live_bytes -= size
        self._dead_bytes += size
        # Nothing live: the file starts afresh once a sync has covered this end (``synced``),
        # not before: a power loss that takes the FINs brings their leases back with them.
        if self._sizes and self._dead_bytes > max(self.COMPACT_MIN_BYTES,
                                                  self.COMPACT_RATIO * self._live_bytes):
            # In the order the file holds them (made, or adopted: written again, last): a
            # later lease claims what it shares with an earlier one at the next start.
            by_id = {lease.lease_id: lease for lease in live()}
            try:
                self._rewrite([(lease_id, self._encode_lease(by_id[lease_id]))
                               for lease_id in self._sizes if lease_id in by_id])
                self._unwritten = []
                return
            except OSError as err:
                log.error("lease journal %s: could not rewrite it: %s", self.path, err)
        self._unwritten.append(self._record(records.LEASE_GONE, lease_id.encode()))
        try:
            self._append(self._unwritten)
            self._unwritten = []
        except OSError as err:
            # Kept, written with the next write: until then a restart keeps the lease,
            # which finds nothing of it waiting (its messages are FINed) and drops it.
            log.error("lease journal %s: could not write the end of lease %s: %s (kept; "
                      "written with the next write)", self.path, lease_id, err)

    def take_sync_work(self) -> str | None:
        """The file's path, if it was written or cut since it was last fsynced (the
        store's sync fsyncs it, in its thread, with the logs; a failed sync tries it
        again); None when there is nothing to fsync."""
        if not self._unsynced:
            return None
        self._unsynced = False
        self._cut_when_synced = not self._sizes
        return str(self.path)

    def synced(self) -> None:
        """The store's sync that took this file (``take_sync_work``) completed: if nothing
        was live then, and nothing is now, the file starts afresh (every end it holds, and
        the FINs before them, are on disk: a power loss that undoes the cut brings back
        leases whose messages are FINed, which are dropped)."""
        cut, self._cut_when_synced = self._cut_when_synced, False
        if not cut or self._sizes or self._size <= records.PROLOGUE_SIZE:
            return   # (already cut: an idle broker fsyncs nothing more)
        try:
            self._cut(records.PROLOGUE_SIZE)
            self._dead_bytes, self._unwritten = 0, []
        except OSError as err:
            log.error("lease journal %s: could not cut it back: %s", self.path, err)

    def close(self) -> None:
        if self._fd >= 0:
            self.files.close(self._fd)
            self._fd = -1

    def _encode_lease(self, lease: "Lease | RememberedLease") -> bytes:
        if isinstance(lease, RememberedLease):
            return self._encode_made(lease.lease_id, lease.channel.topic.name,
                                     lease.channel.name, lease.msg_timeout, lease.ids,
                                     lease.attempts, lease.owner)
        order = lease.order
        return self._encode_made(lease.lease_id, lease.channel.topic.name, lease.channel.name,
                                 lease.msg_timeout, list(map(_ID, order)),
                                 lease.attempts_of(order) or list(map(_ATTEMPTS, order)),
                                 lease.owner)

    def _encode_made(self, lease_id: str, topic: str, channel: str, msg_timeout: float,
                     ids: list[str], attempts: list[int], owner: str = "") -> bytes:
        t, c, o = topic.encode(), channel.encode(), owner.encode()
        counts = array("H", attempts)  # attempts are capped at 65535 (message.MAX_ATTEMPTS)
        if sys.byteorder != "little":
            counts.byteswap()
        payload = b"".join((self._MADE.pack(lease_id.encode(), len(t), len(c), len(o),
                                            int(msg_timeout * 1000), len(ids)),
                            t, c, o, "".join(ids).encode(), counts.tobytes()))
        return self._record(records.LEASE_MADE, payload)

    @staticmethod
    def _record(kind: int, payload: bytes) -> bytes:
        return records.encode(kind, payload)

    def _write_all(self, fd: int, data: "bytes | bytearray") -> None:
        view = memoryview(data)
        while view:
            n = self.files.write(fd, view)
            if n <= 0:
                raise OSError(f"write returned {n}")
            view = view[n:]

    def _append(self, parts: list[bytes]) -> None:
        """Write whole records at the end, or leave the file as it was and raise."""
        if self._fd < 0:
            self._fd = self.files.open(str(self.path), os.O_WRONLY | os.O_APPEND)
            self._size = self.files.size(self._fd)
        data = records.seal(b"".join(parts), self._key)
        self._unsynced = True
        try:
            self._write_all(self._fd, data)
        except OSError:
            try:
                self._cut(self._size)
            except OSError as err:
                log.error("lease journal %s: could not cut a failed write back off: %s "
                          "(the next load skips the torn record)", self.path, err)
            raise
        self._size += len(data)

    def _cut(self, size: int) -> None:
        if self._fd < 0:
            self._fd = self.files.open(str(self.path), os.O_WRONLY | os.O_APPEND)
        self.files.truncate(self._fd, size)
        self._size = size
        self._unsynced = True

    def _rewrite(self, made: "list[tuple[str, bytes]]") -> None:
        """Replace the file with a new key and ``made`` (temp file, fsync, rename); the
        file as it was if that fails."""
        key = records.new_key()
        tmp = self.path.with_name(self.path.name + ".tmp")
        data = records.prologue(key) + records.seal(b"".join(r for _, r in made), key)
        fd = self.files.open(str(tmp), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        try:
            self._write_all(fd, data)
            self.files.fsync(fd)
        except OSError:
            self.files.close(fd)
            self.files.unlink(str(tmp))
            raise
        self.files.close(fd)
        try:
            self.files.rename(str(tmp), str(self.path))
        except OSError:
            self.files.unlink(str(tmp))
            raise
        self.close()
        self._key, self._size = key, len(data)
        self._unsynced = False   # fsynced above, then renamed into place
        self._sizes = {lease_id: len(record) for lease_id, record in made}
        self._live_bytes = sum(self._sizes.values())
        self._dead_bytes = 0
