"""Delivery semantics of the core (DESIGN.md 1-5), on a ManualClock: fan-out,
load-balancing, RDY, in-flight deadlines, FIN, REQ, TOUCH, DPUB, disconnects."""

from __future__ import annotations

import pytest

from broker import InvalidRequest, NotInFlight
from broker.consumer import Consumer
from broker.pqueue import DeadlineQueue
from broker.message import Message

from .corekit import Recorder, advance, new_broker, subscribe


def publish_n(broker, topic: str, n: int) -> list[str]:
    return broker.multi_publish(topic, [f"m{i}".encode() for i in range(n)])


def test_every_channel_gets_a_copy_of_every_message():
    broker, _ = new_broker()
    a = subscribe(broker, "events", "archive")
    b = subscribe(broker, "events", "metrics")
    ids = publish_n(broker, "events", 10)
    assert a.ids == ids
    assert b.ids == ids
    assert [m.body for m in a.received] == [f"m{i}".encode() for i in range(10)]


def test_each_channel_keeps_its_own_attempts_and_deadlines():
    broker, clock = new_broker()
    a = subscribe(broker, "events", "a", msg_timeout_ms=1000)
    b = subscribe(broker, "events", "b", msg_timeout_ms=1000)
    [msg_id] = publish_n(broker, "events", 1)
    a.channel.requeue(a, msg_id)
    b.channel.finish(b, msg_id)
    assert [m.attempts for m in a.received] == [2, 2]  # one copy, redelivered
    assert [m.attempts for m in b.received] == [1]
    advance(broker, clock, 1.0)
    assert (a.channel.timeout_count, b.channel.timeout_count) == (1, 0)


def test_consumers_of_one_channel_share_it_each_message_going_to_one():
    broker, _ = new_broker()
    consumers = [subscribe(broker, "events", "work") for _ in range(3)]
    ids = publish_n(broker, "events", 30)
    got = [c.ids for c in consumers]
    assert sorted(i for ids_ in got for i in ids_) == sorted(ids)
    assert all(len(g) == 10 for g in got)  # round-robin
    # In turns of two: a takes 0 and 1, b 2 and 3, c 4 and 5, a 6 and 7, ...
    assert got[0] == [i for n in range(0, 30, 6) for i in ids[n:n + 2]]


def test_round_robin_skips_consumers_without_room_and_goes_on_after_the_one_served():
    broker, _ = new_broker()
    a = subscribe(broker, "events", "work", rdy=1)
    b = subscribe(broker, "events", "work")
    c = subscribe(broker, "events", "work")
    ids = publish_n(broker, "events", 7)       # a's turn takes 1 (its room), b's and c's 2
    assert (a.ids, b.ids, c.ids) == ([ids[0]], ids[1:3] + ids[5:7], ids[3:5])


def test_when_messages_are_scarce_each_consumer_with_room_takes_a_turn_before_any_takes_another():
    broker, _ = new_broker()
    a, b, c, d, e = (subscribe(broker, "events", "work", rdy=10) for _ in range(5))
    first = publish_n(broker, "events", 4)     # a and b, two each
    second = publish_n(broker, "events", 4)    # then c and d: a and b wait their turn
    third = publish_n(broker, "events", 3)     # e, then a again, with what is left
    fourth = publish_n(broker, "events", 1)    # b
    assert (a.ids, b.ids, c.ids, d.ids, e.ids) == (
        first[0:2] + third[2:3], first[2:4] + fourth, second[0:2], second[2:4], third[0:2])


def test_what_is_left_after_full_rounds_of_turns_goes_a_turn_each_from_the_first():
    broker, _ = new_broker()
    a, b, c = (subscribe(broker, "events", "work", rdy=10) for _ in range(3))
    ids = publish_n(broker, "events", 9)       # a round of turns (6), then a 2, b 1
    assert (a.ids, b.ids, c.ids) == (ids[0:2] + ids[6:8], ids[2:4] + ids[8:9], ids[4:6])
    more = publish_n(broker, "events", 8)      # after b: a round (c, a, b), then c 2
    assert (c.ids[2:], a.ids[4:], b.ids[3:]) == (more[0:2] + more[6:8], more[2:4], more[4:6])
    last = publish_n(broker, "events", 1)      # after c, the last served: a
    assert a.ids[-1:] == last


def test_a_consumer_at_a_high_rdy_takes_a_burst_in_turns_with_the_others_not_alone():
    broker, _ = new_broker()
    big = subscribe(broker, "events", "work", rdy=1000)
    small = [subscribe(broker, "events", "work", rdy=2) for _ in range(4)]
    ids = publish_n(broker, "events", 12)      # big 2, each small 2, big the 2 left
    assert big.ids == ids[0:2] + ids[10:12]
    assert [c.ids for c in small] == [ids[n:n + 2] for n in range(2, 10, 2)]


def test_when_every_consumer_is_full_the_one_that_frees_room_is_served_and_round_robin_goes_on():
    broker, _ = new_broker()
    a, b, c = (subscribe(broker, "events", "work", rdy=1) for _ in range(3))
    ids = publish_n(broker, "events", 7)           # 0, 1, 2 go out; 3 to 6 wait
    assert (a.ids, b.ids, c.ids) == ([ids[0]], [ids[1]], [ids[2]])
    b.channel.finish(b, ids[1])                    # b has room: b, and only b, gets 3
    a.channel.set_rdy(a, 2)                        # a gets 4
    c.channel.requeue(c, ids[2])                   # 2 waits behind 5, 6; c gets 5
    assert (a.ids, b.ids, c.ids) == ([ids[0], ids[4]], [ids[1], ids[3]], [ids[2], ids[5]])
    a.channel.finish_many(a, [ids[0], ids[4]])     # a gets 6 and 2
    assert a.ids[2:] == [ids[6], ids[2]]
    for consumer in (a, b, c):
        consumer.channel.set_rdy(consumer, 10)
    more = publish_n(broker, "events", 3)          # after a, the last served: b, then c
    assert (b.ids[-2:], c.ids[-1:], a.ids[-1]) == (more[0:2], more[2:], ids[2])
    last = publish_n(broker, "events", 1)          # after c: a
    assert a.ids[-1:] == last


def test_a_consumer_with_a_batch_byte_bound_gets_its_room_in_batches_no_bigger_than_it():
    broker, _ = new_broker()
    batches: list[list[str]] = []
    c = Consumer(lambda msg: None, msg_timeout=60.0,
                 on_messages=lambda msgs: batches.append([m.id for m in msgs]))
    c.batch_bytes = 10
    ch = broker.subscribe(c, "events", "work")
    ids = broker.multi_publish("events", [b"1234"] * 9)   # 4 bytes each
    ch.set_rdy(c, 8)
    # 3 bodies reach 10 bytes: batches of 3, 3, then the 2 its RDY still allows.
    assert batches == [ids[0:3], ids[3:6], ids[6:8]]
    assert list(c.in_flight) == ids[:8] and ch.depth == 1


def test_a_pass_serving_consumers_with_different_batch_bounds_keeps_within_the_smallest():
    """A pass takes no more body bytes than the smallest bound among the consumers it
    serves, so the consumer with the small bound never gets a bigger batch (more
    passes follow until the messages or the rooms run out)."""
    broker, _ = new_broker()
    small: list[list[str]] = []
    big: list[list[str]] = []
    a = Consumer(lambda msg: None, msg_timeout=60.0,
                 on_messages=lambda msgs: small.append([m.id for m in msgs]))
    b = Consumer(lambda msg: None, msg_timeout=60.0,
                 on_messages=lambda msgs: big.append([m.id for m in msgs]))
    a.batch_bytes, b.batch_bytes = 10, 1000
    ch = broker.subscribe(a, "events", "work")
    broker.subscribe(b, "events", "work")
    ch.set_rdy(a, 8)
    ch.set_rdy(b, 8)
    ids = broker.multi_publish("events", [b"1234"] * 20)   # 4 bytes each: one pump, both open
    # Each pass takes 3 (12 bytes: the 10 reached), dealt in turns of two.
    assert max(len(batch) for batch in small) <= 3
    got = [i for batch in small + big for i in batch]
    assert sorted(got) == sorted(ids[:16]) and len(got) == 16 and ch.depth == 4
    assert len(a.in_flight) == len(b.in_flight) == 8


def test_a_consumer_gets_nothing_until_it_gives_a_rdy_count():
    broker, _ = new_broker()
    c = Recorder(broker)
    ch = broker.subscribe(c, "events", "work")
    [msg_id] = publish_n(broker, "events", 1)
    assert c.received == [] and ch.depth == 1
    ch.set_rdy(c, 1)
    assert c.ids == [msg_id]


def test_consumer_never_holds_more_than_its_rdy():
    broker, _ = new_broker()
    c = subscribe(broker, "events", "work", rdy=3)
    publish_n(broker, "events", 10)
    assert len(c.received) == 3
    assert broker.channel("events", "work").depth == 7
    c.channel.finish(c, c.ids[0])
    assert len(c.received) == 4
    assert len(c.in_flight) == 3


def test_lowering_rdy_below_in_flight_holds_delivery_until_enough_fins():
    broker, _ = new_broker()
    c = subscribe(broker, "events", "work", rdy=5)
    publish_n(broker, "events", 10)
    c.channel.set_rdy(c, 2)
    for msg_id in c.ids[:3]:
        c.channel.finish(c, msg_id)
    assert len(c.received) == 5  # 2 still held: at the new RDY
    c.channel.finish(c, c.ids[3])
    assert len(c.received) == 6


def test_rdy_zero_stops_delivery_and_raising_it_resumes():
    broker, _ = new_broker()
    c = subscribe(broker, "events", "work", rdy=0)
    publish_n(broker, "events", 5)
    assert c.received == []
    c.channel.set_rdy(c, 5)
    assert len(c.received) == 5


@pytest.mark.parametrize("count", [-1, 2501])
def test_rdy_outside_zero_to_max_rdy_count_is_refused(count):
    broker, _ = new_broker()
    c = subscribe(broker, "events", "work", rdy=1)
    with pytest.raises(InvalidRequest, match=f"RDY {count} out of range.*2500"):
        c.channel.set_rdy(c, count)
    assert c.rdy == 1


def test_rdy_of_exactly_max_rdy_count_is_accepted():
    broker, _ = new_broker(max_rdy_count=3)
    c = subscribe(broker, "events", "work", rdy=3)
    publish_n(broker, "events", 5)
    assert c.rdy == 3 and len(c.received) == 3


def test_delivered_message_is_in_flight_until_fin_and_fin_removes_it_for_good():
    broker, clock = new_broker()
    c = subscribe(broker, "events", "work", msg_timeout_ms=1000)
    [msg_id] = publish_n(broker, "events", 1)
    ch = broker.channel("events", "work")
    assert (ch.depth, ch.in_flight_count, c.received[0].attempts) == (0, 1, 1)
    ch.finish(c, msg_id)
    assert (ch.depth, ch.in_flight_count, ch.finish_count) == (0, 0, 1)
    advance(broker, clock, 5.0)  # long past its deadline: a FINished message never comes back
    assert c.ids == [msg_id] and ch.timeout_count == 0


def test_timed_out_message_is_redelivered_with_higher_attempts():
    broker, clock = new_broker()
    c = subscribe(broker, "events", "work", msg_timeout_ms=5000)
    [msg_id] = publish_n(broker, "events", 1)
    advance(broker, clock, 4.999)
    assert c.ids == [msg_id]
    advance(broker, clock, 0.001)
    assert c.ids == [msg_id, msg_id]
    assert c.received[1].attempts == 2
    assert broker.channel("events", "work").timeout_count == 1


def test_consumer_without_its_own_timeout_gets_msg_timeout():
    broker, clock = new_broker(msg_timeout="2s")
    c = subscribe(broker, "events", "work")
    publish_n(broker, "events", 1)
    advance(broker, clock, 1.9)
    assert len(c.received) == 1
    advance(broker, clock, 0.1)
    assert len(c.received) == 2


def test_consumer_timeout_over_max_msg_timeout_is_refused():
    broker, _ = new_broker(msg_timeout="5s", max_msg_timeout="10s")
    with pytest.raises(InvalidRequest, match="msg_timeout 10001 ms.*max-msg-timeout of 10000"):
        Recorder(broker, msg_timeout_ms=10_001)
    assert Recorder(broker, msg_timeout_ms=10_000).msg_timeout == 10.0


def test_touch_resets_the_deadline():
    broker, clock = new_broker()
    c = subscribe(broker, "events", "work", msg_timeout_ms=1000)
    [msg_id] = publish_n(broker, "events", 1)
    advance(broker, clock, 0.9)
    c.channel.touch(c, msg_id)
    advance(broker, clock, 0.9)
    assert len(c.received) == 1
    advance(broker, clock, 0.1)
    assert len(c.received) == 2


def test_req_without_delay_redelivers_at_once():
    broker, _ = new_broker()
    c = subscribe(broker, "events", "work")
    [msg_id] = publish_n(broker, "events", 1)
    c.channel.requeue(c, msg_id)
    assert c.ids == [msg_id, msg_id]
    assert c.received[1].attempts == 2
    assert broker.channel("events", "work").requeue_count == 1


def test_req_with_delay_waits_in_the_deferred_queue():
    broker, clock = new_broker()
    c = subscribe(broker, "events", "work")
    [msg_id] = publish_n(broker, "events", 1)
    ch = c.channel
    ch.requeue(c, msg_id, delay=2.0)
    assert (ch.deferred_count, ch.in_flight_count, len(c.received)) == (1, 0, 1)
    advance(broker, clock, 1.99)
    assert len(c.received) == 1
    advance(broker, clock, 0.01)
    assert c.ids == [msg_id, msg_id]
    assert ch.deferred_count == 0


def test_req_delay_over_max_req_timeout_is_refused_and_message_stays_held():
    broker, _ = new_broker(max_req_timeout="10s")
    c = subscribe(broker, "events", "work")
    [msg_id] = publish_n(broker, "events", 1)
    with pytest.raises(InvalidRequest, match=r"REQ delay 10001 ms out of range: must be 0 to "
                                             r"10000 ms \(max-req-timeout\)"):
        c.channel.requeue(c, msg_id, delay=10.001)
    assert list(c.in_flight) == [msg_id]
    c.channel.finish(c, msg_id)


def test_req_delay_of_exactly_max_req_timeout_is_accepted():
    broker, clock = new_broker(max_req_timeout="10s")
    c = subscribe(broker, "events", "work")
    [msg_id] = publish_n(broker, "events", 1)
    c.channel.requeue(c, msg_id, delay=10.0)
    assert c.channel.deferred_count == 1
    advance(broker, clock, 10.0)
    assert c.ids == [msg_id, msg_id]


def test_sub_second_req_delays_and_dpub_defers_are_kept():
    broker, clock = new_broker()
    c = subscribe(broker, "events", "work")
    [requeued] = publish_n(broker, "events", 1)
    c.channel.requeue(c, requeued, delay=0.5)
    deferred = broker.publish("events", b"later", defer_ms=500)
    held = broker.publish("no-channel-yet", b"later", defer_ms=500)
    late = subscribe(broker, "no-channel-yet", "work")
    advance(broker, clock, 0.49)
    assert c.ids == [requeued] and late.received == []
    advance(broker, clock, 0.01)
    assert sorted(c.ids) == sorted([requeued, requeued, deferred]) and late.ids == [held]


@pytest.mark.parametrize("command", ["FIN", "REQ", "TOUCH"])
def test_command_on_a_message_held_by_another_consumer_is_refused_and_changes_nothing(command):
    broker, clock = new_broker()
    holder = subscribe(broker, "events", "work", msg_timeout_ms=1000)
    other = subscribe(broker, "events", "work")
    [msg_id] = publish_n(broker, "events", 1)
    assert holder.ids == [msg_id]
    ch = holder.channel
    action = {"FIN": ch.finish, "REQ": ch.requeue, "TOUCH": ch.touch}[command]
    with pytest.raises(NotInFlight, match=f"{command} {msg_id}: message not in flight") as err:
        action(other, msg_id)
    assert (err.value.code, err.value.msg_id) == (f"E_{command}_FAILED", msg_id)
    assert list(holder.in_flight) == [msg_id] and ch.in_flight_count == 1
    advance(broker, clock, 1.0)  # the deadline was not moved either
    assert ch.timeout_count == 1


@pytest.mark.parametrize("command", ["FIN", "REQ", "TOUCH"])
def test_command_on_an_unknown_message_is_refused(command):
    broker, _ = new_broker()
    c = subscribe(broker, "events", "work")
    ch = c.channel
    action = {"FIN": ch.finish, "REQ": ch.requeue, "TOUCH": ch.touch}[command]
    with pytest.raises(NotInFlight, match="0123456789abcdef"):
        action(c, "0123456789abcdef")


def test_fin_of_several_ids_finishes_those_held_and_reports_each_other_one():
    broker, _ = new_broker()
    c = subscribe(broker, "events", "work", rdy=2)
    ids = publish_n(broker, "events", 4)
    unknown = "0123456789abcdef"
    failures = c.channel.finish_many(c, [ids[0], unknown, ids[1]])
    assert [(f.code, f.msg_id) for f in failures] == [("E_FIN_FAILED", unknown)]
    assert c.channel.finish_count == 2
    assert c.ids == ids  # the freed RDY took the other two


def test_fin_twice_is_refused_the_second_time():
    broker, _ = new_broker()
    c = subscribe(broker, "events", "work")
    [msg_id] = publish_n(broker, "events", 1)
    c.channel.finish(c, msg_id)
    with pytest.raises(NotInFlight):
        c.channel.finish(c, msg_id)
    assert c.channel.finish_count == 1


def test_deferred_publish_is_delivered_no_earlier_than_its_delay():
    broker, clock = new_broker()
    c = subscribe(broker, "events", "work")
    msg_id = broker.publish("events", b"later", defer_ms=3000)
    assert broker.channel("events", "work").deferred_count == 1
    advance(broker, clock, 2.99)
    assert c.received == []
    advance(broker, clock, 0.01)
    assert c.ids == [msg_id]
    assert c.received[0].attempts == 1


def test_deferred_publish_to_a_topic_without_channels_keeps_its_delay():
    broker, clock = new_broker()
    msg_id = broker.publish("events", b"later", defer_ms=3000)
    advance(broker, clock, 1.0)
    c = subscribe(broker, "events", "work")
    advance(broker, clock, 1.99)
    assert c.received == []
    advance(broker, clock, 0.01)
    assert c.ids == [msg_id]


@pytest.mark.parametrize("defer_ms", [-1, 3_600_001])
def test_deferred_publish_outside_max_req_timeout_is_refused(defer_ms):
    broker, _ = new_broker()
    with pytest.raises(InvalidRequest, match="DPUB defer .* out of range"):
        broker.publish("events", b"x", defer_ms=defer_ms)
    assert "events" not in broker.topics


def test_multi_publish_defers_each_message_by_its_own_delay():
    broker, clock = new_broker()
    c = subscribe(broker, "events", "work")
    now, later = broker.multi_publish("events", [b"now", b"later"], defer_ms=[0, 2000])
    assert c.ids == [now]
    advance(broker, clock, 1.9995)                 # not a millisecond early
    assert c.ids == [now]
    advance(broker, clock, 0.001)
    assert c.ids == [now, later]


def test_a_topic_without_channels_holds_an_mpubs_undeferred_messages_in_publish_order():
    broker, _ = new_broker()
    first, _later = broker.multi_publish("events", [b"now", b"later"], defer_ms=[0, 2000])
    second = broker.publish("events", b"after")
    c = subscribe(broker, "events", "work")
    assert c.ids == [first, second]


def test_multi_publish_with_a_defer_count_other_than_the_message_count_is_refused():
    broker, _ = new_broker()
    with pytest.raises(InvalidRequest, match="1 defers for 2 messages"):
        broker.multi_publish("events", [b"a", b"b"], defer_ms=[5])
    assert "events" not in broker.topics


def test_disconnecting_consumer_messages_are_requeued_at_once_in_order():
    broker, _ = new_broker()
    leaving = subscribe(broker, "events", "work", rdy=3)
    ids = publish_n(broker, "events", 5)
    ch = leaving.channel
    ch.remove_consumer(leaving)
    staying = subscribe(broker, "events", "work", rdy=10)
    assert staying.ids == ids  # held ones first, ahead of the never-sent ones
    assert [m.attempts for m in staying.received] == [2, 2, 2, 1, 1]
    assert ch.requeue_count == 3 and ch.timeout_count == 0


def test_ticks_move_only_due_messages_and_finished_ones_do_not_pile_up():
    queue = DeadlineQueue()
    msgs = [Message(f"{i:016x}", b"x", 0) for i in range(10_000)]
    for i, msg in enumerate(msgs):
        queue.push(msg, 100.0 + i)
    for msg in msgs[1:]:
        queue.cancel(msg)  # FIN
    assert len(queue) == 1
    assert len(queue._run) + len(queue._heap) < 4 * 1024  # compacted, not 10k stale entries
    assert list(queue.pop_due(99.0)) == []
    assert list(queue.pop_due(100.0)) == [msgs[0]]


def test_a_consumer_attached_with_a_batch_callback_gets_batches_within_its_byte_bound():
    """As the servers attach one: its own timeout, batches handed whole, and on leaving
    what it held goes to the channel's other consumer at once."""
    broker, clock = new_broker()
    batches: list[list[str]] = []

    def one_at_a_time(msg):
        raise AssertionError("a consumer with a batch callback is handed batches")

    c = Consumer.attach(broker, "events", "work", one_at_a_time, msg_timeout_ms=5000,
                        on_messages=lambda msgs: batches.append([m.id for m in msgs]),
                        batch_bytes=10)
    assert c.msg_timeout == 5.0 and c.channel is broker.channel("events", "work")
    ids = broker.multi_publish("events", [b"1234"] * 9)   # 4 bytes each
    c.channel.set_rdy(c, 8)
    assert batches == [ids[0:3], ids[3:6], ids[6:8]]
    other = subscribe(broker, "events", "work")
    assert other.ids == [ids[8]]
    advance(broker, clock, 4.9)
    assert list(c.in_flight) == ids[:8]                   # its 5 s, not the default 60 s
    c.detach()
    assert other.ids == [ids[8], *ids[:8]]
    c.detach()                                            # leaving twice changes nothing
    assert other.ids == [ids[8], *ids[:8]]


def test_a_consumer_whose_transport_is_full_is_handed_nothing_until_it_drains():
    broker, _ = new_broker()
    c = subscribe(broker, "events", "work", rdy=10)
    c.block()
    ids = publish_n(broker, "events", 3)
    assert c.received == [] and broker.channel("events", "work").depth == 3
    c.unblock()
    assert c.ids == ids


def test_a_closing_consumer_is_handed_nothing_more_and_can_still_finish_what_it_holds():
    """After CLS (nsqd's close): nothing new, whatever its RDY; its FINs still count."""
    broker, _ = new_broker()
    c = subscribe(broker, "events", "work", rdy=10)
    first = publish_n(broker, "events", 2)
    c.closing = True
    publish_n(broker, "events", 3)
    assert c.ids == first and broker.channel("events", "work").depth == 3
    c.fin_all()
    assert c.ids == first and not c.in_flight and broker.channel("events", "work").depth == 3
