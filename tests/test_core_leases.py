"""Leases in the core: a batch of a channel's messages held in flight for a
planner and its readers (the Spark connector's driver and executors)."""

from __future__ import annotations

import pytest

from broker import InvalidRequest, LeaseNotFound
from broker.errors import WrongBroker
from broker.lease import RESERVE_STEP_MESSAGES

from .corekit import advance, new_broker, subscribe


def leased(broker, n: int = 10, max_messages: int = 6, msg_timeout_ms: int = 1000):
    session = broker.open_lease_session("planner")
    ids = broker.multi_publish("events", [f"m{i}".encode() for i in range(n)])
    broker.create_channel("events", "spark")
    lease, depth = broker.reserve(session.session_id, "events", "spark", max_messages,
                                  msg_timeout_ms)
    return session, ids, lease, depth


def test_reserve_takes_up_to_max_messages_in_order_and_leaves_the_rest():
    broker, _ = new_broker()
    _, ids, lease, depth = leased(broker)
    assert [m.id for m in lease.order] == ids[:6]
    assert depth == 4
    ch = broker.channel("events", "spark")
    assert (ch.depth, ch.in_flight_count) == (4, 6)


def test_reserve_of_an_empty_channel_makes_no_lease():
    broker, _ = new_broker()
    session = broker.open_lease_session()
    assert broker.reserve(session.session_id, "events", "spark", 10) == (None, 0)
    assert session.leases == {}


def test_slices_split_a_lease_between_partitions_and_can_be_read_again():
    broker, _ = new_broker()
    _, ids, lease, _ = leased(broker)
    slices = [broker.lease(lease.lease_id).slice(p, 3) for p in range(3)]
    assert sorted(m.id for s in slices for m in s) == ids[:6]
    assert [m.id for m in slices[1]] == [ids[1], ids[4]]
    assert broker.lease(lease.lease_id).slice(1, 3) == slices[1]


def test_finish_removes_every_leased_message_and_ends_the_lease():
    broker, _ = new_broker()
    _, _, lease, _ = leased(broker)
    assert broker.finish_leases([lease.lease_id]) == (6, [])
    ch = broker.channel("events", "spark")
    assert (ch.depth, ch.in_flight_count, ch.finish_count) == (4, 0, 6)
    with pytest.raises(LeaseNotFound, match=lease.lease_id):
        broker.lease(lease.lease_id)
    assert broker.finish_leases([lease.lease_id]) == (0, [lease.lease_id])


def test_requeue_puts_leased_messages_back_first_with_attempts_counted():
    broker, _ = new_broker()
    _, ids, lease, _ = leased(broker)
    assert broker.requeue_leases([lease.lease_id]) == (6, [])
    c = subscribe(broker, "events", "spark", rdy=100)
    assert c.ids == ids
    assert [m.attempts for m in c.received] == [2] * 6 + [1] * 4


def test_touch_renews_the_lease_deadline():
    broker, clock = new_broker()
    _, _, lease, _ = leased(broker, msg_timeout_ms=1000)
    advance(broker, clock, 0.9)
    assert broker.touch_leases([lease.lease_id]) == (6, [])
    advance(broker, clock, 0.9)
    assert len(broker.lease(lease.lease_id).slice(0, 1)) == 6
    advance(broker, clock, 0.1)
    assert broker.channel("events", "spark").timeout_count == 6


def test_lease_timeout_requeues_its_messages_and_the_lease_is_then_not_found():
    broker, clock = new_broker()
    _, ids, lease, _ = leased(broker, msg_timeout_ms=1000)
    advance(broker, clock, 1.0)
    ch = broker.channel("events", "spark")
    assert (ch.depth, ch.in_flight_count, ch.timeout_count) == (10, 0, 6)
    with pytest.raises(LeaseNotFound):
        broker.lease(lease.lease_id)
    assert broker.touch_leases([lease.lease_id]) == (0, [lease.lease_id])


def test_finishing_a_timed_out_lease_fins_what_of_it_still_waits():
    """A committed batch whose lease timed out must not be read again."""
    broker, clock = new_broker()
    _, ids, lease, _ = leased(broker, msg_timeout_ms=1000)
    advance(broker, clock, 1.0)
    assert broker.finish_leases([lease.lease_id]) == (6, [])
    c = subscribe(broker, "events", "spark", rdy=100)
    assert c.ids == ids[6:]


def test_a_timed_out_lease_is_remembered_by_ids_only_and_adopted():
    broker, clock = new_broker()
    _, ids, lease, _ = leased(broker, msg_timeout_ms=1000)
    advance(broker, clock, 1.0)
    broker.tick()
    remembered = broker._requeued[lease.lease_id]
    assert remembered.ids == ids[:6] and not hasattr(remembered, "order")
    other = broker.open_lease_session()
    assert broker.adopt_leases(other.session_id, [lease.lease_id]) == (6, [])
    assert [m.id for m in broker.lease(lease.lease_id).slice(0, 1)] == ids[:6]


def test_finishing_a_requeued_lease_after_others_took_some_fins_only_the_rest():
    broker, _ = new_broker()
    session, ids, lease, _ = leased(broker)
    broker.close_lease_session(session.session_id)
    c = subscribe(broker, "events", "spark", rdy=2)
    assert c.ids == ids[:2]
    assert broker.finish_leases([lease.lease_id]) == (4, [])
    ch = broker.channel("events", "spark")
    assert (ch.depth, ch.finish_count) == (4, 4)


def test_a_dropped_session_keeps_its_leases_for_its_grace_period_and_can_be_resumed():
    broker, clock = new_broker()
    session, ids, lease, _ = leased(broker, msg_timeout_ms=60_000)
    session.grace = 5.0
    broker.detach_lease_session(session.session_id)
    advance(broker, clock, 4.0)
    assert broker.channel("events", "spark").in_flight_count == 6
    resumed = broker.open_lease_session(session_id=session.session_id)
    assert resumed is session and resumed.resumed
    advance(broker, clock, 10.0)
    assert [m.id for m in broker.lease(lease.lease_id).slice(0, 1)] == ids[:6]


def test_a_stream_replaced_by_a_resume_that_ends_late_detaches_nothing():
    broker, clock = new_broker()
    session, ids, lease, _ = leased(broker, msg_timeout_ms=60_000)
    session.grace = 5.0
    old_stream = session.stream
    broker.open_lease_session(session_id=session.session_id)  # resumed before the drop is seen
    broker.detach_lease_session(session.session_id, old_stream)
    advance(broker, clock, 10.0)
    assert broker.channel("events", "spark").in_flight_count == 6


def test_a_dropped_session_past_its_grace_period_requeues_its_leases():
    broker, clock = new_broker()
    session, ids, lease, _ = leased(broker, msg_timeout_ms=60_000)
    session.grace = 5.0
    broker.detach_lease_session(session.session_id)
    advance(broker, clock, 5.0)
    ch = broker.channel("events", "spark")
    assert (ch.depth, ch.in_flight_count) == (10, 0)
    fresh = broker.open_lease_session(session_id=session.session_id)
    assert fresh is not session and not fresh.resumed


def test_the_grace_period_defaults_to_the_msg_timeout_capped_by_max_msg_timeout():
    broker, _ = new_broker(msg_timeout=30_000, max_msg_timeout=45_000)
    assert broker.open_lease_session().grace == 30.0
    assert broker.open_lease_session(grace_ms=90_000).grace == 45.0


def test_a_lease_unknown_here_asked_of_another_broker_instance_is_refused_by_name():
    broker, _ = new_broker()
    _, _, lease, _ = leased(broker)
    with pytest.raises(WrongBroker, match="another broker, or this one restarted"):
        broker.lease("f" * 24, broker_id="0123456789abcdef")
    # A lease held here is served whichever instance made it (one kept across a restart).
    assert len(broker.lease(lease.lease_id, broker_id="0123456789abcdef").order) == 6
    assert len(broker.lease(lease.lease_id, broker_id=broker.instance_id).order) == 6


def test_reserve_stops_at_max_bytes_but_takes_one_message_at_least():
    broker, _ = new_broker()
    session = broker.open_lease_session()
    broker.create_channel("events", "spark")
    broker.multi_publish("events", [b"x" * 100] * 10)
    lease, depth = broker.reserve(session.session_id, "events", "spark", 10, max_bytes=350)
    assert (len(lease.order), depth) == (3, 7)
    lease, _ = broker.reserve(session.session_id, "events", "spark", 10, max_bytes=10)
    assert len(lease.order) == 1


def test_a_reserve_fills_its_lease_in_bounded_steps_in_publish_order():
    broker, _ = new_broker()
    session = broker.open_lease_session()
    broker.create_channel("events", "spark")
    ids = broker.multi_publish("events", [b"m%d" % i for i in range(2500)])
    reservation = broker.begin_reserve(session.session_id, "events", "spark", 2500)
    sizes = [len(reservation.lease.order)]
    while broker.reserve_step(reservation):
        sizes.append(len(reservation.lease.order))
    assert sizes == [RESERVE_STEP_MESSAGES, 2 * RESERVE_STEP_MESSAGES]  # the last step ends it
    lease, depth = broker.reserve_result(reservation)
    assert ([m.id for m in lease.order], depth) == (ids, 0)
    assert broker.channel("events", "spark").in_flight_count == 2500


def test_later_steps_of_a_reserve_keep_within_max_bytes():
    broker, _ = new_broker()
    session = broker.open_lease_session()
    broker.create_channel("events", "spark")
    broker.multi_publish("events", [b"x" * 1000] * 3000)
    # 2,500,500 bytes: steps of 1 MiB; the 2501st message would pass the cap.
    lease, depth = broker.reserve(session.session_id, "events", "spark", 3000,
                                  max_bytes=2_500_500)
    assert (len(lease.order), depth) == (2500, 500)


def test_a_session_ended_while_its_reserve_runs_gets_every_message_back():
    broker, _ = new_broker()
    session = broker.open_lease_session()
    broker.create_channel("events", "spark")
    broker.multi_publish("events", [b"m%d" % i for i in range(2500)])
    reservation = broker.begin_reserve(session.session_id, "events", "spark", 2500)
    assert len(reservation.lease.order) == RESERVE_STEP_MESSAGES
    broker.close_lease_session(session.session_id)  # served between two steps
    assert not broker.reserve_step(reservation)
    with pytest.raises(LeaseNotFound, match="ended while its reserve was in progress"):
        broker.reserve_result(reservation)
    ch = broker.channel("events", "spark")
    assert (ch.depth, ch.in_flight_count) == (2500, 0)


def test_ending_the_session_requeues_its_leases_at_once():
    broker, _ = new_broker()
    session, ids, lease, _ = leased(broker, msg_timeout_ms=60_000)
    broker.close_lease_session(session.session_id)
    ch = broker.channel("events", "spark")
    assert (ch.depth, ch.in_flight_count) == (10, 0)
    with pytest.raises(LeaseNotFound, match="session .* does not exist"):
        broker.reserve(session.session_id, "events", "spark", 1)


def test_leases_ignore_rdy_and_share_the_channel_with_consumers():
    broker, _ = new_broker()
    c = subscribe(broker, "events", "spark", rdy=2)
    _, ids, lease, _ = leased(broker)
    assert c.ids == ids[:2]
    assert [m.id for m in lease.order] == ids[2:8]


def test_emptying_a_channel_drops_its_leases():
    broker, _ = new_broker()
    _, _, lease, _ = leased(broker)
    broker.channel("events", "spark").empty()
    assert broker.finish_leases([lease.lease_id]) == (0, [lease.lease_id])
    ch = broker.channel("events", "spark")
    assert (ch.in_flight_count, ch.finish_count) == (0, 0)


def test_deleting_the_channel_makes_its_leases_missing():
    broker, _ = new_broker()
    _, _, lease, _ = leased(broker)
    broker.delete_channel("events", "spark")
    assert broker.requeue_leases([lease.lease_id]) == (0, [lease.lease_id])


def test_reserve_of_zero_messages_is_refused():
    broker, _ = new_broker()
    session = broker.open_lease_session()
    with pytest.raises(InvalidRequest, match="max_messages 0 must be positive"):
        broker.reserve(session.session_id, "events", "spark", 0)


def test_max_bytes_holds_when_expired_messages_leave_on_the_way():
    """A reserve takes live messages past the expired ones (which leave the channel),
    and their bodies still stay within max_bytes."""
    broker, clock = new_broker()
    session = broker.open_lease_session()
    broker.create_channel("events", "spark")
    bodies, ttls = [], []
    for run in (9, 8, 7, 6, 5, 4, 3):      # each run of expired messages, then a live one
        bodies += [b"e" * 100] * run + [b"L" * 100]
        ttls += [1000] * run + [0]
    ids = broker.multi_publish("events", bodies, ttl_ms=ttls)
    live = [i for i, ttl in zip(ids, ttls) if not ttl]
    clock.advance(1.0)                      # the ttls end
    lease, _ = broker.reserve(session.session_id, "events", "spark", 10, max_bytes=450)
    assert [m.id for m in lease.order] == live[:4]
    assert sum(len(m.body) for m in lease.order) == 400
    lease, depth = broker.reserve(session.session_id, "events", "spark", 10, max_bytes=450)
    assert ([m.id for m in lease.order], depth) == (live[4:], 0)
