"""Under load: 4 producers and 4 consumers over 2 channels, 100k messages,
every message FINed exactly once per channel."""

from __future__ import annotations

import threading
from collections import Counter

from .helpers import wait_for
from .grpckit import channel_stats

PRODUCERS, MESSAGES, BATCH = 4, 100_000, 1000
CHANNELS, CONSUMERS_PER_CHANNEL, RDY = ("a", "b"), 2, 500


def consume(client, channel: str, seen: Counter, stop: threading.Event, errors: list) -> None:
    with client.subscribe("load", channel, rdy=RDY) as sub:
        while not stop.is_set():
            msg = sub.get(timeout=0.1)
            if msg is None:
                continue
            batch = [msg.id]
            while len(batch) < RDY // 2 and (more := sub.get(timeout=0)) is not None:
                batch.append(more.id)
            seen.update(batch)
            sub.fin(*batch)
        while (error := sub.error(timeout=0)) is not None:
            errors.append(error)


def test_every_message_is_fined_exactly_once_per_channel(client):
    for channel in CHANNELS:
        client.admin("channel", "create", "load", channel)
    # One Counter per consumer thread; summed per channel at the end.
    seen = [(ch, Counter()) for ch in CHANNELS for _ in range(CONSUMERS_PER_CHANNEL)]
    stop, errors = threading.Event(), []
    consumers = [threading.Thread(target=consume, args=(client, ch, counter, stop, errors))
                 for ch, counter in seen]
    published: list[list[str]] = [[] for _ in range(PRODUCERS)]

    def produce(k: int) -> None:
        per = MESSAGES // PRODUCERS
        for start in range(0, per, BATCH):
            bodies = [b"p%d-%d" % (k, i) for i in range(start, start + BATCH)]
            published[k].extend(client.multi_publish("load", bodies))

    producers = [threading.Thread(target=produce, args=(k,)) for k in range(PRODUCERS)]
    for t in consumers + producers:
        t.start()
    try:
        for t in producers:
            t.join()
        for channel in CHANNELS:
            wait_for(lambda: channel_stats(client, "load", channel).finish_count == MESSAGES,
                     timeout=120, message=f"every message FINed on {channel}")
    finally:
        stop.set()
        for t in consumers:
            t.join()
    ids = Counter(i for p in published for i in p)
    assert len(ids) == MESSAGES and set(ids.values()) == {1}
    for channel in CHANNELS:
        fined = sum((counter for ch, counter in seen if ch == channel), Counter())
        assert fined == ids, f"channel {channel}: each id exactly once"
        stats = channel_stats(client, "load", channel)
        assert (stats.depth, stats.in_flight_count, stats.requeue_count) == (0, 0, 0)
    assert errors == []
