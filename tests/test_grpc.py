"""Every semantic and every error again, through a real gRPC server on loopback."""

from __future__ import annotations

import grpc
import pytest

from broker import Client, ClientError, EmbeddedBroker
from broker import columns
from broker.api import broker_pb2 as pb

from .helpers import wait_for


def drain(sub, n: int, timeout: float = 10):
    msgs = []
    while len(msgs) < n:
        msg = sub.get(timeout=timeout)
        assert msg is not None, f"got {len(msgs)} of {n} messages"
        msgs.append(msg)
    return msgs


def channel(client, topic, name):
    return next(c for c in client.stats(topic).topics[0].channels if c.name == name)


def test_publish_and_consume_with_ids_timestamps_and_attempts(client):
    ids = client.multi_publish("t", [b"a", b"b"])
    with client.subscribe("t", "ch", rdy=10) as sub:
        msgs = drain(sub, 2)
    assert [m.id for m in msgs] == ids and [m.body for m in msgs] == [b"a", b"b"]
    assert all(m.attempts == 1 and m.timestamp > 0 for m in msgs)


def test_several_messages_arrive_in_one_frame(client):
    client.multi_publish("t", [b"x"] * 50)
    stub = client.stub
    frames = iter([pb.ClientFrame(sub=pb.Sub(topic="t", channel="ch")),
                   pb.ClientFrame(rdy=pb.Rdy(count=50))])
    responses = stub.Subscribe(frames, timeout=10)
    assert next(responses).WhichOneof("frame") == "subscribed"
    first = next(responses)
    assert len(first.messages.messages) == 50
    responses.cancel()


def test_fan_out_to_channels_and_sharing_within_one(client):
    client.admin("channel", "create", "t", "a")
    client.admin("channel", "create", "t", "b")
    ids = set(client.multi_publish("t", [str(i).encode() for i in range(40)]))
    with client.subscribe("t", "a", rdy=40) as a, \
            client.subscribe("t", "b", rdy=20) as b1, client.subscribe("t", "b", rdy=20) as b2:
        got_a = drain(a, 40)
        got_b = drain(b1, 20) + drain(b2, 20)
    assert {m.id for m in got_a} == ids and {m.id for m in got_b} == ids


def test_rdy_is_a_hard_cap_over_grpc(client):
    client.multi_publish("t", [b"x"] * 5)
    with client.subscribe("t", "ch", rdy=2) as sub:
        first = drain(sub, 2)
        assert sub.get(timeout=0.3) is None
        sub.fin(first[0].id)
        assert sub.get(timeout=10) is not None


def test_timed_out_message_is_redelivered_with_higher_attempts(client):
    client.publish("t", b"x")
    with client.subscribe("t", "ch", rdy=1, msg_timeout_ms=200) as sub:
        first = sub.get(10)
        again = sub.get(10)
    assert again.id == first.id and again.attempts == 2
    assert channel(client, "t", "ch").timeout_count >= 1


def test_req_with_delay_and_touch_over_grpc(client):
    client.publish("t", b"x")
    with client.subscribe("t", "ch", rdy=1) as sub:
        msg = sub.get(10)
        sub.touch(msg.id)
        sub.req(msg.id, delay_ms=300)
        wait_for(lambda: channel(client, "t", "ch").deferred_count == 1, 5, message="deferred")
        again = sub.get(10)
        assert again.id == msg.id and again.attempts == 2
        sub.fin(again.id)
        wait_for(lambda: channel(client, "t", "ch").finish_count == 1, 5, message="FIN")


def test_deferred_publish_arrives_after_its_delay(client):
    client.publish("t", b"later", defer_ms=300)
    client.publish("t", b"now")
    with client.subscribe("t", "ch", rdy=2) as sub:
        assert sub.get(10).body == b"now"
        assert sub.get(10).body == b"later"


def test_fin_of_a_message_not_held_is_an_error_frame_and_the_stream_goes_on(client):
    client.publish("t", b"a")
    with client.subscribe("t", "ch", rdy=1) as sub:
        msg = sub.get(10)
        sub.fin("0123456789abcdef")
        error = sub.error(10)
        assert error.code == "E_FIN_FAILED" and "0123456789abcdef" in error.message
        assert error.status_code == grpc.StatusCode.FAILED_PRECONDITION.value[0]
        sub.req(msg.id, delay_ms=10_000_000)
        assert sub.error(10).code == "E_INVALID"
        sub.touch("ffffffffffffffff")
        assert sub.error(10).code == "E_TOUCH_FAILED"
        sub.fin(msg.id)
        wait_for(lambda: channel(client, "t", "ch").finish_count == 1, 5, message="FIN")


def test_another_consumers_message_cannot_be_finished(client):
    client.publish("t", b"a")
    with client.subscribe("t", "ch", rdy=1) as owner, client.subscribe("t", "ch", rdy=1) as other:
        msg = owner.get(10)
        other.fin(msg.id)
        assert other.error(10).code == "E_FIN_FAILED"
        assert channel(client, "t", "ch").in_flight_count == 1
        owner.fin(msg.id)


def test_rdy_out_of_range_ends_that_stream_only(client):
    client.multi_publish("t", [b"a", b"b"])
    with client.subscribe("t", "ch", rdy=1) as good:
        assert good.get(10) is not None
        bad = client.subscribe("t", "ch", rdy=0)
        bad.rdy(100_000)
        with pytest.raises(ClientError, match="RDY 100000 out of range") as caught:
            bad.get(10)
        assert caught.value.status == grpc.StatusCode.INVALID_ARGUMENT
        bad.close()
        assert channel(client, "t", "ch").in_flight_count == 1


@pytest.mark.parametrize("call, status, text", [
    (lambda c: c.publish("bad name", b"x"), "INVALID_ARGUMENT", "invalid topic name 'bad name'"),
    (lambda c: c.publish("t", b""), "INVALID_ARGUMENT", "empty body"),
    (lambda c: c.publish("t", b"x" * (1024 * 1024 + 1)), "INVALID_ARGUMENT", "max-msg-size"),
    (lambda c: c.multi_publish("t", [b"ok", b""]), "INVALID_ARGUMENT", "message 1: empty body"),
    (lambda c: c.publish("t", b"x", defer_ms=4_000_000), "INVALID_ARGUMENT", "DPUB defer"),
    (lambda c: c.admin("topic", "pause", "nope"), "NOT_FOUND", "topic nope does not exist"),
    (lambda c: c.admin("channel", "create", "t", "a/b"), "INVALID_ARGUMENT",
     "invalid channel name"),
    (lambda c: c.subscribe("t", "bad channel"), "INVALID_ARGUMENT", "invalid channel name"),
    (lambda c: c.subscribe("t", "ch", msg_timeout_ms=16 * 60_000), "INVALID_ARGUMENT",
     "max-msg-timeout"),
])
def test_bad_requests_get_a_status_naming_what_was_wrong(client, call, status, text):
    with pytest.raises(ClientError) as caught:
        call(client)
    assert caught.value.status.name == status
    assert text in str(caught.value)
    assert client.ping() == "OK"


def test_bad_requests_disturb_nothing_another_client_holds(broker, client):
    client.multi_publish("t", [b"1", b"2"])
    with client.subscribe("t", "ch", rdy=1) as sub:
        held = sub.get(10)
        other = Client(broker.address)
        for bad in (lambda: other.publish("t", b""), lambda: other.publish("bad name", b"x")):
            with pytest.raises(ClientError):
                bad()
        other.close()
        stats = channel(client, "t", "ch")
        assert (stats.in_flight_count, stats.depth) == (1, 1)
        sub.fin(held.id)
        assert sub.get(10).body == b"2"


def test_closing_a_consumer_requeues_what_it_held_at_once(client):
    client.publish("t", b"x")
    sub = client.subscribe("t", "ch", rdy=1, msg_timeout_ms=600_000)
    first = sub.get(10)
    sub.close()
    with client.subscribe("t", "ch", rdy=1) as again:
        msg = again.get(10)
    assert msg.id == first.id and msg.attempts == 2


def test_cls_is_answered_with_close_wait_and_stops_delivery(client):
    with client.subscribe("t", "ch", rdy=5) as sub:
        sub.cls()
        assert sub.close_wait.wait(10)
        client.publish("t", b"x")
        assert sub.get(timeout=0.3) is None


def test_admin_pause_empty_delete_over_grpc(client):
    client.admin("channel", "create", "t", "ch")
    client.admin("channel", "pause", "t", "ch")
    client.publish("t", b"x")
    assert channel(client, "t", "ch").paused
    client.admin("channel", "empty", "t", "ch")
    assert channel(client, "t", "ch").depth == 0
    client.admin("channel", "unpause", "t", "ch")
    client.admin("topic", "pause", "t")
    assert client.stats("t").topics[0].paused
    client.admin("topic", "unpause", "t")
    client.admin("channel", "delete", "t", "ch")
    assert client.stats("t").topics[0].channels == []
    client.admin("topic", "delete", "t")
    assert client.stats().topics == []


def test_deleting_a_channel_ends_its_consumers_streams(client):
    with client.subscribe("t", "ch", rdy=1) as sub:
        client.admin("channel", "delete", "t", "ch")
        with pytest.raises(ClientError, match="was deleted"):
            sub.get(10)


def test_stats_info_and_ping(broker, client):
    client.publish("t", b"x")
    with client.subscribe("t", "ch", rdy=1, client_id="worker-1") as sub:
        sub.fin(sub.get(10).id)
        wait_for(lambda: channel(client, "t", "ch").finish_count == 1, 5, message="FIN")
        stats = channel(client, "t", "ch")
        assert [c.client_id for c in stats.clients] == ["worker-1"]
        assert len(stats.e2e_processing_latency) == 3
    info = client.info()
    assert info.grpc_address == broker.address and info.max_rdy_count == 2500
    assert info.msg_timeout_ms == 60_000 and info.max_msg_size == 1024 * 1024
    assert client.ping() == "OK"


def test_a_lease_session_ending_requeues_its_leases_after_its_grace_period(client):
    client.admin("channel", "create", "t", "ch")
    client.multi_publish("t", [b"a", b"b", b"c"])
    stream = client.stub.OpenLeaseSession(pb.LeaseSessionRequest(client_id="driver",
                                                                 grace_ms=200))
    session_id = next(stream).session_id
    reply = client.stub.Reserve(pb.ReserveRequest(session_id=session_id, topic="t", channel="ch",
                                                  max_messages=2, msg_timeout_ms=600_000))
    assert reply.count == 2 and reply.depth == 1
    frames = list(client.stub.FetchLease(pb.FetchLeaseRequest(lease_id=reply.lease_id,
                                                              partition=0, num_partitions=1)))
    assert [row.body for f in frames for row in columns.decode(f)] == [b"a", b"b"]
    stream.cancel()
    wait_for(lambda: channel(client, "t", "ch").depth == 3, 5, message="leases requeued")
    with pytest.raises(grpc.RpcError) as caught:
        list(client.stub.FetchLease(pb.FetchLeaseRequest(lease_id=reply.lease_id,
                                                         num_partitions=1)))
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND


def test_an_unreachable_broker_is_reported_by_address():
    with EmbeddedBroker() as b:
        address = b.address
    client = Client(address, timeout=2)
    with pytest.raises(ClientError, match=f"cannot reach the broker at {address}"):
        client.ping()
