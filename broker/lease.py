"""Leases: a batch of a channel's messages held in flight for a group of readers.

A reader that plans work on one process and reads it on others (Spark's driver
and executors) cannot use a consumer stream, since only the holder may FIN. A
lease is a holder that is not a connection: a session (one long-lived stream
from the planner) reserves a batch; any process may fetch the batch, slice by
slice, as often as it needs; the planner FINs, REQs or TOUCHes the batch by
lease id. When the session's stream ends, every lease it holds is requeued.
"""

from __future__ import annotations

import itertools
import secrets

from .consumer import Consumer
from .message import Message

_session_ids = itertools.count(1)


class Lease(Consumer):
    """A holder outside any channel's round-robin; its messages are its in-flight."""

    def __init__(self, session: "LeaseSession", *, msg_timeout: float) -> None:
        super().__init__(_ignore, msg_timeout=msg_timeout, client_id=session.client_id)
        self.lease_id = secrets.token_hex(12)
        self.session = session
        self.order: list[Message] = []

    def slice(self, partition: int, num_partitions: int) -> list[Message]:
        """This lease's messages for one partition, still held; fixed at reserve time."""
        held = self.in_flight
        return [m for m in self.order[partition::num_partitions] if held.get(m.id) is m]


class LeaseSession:
    def __init__(self, client_id: str = "") -> None:
        self.session_id = f"{next(_session_ids)}-{secrets.token_hex(8)}"
        self.client_id = client_id or f"lease-session-{self.session_id}"
        self.leases: dict[str, Lease] = {}


def _ignore(msg: Message) -> None:
    pass
