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
