"""A channel hands its consumers the ready messages in bulk while they are in memory,
exactly as it would take them one by one: the same messages in the same batches, a
batch ending once its bodies reach the consumer's byte bound or its room is used, and
expired messages leaving on the way without counting towards either. Checked against
a one-by-one model over random bodies, expiries, RDY counts and byte bounds."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

import broker.channel as channel_module
from broker.consumer import Consumer

from .corekit import new_broker


def batches_one_by_one(msgs: list[tuple[str, int, bool]], rdy: int,
                       batch_bytes: int) -> list[list[str]]:
    """The model: (id, body size, expired) in queue order; every batch is FINed
    before the next RDY's worth is handed over."""
    queue = [(msg_id, size) for msg_id, size, expired in msgs if not expired]
    batches: list[list[str]] = []
    while queue:
        room = rdy
        while room and queue:
            batch, size = [], 0
            while room and queue:
                msg_id, body = queue.pop(0)
                batch.append(msg_id)
                room -= 1
                size += body
                if batch_bytes and size >= batch_bytes:
                    break
            batches.append(batch)
    return batches


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 12), st.booleans()), min_size=1, max_size=40),
       st.integers(1, 15), st.integers(0, 30), st.sampled_from([1, 2, 3, 256]))
def test_the_pump_hands_over_the_batches_taking_messages_one_by_one_would(
        bodies: list[tuple[int, bool]], rdy: int, batch_bytes: int, chunk: int) -> None:
    """(``chunk``: how many a pass bounded by bytes looks at at a time.)"""
    saved, channel_module.BYTES_CHUNK = channel_module.BYTES_CHUNK, chunk
    try:
        pumped(bodies, rdy, batch_bytes)
    finally:
        channel_module.BYTES_CHUNK = saved


def pumped(bodies: list[tuple[int, bool]], rdy: int, batch_bytes: int) -> None:
    broker, clock = new_broker()
    batches: list[list[str]] = []
    c = Consumer(lambda msg: None, msg_timeout=60.0,
                 on_messages=lambda msgs: batches.append([m.id for m in msgs]))
    c.batch_bytes = batch_bytes
    ch = broker.subscribe(c, "events", "work")
    ids = broker.multi_publish("events", [b"x" * size for size, _ in bodies],
                               ttl_ms=[1000 if expired else 0 for _, expired in bodies])
    clock.advance(2.0)           # the expiring ones are past their time, still queued
    ch.set_rdy(c, rdy)
    while c.in_flight:
        ch.finish_many(c, list(c.in_flight))
    expected = batches_one_by_one([(msg_id, size, expired) for msg_id, (size, expired)
                                   in zip(ids, bodies)], rdy, batch_bytes)
    assert batches == expected
    assert ch.depth == 0 and ch.finish_count == sum(map(len, expected))
