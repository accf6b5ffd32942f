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
remembered by its messages' ids (never their bodies) so that a planner
replaying a batch can adopt it, or FIN it once the batch is known committed.
"""

from __future__ import annotations

import itertools
import secrets
from collections.abc import MutableMapping
from dataclasses import dataclass
from operator import attrgetter
from typing import TYPE_CHECKING, Iterator

from .consumer import Consumer
from .message import Message

if TYPE_CHECKING:
    from .channel import Channel

_session_ids = itertools.count(1)
_ID = attrgetter("id")


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

    def __init__(self, session: "LeaseSession", *, msg_timeout: float) -> None:
        super().__init__(_ignore, msg_timeout=msg_timeout, client_id=session.client_id)
        self.in_flight: HeldMessages = HeldMessages()  # type: ignore[assignment]
        self.lease_id = secrets.token_hex(12)
        self.session = session
        self.owner = session.owner     # who may act on it, live or remembered (auth)
        self.order: list[Message] = []

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

    def let_go(self) -> list[Message]:
        """The messages this lease was made of; it keeps none from now on (it is over).
        They point at it (``consumer``): kept, they and it would be a cycle that only a
        full collection frees."""
        order, self.order = self.order, []
        return order

    def remembered(self) -> "RememberedLease":
        assert self.channel is not None
        return RememberedLease(self.channel, [m.id for m in self.order], self.msg_timeout,
                               self.owner)


@dataclass
class RememberedLease:
    """A lease no longer held (requeued or timed out): its channel and message ids."""

    channel: "Channel"
    ids: list[str]
    msg_timeout: float
    owner: str = ""


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
