"""Topic and channel names: ``^[.a-zA-Z0-9_-]+(#ephemeral)?$``, 1 to 64 characters."""

from __future__ import annotations

import re

from .errors import InvalidChannel, InvalidTopic

EPHEMERAL_SUFFIX = "#ephemeral"
_NAME = re.compile(r"[.a-zA-Z0-9_-]+(#ephemeral)?")


def is_valid_name(name: str) -> bool:
    # fullmatch: "$" would also match before a trailing newline ("abc\n").
    return 1 <= len(name) <= 64 and _NAME.fullmatch(name) is not None


def is_ephemeral(name: str) -> bool:
    return name.endswith(EPHEMERAL_SUFFIX)


def check_topic_name(name: str) -> str:
    if not is_valid_name(name):
        raise InvalidTopic(f"invalid topic name {name!r}: use 1-64 characters of "
                           f"[.a-zA-Z0-9_-], optionally ending in #ephemeral")
    return name


def check_channel_name(name: str) -> str:
    if not is_valid_name(name):
        raise InvalidChannel(f"invalid channel name {name!r}: use 1-64 characters of "
                             f"[.a-zA-Z0-9_-], optionally ending in #ephemeral")
    return name
