"""Leases over gRPC, as the Spark connector uses them: a session stream,
Reserve, FetchLease slices, FinishLeases, RequeueLeases, TouchLeases."""

from __future__ import annotations

import time

import grpc
import pytest

from broker import columns
from broker.api import broker_pb2 as pb

from .helpers import wait_for
from .grpckit import channel_stats, collect


@pytest.fixture
def session(client):
    """An open lease session: (session id, the stream that keeps it alive)."""
    stream = client.stub.OpenLeaseSession(pb.LeaseSessionRequest(client_id="planner"))
    first = next(stream)
    yield first.session_id, stream
    stream.cancel()


def reserve(client, session_id: str, max_messages: int = 6, msg_timeout_ms: int = 60_000):
    return client.stub.Reserve(pb.ReserveRequest(
        session_id=session_id, topic="events", channel="spark", max_messages=max_messages,
        msg_timeout_ms=msg_timeout_ms), timeout=10)


def fetch(client, lease_id: str, partition: int = 0, num_partitions: int = 1) -> list:
    frames = client.stub.FetchLease(pb.FetchLeaseRequest(
        lease_id=lease_id, partition=partition, num_partitions=num_partitions), timeout=10)
    return [row for frame in frames for row in columns.decode(frame)]


def leases(lease_id: str) -> pb.LeaseRequest:
    return pb.LeaseRequest(lease_ids=[lease_id])


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
    done = client.stub.FinishLeases(leases(lease.lease_id))
    assert (done.count, list(done.missing)) == (6, [])
    stats = channel_stats(client, "events", "spark")
    assert (stats.depth, stats.in_flight_count, stats.finish_count) == (4, 0, 6)
    with pytest.raises(grpc.RpcError) as err:
        fetch(client, lease.lease_id)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND and lease.lease_id in err.value.details()


def test_requeued_leases_are_delivered_again(client, session, published):
    lease = reserve(client, session[0])
    assert client.stub.RequeueLeases(leases(lease.lease_id)).count == 6
    with client.subscribe("events", "spark", rdy=10) as sub:
        got = collect([sub], 10)
    assert sorted(m.id for _, m in got) == published
    assert sorted(m.attempts for _, m in got) == [1] * 4 + [2] * 6


def test_touch_keeps_a_lease_past_its_timeout(client, session, published):
    lease = reserve(client, session[0], msg_timeout_ms=1000)
    started = time.monotonic()
    while time.monotonic() - started < 1.5:  # past the timeout, touching often
        assert client.stub.TouchLeases(leases(lease.lease_id)).count == 6
        time.sleep(0.1)
    assert client.stub.FinishLeases(leases(lease.lease_id)).count == 6
    assert channel_stats(client, "events", "spark").timeout_count == 0


def test_lease_that_times_out_is_requeued_and_reported_missing(client, session, published):
    lease = reserve(client, session[0], msg_timeout_ms=100)
    wait_for(lambda: channel_stats(client, "events", "spark").timeout_count == 6)
    done = client.stub.FinishLeases(leases(lease.lease_id))
    assert (done.count, list(done.missing)) == (0, [lease.lease_id])
    assert channel_stats(client, "events", "spark").depth == 10


def test_ending_the_session_requeues_its_leases_at_once(client, session, published):
    session_id, stream = session
    lease = reserve(client, session_id, msg_timeout_ms=600_000)
    stream.cancel()
    wait_for(lambda: channel_stats(client, "events", "spark").depth == 10)
    assert list(client.stub.FinishLeases(leases(lease.lease_id)).missing) == [lease.lease_id]
    with pytest.raises(grpc.RpcError) as err:
        reserve(client, session_id)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    assert "does not exist (it ended)" in err.value.details()


def test_fetch_of_a_partition_out_of_range_is_refused(client, session, published):
    lease = reserve(client, session[0])
    with pytest.raises(grpc.RpcError) as err:
        fetch(client, lease.lease_id, 3, 3)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "partition 3 out of range for 3 partition(s)" in err.value.details()


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
    with pytest.raises(grpc.RpcError) as err:
        fetch(client, "0123abcd")
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    assert "lease '0123abcd' does not exist" in err.value.details()
