"""NSQ's V2 wire, as pure functions of bytes: no sockets, no broker.

A client sends ``"  V2"``, then newline-terminated command lines, some followed
by a big-endian int32 size and a body. An MPUB body is ``[int32 count]`` then
``count`` times ``[int32 size][bytes]``. The broker answers with frames
``[int32 size][int32 type][data]``.

Readers take a buffer and a position and return what they read with the
position after it. When the buffer ends too early they raise ``Incomplete``,
which carries the error nsqd answers if the stream really ends there (none for
a partial command line: nsqd just closes). Errors name what was wrong and carry
nsqd's code (``E_BAD_BODY``, ``E_BAD_MESSAGE``, ...).
"""

from __future__ import annotations

import re
import struct

from ..errors import BodyTooBig, BrokerError, InvalidBody, InvalidMessage, MessageTooBig

MAGIC_V2 = b"  V2"
FRAME_RESPONSE, FRAME_ERROR, FRAME_MESSAGE = 0, 1, 2
FRAME_HEAD = struct.Struct(">ii")
MESSAGE_HEAD = struct.Struct(">iiqH")   # size, type, timestamp, attempts
SIZE = struct.Struct(">i")
MSG_ID_LENGTH = 16
#: What a MSG frame adds to its body: size, type, timestamp, attempts and id.
MESSAGE_OVERHEAD = MESSAGE_HEAD.size + MSG_ID_LENGTH
#: nsqd reads a command line through a 16 KiB buffer; a longer line ends the connection.
MAX_LINE = 16 * 1024
# FIN lines in the form clients send them, one after another (read in one match;
# possessive: nothing to give back, so the engine keeps no state to backtrack to).
_FINS = re.compile(rb"(?:FIN [0-9a-f]{16}+\n)++")


class Incomplete(Exception):
    """The buffer ends inside a command; ``error`` is nsqd's answer if the stream ends here."""

    def __init__(self, error: BrokerError | None = None) -> None:
        super().__init__(str(error) if error else "incomplete")
        self.error = error


class LineTooLong(Exception):
    """A command line longer than ``MAX_LINE``: nsqd closes the connection without a word."""


def frame(kind: int, data: bytes) -> bytes:
    return FRAME_HEAD.pack(len(data) + 4, kind) + data


def message_frame(msg_id: str, body: bytes, timestamp: int, attempts: int) -> bytes:
    """A MSG frame: ``MESSAGE_OVERHEAD`` bytes more than the body."""
    return (MESSAGE_HEAD.pack(len(body) + 30, FRAME_MESSAGE, timestamp, attempts)
            + msg_id.encode() + body)


def add_message_frames(out: list[bytes], msgs) -> int:
    """Append the MSG frames of ``msgs`` (objects with ``id``, ``body``, ``timestamp`` and
    ``attempts``) to ``out`` as (head, id, body) parts, to be joined once per write;
    returns the bytes added."""
    pack = MESSAGE_HEAD.pack
    size = 0
    for msg in msgs:
        body = msg.body
        out += (pack(len(body) + 30, FRAME_MESSAGE, msg.timestamp, msg.attempts),
                msg.id.encode(), body)
        size += len(body)
    return size + MESSAGE_OVERHEAD * len(msgs)


def error_frame(err: BrokerError) -> bytes:
    return frame(FRAME_ERROR, f"{err.code} {err.message}".encode(errors="replace"))


def split_frames(buf: bytes | bytearray) -> tuple[list[tuple[int, bytes]], int]:
    """The whole frames at the start of ``buf`` as (type, data), and how many bytes
    they take (what a client reads from the broker)."""
    frames, pos = [], 0
    while len(buf) - pos >= 8:
        size, kind = FRAME_HEAD.unpack_from(buf, pos)
        if len(buf) - pos < 4 + size:
            break
        frames.append((kind, bytes(buf[pos + 8:pos + 4 + size])))
        pos += 4 + size
    return frames, pos


def read_line(buf: bytes | bytearray, pos: int) -> tuple[list[bytes], int]:
    """The parameters of the command line at ``pos`` (split on single spaces, a
    trailing ``\\r`` dropped, as nsqd does) and where the next thing starts."""
    end = buf.find(b"\n", pos)
    if end < 0:
        if len(buf) - pos > MAX_LINE:
            raise LineTooLong()
        raise Incomplete(None)
    if end - pos > MAX_LINE:
        raise LineTooLong()
    line = bytes(buf[pos:end])
    if line.endswith(b"\r"):
        line = line[:-1]
    return line.split(b" "), end + 1


def read_fins(buf: bytes | bytearray, pos: int) -> tuple[list[str], int]:
    """The ids of the FIN lines at ``pos`` in their usual form (``FIN <16 hex>\\n``,
    as many as follow one another) and where the next thing starts. No ids (and
    ``pos``) when something else comes first: ``read_line`` reads that, a FIN in
    another form included. A consumer FINs every message, so this is the one
    command read without splitting a line."""
    match = _FINS.match(buf, pos)
    if match is None:
        return [], pos
    end = match.end()
    # "FIN a\nFIN b\n" -> "a\nFIN b" -> [a, b]
    return buf[pos + 4:end - 1].decode("ascii").split("\nFIN "), end


def read_size(buf: bytes | bytearray, pos: int, missing: BrokerError) -> tuple[int, int]:
    """The int32 at ``pos``; ``missing`` is the error if the stream ends before it."""
    if len(buf) < pos + 4:
        raise Incomplete(missing)
    return SIZE.unpack_from(buf, pos)[0], pos + 4


def read_bytes(buf: bytes | bytearray, pos: int, size: int,
               missing: BrokerError) -> tuple[bytes, int]:
    if len(buf) < pos + size:
        raise Incomplete(missing)
    return bytes(buf[pos:pos + size]), pos + size


def read_body(buf: bytes | bytearray, pos: int, command: str, *, max_size: int,
              body_error: type[BrokerError] = InvalidBody) -> tuple[bytes, int]:
    """A size-prefixed request body (IDENTIFY, AUTH): size checked against ``max_size``."""
    size, pos = read_size(buf, pos, body_error(f"{command} failed to read body size"))
    if size > max_size:
        raise BodyTooBig(f"{command} body too big {size} > {max_size}")
    if size <= 0:
        raise body_error(f"{command} invalid body size {size}")
    return read_bytes(buf, pos, size, body_error(f"{command} failed to read body"))


def read_message(buf: bytes | bytearray, pos: int, command: str, *,
                 max_msg_size: int) -> tuple[bytes, int]:
    """A size-prefixed message body (PUB, DPUB), with nsqd's checks and errors."""
    size, pos = read_size(buf, pos, InvalidMessage(f"{command} failed to read message body size"))
    if size <= 0:
        raise InvalidMessage(f"{command} invalid message body size {size}")
    if size > max_msg_size:
        raise MessageTooBig(f"{command} message too big {size} > {max_msg_size}")
    return read_bytes(buf, pos, size, InvalidMessage(f"{command} failed to read message body"))


def read_mpub(buf: bytes | bytearray, pos: int, *, max_msg_size: int,
              max_body_size: int) -> tuple[list[bytes], int]:
    """The messages of an MPUB body at ``pos`` (``[count]`` then ``[size][bytes]``
    each), checked as nsqd checks them. Used for TCP MPUB and HTTP binary /mpub."""
    count, pos = read_size(buf, pos, InvalidBody("MPUB failed to read message count"))
    max_messages = (max_body_size - 4) // 5   # 4: the count; 5: a size and one byte
    if count <= 0 or count > max_messages:
        raise InvalidBody(f"MPUB invalid message count {count}")
    bodies: list[bytes] = []
    append, unpack, end = bodies.append, SIZE.unpack_from, len(buf)
    # This loop runs once per published message: errors are built only when met, behind
    # one test that a valid body passes; a view copies each body once (bytes of a slice
    # of a bytearray would copy it twice).
    with memoryview(buf) as view:
        for i in range(count):
            if end < pos + 4:
                raise Incomplete(InvalidMessage(f"MPUB failed to read message({i}) body size"))
            size = unpack(buf, pos)[0]
            pos += 4
            stop = pos + size
            if not 0 < size <= max_msg_size or end < stop:
                if size <= 0:
                    raise InvalidMessage(f"MPUB invalid message({i}) body size {size}")
                if size > max_msg_size:
                    raise MessageTooBig(f"MPUB message too big {size} > {max_msg_size}")
                raise Incomplete(InvalidMessage("MPUB failed to read message body"))
            append(view[pos:stop].tobytes())
            pos = stop
    return bodies, pos


def parse_mpub(body: bytes, *, max_msg_size: int, max_body_size: int) -> list[bytes]:
    """A whole MPUB body (HTTP ``/mpub?binary=true``): a body that ends early is an error."""
    try:
        return read_mpub(body, 0, max_msg_size=max_msg_size, max_body_size=max_body_size)[0]
    except Incomplete as short:
        assert short.error is not None
        raise short.error from None


def base10(value: bytes) -> int:
    """nsqd's ``ByteToBase10``: ASCII digits only (no sign, no spaces); empty is 0."""
    if value and not value.isdigit():
        raise ValueError(f"not a number: {value!r}")
    return int(value) if value else 0


def message_id(value: bytes) -> str:
    """A message id parameter: exactly 16 bytes, as nsqd requires."""
    if len(value) != MSG_ID_LENGTH:
        raise ValueError("invalid message ID")
    return value.decode(errors="replace")
