"""Many producers and consumers at once: every message FINed exactly once per channel."""

from __future__ import annotations

import threading
from collections import Counter

from broker import Client

MESSAGES = 100_000
PRODUCERS = 4
CHANNELS = ("archive", "metrics")
CONSUMERS_PER_CHANNEL = 2


def test_4_producers_4_consumers_2_channels_100k_messages_each_finished_once(broker, client):
    for name in CHANNELS:
        client.admin("channel", "create", "load", name)
    published: list[list[str]] = [[] for _ in range(PRODUCERS)]
    received = {name: Counter() for name in CHANNELS}
    lock = threading.Lock()
    errors: list[BaseException] = []

    def produce(p: int) -> None:
        with Client(broker.address) as c:
            share = MESSAGES // PRODUCERS
            for start in range(0, share, 500):
                published[p] += c.multi_publish("load", [f"{p}-{start + i}".encode()
                                                         for i in range(500)])

    def consume(channel: str) -> None:
        with Client(broker.address) as c, c.subscribe("load", channel, rdy=500) as sub:
            pending: list[str] = []
            while True:
                msg = sub.get(timeout=5)
                if msg is None:
                    break
                pending.append(msg.id)
                if len(pending) >= 100:
                    sub.fin(*pending)
                    with lock:
                        received[channel].update(pending)
                    pending = []
            sub.fin(*pending)
            with lock:
                received[channel].update(pending)
            assert sub.error(timeout=0.1) is None

    def run(fn, *args):
        try:
            fn(*args)
        except BaseException as err:  # surfaced below
            errors.append(err)

    threads = [threading.Thread(target=run, args=(produce, p)) for p in range(PRODUCERS)]
    threads += [threading.Thread(target=run, args=(consume, name))
                for name in CHANNELS for _ in range(CONSUMERS_PER_CHANNEL)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert errors == []
    ids = {i for ids in published for i in ids}
    assert len(ids) == MESSAGES
    for name in CHANNELS:
        assert set(received[name]) == ids
        assert max(received[name].values()) == 1
    for channel in client.stats("load").topics[0].channels:
        assert (channel.finish_count, channel.depth, channel.in_flight_count,
                channel.requeue_count, channel.timeout_count) == (MESSAGES, 0, 0, 0, 0)
