"""Leases over gRPC, as the Spark connector uses them through ``broker.Client``: a
session stream, Reserve, FetchLease slices, FinishLeases, RequeueLeases,
TouchLeases, AdoptLeases, and a session resumed after its stream dropped."""

from __future__ import annotations

import time

import grpc
import pytest

from broker import LeaseNotFound, columns
from broker.api import broker_pb2 as pb
from broker.client import ClientError
from broker.errors import WrongBroker

from .helpers import wait_for
from .grpckit import channel_stats, collect


@pytest.fixture
def session(client):
    """An open lease session: (session id, the ``LeaseSession`` that keeps it alive)."""
    opened = client.open_lease_session("planner")
    yield opened.session_id, opened
    opened.close()


def reserve(client, session_id: str, max_messages: int = 6, msg_timeout_ms: int = 60_000):
    return client.reserve(session_id, "events", "spark", max_messages,
                          msg_timeout_ms=msg_timeout_ms)


def fetch(client, lease_id: str, partition: int = 0, num_partitions: int = 1,
          broker_id: str = "") -> list:
    frames = client.fetch_lease(lease_id, partition, num_partitions, broker_id=broker_id)
    return [row for frame in frames for row in columns.decode(frame)]


@pytest.fixture
def published(client):
    client.admin("channel", "create", "events", "spark")
    return client.multi_publish("events", [f"m{i}" for i in range(10)])


def test_reserve_then_fetch_slices_that_together_are_the_lease(client, session, published):
    lease = reserve(client, session[0])
    assert (lease.count, lease.depth) == (6, 4)
    slices = [fetch(client, lease.lease_id, p, 3) for p in range(3)]
    assert sorted(m.id for s in slices for m in s) == published[:6]
    assert [m.body for m in fetch(client, lease.lease_id, 2, 3)] == [b"m2", b"m5"]  # again


def test_reserve_of_an_empty_channel_returns_no_lease(client, session):
    client.admin("channel", "create", "events", "spark")
    assert reserve(client, session[0]).lease_id == ""


def test_finish_leases_removes_the_messages(client, session, published):
    lease = reserve(client, session[0])
    done = client.finish_leases([lease.lease_id])
    assert (done.count, list(done.missing)) == (6, [])
    stats = channel_stats(client, "events", "spark")
    assert (stats.depth, stats.in_flight_count, stats.finish_count) == (4, 0, 6)
    with pytest.raises(LeaseNotFound, match=lease.lease_id) as err:
        fetch(client, lease.lease_id)
    assert err.value.code == "E_LEASE_NOT_FOUND" and isinstance(err.value, ClientError)


def test_requeued_leases_are_delivered_again(client, session, published):
    lease = reserve(client, session[0])
    assert client.requeue_leases([lease.lease_id]).count == 6
    with client.subscribe("events", "spark", rdy=10) as sub:
        got = collect([sub], 10)
    assert sorted(m.id for _, m in got) == published
    assert sorted(m.attempts for _, m in got) == [1] * 4 + [2] * 6


def test_touch_keeps_a_lease_past_its_timeout(client, session, published):
    # Touches every 0.1 s against a 2 s timeout, for 1.5 timeouts: a margin of 20 touch
    # intervals against a loaded machine's scheduling delays.
    lease = reserve(client, session[0], msg_timeout_ms=2000)
    started = time.monotonic()
    while time.monotonic() - started < 3.0:  # past the timeout, touching often
        assert client.touch_leases([lease.lease_id]).count == 6
        time.sleep(0.1)
    assert client.finish_leases([lease.lease_id]).count == 6
    assert channel_stats(client, "events", "spark").timeout_count == 0


def test_lease_that_times_out_is_requeued_and_touch_reports_it_missing(client, session,
                                                                      published):
    lease = reserve(client, session[0], msg_timeout_ms=100)
    wait_for(lambda: channel_stats(client, "events", "spark").timeout_count == 6)
    assert channel_stats(client, "events", "spark").depth == 10
    done = client.touch_leases([lease.lease_id])
    assert (done.count, list(done.missing)) == (0, [lease.lease_id])


def test_finishing_a_timed_out_lease_fins_its_messages_still_waiting(client, session, published):
    lease = reserve(client, session[0], msg_timeout_ms=100)
    wait_for(lambda: channel_stats(client, "events", "spark").timeout_count == 6)
    assert client.finish_leases([lease.lease_id]).count == 6
    assert channel_stats(client, "events", "spark").depth == 4


def test_a_reserve_fins_the_leases_named_with_it_before_it_reserves(client, session, published):
    """A committed batch's lease that timed out has its messages waiting again: the reserve
    that FINs it in the same call must not lease them to the next batch."""
    lease = reserve(client, session[0], msg_timeout_ms=100)
    wait_for(lambda: channel_stats(client, "events", "spark").timeout_count == 6)
    assert client.info().reserve_finishes
    nxt = client.reserve(session[0], "events", "spark", 100, msg_timeout_ms=60_000,
                         finish=[lease.lease_id, "0123456789abcdef"])
    assert (nxt.finished, list(nxt.missing)) == (6, ["0123456789abcdef"])
    assert [row.body for row in fetch(client, nxt.lease_id)] == [f"m{i}".encode()
                                                                 for i in range(6, 10)]
    assert channel_stats(client, "events", "spark").finish_count == 6


def test_a_reserve_refused_fins_none_of_the_leases_named_with_it(client, session, published):
    lease = reserve(client, session[0])
    with pytest.raises(LeaseNotFound):
        client.reserve("no-such-session", "events", "spark", 10, finish=[lease.lease_id])
    with pytest.raises(ClientError, match="max_messages"):
        client.reserve(session[0], "events", "spark", 0, finish=[lease.lease_id])
    assert client.touch_leases([lease.lease_id]).count == 6  # still held
    assert channel_stats(client, "events", "spark").finish_count == 0


def test_a_dropped_session_requeues_its_leases_after_its_grace_period(client, published):
    dropped = client.open_lease_session("planner", grace_ms=300)
    lease = reserve(client, dropped.session_id, msg_timeout_ms=600_000)
    dropped.close()
    wait_for(lambda: channel_stats(client, "events", "spark").depth == 10)
    with pytest.raises(LeaseNotFound, match="does not exist \\(it ended\\)"):
        reserve(client, dropped.session_id)
    assert client.finish_leases([lease.lease_id]).count == 6  # remembered by id


def test_a_dropped_session_is_resumed_with_its_leases_within_its_grace_period(client, published):
    dropped = client.open_lease_session("planner", grace_ms=600_000)
    lease = reserve(client, dropped.session_id, msg_timeout_ms=600_000)
    dropped.close()
    wait_for(lambda: dropped.ended.is_set())
    resumed = client.open_lease_session("planner", session_id=dropped.session_id)
    try:
        assert resumed.resumed and resumed.session_id == dropped.session_id
        assert resumed.broker_id == dropped.broker_id
        assert sorted(m.id for m in fetch(client, lease.lease_id)) == published[:6]
        assert channel_stats(client, "events", "spark").depth == 4
    finally:
        resumed.close()
        client.requeue_leases([lease.lease_id])


def test_a_session_that_cannot_be_resumed_is_opened_anew(client):
    fresh = client.open_lease_session("planner", session_id="1-0000000000000000")
    try:
        assert not fresh.resumed and fresh.session_id != "1-0000000000000000"
    finally:
        fresh.close()


def test_fetching_a_lease_unknown_here_from_another_broker_instance_fails_loudly(
        client, session, published):
    lease = reserve(client, session[0])
    with pytest.raises(WrongBroker, match="another broker, or this one restarted"):
        fetch(client, "f" * 24, broker_id="0123456789abcdef")
    assert len(fetch(client, lease.lease_id, broker_id=session[1].broker_id)) == 6


def test_fetch_of_a_partition_out_of_range_is_refused(client, session, published):
    lease = reserve(client, session[0])
    with pytest.raises(ClientError, match="partition 3 out of range for 3 partition\\(s\\)") as err:
        fetch(client, lease.lease_id, 3, 3)
    assert err.value.status == grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.parametrize("change, status, message", [
    ({"session_id": "nope"}, grpc.StatusCode.NOT_FOUND, "lease session 'nope' does not exist"),
    ({"topic": "bad topic"}, grpc.StatusCode.INVALID_ARGUMENT, "invalid topic name 'bad topic'"),
    ({"channel": "a/b"}, grpc.StatusCode.INVALID_ARGUMENT, "invalid channel name 'a/b'"),
    ({"max_messages": 0}, grpc.StatusCode.INVALID_ARGUMENT, "max_messages 0 must be positive"),
    ({"msg_timeout_ms": 900_001}, grpc.StatusCode.INVALID_ARGUMENT, "max-msg-timeout"),
])
def test_bad_reserve_is_refused_naming_what_was_wrong(client, session, published, change, status,
                                                      message):
    request = dict(session_id=session[0], topic="events", channel="spark", max_messages=5)
    request.update(change)
    with pytest.raises(grpc.RpcError) as err:
        client.stub.Reserve(pb.ReserveRequest(**request), timeout=10)
    assert err.value.code() == status and message in err.value.details()
    assert channel_stats(client, "events", "spark").depth == 10


def test_fetch_of_an_unknown_lease_is_not_found(client):
    with pytest.raises(LeaseNotFound, match="lease '0123abcd' does not exist") as err:
        fetch(client, "0123abcd")
    assert err.value.status == grpc.StatusCode.NOT_FOUND


def test_adopting_into_a_session_that_ended_is_not_found_naming_the_session(client):
    with pytest.raises(LeaseNotFound, match="lease session 'gone' does not exist") as err:
        client.adopt_leases("gone", ["0123abcd"])
    assert err.value.status == grpc.StatusCode.NOT_FOUND


def test_a_large_reserve_from_disk_lets_the_broker_answer_pings_while_it_runs(tmp_path):
    """The loop is served between a reserve's steps: a /ping issued while a reserve of
    100k messages waiting on disk runs is answered before it ends. Proof without timing:
    Stats showed the lease partly filled before the ping was sent, and still short of
    full once the ping was answered."""
    import threading
    import urllib.request

    from broker import Client, EmbeddedBroker

    n = 100_000
    with EmbeddedBroker(data_path=str(tmp_path), mem_queue_size=1000) as broker, \
            Client(broker.address, timeout=60) as client:
        client.admin("channel", "create", "events", "spark")
        for start in range(0, n, 5000):
            client.multi_publish("events", [b"%d" % i for i in range(start, start + 5000)])
        session = client.open_lease_session("planner")
        outcome: dict = {}
        thread = threading.Thread(target=lambda: outcome.update(lease=client.reserve(
            session.session_id, "events", "spark", n, msg_timeout_ms=600_000)), daemon=True)

        def in_flight() -> int:
            return channel_stats(client, "events", "spark").in_flight_count

        def ping() -> bytes:
            with urllib.request.urlopen(f"http://{broker.http_address}/ping", timeout=60) as r:
                return r.read()

        answered_mid_reserve = []
        thread.start()
        # The reserve has begun once its lease holds some messages (they only grow) ...
        wait_for(lambda: in_flight() > 0 or not thread.is_alive(), 120, interval=0,
                 message="the reserve to begin")
        while thread.is_alive():
            answer = ping()
            if in_flight() < n:  # ... and had not ended when the ping was answered
                answered_mid_reserve.append(answer)
        thread.join()
        assert outcome["lease"].count == n
        assert answered_mid_reserve, "no ping was answered while the reserve ran"
        assert set(answered_mid_reserve) == {b"OK"}
        session.close()
