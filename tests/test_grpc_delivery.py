"""The delivery semantics again, through a real gRPC server on loopback with
several consumers and channels."""

from __future__ import annotations

import time
from collections import Counter

import grpc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker import ClientError
from broker.api import broker_pb2 as pb
from broker.message import Message
from broker.server.grpc_server import MAX_FRAME_BYTES, delivery_frames, encode_delivery

from .grpckit import channel_stats, collect, so_far
from .helpers import wait_for


def test_messages_arrive_with_their_ids_bodies_publish_time_in_ns_and_attempts(client):
    before_ns = time.time_ns()
    ids = client.multi_publish("events", [b"a", b"b"])
    after_ns = time.time_ns()
    with client.subscribe("events", "work", rdy=10) as sub:
        got = [m for _, m in collect([sub], 2)]
    assert [m.id for m in got] == ids and [m.body for m in got] == [b"a", b"b"]
    assert all(m.attempts == 1 for m in got)
    assert all(before_ns <= m.timestamp <= after_ns for m in got)


def test_several_messages_arrive_in_one_frame(client):
    client.multi_publish("events", [b"x"] * 50)
    frames = iter([pb.ClientFrame(sub=pb.Sub(topic="events", channel="work")),
                   pb.ClientFrame(rdy=pb.Rdy(count=50))])
    responses = client.stub.Subscribe(frames, timeout=30)
    try:
        assert next(responses).WhichOneof("frame") == "subscribed"
        assert len(next(responses).messages.messages) > 1  # not one frame per message
    finally:
        responses.cancel()


def test_each_channel_gets_every_message_and_its_consumers_share_them(client):
    subs = {ch: [client.subscribe("events", ch, rdy=10) for _ in range(2)] for ch in ("a", "b")}
    ids = client.multi_publish("events", [f"m{i}" for i in range(100)])
    for ch, pair in subs.items():
        got = collect(pair, 100)
        assert Counter(m.id for _, m in got) == Counter(ids), f"channel {ch}"
        assert {i for i, _ in got} == {0, 1}, "both consumers take a share"
        wait_for(lambda: channel_stats(client, "events", ch).finish_count == 100)
    for pair in subs.values():
        for sub in pair:
            sub.close()


def test_consumer_holds_no_more_than_its_rdy_until_it_fins(client):
    with client.subscribe("events", "work", rdy=3) as sub:
        client.multi_publish("events", [f"m{i}" for i in range(10)])
        first = collect([sub], 3, fin=False)
        wait_for(lambda: channel_stats(client, "events", "work").depth == 7)
        assert so_far(sub) == ([], [])
        assert channel_stats(client, "events", "work").in_flight_count == 3
        sub.fin(first[0][1].id)
        collect([sub], 1, fin=False)
        wait_for(lambda: channel_stats(client, "events", "work").depth == 6)


def test_stats_count_each_grpc_subscribers_messages_reqs_and_fins(client):
    with client.subscribe("events", "work", rdy=1, client_id="counted") as sub:
        client.publish("events", "again")
        [(_, first)] = collect([sub], 1, fin=False)
        sub.req(first.id)
        collect([sub], 1)
        wait_for(lambda: channel_stats(client, "events", "work").finish_count == 1)
        [k] = channel_stats(client, "events", "work").clients
        assert (k.client_id, k.message_count, k.requeue_count, k.finish_count,
                k.in_flight_count, k.ready_count) == ("counted", 2, 1, 1, 0, 1)


def test_a_grpc_consumer_that_reads_a_burst_over_its_stream_buffer_keeps_its_stream(client):
    """A burst of a frame's worth of messages (2500) blocks the stream until they are
    sent; a consumer that reads them is not taken for stuck when its timeout passes."""
    with client.subscribe("t", "ch", rdy=2500, msg_timeout_ms=1000) as sub:
        ids = client.multi_publish("t", [b"m"] * 2500)
        got = set()
        for _ in ids:
            msg = sub.get(10)
            assert msg is not None, f"the stream ended after {len(got)} messages"
            got.add(msg.id)
        sub.fin(*got)
        assert got == set(ids)
        # Keep reading for twice the message timeout: the stream stays.
        until = time.monotonic() + 2.0
        while time.monotonic() < until:
            [msg_id] = client.multi_publish("t", [b"more"])
            msg = sub.get(10)
            assert msg is not None and msg.id == msg_id, "the stream ended"
            sub.fin(msg.id)
        assert len(client.stats("t").topics[0].channels[0].clients) == 1


def test_timed_out_message_is_redelivered_with_higher_attempts(client):
    with client.subscribe("events", "work", rdy=1, msg_timeout_ms=1000) as sub:
        msg_id = client.publish("events", "late")
        [(_, first)] = collect([sub], 1, fin=False)
        [(_, again)] = collect([sub], 1)
    assert (first.id, first.attempts) == (msg_id, 1)
    assert (again.id, again.attempts) == (msg_id, 2)
    assert channel_stats(client, "events", "work").timeout_count == 1


def test_req_with_delay_comes_back_from_the_deferred_queue(client):
    with client.subscribe("events", "work", rdy=1) as sub:
        msg_id = client.publish("events", "again")
        [(_, first)] = collect([sub], 1, fin=False)
        sub.req(first.id, delay_ms=200)
        wait_for(lambda: channel_stats(client, "events", "work").deferred_count == 1)
        [(_, again)] = collect([sub], 1)
    assert (again.id, again.attempts) == (msg_id, 2)
    stats = channel_stats(client, "events", "work")
    assert (stats.requeue_count, stats.deferred_count, stats.finish_count) == (1, 0, 1)


def test_touch_keeps_a_message_in_flight_past_its_timeout(client):
    # Touches every 0.1 s against a 2 s timeout, for 1.5 timeouts: the margin is 20 touch
    # intervals, so a loaded machine's scheduling delays cannot time the message out.
    with client.subscribe("events", "work", rdy=1, msg_timeout_ms=2000) as sub:
        client.publish("events", "slow")
        [(_, msg)] = collect([sub], 1, fin=False)
        started = time.monotonic()
        while time.monotonic() - started < 3.0:  # past the timeout, touching often
            sub.touch(msg.id)
            time.sleep(0.1)
        sub.fin(msg.id)
        assert so_far(sub) == ([], [])
    stats = channel_stats(client, "events", "work")
    assert (stats.timeout_count, stats.finish_count) == (0, 1)


def test_deferred_publish_arrives_no_earlier_than_its_delay(client):
    with client.subscribe("events", "work", rdy=1) as sub:
        sent = time.monotonic()
        msg_id = client.publish("events", "later", defer_ms=300)
        assert channel_stats(client, "events", "work").deferred_count == 1
        [(_, msg)] = collect([sub], 1)
        assert time.monotonic() - sent >= 0.3
    assert msg.id == msg_id


def test_a_multi_publish_defers_each_message_by_its_own_defer(client):
    with client.subscribe("events", "work", rdy=2) as sub:
        now, later = client.multi_publish("events", ["now", "later"], defer_ms=[0, 600_000])
        [(_, msg)] = collect([sub], 1)
        stats = channel_stats(client, "events", "work")
        assert (msg.id, msg.body, stats.deferred_count) == (now, b"now", 1)
        assert later != now


def test_disconnecting_consumer_messages_go_to_another_consumer_at_once(client):
    leaving = client.subscribe("events", "work", rdy=5, msg_timeout_ms=600_000)
    ids = client.multi_publish("events", [f"m{i}" for i in range(5)])
    collect([leaving], 5, fin=False)
    leaving.close()
    with client.subscribe("events", "work", rdy=5) as staying:
        got = collect([staying], 5)
    assert sorted(m.id for _, m in got) == sorted(ids)
    assert {m.attempts for _, m in got} == {2}
    stats = channel_stats(client, "events", "work")
    assert (stats.requeue_count, stats.timeout_count) == (5, 0)


def test_paused_channel_holds_messages_until_unpaused(client):
    with client.subscribe("events", "work", rdy=5) as sub:
        client.admin("channel", "pause", "events", "work")
        msg_id = client.publish("events", "held")
        assert channel_stats(client, "events", "work").paused
        assert so_far(sub) == ([], [])
        client.admin("channel", "unpause", "events", "work")
        [(_, msg)] = collect([sub], 1)
    assert msg.id == msg_id


def test_paused_topic_holds_messages_until_unpaused(client):
    with client.subscribe("events", "work", rdy=5) as sub:
        client.admin("topic", "pause", "events")
        msg_id = client.publish("events", "held")
        assert client.stats("events").topics[0].depth == 1
        assert so_far(sub) == ([], [])
        client.admin("topic", "unpause", "events")
        [(_, msg)] = collect([sub], 1)
    assert msg.id == msg_id


def test_empty_channel_drops_its_messages(client):
    client.admin("channel", "create", "events", "work")
    client.multi_publish("events", ["a", "b", "c"])
    client.admin("channel", "empty", "events", "work")
    assert channel_stats(client, "events", "work").depth == 0
    with client.subscribe("events", "work", rdy=5) as sub:
        msg_id = client.publish("events", "new")
        [(_, msg)] = collect([sub], 1)
    assert msg.id == msg_id


def test_deleting_a_channel_ends_its_consumer_streams_with_not_found(client):
    with client.subscribe("events", "gone", rdy=5) as gone, \
            client.subscribe("events", "kept", rdy=5) as kept:
        client.admin("channel", "delete", "events", "gone")
        with pytest.raises(ClientError, match="channel events/gone was deleted") as err:
            gone.get(timeout=5)
        assert err.value.status == grpc.StatusCode.NOT_FOUND
        msg_id = client.publish("events", "still served")
        [(_, msg)] = collect([kept], 1)
    assert msg.id == msg_id
    assert [c.name for c in client.stats("events").topics[0].channels] == ["kept"]


def test_ephemeral_channel_and_topic_go_away_with_their_last_consumer(client):
    with client.subscribe("scratch#ephemeral", "tail#ephemeral", rdy=5) as sub:
        client.publish("scratch#ephemeral", "x")
        collect([sub], 1)
        assert [t.name for t in client.stats().topics] == ["scratch#ephemeral"]
    wait_for(lambda: not client.stats().topics, message="the ephemeral topic to go")


def test_stats_show_clients_counts_and_latency_percentiles(client):
    with client.subscribe("events", "work", rdy=10, client_id="worker-1") as sub:
        client.multi_publish("events", [f"m{i}" for i in range(10)])
        collect([sub], 10)
        wait_for(lambda: channel_stats(client, "events", "work").finish_count == 10)
        stats = channel_stats(client, "events", "work")
    [worker] = stats.clients
    assert (worker.client_id, worker.ready_count, worker.finish_count) == ("worker-1", 10, 10)
    assert stats.message_count == 10
    assert [p.quantile for p in stats.e2e_processing_latency] == [0.5, 0.95, 0.99]
    assert all(p.value_ms > 0 for p in stats.e2e_processing_latency)


def test_req_without_delay_redelivers_at_once_with_higher_attempts(client):
    with client.subscribe("events", "work", rdy=1) as sub:
        msg_id = client.publish("events", "again")
        [(_, first)] = collect([sub], 1, fin=False)
        sub.req(first.id)
        [(_, again)] = collect([sub], 1)
    assert (again.id, again.attempts) == (msg_id, 2)
    assert channel_stats(client, "events", "work").deferred_count == 0


def test_subscribed_frame_states_the_consumer_timeout(client):
    with client.subscribe("events", "default", rdy=0) as default, \
            client.subscribe("events", "own", rdy=0, msg_timeout_ms=1234) as own:
        assert (default.msg_timeout_ms, own.msg_timeout_ms) == (60_000, 1234)


def test_cls_stops_delivery_and_is_answered_with_close_wait(client):
    with client.subscribe("events", "work", rdy=5) as sub, \
            client.subscribe("events", "work", rdy=5) as other:
        sub.cls()
        assert sub.close_wait.wait(timeout=5)
        ids = client.multi_publish("events", ["a", "b", "c"])
        got = collect([other], 3)
        assert sorted(m.id for _, m in got) == sorted(ids)
        assert so_far(sub) == ([], [])


def test_nop_is_accepted_and_the_stream_goes_on(client):
    with client.subscribe("events", "work", rdy=1) as sub:
        sub.nop()
        msg_id = client.publish("events", "after nop")
        [(_, msg)] = collect([sub], 1)
        assert so_far(sub) == ([], [])
    assert msg.id == msg_id


# -- the delivery frame, encoded by hand ---------------------------------------------

def _protobufs(msgs):
    return pb.ServerFrame(messages=pb.Messages(messages=[
        pb.Message(id=m.id, body=m.body, timestamp=m.timestamp, attempts=m.attempts)
        for m in msgs])).SerializeToString()


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.text(max_size=20), st.binary(max_size=300),
                          st.sampled_from([0, 1, 127, 128, 1_700_000_000_000_000_000])
                          | st.integers(-2**63, 2**63 - 1),
                          st.integers(0, 65535)), max_size=30),
       st.booleans())
def test_a_delivery_frame_is_byte_for_byte_what_protobuf_writes(fields, shared_ts):
    """Consumer streams send delivery frames encoded without protobuf objects: the
    same bytes for any ids, bodies (empty ones too), publish times (zero, negative,
    runs of equal ones, as an MPUB's) and attempts."""
    msgs = []
    for msg_id, body, ts, attempts in fields:
        msg = Message(msg_id, body, fields[0][2] if shared_ts else ts)
        msg.attempts = attempts
        msgs.append(msg)
    encoded = encode_delivery(msgs)
    assert encoded == _protobufs(msgs)
    assert pb.ServerFrame.FromString(encoded).messages == pb.ServerFrame.FromString(
        _protobufs(msgs)).messages


def test_delivery_frames_are_bounded_and_large_bodies_keep_their_length():
    big = [Message(f"{i:016x}", b"x" * 300_000, 1) for i in range(10)]
    frames = delivery_frames(big)
    assert len(frames) > 1
    decoded = [m for f in frames for m in pb.ServerFrame.FromString(f).messages.messages]
    assert [(m.id, len(m.body)) for m in decoded] == [(m.id, 300_000) for m in big]
    assert all(len(f) <= MAX_FRAME_BYTES + 64 * 1024 for f in frames)


def test_a_waiting_subscriber_gets_a_published_message_before_the_publisher_its_answer(broker):
    """Publish to delivery is not made to wait for the publisher's answer to be sent:
    the subscriber's frame leaves first, so the client (one connection for both) reads
    the delivery before the answer, for every message."""
    import asyncio

    from broker.api import broker_pb2_grpc as pb_grpc

    async def run() -> list[tuple[str, bytes]]:
        events: list[tuple[str, bytes]] = []
        async with grpc.aio.insecure_channel(broker.address) as channel:
            stub = pb_grpc.BrokerStub(channel)
            call = stub.Subscribe()
            await call.write(pb.ClientFrame(sub=pb.Sub(topic="events", channel="work")))
            await call.read()
            await call.write(pb.ClientFrame(rdy=pb.Rdy(count=100)))

            async def read() -> None:
                while True:
                    frame = await call.read()
                    events.extend(("delivered", m.body) for m in frame.messages.messages)

            reader = asyncio.create_task(read())
            for i in range(50):
                body = b"%d" % i
                await stub.Publish(pb.PublishRequest(topic="events", body=body))
                events.append(("answered", body))
                await asyncio.sleep(0.002)
            await asyncio.wait_for(_until(lambda: sum(k == "delivered" for k, _ in events) == 50),
                                   30)
            reader.cancel()
            call.cancel()
        return events

    first: dict[bytes, str] = {}
    for kind, body in asyncio.run(run()):
        first.setdefault(body, kind)
    assert len(first) == 50
    assert [body for body, kind in first.items() if kind != "delivered"] == []


async def _until(condition) -> None:
    import asyncio
    while not condition():
        await asyncio.sleep(0.01)
