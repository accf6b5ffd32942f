"""What the Spark tests share: publishing a known set of ids, and running a
pynsq query whose foreachBatch records what each micro-batch delivered."""

from __future__ import annotations

from collections import Counter
from typing import Callable

from broker import Client


def publish(client: Client, topic: str, n: int, batch: int = 500) -> set[str]:
    """Publish ``n`` bodies ``msg-<i>``; return their ids."""
    ids: list[str] = []
    for start in range(0, n, batch):
        ids += client.multi_publish(topic, [f"msg-{i}".encode()
                                            for i in range(start, min(n, start + batch))])
    return set(ids)


def reader(spark, address: str, topic: str, channel: str = "spark", **options):
    r = (spark.readStream.format("pynsq").option("address", address)
         .option("topic", topic).option("channel", channel))
    for key, value in options.items():
        r = r.option(key, value)
    return r.load()


class Recorder:
    """A foreachBatch function that records the ids of every batch that completes.

    ``fail_on`` is called with the batch id before anything is recorded; if it
    returns True the batch raises, as a user's sink would.
    """

    def __init__(self, fail_on: Callable[[int], bool] = lambda batch_id: False) -> None:
        self.batches: list[tuple[int, list[str]]] = []
        self.fail_on = fail_on

    def __call__(self, df, batch_id: int) -> None:
        rows = df.select("id").collect()
        if self.fail_on(batch_id):
            raise RuntimeError(f"injected failure in batch {batch_id}")
        self.batches.append((batch_id, [r.id for r in rows]))

    @property
    def ids(self) -> list[str]:
        return [i for _, ids in self.batches for i in ids]

    def duplicates(self) -> dict[str, int]:
        return {i: n for i, n in Counter(self.ids).items() if n > 1}


def channel_stats(client: Client, topic: str, channel: str = "spark"):
    for t in client.stats(topic, channel).topics:
        for c in t.channels:
            if c.name == channel:
                return c
    raise AssertionError(f"channel {topic}/{channel} not found")
