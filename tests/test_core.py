"""The core's semantics under a clock the tests turn by hand (no sleeps, no sockets)."""

from __future__ import annotations

import pytest

from broker import Broker, Options
from broker.clock import ManualClock
from broker.consumer import Consumer
from broker.errors import (ChannelNotFound, InvalidChannel, InvalidMessage, InvalidRequest,
                           InvalidTopic, MessageTooBig, NotInFlight, TopicNotFound)


class Inbox(Consumer):
    """A consumer that keeps what it is handed."""

    def __init__(self, broker: Broker, timeout_ms: int = 0, rdy: int = 100) -> None:
        self.got: list = []
        super().__init__(self.got.append, msg_timeout=broker.msg_timeout(timeout_ms))
        self.rdy = rdy

    @property
    def bodies(self) -> list[bytes]:
        return [m.body for m in self.got]


@pytest.fixture
def clock():
    return ManualClock()


@pytest.fixture
def core(clock):
    return Broker(Options(msg_timeout="10s", max_msg_timeout="60s", max_req_timeout="30s",
                          max_msg_size=1024, max_rdy_count=50), clock)


def advance(core: Broker, clock: ManualClock, seconds: float) -> None:
    clock.advance(seconds)
    core.tick()


def test_a_topic_copies_every_message_to_each_channel(core):
    a, b = Inbox(core), Inbox(core)
    core.subscribe(a, "t", "archive")
    core.subscribe(b, "t", "metrics")
    core.multi_publish("t", [b"1", b"2"])
    assert a.bodies == [b"1", b"2"] and b.bodies == [b"1", b"2"]
    assert a.got[0] is not b.got[0]  # each channel tracks its own copy


def test_consumers_of_one_channel_share_it(core):
    consumers = [Inbox(core) for _ in range(3)]
    for c in consumers:
        core.subscribe(c, "t", "ch")
    core.multi_publish("t", [str(i).encode() for i in range(9)])
    assert [len(c.got) for c in consumers] == [3, 3, 3]
    assert sorted(b for c in consumers for b in c.bodies) == sorted(str(i).encode()
                                                                   for i in range(9))


def test_messages_published_before_any_channel_wait_in_the_topic(core):
    core.publish("t", b"early")
    assert core.topic("t").depth == 1
    c = Inbox(core)
    core.subscribe(c, "t", "ch")
    assert c.bodies == [b"early"] and core.topic("t").depth == 0


def test_rdy_caps_unfinished_messages_per_consumer(core):
    c = Inbox(core, rdy=2)
    ch = core.subscribe(c, "t", "ch")
    core.multi_publish("t", [b"1", b"2", b"3"])
    assert c.bodies == [b"1", b"2"] and ch.depth == 1
    ch.finish(c, c.got[0].id)
    assert c.bodies == [b"1", b"2", b"3"]


def test_rdy_zero_pauses_delivery_and_out_of_range_is_refused(core):
    c = Inbox(core, rdy=0)
    ch = core.subscribe(c, "t", "ch")
    core.publish("t", b"x")
    assert c.got == []
    with pytest.raises(InvalidRequest, match="RDY 51 out of range.*max-rdy-count"):
        ch.set_rdy(c, 51)
    ch.set_rdy(c, 1)
    assert c.bodies == [b"x"]


def test_a_message_in_flight_past_its_deadline_is_redelivered_with_attempts_plus_one(core, clock):
    c = Inbox(core, timeout_ms=2000)
    ch = core.subscribe(c, "t", "ch")
    core.publish("t", b"x")
    assert c.got[0].attempts == 1
    advance(core, clock, 1.9)
    assert len(c.got) == 1
    advance(core, clock, 0.2)
    assert len(c.got) == 2 and c.got[1].attempts == 2
    assert ch.timeout_count == 1


def test_consumer_timeout_defaults_to_msg_timeout_and_is_capped(core):
    assert core.msg_timeout(0) == 10.0
    assert core.msg_timeout(5000) == 5.0
    with pytest.raises(InvalidRequest, match="max-msg-timeout"):
        core.msg_timeout(61_000)


def test_touch_resets_the_deadline(core, clock):
    c = Inbox(core, timeout_ms=2000)
    ch = core.subscribe(c, "t", "ch")
    core.publish("t", b"x")
    advance(core, clock, 1.5)
    ch.touch(c, c.got[0].id)
    advance(core, clock, 1.5)
    assert len(c.got) == 1
    advance(core, clock, 0.6)
    assert len(c.got) == 2 and ch.timeout_count == 1


def test_fin_removes_the_message_for_good(core, clock):
    c = Inbox(core, timeout_ms=1000)
    ch = core.subscribe(c, "t", "ch")
    core.publish("t", b"x")
    ch.finish(c, c.got[0].id)
    advance(core, clock, 5)
    assert len(c.got) == 1
    assert (ch.in_flight_count, ch.depth, ch.finish_count) == (0, 0, 1)


def test_req_without_delay_redelivers_at_once(core):
    c = Inbox(core)
    ch = core.subscribe(c, "t", "ch")
    core.publish("t", b"x")
    ch.requeue(c, c.got[0].id)
    assert len(c.got) == 2 and c.got[1].attempts == 2 and ch.requeue_count == 1


def test_req_with_delay_waits_in_the_deferred_queue(core, clock):
    c = Inbox(core)
    ch = core.subscribe(c, "t", "ch")
    core.publish("t", b"x")
    ch.requeue(c, c.got[0].id, delay=5)
    assert ch.deferred_count == 1
    advance(core, clock, 4.9)
    assert len(c.got) == 1
    advance(core, clock, 0.1)
    assert len(c.got) == 2 and ch.deferred_count == 0


def test_req_delay_out_of_range_is_refused_and_the_message_stays_in_flight(core):
    c = Inbox(core)
    ch = core.subscribe(c, "t", "ch")
    core.publish("t", b"x")
    with pytest.raises(InvalidRequest, match="REQ delay 31000 ms out of range"):
        ch.requeue(c, c.got[0].id, delay=31)
    assert ch.in_flight_count == 1


def test_fin_req_touch_of_a_message_not_held_are_errors_that_change_nothing(core):
    a, b = Inbox(core), Inbox(core)
    ch = core.subscribe(a, "t", "ch")
    core.subscribe(b, "t", "ch")
    core.publish("t", b"x")
    msg_id = a.got[0].id
    for command, action in (("FIN", ch.finish), ("REQ", ch.requeue), ("TOUCH", ch.touch)):
        with pytest.raises(NotInFlight, match=f"{command} {msg_id}: message not in flight") as e:
            action(b, msg_id)
        assert e.value.code == f"E_{command}_FAILED"
    with pytest.raises(NotInFlight):
        ch.finish(a, "0000000000000000")
    assert ch.in_flight_count == 1 and a.in_flight == {msg_id: a.got[0]}


def test_deferred_publish_is_delivered_no_earlier_than_its_delay(core, clock):
    c = Inbox(core)
    core.subscribe(c, "t", "ch")
    core.publish("t", b"later", defer_ms=3000)
    advance(core, clock, 2.99)
    assert c.got == []
    advance(core, clock, 0.01)
    assert c.bodies == [b"later"]


def test_deferred_publish_keeps_its_delay_while_the_topic_has_no_channel(core, clock):
    core.publish("t", b"later", defer_ms=3000)
    advance(core, clock, 1)
    c = Inbox(core)
    core.subscribe(c, "t", "ch")
    advance(core, clock, 1.9)
    assert c.got == []
    advance(core, clock, 0.2)
    assert c.bodies == [b"later"]


def test_defer_out_of_range_is_refused(core):
    with pytest.raises(InvalidRequest, match="DPUB defer 31000 ms out of range"):
        core.publish("t", b"x", defer_ms=31_000)


def test_a_disconnecting_consumer_hands_its_messages_back_at_once(core):
    a, b = Inbox(core, rdy=1), Inbox(core, rdy=0)
    ch = core.subscribe(a, "t", "ch")
    core.subscribe(b, "t", "ch")
    core.publish("t", b"x")
    ch.set_rdy(b, 1)
    ch.remove_consumer(a)
    assert b.bodies == [b"x"] and b.got[0].attempts == 2
    assert ch.requeue_count == 1


def test_paused_channel_holds_messages_until_unpaused(core):
    c = Inbox(core)
    ch = core.subscribe(c, "t", "ch")
    ch.pause()
    core.publish("t", b"x")
    assert c.got == [] and ch.depth == 1
    ch.unpause()
    assert c.bodies == [b"x"]


def test_paused_topic_holds_messages_for_every_channel(core):
    c = Inbox(core)
    core.subscribe(c, "t", "ch")
    core.topic("t").pause()
    core.publish("t", b"x")
    assert c.got == [] and core.topic("t").depth == 1
    core.topic("t").unpause()
    assert c.bodies == [b"x"]


def test_empty_channel_drops_queued_deferred_and_in_flight(core):
    c = Inbox(core, rdy=1)
    ch = core.subscribe(c, "t", "ch")
    core.multi_publish("t", [b"1", b"2"])
    core.publish("t", b"3", defer_ms=1000)
    ch.empty()
    assert (ch.depth, ch.in_flight_count, ch.deferred_count) == (0, 0, 0)
    with pytest.raises(NotInFlight):
        ch.finish(c, c.got[0].id)


def test_empty_topic_drops_what_it_holds_for_later_channels(core):
    core.publish("t", b"x")
    core.topic("t").empty()
    assert core.topic("t").depth == 0


def test_delete_channel_and_topic(core):
    evicted = []
    c = Inbox(core)
    c.on_evicted = lambda: evicted.append(c)
    core.subscribe(c, "t", "ch")
    core.delete_channel("t", "ch")
    assert evicted == [c]
    with pytest.raises(ChannelNotFound, match="channel t/ch does not exist"):
        core.channel("t", "ch")
    core.delete_topic("t")
    with pytest.raises(TopicNotFound, match="topic t does not exist"):
        core.topic("t")


def test_an_ephemeral_channel_goes_away_with_its_last_consumer(core):
    a, b = Inbox(core), Inbox(core)
    ch = core.subscribe(a, "t", "tmp#ephemeral")
    core.subscribe(b, "t", "tmp#ephemeral")
    ch.remove_consumer(a)
    assert "tmp#ephemeral" in core.topic("t").channels
    ch.remove_consumer(b)
    assert "tmp#ephemeral" not in core.topic("t").channels


def test_an_ephemeral_topic_goes_away_with_its_last_channel(core):
    c = Inbox(core)
    ch = core.subscribe(c, "t#ephemeral", "tmp#ephemeral")
    ch.remove_consumer(c)
    assert "t#ephemeral" not in core.topics


@pytest.mark.parametrize("name", ["", "a" * 65, "has space", "bad/slash", "x#ephemeralx", "#ephemeral"])
def test_bad_names_are_refused_naming_the_name(core, name):
    with pytest.raises(InvalidTopic, match="invalid topic name"):
        core.publish(name, b"x")
    with pytest.raises(InvalidChannel, match="invalid channel name"):
        core.subscribe(Inbox(core), "t", name)


@pytest.mark.parametrize("name", ["a", "a" * 64, "Events.v1_x-y", "t#ephemeral"])
def test_good_names_are_accepted(core, name):
    core.publish(name, b"x")
    assert name in core.topics


def test_empty_and_oversize_bodies_are_refused_and_mpub_is_all_or_nothing(core):
    with pytest.raises(InvalidMessage, match="empty body"):
        core.publish("t", b"")
    with pytest.raises(MessageTooBig, match="body of 1025 bytes is over the max-msg-size of 1024"):
        core.publish("t", b"x" * 1025)
    with pytest.raises(MessageTooBig, match="message 1: body of 2000 bytes"):
        core.multi_publish("t", [b"ok", b"x" * 2000, b"ok"])
    assert "t" not in core.topics or core.topic("t").message_count == 0


def test_stats_count_depth_in_flight_deferred_and_latency(core, clock):
    c = Inbox(core, rdy=1, timeout_ms=1000)
    ch = core.subscribe(c, "t", "ch")
    core.multi_publish("t", [b"1", b"2", b"3"])
    core.publish("t", b"4", defer_ms=5000)
    advance(core, clock, 0.25)
    ch.finish(c, c.got[0].id)
    advance(core, clock, 1.1)  # the second message times out
    [topic] = core.stats()
    [channel] = topic.channels
    assert (topic.message_count, channel.message_count) == (4, 4)
    assert (channel.depth, channel.in_flight_count, channel.deferred_count) == (1, 1, 1)
    assert (channel.finish_count, channel.timeout_count) == (1, 1)
    assert [q for q, _ in channel.e2e_processing_latency] == [0.5, 0.95, 0.99]
    assert channel.e2e_processing_latency[0][1] == pytest.approx(250, abs=1)
    assert channel.clients[0].in_flight_count == 1


def test_ticks_visit_only_due_messages(core, clock):
    c = Inbox(core, rdy=50, timeout_ms=60_000)
    ch = core.subscribe(c, "t", "ch")
    core.multi_publish("t", [b"x"] * 50)
    for m in c.got:
        ch.finish(c, m.id)
    # Finished messages leave nothing due behind; a later tick moves nothing.
    advance(core, clock, 61)
    assert len(c.got) == 50 and ch.timeout_count == 0


def test_a_lease_holds_messages_until_finished_or_its_session_ends(core, clock):
    session = core.open_lease_session("spark")
    core.create_channel("t", "ch")
    core.multi_publish("t", [str(i).encode() for i in range(10)])
    lease, depth = core.reserve(session.session_id, "t", "ch", 6, 5000)
    assert (len(lease.order), depth) == (6, 4)
    assert [m.body for m in lease.slice(0, 2)] == [b"0", b"2", b"4"]
    assert [m.body for m in lease.slice(1, 2)] == [b"1", b"3", b"5"]
    assert core.finish_leases([lease.lease_id]) == (6, [])
    other, _ = core.reserve(session.session_id, "t", "ch", 10, 5000)
    core.close_lease_session(session.session_id)
    ch = core.channel("t", "ch")
    assert (ch.depth, ch.in_flight_count, ch.finish_count) == (4, 0, 6)
    assert core.touch_leases([other.lease_id]) == (0, [other.lease_id])


def test_a_lease_times_out_unless_touched(core, clock):
    session = core.open_lease_session()
    core.create_channel("t", "ch")
    core.multi_publish("t", [b"a", b"b"])
    lease, _ = core.reserve(session.session_id, "t", "ch", 2, 2000)
    advance(core, clock, 1.5)
    assert core.touch_leases([lease.lease_id]) == (2, [])
    advance(core, clock, 1.5)
    assert core.channel("t", "ch").in_flight_count == 2
    advance(core, clock, 1)
    ch = core.channel("t", "ch")
    assert (ch.depth, ch.timeout_count) == (2, 2)
    assert core.touch_leases([lease.lease_id]) == (0, [lease.lease_id])


def test_a_replay_adopts_a_requeued_lease_and_reads_the_same_messages(core):
    core.create_channel("t", "ch")
    core.multi_publish("t", [str(i).encode() for i in range(5)])
    old = core.open_lease_session()
    lease, _ = core.reserve(old.session_id, "t", "ch", 3, 5000)
    first = [m.body for m in lease.slice(0, 1)]
    core.close_lease_session(old.session_id)
    assert core.channel("t", "ch").depth == 5
    new = core.open_lease_session()
    assert core.adopt_leases(new.session_id, [lease.lease_id]) == (3, [])
    again = core.lease(lease.lease_id).slice(0, 1)
    assert [m.body for m in again] == first and all(m.attempts == 2 for m in again)
    assert core.channel("t", "ch").depth == 2
    assert core.finish_leases([lease.lease_id]) == (3, [])


def test_a_live_lease_changes_hands_and_a_consumed_one_cannot_be_adopted(core):
    core.create_channel("t", "ch")
    core.multi_publish("t", [b"a", b"b"])
    old, new = core.open_lease_session(), core.open_lease_session()
    lease, _ = core.reserve(old.session_id, "t", "ch", 1, 5000)
    assert core.adopt_leases(new.session_id, [lease.lease_id]) == (1, [])
    core.close_lease_session(old.session_id)  # no longer the holder: nothing requeued
    assert core.channel("t", "ch").in_flight_count == 1
    core.close_lease_session(new.session_id)
    c = Inbox(core)
    core.subscribe(c, "t", "ch")  # a consumer takes the requeued messages first
    third = core.open_lease_session()
    assert core.adopt_leases(third.session_id, [lease.lease_id]) == (0, [lease.lease_id])


def test_a_repeated_producer_sequence_publishes_nothing_and_returns_the_first_ids(core, clock):
    c = Inbox(core)
    core.subscribe(c, "t", "ch")
    first = core.multi_publish("t", [b"a", b"b"], producer_id="q1:7:0", sequence=0)
    again = core.multi_publish("t", [b"a", b"b"], producer_id="q1:7:0", sequence=0)
    other = core.multi_publish("t", [b"c"], producer_id="q1:7:0", sequence=1)
    assert again == first and len(other) == 1
    assert c.bodies == [b"a", b"b", b"c"]
    clock.advance(601)  # past the de-duplication window
    core.multi_publish("t", [b"a", b"b"], producer_id="q1:7:0", sequence=0)
    assert len(c.got) == 5


def test_mpub_with_a_defer_per_message(core, clock):
    c = Inbox(core)
    core.subscribe(c, "t", "ch")
    core.multi_publish("t", [b"now", b"later"], defer_ms=[0, 2000])
    assert c.bodies == [b"now"]
    advance(core, clock, 2)
    assert c.bodies == [b"now", b"later"]
    with pytest.raises(InvalidRequest, match="1 defers for 2 messages"):
        core.multi_publish("t", [b"a", b"b"], defer_ms=[5])
