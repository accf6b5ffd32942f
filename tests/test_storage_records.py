"""The topic log's records and what recovery reads from them, byte by byte, with no file.

Each record kind round-trips through ``records.scan``; damage is skipped and the
scan resynchronises on the next valid record; a block cut mid-record leaves the
rest for the next block. ``Replay`` (what a log says is pending where) is checked
against a plain model over random sequences of records.
"""

from __future__ import annotations

import logging
import struct
from array import array
from collections import Counter

import pytest
from hypothesis import given, settings, strategies as st

from broker.message import id_run, raw_id_run
from broker.storage import fileops, records, segments
from broker.storage.replay import Replay
from broker.storage.segments import Reader, location


def scanned(*encoded: bytes) -> list[records.Record]:
    return list(records.scan(b"".join(encoded), "test"))


def once(scanned: list[records.Record]) -> list[records.Record]:
    """Without the second copy of each record written twice."""
    return [r for i, r in enumerate(scanned) if not i or (r.kind, bytes(r.payload)) != (
        scanned[i - 1].kind, bytes(scanned[i - 1].payload))]


def test_every_record_kind_reads_back_what_was_written():
    [pub, pub_expiring, fin, attempts, defer, empty, channel, topic, state, flush, dedupe,
     config] = once(scanned(
        records.pub(7, 1_000, 2_000, False, b"body"),
        records.pub(8, 1_001, 0, True, b"held", expires=9_000),
        *records.fins("work", [7, 8, 2**64 - 1]),
        *records.attempts("work", [(7, 3), (8, 65535)]),
        records.defer("work", 7, 5_000, 4),
        records.empty("work"),
        records.channel_op(records.PAUSE, "work"),
        records.topic_op(records.UNPAUSE),
        records.state(True, {"a": False, "b#x": True}),
        records.flush(),
        records.dedupe(b"\x00entry"),
        records.config("", b'{"ttl_ms": 5}')))
    assert [r.kind for r in (pub, pub_expiring, fin, attempts, defer, empty, channel, topic,
                             state, flush, dedupe, config)] == [
        records.PUB, records.PUB, records.FIN, records.ATTEMPTS, records.DEFER, records.EMPTY,
        records.CHANNEL, records.TOPIC, records.STATE, records.FLUSH, records.DEDUPE,
        records.CONFIG]
    assert pub.pub() == (7, 1_000, 2_000, 0)
    assert pub_expiring.pub() == (8, 1_001, 0, records.HELD | records.EXPIRES)
    assert fin.fins() == ("work", (7, 8, 2**64 - 1))
    assert attempts.attempts() == ("work", [(7, 3), (8, 65535)])
    assert defer.defer() == ("work", 7, 5_000, 4)
    assert empty.channel() == "work"
    assert channel.channel_op() == (records.PAUSE, "work")
    assert bytes(topic.payload) == bytes((records.UNPAUSE,))
    assert state.state() == (True, {"a": False, "b#x": True})
    assert bytes(flush.payload) == b""
    assert bytes(dedupe.payload) == b"\x00entry"
    assert config.config() == ("", b'{"ttl_ms": 5}')
    assert pub.offset == 0 and pub_expiring.offset == len(records.pub(7, 1_000, 2_000, False,
                                                                      b"body"))


def test_a_move_keeps_each_copy_its_attempts_and_time_and_the_expiry():
    [plain, expiring] = scanned(
        records.move(5, 10, [("", 2, 0), ("work", 3, 77)], b"moved"),
        records.move(6, 11, [("work", 1, 0)], b"late", expires=12_345))
    assert plain.move() == (5, 10, [("", 2, 0), ("work", 3, 77)], b"moved", 0)
    assert expiring.move() == (6, 11, [("work", 1, 0)], b"late", 12_345)


def test_a_fin_of_more_ids_than_one_record_holds_is_split_and_keeps_every_id():
    ids = list(range(records.MAX_IDS_PER_RECORD + 3))
    fins = records.fins("c", ids)
    entries = records.attempts("c", [(i, 1) for i in ids])
    assert len(fins) == len(entries) == 2
    read = [r.fins()[1] for r in scanned(*fins)]
    assert [len(r) for r in read] == [records.MAX_IDS_PER_RECORD, 3]
    assert [i for chunk in read for i in chunk] == ids
    assert [i for r in scanned(*entries) for i, _ in r.attempts()[1]] == ids
    assert records.fins("c", []) == []



_IDS_AND_COUNTS = st.lists(st.tuples(st.integers(0, 2**64 - 1), st.integers(0, 65535)),
                           min_size=1, max_size=40)


@given(_IDS_AND_COUNTS, st.booleans())
def test_fin_and_attempts_records_of_hex_ids_are_the_records_of_their_numbers(entries, same):
    """What a channel writes (ids as messages carry them, one count for all or each its
    own) is byte for byte what the reference encoders write from the ids' numbers."""
    if same:  # a pass's first deliveries: one count for all
        entries = [(msg_id, entries[0][1]) for msg_id, _ in entries]
    hex_ids = [f"{msg_id:016x}" for msg_id, _ in entries]
    counts = [count for _, count in entries]
    assert records.attempts_of("c", hex_ids, counts) == b"".join(records.attempts("c", entries))
    assert records.fins_of("c", hex_ids) == b"".join(records.fins("c", [i for i, _ in entries]))


def test_attempts_of_more_ids_than_one_record_holds_keep_each_count():
    ids = id_run(1 << 40, records.MAX_IDS_PER_RECORD + 3)
    counts = [1] * records.MAX_IDS_PER_RECORD + [2, 1, 1]
    read = [entry for r in scanned(records.attempts_of("c", ids, counts))
            for entry in r.attempts()[1]]
    assert read == [(int(i, 16), count) for i, count in zip(ids, counts)]

def replayed(data: bytes, seg: int = 1) -> Replay:
    replay = Replay("t")
    for record in records.scan(data, "t"):
        replay.read(seg, record)
    return replay


def reader_of(data: bytes, replay: Replay) -> Reader:
    """Messages by location from ``data`` as one segment's file, with the replay's index
    of batches (what a start hands the log)."""
    return Reader(replay.batches, lambda seg, size, offset: data[offset:offset + size])


def read(data: bytes, replay: Replay, locs: "list[int] | array") -> list[tuple | None]:
    return [m and (m.id, m.timestamp, m.body, m.expires, m.loc)
            for m in reader_of(data, replay).messages(locs)]


def test_a_reader_reads_pub_move_and_batch_records_by_location_up_to_a_cut_record():
    first = records.pub(1, 100, 0, False, b"one")
    second = records.pub(2, 200, 0, False, b"two", expires=999)
    fin = records.fins("c", [1])[0]
    moved = records.move(3, 300, [("c", 1, 0)], b"three", expires=5)
    batch = records.batch([f"{i:016x}" for i in (4, 5, 6)], [400, 500, 600],
                          [b"four", b"five", b"six"], None, [0, 77, 0], False)
    cut = records.pub(7, 700, 0, False, b"seven")[:-1]
    data = records.channel_op(records.CREATE, "c") + first + second + fin + moved + batch + cut
    at = len(records.channel_op(records.CREATE, "c"))
    locs = [location(1, at + n) for n in (
        0, len(first), len(first) + len(second) + len(fin),
        *(len(first) + len(second) + len(fin) + len(moved) + i for i in range(3)))]
    expected = [(f"{n:016x}", ts, body, exp, loc) for (n, ts, body, exp), loc in zip(
        [(1, 100, b"one", 0), (2, 200, b"two", 999), (3, 300, b"three", 5),
         (4, 400, b"four", 0), (5, 500, b"five", 77), (6, 600, b"six", 0)], locs)]
    replay = replayed(data)
    assert [loc for loc, _, _ in replay.pending("c")] == locs[1:]  # 1 FINed
    assert read(data, replay, locs) == expected             # in order: a read per block
    assert [read(data, replay, [loc])[0] for loc in reversed(locs)] == expected[::-1]
    cut_loc = location(1, len(data) - len(cut))
    assert read(data, replay, [*locs, cut_loc]) == [*expected, None]


def test_a_reader_gives_none_for_a_damaged_record_and_reads_on_past_it():
    first = records.pub(1, 100, 0, False, b"one")
    damaged = bytearray(records.pub(2, 200, 0, False, b"two"))
    damaged[-1] ^= 0xFF
    moved = bytearray(records.move(3, 300, [("c", 1, 0)], b"three"))
    moved[-1] ^= 0xFF
    data = first + bytes(damaged) + bytes(moved) + first
    replay = replayed(data)
    locs = [location(1, n) for n in (0, len(first), len(first) + len(damaged),
                                     len(data) - len(first))]
    assert [m and m.id for m in reader_of(data, replay).messages(locs)] == [
        f"{1:016x}", None, None, f"{1:016x}"]


# -- BATCH: the messages of one MPUB under one checksum -------------------------

IDS = [f"{n:016x}" for n in range(0x1234_5678_9abc_d000, 0x1234_5678_9abc_d000 + 5 * 1024, 1024)]
STAMPS = [1_000 + i for i in range(5)]
BODIES = [bytes([65 + i]) * (i + 1) * 7 for i in range(5)]


@pytest.mark.parametrize("held", [False, True])
@pytest.mark.parametrize("deliver_ats", [None, [0, 5_000, 0, 0, 7_000]])
@pytest.mark.parametrize("expires", [None, [0, 0, 9_000, 0, 9_500]])
def test_a_batch_reads_back_every_message_as_written(held, deliver_ats, expires):
    data = records.batch(IDS, STAMPS, BODIES, deliver_ats, expires, held)
    [record] = scanned(data)
    assert record.kind == records.BATCH and record.offset == 0
    batch = record.batch()
    assert len(batch) == 5 and batch.held == held
    assert list(batch.raw_ids()) == [int(i, 16) for i in IDS]
    assert list(batch.timestamps) == STAMPS
    assert [bytes(batch.data[a:b]) for a, b in zip(batch.bounds, batch.bounds[1:])] == BODIES
    assert (None if batch.deliver_ats is None else list(batch.deliver_ats)) == deliver_ats
    assert (None if batch.expires is None else list(batch.expires)) == expires
    # Replay puts message i at the batch's location + i, with its own deliver-at time.
    replay = replayed(records.channel_op(records.CREATE, "c") + data)
    at = len(records.channel_op(records.CREATE, "c"))
    pending = list(replay.pending(None if held else "c"))
    assert pending == [(location(1, at + i), 0, (deliver_ats or [0] * 5)[i]) for i in range(5)]
    assert replay.max_id == int(IDS[-1], 16)
    assert replay.batches == {1: (array("q", [at]), array("I", [5]))}
    got = read(records.channel_op(records.CREATE, "c") + data, replay,
               [loc for loc, _, _ in pending])
    assert got == [(i, ts, body, (expires or [0] * 5)[n], location(1, at + n))
                   for n, (i, ts, body) in enumerate(zip(IDS, STAMPS, BODIES))]


@settings(max_examples=120, deadline=None)
@given(st.data())
def test_one_damaged_byte_of_a_batch_costs_its_messages_and_nothing_around_it(data):
    before = records.pub(1, 1, 0, False, b"before")
    batch = records.batch(IDS, STAMPS, BODIES, None, None, False)
    after = records.batch([f"{9 << 40:016x}", f"{(9 << 40) + 1:016x}"], [2, 3], [b"a", b"b"],
                          None, None, False)
    head = records.channel_op(records.CREATE, "c") + before
    at = data.draw(st.integers(0, len(batch) - 1), label="damaged byte")
    damaged = bytearray(batch)
    damaged[at] ^= data.draw(st.integers(1, 255), label="flipped bits")
    log = head + bytes(damaged) + after
    replay = Replay("t")
    spans: list[bytes] = []
    for record in records.scan(log, "t", damaged=lambda _, span: spans.append(span)):
        replay.read(1, record)
    for span in spans:
        replay.damaged(span)
    pending = [loc for loc, _, _ in replay.pending("c")]
    after_at = len(head) + len(damaged)
    assert pending == [location(1, len(head) - len(before)),
                       location(1, after_at), location(1, after_at + 1)]
    if at >= records.HEADER_SIZE + records.BATCH_HEAD.size:  # its count says what was lost
        assert replay.damage == Counter({"message(s) lost to channel(s) c": 5})
    # Read back in place (damaged after the start): None for each of its messages.
    intact = replayed(head + batch + after)
    locs = [location(1, len(head) + i) for i in range(5)]
    assert read(log, intact, locs) == [None] * 5
    assert [m.body for m in reader_of(log, intact).messages(pending)] == [b"before", b"a", b"b"]


def test_a_log_of_one_pub_record_per_message_replays_and_reads_as_before():
    """Logs written before BATCH records (an MPUB as one PUB record per message, byte for
    byte what ``records.pubs`` makes) replay, and their messages read back, beside the
    batches written since; a FIN of one message of a batch leaves the others pending."""
    old, starts = records.pubs(IDS, STAMPS, BODIES, [0] * 5, [0] * 5, False)
    assert old == b"".join(records.pub(int(i, 16), ts, 0, False, body)
                           for i, ts, body in zip(IDS, STAMPS, BODIES))
    new_ids = [f"{int(IDS[-1], 16) + 1024 * k:016x}" for k in range(1, 4)]
    new = records.batch(new_ids, [7, 8, 9], [b"x", b"yy", b"zzz"], None, None, False)
    head = records.state(False, {"c": False})
    fin = records.fins_of("c", [IDS[1], new_ids[1]])
    log = head + old + new + fin
    replay = replayed(log, seg=4)
    old_locs = [location(4, len(head) + s) for s in starts]
    new_locs = [location(4, len(head) + len(old) + i) for i in range(3)]
    pending = [loc for loc, _, _ in replay.pending("c")]
    assert pending == [old_locs[0], *old_locs[2:], new_locs[0], new_locs[2]]
    assert replay.copies_per_segment() == {4: 6}
    assert [m.id for m in reader_of(log, replay).messages(pending)] == [
        IDS[0], *IDS[2:], new_ids[0], new_ids[2]]


def test_damaged_bytes_are_skipped_and_the_scan_resumes_at_the_next_valid_record(caplog):
    a = records.pub(1, 1, 0, False, b"a")
    b = bytearray(records.pub(2, 2, 0, False, b"b"))
    b[-1] ^= 0xFF                                  # fails its CRC
    c = records.pub(3, 3, 0, False, b"c")
    with caplog.at_level(logging.WARNING, "pynsqd"):
        got = list(records.scan(a + b"junk" + bytes(b) + c, "t-x/1.log", base=1000))
    assert [(r.pub()[0], r.offset) for r in got] == [(1, 1000), (3, 1000 + len(a) + 4 + len(b))]
    assert f"skipped {4 + len(b)} damaged byte(s) at offset {1000 + len(a)}" in caplog.text


def test_a_record_torn_at_the_end_of_a_file_is_skipped_and_said(caplog):
    a = records.pub(1, 1, 0, False, b"a")
    torn = records.pub(2, 2, 0, False, b"bbbb")[:-2]
    with caplog.at_level(logging.WARNING, "pynsqd"):
        got = list(records.scan(a + torn, "t-x/1.log"))
        header_only = list(records.scan(a + torn[:5], "t-x/1.log"))
    assert [r.pub()[0] for r in got] == [1] == [r.pub()[0] for r in header_only]
    assert f"{len(torn)} byte(s) at offset {len(a)} are a damaged or torn record" in caplog.text


def test_a_length_over_the_largest_payload_is_damage_not_a_record_to_wait_for():
    huge = struct.pack(">2sBII", records.MAGIC, records.PUB, records.MAX_PAYLOAD + 1, 0)
    a = records.pub(1, 1, 0, False, b"a")
    rest: list[int] = []
    assert [r.pub()[0] for r in records.scan(huge + a, "t", rest=rest)] == [1]
    assert rest == [len(huge) + len(a)]


def test_a_block_that_cuts_a_record_leaves_its_start_for_the_next_block():
    a = records.pub(1, 1, 0, False, b"a")
    b = records.pub(2, 2, 0, False, b"b" * 50)
    for cut in (1, records.HEADER_SIZE - 1, records.HEADER_SIZE + 3, len(b) - 1):
        rest: list[int] = []
        got = list(records.scan(a + b[:cut], "t", rest=rest))
        assert [r.pub()[0] for r in got] == [1] and rest == [len(a)]
    rest = []
    assert [r.pub()[0] for r in records.scan(a + b, "t", rest=rest)] == [1, 2]
    assert rest == [len(a) + len(b)]


# -- Replay against a plain model -------------------------------------------------

SEG = 3
CHANNELS = ["a", "b", "c"]
ops = st.lists(st.one_of(
    st.tuples(st.just("create"), st.sampled_from(CHANNELS)),
    st.tuples(st.just("delete"), st.sampled_from(CHANNELS)),
    st.tuples(st.just("pub"), st.booleans(), st.integers(0, 3)),
    # a batch: held or not, each message's deliver-at, its ids given in reverse or not
    st.tuples(st.just("batch"), st.booleans(), st.lists(st.integers(0, 3), min_size=2,
                                                        max_size=4), st.booleans()),
    st.tuples(st.just("fin"), st.sampled_from(CHANNELS), st.integers(0, 20)),
    st.tuples(st.just("attempts"), st.sampled_from(CHANNELS), st.integers(0, 20),
              st.integers(1, 9)),
    st.tuples(st.just("defer"), st.sampled_from(CHANNELS), st.integers(0, 20),
              st.integers(1, 99), st.integers(1, 9)),
    st.tuples(st.just("flush")),
    st.tuples(st.just("empty"), st.sampled_from(["", *CHANNELS])),
    st.tuples(st.just("pause"), st.sampled_from(CHANNELS), st.booleans()),
    st.tuples(st.just("topic"), st.booleans()),
), max_size=40)


@settings(max_examples=150, deadline=None)
@given(ops)
def test_replay_says_what_is_pending_where_as_a_plain_model_does(steps):
    log: list[bytes] = []
    offset = 0
    ids: list[int] = []
    channels: dict[str, dict[int, list[int]]] = {}   # channel -> id -> [loc, attempts, at]
    paused: dict[str, bool] = {}
    held: dict[int, list[int]] = {}                   # id -> [loc, attempts, at]
    topic_paused = False

    def write(record: bytes) -> int:
        nonlocal offset
        log.append(record)
        at, offset = offset, offset + len(record)
        return at

    def flush() -> None:
        for msg_id, copy in held.items():
            for pending in channels.values():
                pending[msg_id] = list(copy)
        held.clear()

    for step in steps:
        kind = step[0]
        if kind == "create":
            write(records.channel_op(records.CREATE, step[1]))
            channels.setdefault(step[1], {})
            paused.setdefault(step[1], False)
            if not topic_paused:  # the broker hands what the topic held to its channels
                flush()
        elif kind == "delete":
            write(records.channel_op(records.DELETE, step[1]))
            channels.pop(step[1], None)
            paused.pop(step[1], None)
        elif kind == "pub":
            msg_id = len(ids) + 1
            ids.append(msg_id)
            loc = location(SEG, write(records.pub(msg_id, msg_id, step[2], step[1], b"x")))
            if step[1]:
                held[msg_id] = [loc, 0, step[2]]
            else:
                for pending in channels.values():
                    pending[msg_id] = [loc, 0, step[2]]
        elif kind == "batch":
            new = list(range(len(ids) + 1, len(ids) + 1 + len(step[2])))
            if step[3]:
                new.reverse()
            ids += new
            at = location(SEG, write(records.batch(
                [f"{i:016x}" for i in new], new, [b"x"] * len(new),
                step[2] if any(step[2]) else None, None, step[1])))
            for i, (msg_id, deliver_at) in enumerate(zip(new, step[2])):
                for pending in [held] if step[1] else channels.values():
                    pending[msg_id] = [at + i, 0, deliver_at]
        elif kind == "fin" and ids:
            msg_id = ids[step[2] % len(ids)]
            write(records.fins(step[1], [msg_id])[0])
            channels.get(step[1], {}).pop(msg_id, None)
        elif kind == "attempts" and ids:
            msg_id = ids[step[2] % len(ids)]
            write(records.attempts(step[1], [(msg_id, step[3])])[0])
            if msg_id in channels.get(step[1], {}):
                channels[step[1]][msg_id][1] = step[3]
        elif kind == "defer" and ids:
            msg_id = ids[step[2] % len(ids)]
            write(records.defer(step[1], msg_id, step[3], step[4]))
            if msg_id in channels.get(step[1], {}):
                channels[step[1]][msg_id][1:] = [step[4], step[3]]
        elif kind == "flush":
            write(records.flush())
            flush()
        elif kind == "empty":
            write(records.empty(step[1]))
            (held if not step[1] else channels.get(step[1], {})).clear()
        elif kind == "pause":
            write(records.channel_op(records.PAUSE if step[2] else records.UNPAUSE, step[1]))
            if step[1] in paused:
                paused[step[1]] = step[2]
        elif kind == "topic":
            write(records.topic_op(records.PAUSE if step[1] else records.UNPAUSE))
            topic_paused = step[1]
            if not topic_paused and channels:
                flush()

    replay = Replay("t")
    for record in records.scan(b"".join(log), "t"):
        replay.read(SEG, record)
    assert sorted(replay.channels) == sorted(channels)
    assert replay.paused == paused and replay.topic_paused == topic_paused
    assert replay.max_id == len(ids)
    for name, pending in channels.items():
        assert list(replay.pending(name)) == sorted(tuple(v) for v in pending.values())
    assert list(replay.pending(None)) == sorted(tuple(v) for v in held.values())
    copies = sum(map(len, channels.values())) + len(held)
    assert replay.count() == copies
    assert replay.copies_per_segment() == ({SEG: copies} if copies else {})


def test_a_segment_state_drops_channels_it_does_not_name_and_sets_paused_states():
    replay = Replay("t")
    first = [records.channel_op(records.CREATE, "gone"),
             records.channel_op(records.CREATE, "kept"), records.pub(1, 1, 0, False, b"x")]
    for record in scanned(*first):
        replay.read(1, record)
    state = records.state(True, {"kept": True, "new": False})
    for record in scanned(state, records.pub(2, 2, 0, False, b"y")):
        replay.read(2, record)
    assert sorted(replay.channels) == ["kept", "new"]
    assert (replay.topic_paused, replay.paused) == (True, {"kept": True, "new": False})
    first_pub, second_pub = location(1, len(first[0]) + len(first[1])), location(2, len(state))
    assert [loc for loc, _, _ in replay.pending("kept")] == [first_pub, second_pub]
    assert [loc for loc, _, _ in replay.pending("new")] == [second_pub]


def test_a_move_puts_a_copy_in_exactly_the_channels_it_names_with_their_times():
    replay = Replay("t")
    log = [records.channel_op(records.CREATE, "a"), records.channel_op(records.CREATE, "b"),
           records.move(9, 1, [("a", 4, 70), ("", 2, 50), ("deleted", 1, 0)], b"m")]
    for record in scanned(*log):
        replay.read(5, record)
    loc = location(5, len(log[0]) + len(log[1]))
    assert list(replay.pending("a")) == [(loc, 4, 70)]
    assert list(replay.pending("b")) == []
    assert list(replay.pending(None)) == [(loc, 2, 50)]
    replay.read(5, scanned(records.flush())[0])     # the held copy keeps its time in each channel
    assert list(replay.pending("a")) == [(loc, 2, 50)]
    assert list(replay.pending("b")) == [(loc, 2, 50)]
    assert (replay.max_id, replay.count()) == (9, 2)


def test_dedupe_entries_and_the_latest_config_of_each_channel_are_kept():
    replay = Replay("t")
    for record in scanned(records.channel_op(records.CREATE, "a"), records.dedupe(b"e1"),
                          records.config("a", b"{1}"), records.config("a", b"{2}"),
                          records.config("", b"{t}"), records.dedupe(b"e2")):
        replay.read(4, record)
    assert replay.dedupe == [(4, b"e1"), (4, b"e2")]
    assert replay.config == {"a": b"{2}", "": b"{t}"}
    replay.read(4, scanned(records.channel_op(records.DELETE, "a"))[0])
    assert replay.config == {"": b"{t}"}


def test_a_publish_encoded_in_one_pass_is_byte_for_byte_one_pub_record_per_message():
    ids = [f"{n:016x}" for n in range(0x1234_5678_9abc_def0, 0x1234_5678_9abc_def0 + 6)]
    stamps = [1_000 + i for i in range(6)]
    bodies = [bytes([65 + i]) * (i + 1) for i in range(6)]
    deliver_ats = [0, 5_000, 0, 0, 7_000, 0]
    expiries = [0, 0, 9_000, 0, 9_500, 0]
    for held in (False, True):
        data, starts = records.pubs(ids, stamps, bodies, deliver_ats, expiries, held)
        one_by_one = [records.pub(int(i, 16), ts, at, held, body, expires=exp)
                      for i, ts, body, at, exp in zip(ids, stamps, bodies, deliver_ats, expiries)]
        assert data == b"".join(one_by_one)
        assert starts == [sum(len(r) for r in one_by_one[:k]) for k in range(6)]


@pytest.mark.parametrize("count", [1, 3])
def test_a_publish_made_under_a_key_is_byte_for_byte_the_publish_sealed_with_it(count):
    raw = raw_id_run(0x1234_5678_9abc_def0, count)
    bodies = [bytes([65 + i]) * (i + 1) for i in range(count)]
    key = records.new_key()
    plain, starts = records.publish(raw, 1_000, bodies, None, [9_000] * count, False)
    keyed, keyed_starts = records.publish(raw, 1_000, bodies, None, [9_000] * count, False,
                                          key)
    assert keyed == records.seal(plain, key) and keyed_starts == starts
    assert records.dedupe(b"entry", key) == records.seal(records.dedupe(b"entry"), key)
    assert [r.kind for r in records.scan(keyed, "log", key=key)] == (
        [records.PUB] if count == 1 else [records.BATCH])


def test_a_publish_to_a_log_that_rolls_to_a_new_file_is_checked_under_the_new_files_key(
        tmp_path):
    topic_log = segments.TopicLog(tmp_path, 1024, fileops.current, lambda: b"")
    topic_log.start_appending()
    first_key = topic_log.key
    locs = []
    for i in range(40):  # 40 PUBs of 100 B: past 1 KiB, the log rolls on
        raw = raw_id_run(1_000 + i, 1)
        data, _ = records.publish(raw, i, [bytes([i]) * 100], None, None, False,
                                  topic_log.key)
        locs.append(topic_log.append(data, raw, topic_log.key))
    assert topic_log.key != first_key and segments.segment_of(locs[-1]) > 1
    msgs = topic_log.read_many(locs)
    assert [m.body for m in msgs] == [bytes([i]) * 100 for i in range(40)]
    topic_log.close()


def test_replay_time_grows_with_the_log_not_with_deletes_times_backlog():
    # 20,000 pending messages, then 1,000 channels made and deleted (and as many EMPTYs):
    # a replay that walked every slot at each would take 2,000 x 20,000 steps.
    import time

    def replay_of(cycles: int) -> float:
        replay = Replay("t")
        head = scanned(records.channel_op(records.CREATE, "work"),
                       *(records.pub(i, i, 0, False, b"x") for i in range(1, 20_001)))
        churn = scanned(*(op for _ in range(cycles) for op in (
            records.channel_op(records.CREATE, "tmp"), records.empty("tmp"),
            records.channel_op(records.DELETE, "tmp"))))
        started = time.perf_counter()
        for record in head + churn:
            replay.read(1, record)
        assert replay.count() == 20_000 and len(list(replay.pending("work"))) == 20_000
        return time.perf_counter() - started

    without = min(replay_of(0) for _ in range(3))
    with_churn = min(replay_of(1_000) for _ in range(3))
    assert with_churn < 3 * without + 0.05


def test_a_publish_past_the_largest_record_is_split_into_batches_that_each_fit(monkeypatch):
    monkeypatch.setattr(records, "MAX_PAYLOAD", 1_000)
    ids = [f"{(1 << 50) + 1024 * i:016x}" for i in range(41)]
    bodies = [bytes([65 + i % 26]) * (60 + i) for i in range(41)]
    data, batches = records.publish(ids, list(range(41)), bodies, None, [7] * 41, False)
    found = scanned(records.channel_op(records.CREATE, "c"), data)[2:]
    assert len(found) > 3 and all(len(r.payload) <= 1_000 for r in found)
    at = len(records.channel_op(records.CREATE, "c"))
    assert [(r.offset - at, len(r.batch()) if r.kind == records.BATCH else 1)
            for r in found] == batches
    assert sum(n for _, n in batches) == 41
    log = records.channel_op(records.CREATE, "c") + data
    replay = replayed(log)
    locs = [loc for loc, _, _ in replay.pending("c")]
    assert [(m.id, m.body, m.timestamp, m.expires)
            for m in reader_of(log, replay).messages(locs)] == [
        (i, body, n, 7) for n, (i, body) in enumerate(zip(ids, bodies))]
    assert records.publish(ids[:1], [0], bodies[:1], None, None, True) == (
        records.pub(int(ids[0], 16), 0, 0, True, bodies[0]), [(0, 1)])


@settings(max_examples=50, deadline=None)
@given(st.integers(0, (1 << 54) - 300), st.integers(1, 40), st.integers(0, 1 << 62),
       st.booleans(), st.booleans())
def test_a_publish_given_as_columns_writes_the_same_bytes_as_given_message_by_message(
        sequence, count, stamp, expiring, held):
    """The broker hands storage an MPUB's ids as raw bytes and one publish time; the log
    gets byte for byte what the ids in hex and a time per message make (what logs hold)."""
    first = sequence << 10 | 7
    bodies = [b"m%d" % i for i in range(count)]
    expires = [stamp + i for i in range(count)] if expiring else None
    assert records.publish(raw_id_run(first, count), stamp, bodies, None, expires, held) == \
        records.publish(id_run(first, count), [stamp] * count, bodies, None, expires, held)


# A log of PUB, MOVE and BATCH records (each message with or without an expiry), some of
# them damaged; then locations to read, in any order, runs and repeats included.
_message = st.tuples(st.binary(min_size=1, max_size=40), st.integers(0, 3))
_record = st.one_of(
    st.tuples(st.just(records.PUB), st.lists(_message, min_size=1, max_size=1), st.booleans()),
    st.tuples(st.just(records.MOVE), st.lists(_message, min_size=1, max_size=1), st.booleans()),
    st.tuples(st.just(records.BATCH), st.lists(_message, min_size=2, max_size=30),
              st.booleans()))


@settings(max_examples=150, deadline=None)
@given(st.lists(_record, min_size=1, max_size=12), st.data())
def test_a_reader_reads_any_locations_in_bulk_as_each_one_alone_reads_as_written(log, data):
    parts = [records.channel_op(records.CREATE, "c")]
    intact_parts, written, damaged_locs = list(parts), {}, set()
    at, next_id = len(parts[0]), 1
    for kind, messages, damaged in log:
        ids = [f"{n << 10:016x}" for n in range(next_id, next_id + len(messages))]
        next_id += len(messages)
        stamps = [1_000 + int(i, 16) for i in ids]
        bodies = [body for body, _ in messages]
        if data.draw(st.booleans(), label="bodies all as long"):
            bodies = [(body * 40)[:len(bodies[0])] for body in bodies]
        expires = [e * 1_000_000 for _, e in messages]
        if kind == records.PUB:
            record = records.pub(int(ids[0], 16), stamps[0], 0, False, bodies[0], expires[0])
        elif kind == records.MOVE:
            record = records.move(int(ids[0], 16), stamps[0], [("c", 2, 0)], bodies[0],
                                  expires[0])
        else:
            record = records.batch(ids, stamps, bodies, None,
                                   expires if any(expires) else None, False)
        locs = [location(1, at + i) for i in range(len(messages))]
        written.update(zip(locs, zip(ids, stamps, bodies, expires, locs)))
        intact_parts.append(record)
        if damaged:  # its last byte flipped: each of its messages reads as None
            record = record[:-1] + bytes((record[-1] ^ 0xFF,))
            damaged_locs.update(locs)
        parts.append(record)
        at += len(record)
    log_bytes = b"".join(parts)
    index = replayed(b"".join(intact_parts))    # the batches as they were written
    everything = sorted(written)
    # Runs of neighbours (as a read-ahead asks), single ones, and repeats, in any order.
    locs = data.draw(st.lists(st.one_of(
        st.sampled_from(everything).map(lambda loc: [loc]),
        st.tuples(st.integers(0, len(everything) - 1), st.integers(1, 40)).map(
            lambda run: everything[run[0]:run[0] + run[1]])), max_size=12).map(
        lambda runs: [loc for run in runs for loc in run]), label="locations")
    expected = [None if loc in damaged_locs else written[loc] for loc in locs]
    block = data.draw(st.sampled_from([64, 512, segments.READ_AHEAD]), label="read-ahead")
    saved, segments.READ_AHEAD = segments.READ_AHEAD, block
    try:
        bulk = read(log_bytes, index, array("q", locs))
        alone = [read(log_bytes, index, [loc])[0] for loc in locs]
    finally:
        segments.READ_AHEAD = saved
    assert bulk == expected
    assert alone == expected

def test_a_log_file_takes_a_record_ending_at_max_bytes_per_file_and_rolls_for_one_past_it(
        tmp_path):
    """--max-bytes-per-file at its edge: a record that ends exactly at it goes in the file,
    one that would end a byte past it starts the next file."""
    for past, segment in ((0, 1), (1, 2)):
        directory = tmp_path / str(past)
        topic_log = segments.TopicLog(directory, 1024, fileops.current, lambda: b"")
        topic_log.start_appending()

        def publish(i: int, size: int) -> tuple[int, int]:
            raw = raw_id_run(1_000 + i, 1)
            data, _ = records.publish(raw, i, [b"x" * size], None, None, False,
                                      topic_log.key)
            return topic_log.append(data, raw, topic_log.key), len(data)

        _, first = publish(0, 100)
        overhead, room = first - 100, 1024 - topic_log.sizes[1]
        loc, size = publish(1, room - overhead + past)
        assert size == room + past
        assert segments.segment_of(loc) == segment
        if not past:
            assert (directory / "00000001.log").stat().st_size == 1024
        topic_log.close()


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=3000), st.integers(0, 2**32 - 1))
def test_the_logs_checksum_is_zlibs_crc32_computed_by_zlib_ng(data, seed):
    """Every record's check is zlib's CRC-32 (so logs written before read as before),
    computed by zlib-ng (the speed a publish and a read-back take)."""
    import zlib

    from zlib_ng import zlib_ng

    from broker.storage import checksum

    assert checksum.crc32 is zlib_ng.crc32
    assert checksum.crc32(data, seed) == zlib.crc32(data, seed)
    assert checksum.crc32(memoryview(data)[1:], seed) == zlib.crc32(data[1:], seed)
    assert records.encode(records.FIN, data) == (
        records.HEADER.pack(records.MAGIC, records.FIN, len(data),
                            zlib.crc32(data, zlib.crc32(bytes((records.FIN,))))) + data)


@pytest.mark.parametrize("stamps", [[5_000] * 5, [5_000] * 4 + [5_001], [4_999] + [5_000] * 4])
def test_messages_of_a_batch_read_back_with_each_ones_publish_time_one_number_when_shared(
        stamps):
    """An MPUB's messages share their publish time: read back, they share one number (no
    object each, in memory while they wait); a batch whose times differ anywhere gives
    each its own."""
    head = records.channel_op(records.CREATE, "c")
    data = head + records.batch(IDS, stamps[0] if len(set(stamps)) == 1 else stamps, BODIES,
                                None, None, False)
    replay = replayed(data)
    msgs = reader_of(data, replay).messages([location(1, len(head) + i) for i in range(5)])
    assert [m.timestamp for m in msgs] == stamps
    assert [m.id for m in msgs] == IDS and [m.body for m in msgs] == BODIES
    assert len({id(m.timestamp) for m in msgs}) == (1 if len(set(stamps)) == 1 else 5)
