"""A lease fetch as packed column frames: bounded in messages and body bytes,
in order, nothing lost or changed; what the Spark reader turns into Arrow."""

from __future__ import annotations

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from broker import columns
from broker.message import Message
from broker.server.grpc_server import LEASE_FRAME_BYTES
from spark_connector.fetch import to_record_batch

bodies = st.lists(st.binary(max_size=40), max_size=60)


def messages(payloads: list[bytes]) -> list[Message]:
    return [Message(f"{i:016x}", body, 1_700_000_000_000_000_000 + i, i % 3 + 1)
            for i, body in enumerate(payloads)]


@settings(max_examples=200, deadline=None)
@given(bodies, st.integers(1, 8), st.integers(0, 100))
def test_frames_hold_every_message_in_order_within_their_bounds(payloads, max_messages,
                                                                max_bytes):
    msgs = messages(payloads)
    frames = list(columns.frames(msgs, max_messages, max_bytes))
    rows = [row for frame in frames for row in columns.decode(frame)]
    assert rows == [(m.id, m.body, m.timestamp, m.attempts) for m in msgs]
    for frame in frames:
        assert 1 <= frame.count <= max_messages
        assert len(frame.bodies) <= max_bytes or frame.count == 1  # a larger body goes alone
    # Each frame is as full as its bounds allow: no more frames than needed.
    for frame, following in zip(frames, frames[1:]):
        first_next = columns.decode(following)[0].body
        assert (frame.count == max_messages
                or len(frame.bodies) + len(first_next) > max_bytes)


def test_frames_of_a_lease_whose_bodies_pass_2_gib_keep_their_offsets_exact():
    body = b"y" * (1 << 20)  # one object shared: 3,000 messages of 1 MiB cost 1 MiB here
    frames = list(columns.frames(messages([body] * 3000), 16384, LEASE_FRAME_BYTES))
    assert sum(frame.count for frame in frames) == 3000
    assert all(row.body == body for frame in frames[:3] + frames[-3:]
               for row in columns.decode(frame))


@settings(max_examples=50, deadline=None)
@given(bodies)
def test_frames_become_arrow_batches_with_the_same_rows(payloads):
    msgs = messages(payloads)
    batches = [to_record_batch(f, "events", "spark") for f in columns.frames(msgs, 7, 64)]
    got = [row for b in batches for row in b.to_pylist()]
    assert [(r["id"], r["body"], r["attempts"], r["topic"], r["channel"]) for r in got] == \
        [(m.id, m.body, m.attempts, "events", "spark") for m in msgs]
    micros = [t for b in batches for t in b.column("timestamp").cast(pa.int64()).to_pylist()]
    assert micros == [m.timestamp // 1000 for m in msgs]


def test_a_lease_larger_than_a_frame_is_fetched_whole_in_order(client):
    client.admin("channel", "create", "events", "spark")
    body_size = 300_000
    per_frame = LEASE_FRAME_BYTES // body_size
    count = 3 * per_frame + 1
    ids = []
    for start in range(0, count, 10):
        ids += client.multi_publish("events", [bytes([65 + i % 26]) * body_size
                                               for i in range(start, min(count, start + 10))])
    session = client.open_lease_session("planner")
    try:
        lease = client.reserve(session.session_id, "events", "spark", count)
        frames = list(client.fetch_lease(lease.lease_id))
        rows = [row for frame in frames for row in columns.decode(frame)]
        assert [r.id for r in rows] == ids
        assert [r.body for r in rows] == [bytes([65 + i % 26]) * body_size for i in range(count)]
        assert len(frames) == 4
        assert lease.bytes == count * body_size
    finally:
        session.close()
