"""Client bytes never pass for a record: message bodies that are themselves valid log
records (of every kind, nested, at every offset), and damage anywhere in the file.

Every log file begins with a random key mixed into every record's check; a publisher
never sees it, so a record it crafts inside a body fails its check wherever a resync
tries it. What damage costs is the record it touched, never one before or after it,
never a channel's state. A file written before keys is still read (as it always was).
"""

from __future__ import annotations

import struct

import pytest

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.clock import ManualClock
from broker.storage import records

from .test_storage_recovery import clean, crash, drain, start


def crafted_records() -> list[bytes]:
    """A record of every kind, as a client could build it (it does not know the key:
    checked without one), the records written twice among them as the broker writes
    them, and a PUB nested in a PUB nested in a BATCH."""
    inner = records.empty("work") + records.channel_op(records.DELETE, "work")
    nested = records.pub(7, 1, 0, False, records.pub(8, 1, 0, False, inner))
    return [
        records.pub(1, 1, 0, False, b"planted"),
        records.batch([f"{i:016x}" for i in (2, 3)], 1, [b"a", b"b"], None, None, False),
        *records.fins("work", [1, 2, 3]),
        *records.attempts("work", [(1, 5)]),
        records.defer("work", 1, 10**18, 3),
        records.empty("work"),
        records.channel_op(records.DELETE, "work"),
        records.channel_op(records.CREATE, "other"),
        records.topic_op(records.PAUSE),
        records.state(True, {}),
        records.flush(),
        records.dedupe(b"x" * 40),
        records.move(9, 1, [("work", 1, 0)], b"moved"),
        records.config("work", b'{"ttl_ms": 1}'),
        records.prologue(0) + records.prologue(12345),
        records.batch([f"{i:016x}" for i in (4, 5)], 1, [nested, inner], None, None, False),
    ]


CRAFTED = crafted_records()


def body_strategy():
    """A body of crafted records at any offset: some filler, then records back to back."""
    return st.builds(lambda pad, picks, tail: b"\x00" * pad + b"".join(CRAFTED[i] for i in picks)
                     + tail,
                     st.integers(0, 12), st.lists(st.integers(0, len(CRAFTED) - 1),
                                                  min_size=1, max_size=4),
                     st.binary(max_size=8))


def a_file(bodies: list[bytes]) -> tuple[bytes, list[tuple[int, int, int]]]:
    """A keyed log file as the broker writes it (STATE, then a PUB per body, an MPUB of
    them all and an EMPTY of another channel), and (kind, offset, end) of each record."""
    key = records.new_key()
    parts = [records.state(False, {"work": False, "other": False})]
    parts += [records.pub(100 + i, 1, 0, False, body) for i, body in enumerate(bodies)]
    parts.append(records.batch([f"{200 + i:016x}" for i in range(len(bodies))], 1, bodies,
                               None, None, False))
    parts.append(records.empty("other"))
    data = records.prologue(key) + bytes(records.seal(b"".join(parts), key))
    written, at = [], records.PROLOGUE_SIZE
    while at < len(data):
        _, kind, length, _ = records.HEADER.unpack_from(data, at)
        written.append((kind, at, at + records.HEADER_SIZE + length))
        at += records.HEADER_SIZE + length
    return data, written


@settings(max_examples=300, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(body_strategy(), min_size=1, max_size=4), st.data())
def test_damage_anywhere_among_crafted_bodies_costs_only_the_record_it_touched(bodies, data):
    raw, written = a_file(bodies)
    # Undamaged, the file reads as written: no planted record among them.
    assert [(r.kind, r.offset) for r in records.scan_file(raw, "log")] == \
        [(kind, at) for kind, at, _ in written]
    where = data.draw(st.integers(0, len(raw) - 1), label="damaged byte")
    bit = data.draw(st.integers(0, 7), label="bit")
    damaged = bytearray(raw)
    damaged[where] ^= 1 << bit
    read = [(r.kind, r.offset) for r in records.scan_file(bytes(damaged), "log")]
    expected = [(kind, at) for kind, at, end in written if not at <= where < end]
    assert read == expected


@pytest.mark.parametrize("field", [2, 5, 9], ids=["type", "length", "check"])
def test_a_crafted_body_followed_by_a_damaged_header_costs_that_message_only(tmp_path, field):
    """A publisher's body that holds a record of every kind (an EMPTY and a DELETE of
    the channel among them), between 100 messages and 100 more; a bit flipped in that
    message's own header: 200 of 201 come back and the channel is there (the resync
    never takes the body's records)."""
    clock = ManualClock()
    broker = start(tmp_path, clock)
    broker.create_channel("events", "work")
    before = [broker.publish("events", f"before {i}".encode()) for i in range(100)]
    crafted = broker.publish("events", b"".join(CRAFTED))
    after = [broker.publish("events", f"after {i}".encode()) for i in range(100)]
    clean(broker)
    log_file, = sorted((tmp_path / "topics" / "t-events").glob("*.log"))
    data = bytearray(log_file.read_bytes())
    record = next(r for r in records.scan_file(bytes(data), "log")
                  if r.kind == records.PUB and bytes(r.payload[:8]) == bytes.fromhex(crafted))
    data[record.offset + field] ^= 0x01
    log_file.write_bytes(bytes(data))
    broker = start(tmp_path, clock)
    assert set(broker.topic("events").channels) == {"work"}
    assert sorted(drain(broker, "events", "work", fin=False)) == sorted(before + after)
    crash(broker)
    broker = start(tmp_path, clock)       # and again: nothing of it came back meanwhile
    assert sorted(drain(broker, "events", "work")) == sorted(before + after)


def test_every_copy_of_a_files_key_damaged_costs_nothing(tmp_path):
    """The key is written three times; with all three damaged it is found again from
    the STATE record the broker wrote after them (twice, both must agree)."""
    clock = ManualClock()
    broker = start(tmp_path, clock)
    broker.create_channel("events", "work")
    ids = [broker.publish("events", f"m{i}".encode()) for i in range(20)]
    clean(broker)
    log_file, = sorted((tmp_path / "topics" / "t-events").glob("*.log"))
    data = bytearray(log_file.read_bytes())
    for copy in range(records.KEY_COPIES):
        data[copy * records.KEY_RECORD_SIZE + records.HEADER_SIZE + 2] ^= 0x10
    log_file.write_bytes(bytes(data))
    broker = start(tmp_path, clock)
    assert sorted(drain(broker, "events", "work")) == sorted(ids)


def test_a_log_file_written_before_keys_is_read_as_it_was(tmp_path):
    """A data path of the format before keys: its file (no key, checks without one) is
    read as before; the start appends to a new file, which has a key."""
    topic_dir = tmp_path / "topics" / "t-events"
    topic_dir.mkdir(parents=True)
    ids = [f"{i:016x}" for i in range(1, 11)]
    (topic_dir / "00000001.log").write_bytes(
        records.state(False, {"work": False})
        + b"".join(records.pub(int(i, 16), 1, 0, False, f"old {i}".encode()) for i in ids[:5])
        + records.batch(ids[5:], 1, [f"old {i}".encode() for i in ids[5:]], None, None, False)
        + records.fins("work", [1])[0])
    clock = ManualClock()
    broker = start(tmp_path, clock)
    new = broker.publish("events", b"new")
    assert sorted(drain(broker, "events", "work", fin=False)) == sorted(ids[1:] + [new])
    clean(broker)
    newest = sorted(topic_dir.glob("*.log"))[-1]
    assert records.file_key(newest.read_bytes())[0] != 0
    broker = start(tmp_path, clock)
    assert sorted(drain(broker, "events", "work")) == sorted(ids[1:] + [new])


def test_a_key_is_fresh_per_file_and_never_zero():
    keys = {records.new_key() for _ in range(1000)}
    assert 0 not in keys and len(keys) > 990
    assert struct.unpack(">I", records.prologue(5)[records.HEADER_SIZE + 1:
                                                   records.KEY_RECORD_SIZE])[0] == 5
