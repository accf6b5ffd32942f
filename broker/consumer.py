"""A consumer of a channel, as the core sees it: a RDY count, the messages it
holds in flight, and a callback that hands a message to its connection.

The servers (gRPC and TCP) create one per subscribed connection through
``Consumer.attach`` and let go of it through ``detach``; the core never knows
which wire it speaks. A server whose transport cannot take more (a client that
does not read) sets ``blocked``: the channel then delivers nothing to it, its
timed-out messages go to others, and ``unblock`` asks the channel for more.

The channel hands messages over in batches (``deliver_many``): a server that
frames many messages at once gives ``on_messages``; ``batch_bytes`` (0: none)
bounds the bodies of one batch, so a transport that fills up mid-way has little
more than that queued before ``block`` stops the next one.
"""

from __future__ import annotations

import itertools
import logging
import time
from typing import TYPE_CHECKING, Callable, Optional

from .message import Message
from .stats import ClientIdentity

log = logging.getLogger("pynsqd")

if TYPE_CHECKING:
    from .channel import Channel
    from .core import Broker

_ids = itertools.count(1)


class Consumer:
    # Whether what it gives back (requeued or timed out) stays in memory past
    # --mem-queue-size, at the front, for its owner to take back: a lease's messages
    # must all be there for a replay to read the same rows. They were in memory while in
    # flight, so keeping them adds nothing to what the broker held.
    keeps_given_back = False

    def __init__(self, on_message: Callable[[Message], None], *, msg_timeout: float,
                 client_id: str = "", identity: ClientIdentity | None = None,
                 on_messages: Callable[[list[Message]], None] | None = None) -> None:
        self.id = next(_ids)
        self.client_id = client_id or (identity and identity.client_id) or f"consumer-{self.id}"
        # Who it is, as its server recorded it (for /stats); the core only keeps it.
        self.identity = identity or ClientIdentity(client_id=self.client_id)
        self.msg_timeout = msg_timeout          # seconds, already capped
        self.rdy = 0
        self.in_flight: dict[str, Message] = {}  # insertion-ordered
        self.channel: Optional["Channel"] = None
        self.closing = False                    # after CLS: receives nothing more
        self.blocked = False                    # its transport is full: send nothing now
        self.message_count = 0
        self.finish_count = 0
        self.requeue_count = 0
        self.connect_ts = int(time.time())  # wall clock, for stats
        self.batch_bytes = 0                    # bodies per batch handed over (0: no bound)
        self._on_message = on_message
        self._on_messages = on_messages
        # Set by a server: called when the channel is deleted under the consumer.
        self.on_evicted: Callable[[], None] | None = None

    @classmethod
    def attach(cls, broker: "Broker", topic: str, channel: str,
               on_message: Callable[[Message], None], *, client_id: str = "",
               msg_timeout_ms: int = 0, identity: ClientIdentity | None = None,
               on_evicted: Callable[[], None] | None = None,
               on_messages: Callable[[list[Message]], None] | None = None,
               batch_bytes: int = 0) -> "Consumer":
        """SUB: a new consumer of ``topic``/``channel``, its timeout checked and
        capped by the broker. Raises ``InvalidTopic``, ``InvalidChannel`` or
        ``InvalidRequest`` (timeout out of range) before anything is created.
        ``on_messages``, when given, takes each batch instead of ``on_message``."""
        consumer = cls(on_message, client_id=client_id, identity=identity,
                       msg_timeout=broker.msg_timeout(msg_timeout_ms), on_messages=on_messages)
        consumer.on_evicted = on_evicted
        consumer.batch_bytes = batch_bytes
        broker.subscribe(consumer, topic, channel)
        log.info("%s: subscribed to %s/%s", consumer.describe(), topic, channel)
        return consumer

    def detach(self) -> None:
        """The connection is gone: what it held goes back to the channel at once."""
        channel, self.channel = self.channel, None
        self.closing = True
        if channel is not None:
            log.info("%s: left %s/%s (%d in flight requeued)", self.describe(),
                     channel.topic.name, channel.name, len(self.in_flight))
        if channel is not None and not channel.deleted:
            channel.remove_consumer(self)

    def describe(self) -> str:
        """``CLIENT(grpc spark-1 127.0.0.1:5123)``, as the log names a consumer."""
        i = self.identity
        return f"CLIENT({' '.join(filter(None, (i.version, self.client_id, i.remote_address)))})"

    def can_receive(self) -> bool:
        return not self.closing and not self.blocked and len(self.in_flight) < self.rdy

    def room(self) -> int:
        """How many more messages it may be handed now (0 or less: none)."""
        if self.closing or self.blocked:
            return 0
        return self.rdy - len(self.in_flight)

    def block(self) -> None:
        self.blocked = True

    def unblock(self) -> None:
        if self.blocked:
            self.blocked = False
            if self.channel is not None and not self.channel.deleted:
                self.channel.wake(self)

    def deliver_many(self, msgs: list[Message]) -> None:
        """Hand over ``msgs``, already recorded in its ``in_flight`` by the channel."""
        self.message_count += len(msgs)
        if self._on_messages is not None:
            self._on_messages(msgs)
        else:
            on_message = self._on_message
            for msg in msgs:
                on_message(msg)

    def __repr__(self) -> str:
        return f"Consumer({self.client_id!r}, rdy={self.rdy}, in_flight={len(self.in_flight)})"
