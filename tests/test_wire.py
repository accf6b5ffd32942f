"""NSQ's V2 wire as pure functions of bytes, tested byte by byte without a socket."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.errors import BodyTooBig, InvalidBody, InvalidMessage, MessageTooBig
from broker.message import Message
from broker.server import wire
from broker.server.wire import Incomplete, LineTooLong

LIMITS = {"max_msg_size": 100, "max_body_size": 1000}


def sized(body: bytes) -> bytes:
    return struct.pack(">i", len(body)) + body


def mpub(*bodies: bytes) -> bytes:
    return struct.pack(">i", len(bodies)) + b"".join(sized(b) for b in bodies)


def test_a_command_line_splits_on_single_spaces_and_drops_a_carriage_return():
    assert wire.read_line(b"REQ abc 10\r\nrest", 0) == ([b"REQ", b"abc", b"10"], 12)
    assert wire.read_line(b"\n", 0) == ([b""], 1)
    assert wire.read_line(b"PUB  t\n", 0) == ([b"PUB", b"", b"t"], 7)


def test_a_partial_line_is_incomplete_with_no_error_and_an_overlong_one_is_refused():
    with pytest.raises(Incomplete) as short:
        wire.read_line(b"PUB t", 0)
    assert short.value.error is None
    with pytest.raises(LineTooLong):
        wire.read_line(b"x" * (wire.MAX_LINE + 1), 0)


def test_a_line_after_another_is_read_from_where_it_starts_with_the_limit_counted_from_there():
    first = b"x" * wire.MAX_LINE + b"\n"
    buf = first + b"NOP\n" + b"y" * wire.MAX_LINE + b"\n"
    assert wire.read_line(buf, 0) == ([b"x" * wire.MAX_LINE], len(first))
    assert wire.read_line(buf, len(first)) == ([b"NOP"], len(first) + 4)
    assert wire.read_line(buf, len(first) + 4) == ([b"y" * wire.MAX_LINE], len(buf))


def test_a_message_of_exactly_max_msg_size_is_read():
    body = b"m" * 100
    assert wire.read_message(sized(body), 0, "PUB", max_msg_size=100) == (body, 104)


def test_a_body_that_ends_early_says_which_part_is_missing_once_the_stream_closes():
    with pytest.raises(Incomplete) as size:
        wire.read_body(b"\x00\x00", 0, "AUTH", max_size=100)
    assert size.value.error.message == "AUTH failed to read body size"
    with pytest.raises(Incomplete) as body:
        wire.read_body(struct.pack(">i", 10) + b"abc", 0, "AUTH", max_size=100)
    assert body.value.error.message == "AUTH failed to read body"
    assert isinstance(body.value.error, InvalidBody)


@pytest.mark.parametrize("data, error, text", [
    (b"", InvalidBody, "MPUB failed to read message count"),
    (struct.pack(">i", 0), InvalidBody, "MPUB invalid message count 0"),
    (struct.pack(">i", -1), InvalidBody, "MPUB invalid message count -1"),
    (struct.pack(">i", 200), InvalidBody, "MPUB invalid message count 200"),
    (struct.pack(">i", 1), InvalidMessage, "MPUB failed to read message(0) body size"),
    (mpub(b"a", b""), InvalidMessage, "MPUB invalid message(1) body size 0"),
    (struct.pack(">ii", 1, 101), MessageTooBig, "MPUB message too big 101 > 100"),
    (struct.pack(">ii", 1, 5) + b"abc", InvalidMessage, "MPUB failed to read message body"),
])
def test_a_bad_mpub_body_gets_nsqds_error(data, error, text):
    with pytest.raises(error) as caught:
        wire.parse_mpub(data, **LIMITS)
    assert type(caught.value) is error and caught.value.message == text


def test_mpub_reads_its_messages_and_says_where_it_stopped():
    data = mpub(b"one", b"two\n") + b"NEXT"
    assert wire.read_mpub(data, 0, **LIMITS) == ([b"one", b"two\n"], len(data) - 4)


def test_mpub_cut_short_on_a_stream_is_incomplete_with_the_error_for_its_end():
    data = mpub(b"one", b"two")
    for cut in range(len(data)):
        with pytest.raises(Incomplete) as short:
            wire.read_mpub(data[:cut], 0, **LIMITS)
        assert short.value.error is not None


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(min_size=1, max_size=100), min_size=1, max_size=20))
def test_any_valid_mpub_round_trips(bodies):
    assert wire.parse_mpub(mpub(*bodies), **LIMITS) == bodies


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64))
def test_any_bytes_give_messages_or_a_coded_error_never_a_crash(data):
    try:
        bodies = wire.parse_mpub(data, **LIMITS)
    except (InvalidBody, InvalidMessage) as err:
        assert err.code in ("E_BAD_BODY", "E_BAD_MESSAGE")
    else:
        assert bodies and all(0 < len(b) <= 100 for b in bodies)


@pytest.mark.parametrize("data, error, code", [
    (struct.pack(">i", 0), InvalidMessage, "PUB invalid message body size 0"),
    (struct.pack(">i", -7), InvalidMessage, "PUB invalid message body size -7"),
    (struct.pack(">i", 101), MessageTooBig, "PUB message too big 101 > 100"),
])
def test_a_bad_message_size_is_bad_message_before_the_body_is_read(data, error, code):
    with pytest.raises(error) as caught:
        wire.read_message(data, 0, "PUB", max_msg_size=100)
    assert caught.value.message == code and caught.value.code == "E_BAD_MESSAGE"


def test_a_request_body_over_max_body_size_is_refused_before_it_is_read():
    with pytest.raises(BodyTooBig) as caught:
        wire.read_body(struct.pack(">i", 1001), 0, "IDENTIFY", max_size=1000)
    assert caught.value.code == "E_BAD_BODY"
    assert wire.read_body(sized(b"{}") + b"x", 0, "IDENTIFY", max_size=1000) == (b"{}", 6)


@pytest.mark.parametrize("value, number", [(b"0", 0), (b"", 0), (b"2500", 2500)])
def test_numbers_are_plain_digits_as_nsqd_reads_them(value, number):
    assert wire.base10(value) == number


@pytest.mark.parametrize("value", [b"-1", b"+5", b" 5", b"5 ", b"1_0", b"x", "٣".encode()])
def test_anything_but_plain_digits_is_not_a_number(value):
    with pytest.raises(ValueError):
        wire.base10(value)


def test_frames_are_nsqds_layout():
    assert wire.frame(0, b"OK") == b"\x00\x00\x00\x06\x00\x00\x00\x00OK"
    data = wire.message_frame("0123456789abcdef", b"body", 7, 2)
    assert data == struct.pack(">iiqH", 34, 2, 7, 2) + b"0123456789abcdefbody"
    assert wire.error_frame(InvalidBody("MPUB invalid body size 0"))[8:] == \
        b"E_BAD_BODY MPUB invalid body size 0"


def test_a_batch_of_messages_is_framed_as_each_would_be_alone():
    msgs = [Message(f"{i:016x}", b"b" * i, 1_000 + i, i) for i in range(1, 4)]
    out: list[bytes] = []
    added = wire.add_message_frames(out, msgs)
    data = b"".join(out)
    assert data == b"".join(wire.message_frame(m.id, m.body, m.timestamp, m.attempts)
                            for m in msgs)
    assert added == len(data) == sum(len(m.body) + wire.MESSAGE_OVERHEAD for m in msgs)
    frames, used = wire.split_frames(data)
    assert used == len(data) and [kind for kind, _ in frames] == [wire.FRAME_MESSAGE] * 3


def test_frames_split_whole_and_leave_a_partial_one():
    data = wire.frame(0, b"OK") + wire.frame(1, b"E_INVALID x")
    assert wire.split_frames(data + data[:5]) == ([(0, b"OK"), (1, b"E_INVALID x")], len(data))
    assert wire.split_frames(b"\x00\x00") == ([], 0)


def test_fin_lines_in_a_row_are_read_at_once_up_to_the_first_other_thing():
    data = b"FIN 0123456789abcdef\nFIN 00000000000000ff\nRDY 10\nFIN 0123456789abcdef\n"
    assert wire.read_fins(data, 0) == (["0123456789abcdef", "00000000000000ff"], 42)
    assert wire.read_fins(data, 42) == ([], 42)
    assert wire.read_fins(bytearray(data), 49) == (["0123456789abcdef"], len(data))


@pytest.mark.parametrize("data", [
    b"FIN 0123456789abcdef\r\n",   # a carriage return: read_line drops it
    b"FIN 0123456789ABCDEF\n",     # not an id the broker makes: read_line reports it
    b"FIN 0123456789abcde\n",      # too short
    b"FIN 0123456789abcdef",       # not complete yet
    b"FIN  0123456789abcdef\n",
])
def test_a_fin_in_any_other_form_is_left_to_read_line(data):
    assert wire.read_fins(data, 0) == ([], 0)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(min_size=16, max_size=16), max_size=5), st.binary(max_size=30))
def test_fins_read_at_once_are_what_read_line_reads_one_by_one(ids, rest):
    data = b"".join(b"FIN " + i + b"\n" for i in ids) + rest
    fins, pos = wire.read_fins(data, 0)
    one_by_one, at = [], 0
    while at < pos:
        params, at = wire.read_line(data, at)
        assert params[0] == b"FIN"
        one_by_one.append(wire.message_id(params[1]))
    assert (fins, at) == (one_by_one, pos)
