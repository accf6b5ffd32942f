"""The demo: an embedded broker, a producer and a consumer, and what flowed."""

from __future__ import annotations

import time

from broker import Client, EmbeddedBroker

N = 1000

with EmbeddedBroker() as broker:
    print(f"broker listening on {broker.address}")
    client = Client(broker.address)
    started = time.perf_counter()
    for start in range(0, N, 100):
        client.multi_publish("events", [f"event {i}".encode() for i in range(start, start + 100)])
    print(f"published {N} messages to topic 'events'")
    received = 0
    with client.subscribe("events", "demo", rdy=200) as sub:
        while received < N:
            msg = sub.get(timeout=10)
            if msg is None:
                break
            sub.fin(msg.id)
            received += 1
            if received <= 3 or received == N:
                print(f"  got {msg.body.decode()!r} (id {msg.id}, attempts {msg.attempts})")
    elapsed = time.perf_counter() - started
    print(f"consumed and FINed {received} of {N} messages in {elapsed:.2f}s")
    for topic in client.stats().topics:
        for channel in topic.channels:
            print(f"stats: {topic.name}/{channel.name} finished={channel.finish_count} "
                  f"depth={channel.depth} in_flight={channel.in_flight_count}")
    client.close()
