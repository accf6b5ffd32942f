"""Messages read back from the log in bulk are the messages ``Message(...)`` makes one
by one: the same value in every slot."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from broker.message import Message, Published, raw_id_run, read_back

_ID = st.integers(0, 2**64 - 1).map(lambda n: f"{n:016x}")
_TIME = st.integers(0, 2**63 - 1)
_READ = st.lists(st.tuples(_ID, st.binary(max_size=40), _TIME, _TIME), max_size=30)


def slots(msg: Message) -> dict:
    return {name: getattr(msg, name) for name in Message.__slots__}


@given(_READ, st.integers(0, 2**62), st.booleans())
def test_messages_read_back_in_bulk_equal_messages_made_one_by_one(rows, loc, expiring):
    ids = [row[0] for row in rows]
    bodies = [row[1] for row in rows]
    timestamps = [row[2] for row in rows]
    expires = [row[3] for row in rows] if expiring else None
    bulk = read_back(ids, bodies, timestamps, loc, expires)
    one_by_one = [Message(msg_id, body, ts, 0, loc + i, expires[i] if expiring else 0)
                  for i, (msg_id, body, ts) in enumerate(zip(ids, bodies, timestamps))]
    assert [type(msg) for msg in bulk] == [Message] * len(rows)
    assert [slots(msg) for msg in bulk] == [slots(msg) for msg in one_by_one]


@given(st.lists(st.tuples(st.integers(1, 2**62), st.integers(1, 2500)), min_size=1, max_size=3),
       st.data())
def test_a_publishs_locations_are_its_runs_in_order_however_long(runs, data):
    """Where each message of a publish is on disk, as its queues read it (an array for
    those waiting on disk, each message's own ``loc``): run after run, a run longer than
    one number's worth of locations included."""
    n = sum(count for _, count in runs)
    published = Published(raw_id_run(1 << 40, n), [b"x"] * n, 5)
    published.runs = runs
    flat = [first + i for first, count in runs for i in range(count)]
    start = data.draw(st.integers(0, n))
    stop = data.draw(st.integers(start, n))
    assert published.locations(start, stop).tolist() == flat[start:stop]
    assert [msg.loc for msg in published.messages(start, stop)] == flat[start:stop]


@given(st.lists(st.tuples(st.binary(max_size=40), _TIME), min_size=1, max_size=30),
       _TIME, st.booleans(), st.booleans(), st.data())
def test_a_publishs_messages_made_in_bulk_equal_messages_made_one_by_one(
        rows, timestamp, expiring, stored, data):
    """What a queue keeps in memory of a publish (memory-only, or durable within
    --mem-queue-size) is what ``Message(...)`` makes of each: the same value in every slot."""
    n = len(rows)
    bodies = [row[0] for row in rows]
    expires = [row[1] for row in rows] if expiring else None
    published = Published(raw_id_run(7 << 40, n), bodies, timestamp, expires)
    if stored:
        published.runs = [(1 << 41, n)]
    start = data.draw(st.integers(0, n))
    stop = data.draw(st.integers(start, n))
    one_by_one = [Message(published.ids[i], bodies[i], timestamp, 0,
                          (1 << 41) + i if stored else 0, expires[i] if expiring else 0)
                  for i in range(start, stop)]
    bulk = published.messages(start, stop)
    assert [type(msg) for msg in bulk] == [Message] * (stop - start)
    assert [slots(msg) for msg in bulk] == [slots(msg) for msg in one_by_one]
