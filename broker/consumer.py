"""A consumer of a channel, as the core sees it: a RDY count, the messages it
holds in flight, and a callback that hands a message to its connection.

The servers (gRPC, and any other protocol) create one per connection; the core
never knows which wire it speaks.
"""

from __future__ import annotations

import itertools
import time
from typing import TYPE_CHECKING, Callable, Optional

from .message import Message

if TYPE_CHECKING:
    from .channel import Channel

_ids = itertools.count(1)


class Consumer:
    def __init__(self, on_message: Callable[[Message], None], *, msg_timeout: float,
                 client_id: str = "") -> None:
        self.id = next(_ids)
        self.client_id = client_id or f"consumer-{self.id}"
        self.msg_timeout = msg_timeout          # seconds, already capped
        self.rdy = 0
        self.in_flight: dict[str, Message] = {}  # insertion-ordered
        self.channel: Optional["Channel"] = None
        self.closing = False                    # after CLS: receives nothing more
        self.message_count = 0
        self.finish_count = 0
        self.requeue_count = 0
        self.connect_ts = int(time.time())  # wall clock, for stats
        self._on_message = on_message
        # Set by a server: called when the channel is deleted under the consumer.
        self.on_evicted: Callable[[], None] | None = None

    def can_receive(self) -> bool:
        return not self.closing and len(self.in_flight) < self.rdy

    def deliver(self, msg: Message) -> None:
        self.in_flight[msg.id] = msg
        self.message_count += 1
        self._on_message(msg)

    def __repr__(self) -> str:
        return f"Consumer({self.client_id!r}, rdy={self.rdy}, in_flight={len(self.in_flight)})"
