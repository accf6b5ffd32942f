"""A backlog takes messages in bulk (an MPUB's, a hold flushed to a channel) exactly as it
would take them one at a time: the same ones in memory and the same ones waiting on
disk, in the same order, with the same delivery counts; a publish's messages that wait
on disk are never made into ``Message`` objects at all. Checked against one-by-one
``append`` over random sequences of publishes and pops."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from broker.backlog import Backlog, OnDisk
from broker.message import Message, Published, raw_id_run


def loaded(loc: int) -> Message:
    """What the disk holds at ``loc`` (a body naming its location)."""
    return Message(f"{loc:016x}", b"at %d" % loc, 7, 0, loc)


def backlog(limit: int | None) -> Backlog:
    return Backlog(limit, loaded)


def seen(msg: Message) -> tuple:
    return msg.id, msg.body, msg.loc, msg.attempts, msg.expires


def shape(b: Backlog) -> tuple:
    """What a backlog holds: its counts, and each entry (a message, or a run on disk)."""
    items = [("disk", tuple(item.remaining()), tuple(item.remaining_attempts() or ()))
             if type(item) is OnDisk else seen(item) for item in b._items]
    return len(b), b.in_memory, items


def drained(b: Backlog) -> list[tuple]:
    out = []
    while (msg := b.popleft()) is not None:
        out.append(seen(msg))
    return out


def pop_both(one: Backlog, bulk: Backlog, count: int) -> None:
    """Pop ``count`` from each: the same messages come off both."""
    for _ in range(count):
        a, b = one.popleft(), bulk.popleft()
        assert (a and seen(a)) == (b and seen(b))


limits = st.one_of(st.none(), st.integers(0, 12))
# A message: on disk (its location, unless 0) or not, and its delivery count so far.
messages = st.tuples(st.booleans(), st.integers(0, 3))


@st.composite
def publishes(draw) -> tuple[int, int, list[int], bool]:
    """(first id, count, record sizes (messages per record), on disk)."""
    count = draw(st.integers(1, 30))
    sizes, left = [], count
    while left:
        size = draw(st.integers(1, left))
        sizes.append(size)
        left -= size
    return draw(st.integers(1, 1 << 40)), count, sizes, draw(st.booleans())


def run_of(first: int, count: int, sizes: list[int], on_disk: bool, at: int,
           expires: bool) -> Published:
    run = Published(raw_id_run(first << 10, count), [b"body %d" % i for i in range(count)],
                    123, [0 if i % 3 else 99 for i in range(count)] if expires else None)
    if on_disk:
        loc = at
        for size in sizes:
            run.runs.append((loc, size))
            loc += size + 1000   # a record is longer than its count of messages
    return run


@settings(max_examples=300, deadline=None)
@given(limits, st.lists(st.one_of(
    st.tuples(st.just("extend"), st.lists(messages, max_size=25)),
    st.tuples(st.just("pop"), st.integers(0, 20))), max_size=8))
def test_extend_queues_what_appending_one_by_one_queues(limit, steps):
    one, bulk = backlog(limit), backlog(limit)
    loc = 1
    for kind, arg in steps:
        if kind == "pop":
            pop_both(one, bulk, arg)
            continue
        batch = []
        for stored, attempts in arg:
            batch.append((f"{loc:016x}", loc if stored else 0, attempts))
            loc += 1
        for msg_id, at, attempts in batch:
            one.append(Message(msg_id, b"at %d" % at, 7, attempts, at))
        bulk.extend([Message(msg_id, b"at %d" % at, 7, attempts, at)
                     for msg_id, at, attempts in batch])
        assert shape(bulk) == shape(one)
    assert drained(bulk) == drained(one)


@settings(max_examples=300, deadline=None)
@given(limits, st.booleans(), st.lists(st.one_of(
    st.tuples(st.just("publish"), publishes()),
    st.tuples(st.just("pop"), st.integers(0, 20))), max_size=8))
def test_a_publish_is_queued_as_its_messages_appended_one_by_one(limit, expires, steps):
    one, bulk = backlog(limit), backlog(limit)
    at = 1
    for kind, arg in steps:
        if kind == "pop":
            pop_both(one, bulk, arg)
            continue
        run = run_of(*arg, at=at, expires=expires)
        at += 100_000
        for msg in run.messages():
            one.append(msg)
        bulk.extend_published(run)
        assert shape(bulk) == shape(one)
    assert drained(bulk) == drained(one)


def test_a_publish_past_the_limit_makes_messages_only_of_those_kept_in_memory(monkeypatch):
    made = []
    real = Published.messages
    monkeypatch.setattr(Published, "messages",
                        lambda self, start=0, stop=None: made.append((start, stop))
                        or real(self, start, stop))
    b = backlog(3)
    run = run_of(5, 200, [200], True, at=64, expires=False)
    b.extend_published(run)
    assert made == [(0, 3)]
    assert (len(b), b.in_memory) == (200, 3)
    assert list(b.on_disk()) == list(range(67, 264))
