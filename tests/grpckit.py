"""Helpers for the gRPC tests: reading from several consumers, channel stats."""

from __future__ import annotations

import time


def collect(subs: list, n: int, *, fin: bool = True,
            timeout: float = 10.0) -> list[tuple[int, object]]:
    """Read ``n`` messages from any of ``subs``: (index of the sub, message)."""
    got = []
    deadline = time.monotonic() + timeout
    while len(got) < n:
        assert time.monotonic() < deadline, f"received {len(got)} of {n} messages"
        for i, sub in enumerate(subs):
            msg = sub.get(timeout=0.02)
            if msg is not None:
                got.append((i, msg))
                if fin:
                    sub.fin(msg.id)
    return got


def channel_stats(client, topic: str, channel: str):
    [t] = client.stats(topic, channel).topics
    [c] = t.channels
    return c


SENTINEL_ID = "ffffffffffffffff"


def so_far(sub) -> tuple[list, list]:
    """(messages, errors) that reached ``sub`` and were not read yet, up to now.

    A FIN of an unknown id is answered with an error frame, and the broker sends a
    stream's frames in order: once that sentinel error is here, whatever the broker
    sent before it is here too. So ``so_far(sub) == ([], [])`` proves that nothing
    arrived, where a short wait would only hope it.
    """
    sub.fin(SENTINEL_ID)
    errors = []
    while True:
        error = sub.error(timeout=10)
        assert error is not None, "the sentinel FIN was not answered"
        if error.id == SENTINEL_ID:
            break
        errors.append(error)
    messages = []
    while (msg := sub.get(timeout=0)) is not None:
        messages.append(msg)
    return messages, errors


def drain(client, sub, topic: str, channel: str, *, fin: bool = True,
          timeout: float = 60.0) -> dict[str, bytes]:
    """id -> body of everything ``channel`` has ready, read through ``sub`` (FINed unless
    told otherwise) until its stats show nothing ready and nothing arrived unread.

    No quiet period stands in for "nothing more": after ``so_far`` (which also waits for
    the FINs sent before it) finds nothing new, the channel's depth says whether more is
    to come. Deferred messages are left where they are.
    """
    got: dict[str, bytes] = {}

    def take(msg) -> None:
        got[msg.id] = msg.body
        if fin:
            sub.fin(msg.id)

    deadline = time.monotonic() + timeout
    while True:
        assert time.monotonic() < deadline, f"{topic}/{channel}: still ready after {len(got)}"
        while (msg := sub.get(timeout=0.05)) is not None:
            take(msg)
        messages, _ = so_far(sub)
        for msg in messages:
            take(msg)
        if messages:
            continue
        stats = channel_stats(client, topic, channel)
        if stats.depth == 0 and stats.in_flight_count == (0 if fin else len(got)):
            return got
