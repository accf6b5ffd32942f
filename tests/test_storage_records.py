"""The topic log's records and what recovery reads from them, byte by byte, with no file.

Each record kind round-trips through ``records.scan``; damage is skipped and the
scan resynchronises on the next valid record; a block cut mid-record leaves the
rest for the next block. ``Replay`` (what a log says is pending where) is checked
against a plain model over random sequences of records.
"""

from __future__ import annotations

import logging
import struct

from hypothesis import given, settings, strategies as st

from broker.storage import records
from broker.storage.replay import Replay
from broker.storage.segments import location


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


def test_pubs_in_reads_bodies_and_expiries_by_location_up_to_a_cut_record():
    first = records.pub(1, 100, 0, False, b"one")
    second = records.pub(2, 200, 0, False, b"two", expires=999)
    fin = records.fins("c", [1])[0]
    moved = records.move(3, 300, [("c", 1, 0)], b"three", expires=5)
    cut = records.pub(4, 400, 0, False, b"four")[:-1]
    block = first + second + fin + moved + cut
    base = 1 << 40
    assert records.pubs_in(block, base) == {
        base: (1, 100, b"one", 0),
        base + len(first): (2, 200, b"two", 999),
        base + len(first) + len(second) + len(fin): (3, 300, b"three", 5)}


def test_pubs_in_stops_at_a_damaged_record():
    first = records.pub(1, 100, 0, False, b"one")
    damaged = bytearray(records.pub(2, 200, 0, False, b"two"))
    damaged[-1] ^= 0xFF
    moved = bytearray(records.move(3, 300, [("c", 1, 0)], b"three"))
    moved[-1] ^= 0xFF
    assert records.pubs_in(first + bytes(damaged) + first, 0) == {0: (1, 100, b"one", 0)}
    assert records.pubs_in(first + bytes(moved), 0) == {0: (1, 100, b"one", 0)}
    assert records.pubs_in(b"\x00" * 66 + first, 0) == {}         # bad magic: no resync
    assert records.pubs_in(first, 0) == {0: (1, 100, b"one", 0)}  # ends with the block
    assert records.pubs_in(first + records.MAGIC + b"\x01", 0) == {0: (1, 100, b"one", 0)}


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
