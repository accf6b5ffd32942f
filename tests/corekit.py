"""Helpers for the core's unit tests: a broker on a ManualClock and consumers
that record what they are handed."""

from __future__ import annotations

from broker import Broker, Options
from broker.clock import ManualClock
from broker.consumer import Consumer
from broker.message import Message


class Recorder(Consumer):
    """A consumer that keeps every message it is handed, in order."""

    def __init__(self, broker: Broker, msg_timeout_ms: int = 0, client_id: str = "") -> None:
        self.received: list[Message] = []
        super().__init__(self.received.append, msg_timeout=broker.msg_timeout(msg_timeout_ms),
                         client_id=client_id)

    @property
    def ids(self) -> list[str]:
        return [m.id for m in self.received]

    def fin_all(self) -> None:
        for msg_id in list(self.in_flight):
            self.channel.finish(self, msg_id)


def new_broker(**options) -> tuple[Broker, ManualClock]:
    clock = ManualClock()
    return Broker(Options(**options), clock=clock), clock


def subscribe(broker: Broker, topic: str, channel: str, *, rdy: int = 100,
              msg_timeout_ms: int = 0) -> Recorder:
    consumer = Recorder(broker, msg_timeout_ms)
    ch = broker.subscribe(consumer, topic, channel)
    ch.set_rdy(consumer, rdy)
    return consumer


def advance(broker: Broker, clock: ManualClock, seconds: float) -> None:
    """Move time on and tick, as the app's ticker would."""
    clock.advance(seconds)
    broker.tick()
