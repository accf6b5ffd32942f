"""What the Spark tests share: publishing a known set of ids, and running a
pynsq query whose foreachBatch records what each micro-batch delivered."""

from __future__ import annotations

import functools
import logging
import re
from collections import Counter
from pathlib import Path
from typing import Callable

from broker import Client

from .helpers import wait_for

log = logging.getLogger(__name__)

# Spark starts the Python process behind a Python streaming source on the driver
# (PythonStreamingSourceRunner) with PythonWorkerFactory.createSimpleWorker, which gives it
# a fixed 10 s to connect back: neither spark.python.authenticate.socketTimeout (the
# handshake after it connects) nor spark.python.use.daemon reaches it. The process imports
# pyspark.sql and pyarrow first (0.4 s of CPU, 2.4 s of wall clock at a load of 10 on 2
# cores; 8 s seen between its start and the query's sources being made), so a busier host
# passes the 10 s and the query dies at start, having read nothing, with these words.
WORKER_NEVER_CONNECTED = ("Python worker failed to connect back",
                          "Timed out while waiting for the Python worker to connect back")
STARTS = 3


def worker_never_connected(query) -> bool:
    """The query ended because Spark's Python process never connected back to its JVM."""
    error = query.exception()
    return error is not None and any(words in str(error) for words in WORKER_NEVER_CONNECTED)


def start_past_worker_start(start: Callable) -> Callable:
    """``DataStreamWriter.start`` that returns once the query's sources are made (its status
    leaves "Initializing sources"), starting it again, from the same checkpoint, when it
    died of Spark's worker start above: before that nothing was read, so the test goes on
    from the state it meant to start from, and any other failure is the test's own."""
    @functools.wraps(start)
    def start_made(self, *args, **kwargs):
        for attempt in range(1, STARTS + 1):
            query = start(self, *args, **kwargs) if attempt == 1 else \
                _start_again(start, self, *args, **kwargs)
            wait_for(lambda: not query.isActive
                     or query.status["message"] != "Initializing sources",
                     600, interval=0.05, message="the query's sources to be made")
            if query.isActive or attempt == STARTS or not worker_never_connected(query):
                return query
            log.warning("Spark's Python worker did not connect back within its 10 s "
                        "(start %d of %d): starting the query again", attempt, STARTS)
        return query
    return start_made


# The memory sink will not start from a checkpoint that has an offsets folder, even an
# empty one: Spark names the folder to delete.
MEMORY_SINK_REFUSES = re.compile(r"does not support recovering from checkpoint location\. "
                                 r"Delete (\S+) to start over")


def _start_again(start: Callable, writer, *args, **kwargs):
    """``start`` after a start that died at Spark's worker start: a memory sink's offsets
    folder that start made is empty (nothing was planned), and goes before the retry."""
    try:
        return start(writer, *args, **kwargs)
    except Exception as err:
        refused = MEMORY_SINK_REFUSES.search(str(err))
        offsets = Path(refused.group(1)) if refused else None
        if offsets is None or not offsets.is_dir() or any(offsets.iterdir()):
            raise
        offsets.rmdir()
        return start(writer, *args, **kwargs)


def install_start_past_worker_start() -> None:
    """Make every ``writeStream...start()`` of this process wait as above (idempotent)."""
    from pyspark.sql.streaming.readwriter import DataStreamWriter

    if not getattr(DataStreamWriter.start, "_past_worker_start", False):
        DataStreamWriter.start = start_past_worker_start(DataStreamWriter.start)
        DataStreamWriter.start._past_worker_start = True


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
