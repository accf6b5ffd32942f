"""The channel's delivery semantics against a plain model, over random sequences of
publish, DPUB, RDY, FIN, REQ, TOUCH, disconnects and the passing of time (a
hypothesis state machine on the hand-turned clock).

The model keeps, per message id: whether it was FINished, which consumer holds it,
the earliest time it may be delivered again (DPUB defer, REQ delay) and the deadline
of the current delivery. Every delivery is checked against it as it happens."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (RuleBasedStateMachine, invariant, precondition, rule,
                                 run_state_machine_as_test)

from broker import NotInFlight
from broker.consumer import Consumer
from broker.message import Message

from .corekit import new_broker

MAX_RDY = 4
TIMEOUTS_MS = [1000, 2500]
UNKNOWN_ID = "0123456789abcdef"


class ModelConsumer(Consumer):
    def __init__(self, machine: "ChannelMachine", msg_timeout_ms: int) -> None:
        self.machine = machine
        super().__init__(self.received, msg_timeout=msg_timeout_ms / 1000)

    def received(self, msg: Message) -> None:
        self.machine.check_delivery(self, msg)


class ChannelMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.broker, self.clock = new_broker(msg_timeout="1s", max_msg_timeout="10s",
                                             max_req_timeout="5s", max_rdy_count=MAX_RDY)
        self.channel = self.broker.create_channel("events", "work")
        self.consumers: list[ModelConsumer] = []
        self.published: list[str] = []
        self.finished: set[str] = set()
        self.deliveries: Counter[str] = Counter()
        self.holder: dict[str, ModelConsumer] = {}
        self.not_before: dict[str, float] = {}
        self.deadline: dict[str, float] = {}

    @property
    def now(self) -> float:
        return self.clock.monotonic()

    # -- the model's check of every delivery --------------------------------
    def check_delivery(self, consumer: ModelConsumer, msg: Message) -> None:
        assert consumer in self.consumers, "delivered to a consumer that left"
        assert msg.id not in self.finished, f"{msg.id} delivered after its FIN"
        assert self.now >= self.not_before.get(msg.id, 0.0) - 1e-9, \
            f"{msg.id} delivered before its delay ran out"
        if msg.id in self.holder:  # still held: only its deadline passing may free it
            assert self.now >= self.deadline[msg.id] - 1e-9, f"{msg.id} delivered twice at once"
        self.deliveries[msg.id] += 1
        assert msg.attempts == self.deliveries[msg.id]
        assert len(consumer.in_flight) <= consumer.rdy, "more in flight than RDY"
        self.holder[msg.id] = consumer
        self.deadline[msg.id] = self.now + consumer.msg_timeout

    def held_by(self, consumer: ModelConsumer) -> list[str]:
        return sorted(i for i, c in self.holder.items() if c is consumer)

    def release(self, msg_id: str, delay: float = 0.0) -> None:
        del self.holder[msg_id]
        self.not_before[msg_id] = self.now + delay

    # -- rules --------------------------------------------------------------
    @precondition(lambda self: len(self.consumers) < 3)
    @rule(rdy=st.integers(0, MAX_RDY), timeout_ms=st.sampled_from(TIMEOUTS_MS))
    def subscribe(self, rdy: int, timeout_ms: int) -> None:
        consumer = ModelConsumer(self, timeout_ms)
        self.consumers.append(consumer)
        self.broker.subscribe(consumer, "events", "work")
        self.channel.set_rdy(consumer, rdy)

    @rule(n=st.integers(1, 3), defer_ms=st.sampled_from([0, 0, 500, 1500]))
    def publish(self, n: int, defer_ms: int) -> None:
        at = self.now
        bodies = [b"m%d" % (len(self.published) + i) for i in range(n)]
        if defer_ms:
            ids = [self.broker.publish("events", body, defer_ms=defer_ms) for body in bodies]
        else:
            ids = self.broker.multi_publish("events", bodies)
        for msg_id in ids:
            self.not_before.setdefault(msg_id, at + defer_ms / 1000)
        self.published.extend(ids)

    @precondition(lambda self: self.consumers)
    @rule(data=st.data(), rdy=st.integers(0, MAX_RDY))
    def set_rdy(self, data, rdy: int) -> None:
        consumer = data.draw(st.sampled_from(self.consumers))
        self.channel.set_rdy(consumer, rdy)

    @precondition(lambda self: self.holder)
    @rule(data=st.data())
    def fin(self, data) -> None:
        msg_id = data.draw(st.sampled_from(sorted(self.holder)))
        consumer = self.holder[msg_id]
        self.release(msg_id)
        self.finished.add(msg_id)
        self.channel.finish(consumer, msg_id)

    @precondition(lambda self: self.holder)
    @rule(data=st.data(), delay=st.sampled_from([0.0, 0.5, 2.0]))
    def req(self, data, delay: float) -> None:
        msg_id = data.draw(st.sampled_from(sorted(self.holder)))
        consumer = self.holder[msg_id]
        self.release(msg_id, delay)
        self.channel.requeue(consumer, msg_id, delay=delay)

    @precondition(lambda self: self.holder)
    @rule(data=st.data())
    def touch(self, data) -> None:
        msg_id = data.draw(st.sampled_from(sorted(self.holder)))
        consumer = self.holder[msg_id]
        self.channel.touch(consumer, msg_id)
        self.deadline[msg_id] = self.now + consumer.msg_timeout

    @precondition(lambda self: len(self.consumers) >= 2 and self.holder)
    @rule(data=st.data(), command=st.sampled_from(["FIN", "REQ", "TOUCH"]))
    def command_on_another_consumers_message_changes_nothing(self, data, command: str) -> None:
        msg_id = data.draw(st.sampled_from(sorted(self.holder)))
        other = data.draw(st.sampled_from([c for c in self.consumers
                                           if c is not self.holder[msg_id]]))
        target = data.draw(st.sampled_from([msg_id, UNKNOWN_ID]))
        action = {"FIN": self.channel.finish, "REQ": self.channel.requeue,
                  "TOUCH": self.channel.touch}[command]
        with pytest.raises(NotInFlight):
            action(other, target)

    @precondition(lambda self: self.consumers)
    @rule(data=st.data())
    def disconnect(self, data) -> None:
        consumer = data.draw(st.sampled_from(self.consumers))
        self.consumers.remove(consumer)
        for msg_id in self.held_by(consumer):
            self.release(msg_id)
        self.channel.remove_consumer(consumer)

    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)
        self.broker.tick()
        for msg_id, consumer in list(self.holder.items()):
            if self.deadline[msg_id] <= self.now:  # timed out, and not delivered again yet
                assert msg_id not in consumer.in_flight, f"{msg_id} held past its deadline"
                del self.holder[msg_id]

    @rule(seconds=st.sampled_from([0.25, 0.5, 1.0, 3.0]))
    def time_passes(self, seconds: float) -> None:
        self.advance(seconds)

    @precondition(lambda self: self.published)
    @rule()
    def everything_published_is_delivered_once_consumed(self) -> None:
        if not self.consumers:
            self.subscribe(MAX_RDY, TIMEOUTS_MS[0])
        for _ in range(100):
            for consumer in self.consumers:
                self.channel.set_rdy(consumer, MAX_RDY)
                for msg_id in self.held_by(consumer):
                    self.release(msg_id)
                    self.finished.add(msg_id)
                    self.channel.finish(consumer, msg_id)
            if self.finished == set(self.published):
                break
            self.advance(0.5)
        assert self.finished == set(self.published), "published messages never delivered"

    # -- invariants ---------------------------------------------------------
    @invariant()
    def what_consumers_hold_is_what_the_model_says(self) -> None:
        for consumer in self.consumers:
            assert sorted(consumer.in_flight) == self.held_by(consumer)

    @invariant()
    def nothing_accepted_is_lost_or_made_up(self) -> None:
        ch = self.channel
        assert ch.depth + ch.deferred_count + ch.in_flight_count == \
            len(self.published) - len(self.finished)
        assert ch.finish_count == len(self.finished)
        assert ch.in_flight_count == len(self.holder)

    @invariant()
    def ready_messages_wait_only_while_no_consumer_has_room(self) -> None:
        if self.channel.depth:
            assert not any(c.can_receive() for c in self.consumers)


def test_delivery_semantics_hold_over_random_sequences_of_operations():
    run_state_machine_as_test(
        ChannelMachine,
        settings=settings(max_examples=60, stateful_step_count=40, deadline=None,
                          derandomize=True, database=None,
                          suppress_health_check=[HealthCheck.too_slow]))


class TurnsMachine(RuleBasedStateMachine):
    """Who gets which message, against a plain model of the round-robin: consumers in
    the order they subscribed, the turns going on after the one served last; on its turn
    a consumer with room takes the next two ready messages (fewer if its room or the
    messages run out), and turns go round while messages and room remain. A consumer
    that leaves gives back what it held, in order, ahead of the rest."""

    def __init__(self) -> None:
        super().__init__()
        self.broker, _ = new_broker(max_rdy_count=MAX_RDY + 1)
        self.channel = self.broker.create_channel("events", "work")
        self.seats: dict[int, Consumer] = {}      # the model's seat -> the real consumer
        self.rdy: dict[int, int] = {}
        self.held: dict[int, list[str]] = {}
        self.ready: list[str] = []
        self.last = -1                            # the seat served last
        self.count = 0

    def deal(self) -> None:
        while self.ready:
            seats = sorted(self.seats)
            order = [s for s in seats if s > self.last] + [s for s in seats if s <= self.last]
            served = False
            for s in order:
                room = self.rdy[s] - len(self.held[s])
                if room > 0 and self.ready:
                    take = min(2, room)
                    self.held[s] += self.ready[:take]
                    del self.ready[:take]
                    self.last, served = s, True
            if not served:
                return

    @precondition(lambda self: len(self.seats) < 5)
    @rule(rdy=st.integers(0, MAX_RDY + 1))
    def subscribe(self, rdy: int) -> None:
        seat = self.count
        self.count += 1
        consumer = Consumer(lambda msg: None, msg_timeout=60.0)
        self.seats[seat], self.rdy[seat], self.held[seat] = consumer, rdy, []
        self.broker.subscribe(consumer, "events", "work")
        self.channel.set_rdy(consumer, rdy)
        self.deal()

    @rule(n=st.integers(1, 9))
    def publish(self, n: int) -> None:
        self.ready += self.broker.multi_publish("events", [b"m"] * n)
        self.deal()

    @precondition(lambda self: self.seats)
    @rule(data=st.data(), rdy=st.integers(0, MAX_RDY + 1))
    def set_rdy(self, data, rdy: int) -> None:
        seat = data.draw(st.sampled_from(sorted(self.seats)))
        self.rdy[seat] = rdy
        self.channel.set_rdy(self.seats[seat], rdy)
        self.deal()

    @precondition(lambda self: any(self.held.values()))
    @rule(data=st.data())
    def fin(self, data) -> None:
        seat = data.draw(st.sampled_from(sorted(s for s, h in self.held.items() if h)))
        ids = data.draw(st.lists(st.sampled_from(self.held[seat]), min_size=1, unique=True))
        self.held[seat] = [i for i in self.held[seat] if i not in ids]
        self.channel.finish_many(self.seats[seat], ids)
        self.deal()

    @precondition(lambda self: self.seats)
    @rule(data=st.data())
    def disconnect(self, data) -> None:
        seat = data.draw(st.sampled_from(sorted(self.seats)))
        consumer = self.seats.pop(seat)
        self.ready[:0] = self.held.pop(seat)
        del self.rdy[seat]
        self.channel.remove_consumer(consumer)
        self.deal()

    @invariant()
    def each_consumer_holds_what_the_turns_gave_it(self) -> None:
        for seat, consumer in self.seats.items():
            assert list(consumer.in_flight) == self.held[seat], f"seat {seat}"
        assert self.channel.depth == len(self.ready)


def test_consumers_take_turns_of_two_in_the_order_they_subscribed():
    run_state_machine_as_test(
        TurnsMachine,
        settings=settings(max_examples=80, stateful_step_count=30, deadline=None,
                          derandomize=True, database=None,
                          suppress_health_check=[HealthCheck.too_slow]))
