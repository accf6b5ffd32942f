"""Client strings made safe for the operator's log and ``/stats`` text.

A client chooses its IDENTIFY fields, its user agent, the names it sends and the
paths it asks for. Written as given, a newline followed by ``[pynsqd] ... WARNING:``
is a whole forged line in the broker's log, and ANSI or bidi controls rewrite what
a terminal shows. ``printable`` escapes every character that is not printable
(control characters, line and paragraph separators, bidi controls) and the
backslash, as Python's ``\\xNN`` / ``\\uNNNN`` escapes, and cuts the text at
``limit`` characters: one client string is part of one line, and reads unambiguously.
"""

from __future__ import annotations

import re

#: Most characters of one client string in a log line or /stats text.
MAX_LOGGED = 256

_UNSAFE = re.compile("[\\\\\x00-\x1f\x7f-\x9f\u00ad\u061c\u200b-\u200f\u2028-\u202e"
                     "\u2060-\u206f\ufeff\ufff9-\ufffb\ud800-\udfff]")


def _escape(match: re.Match) -> str:
    c = match.group()
    if c == "\\":
        return "\\\\"
    code = ord(c)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: object, limit: int = MAX_LOGGED) -> str:
    """``text`` as one safe piece of a line: escaped, and cut at ``limit`` characters
    (saying how many more there were)."""
    text = text if isinstance(text, str) else str(text)
    more = len(text) - limit
    if more > 0:
        text = text[:limit]
    text = _UNSAFE.sub(_escape, text)
    return f"{text}...({more} more)" if more > 0 else text
