"""Exactly once end to end: pynsq -> Spark -> pynsq under failures, with either writer.

Each case publishes N distinct bodies to topic ``a``, runs a relay to topic ``b``
through the failure, and checks what a user would: ``b``'s distinct bodies equal
its message count equal N (nothing lost, nothing duplicated).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from pyspark import TaskContext

from spark_connector import pub_to_topic

from .drivers import stream_to_file
from .faultproxy import FaultProxy
from .helpers import Daemon, wait_for
from .spark_helpers import channel_stats, publish, reader
from .test_spark_writers import drain

N = 300
DRIVER = Path(__file__).parent / "drivers" / "stream_to_file.py"


def writer_of(kind: str, address: str):
    if kind == "pub_to_topic":
        return lambda w: w.foreachBatch(pub_to_topic(address, "b", batch_size=10))
    return lambda w: (w.format("pynsq").option("address", address).option("topic", "b")
                      .option("batchSize", 10))


def assert_exactly_once(client, n: int) -> Counter:
    bodies = drain(client, "b")
    assert len(bodies) == sum(bodies.values()) == n, \
        f"{len(bodies)} distinct, {sum(bodies.values())} messages, {n} published"
    return bodies


@pytest.mark.parametrize("kind", ["pub_to_topic", "sink"])
def test_the_readers_connections_cut_while_the_query_runs_lose_and_duplicate_nothing(
        spark, broker, client, tmp_path, kind):
    client.admin("channel", "create", "b", "check")
    publish(client, "a", N)
    with FaultProxy(broker.address) as proxy:
        # The source (driver session and executors' fetches) goes through the proxy.
        df = reader(spark, proxy.address, "a", maxMessagesPerTrigger=100,
                    msgTimeoutMs=5000).selectExpr("CAST(body AS STRING) AS body")
        query = writer_of(kind, broker.address)(
            df.writeStream.option("checkpointLocation", str(tmp_path / "ck"))
            .trigger(processingTime="100 milliseconds")).start()
        try:
            wait_for(lambda: query.lastProgress is not None, 120, message="a first batch")
            accepted = proxy.accepted
            proxy.cut()  # the driver's session stream and any fetch in progress
            wait_for(lambda: proxy.accepted > accepted, 60, message="the driver to reconnect")
            wait_for(lambda: sum(p["numInputRows"] for p in query.recentProgress) >= N
                     or query.exception() is not None, 180, message="every message read")
        finally:
            query.stop()
        assert query.exception() is None
    assert_exactly_once(client, N)


@pytest.mark.parametrize("kind", ["pub_to_topic", "sink"])
def test_a_task_failing_after_publishing_part_of_its_partition_duplicates_nothing(
        spark, broker, client, tmp_path, kind):
    client.admin("channel", "create", "b", "check")
    publish(client, "a", N)
    flag_path, address = str(tmp_path / "failed-once"), broker.address

    def pad_and_fail_once_after_a_partial_publish(batches):
        import os

        import pyarrow as pa

        from broker import Client

        from tests.helpers import wait_for
        from tests.spark_helpers import channel_stats

        ctx = TaskContext.get()
        sent = 0
        for batch in batches:
            # Rows of 8 KB, one by one, so Spark passes the first ones on to the writer.
            padded = pa.array([b.ljust(8000, "x") for b in batch.column(0).to_pylist()])
            batch = pa.RecordBatch.from_arrays([padded], schema=batch.schema)
            for i in range(batch.num_rows):
                yield batch.slice(i, 1)
                sent += 1
                if sent == 25 and not os.path.exists(flag_path):
                    with Client(address, timeout=10) as c:  # the writer's task has published
                        try:
                            depth = wait_for(lambda: channel_stats(c, "b", "check").depth, 60)
                        except AssertionError:
                            depth = 0
                    with open(flag_path, "w") as f:
                        f.write(str(depth))
                    raise RuntimeError("injected failure after publishing part of the partition")

    # One partition per batch: whatever is in "b" when the task fails, that task published.
    df = reader(spark, broker.address, "a", maxMessagesPerTrigger=100, numPartitions=1) \
        .selectExpr("CAST(body AS STRING) AS body")
    df = df.mapInArrow(pad_and_fail_once_after_a_partial_publish, df.schema)
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "10")
    try:
        query = writer_of(kind, broker.address)(
            df.writeStream.option("checkpointLocation", str(tmp_path / "ck"))
            .trigger(availableNow=True)).start()
        assert query.awaitTermination(180)
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    assert query.exception() is None
    # The failure did happen after part of the partition was published, and Spark retried.
    assert 0 < int((tmp_path / "failed-once").read_text()) < N
    bodies = assert_exactly_once(client, N)
    assert {b[:b.index(b"x")] for b in bodies} == {f"msg-{i}".encode() for i in range(N)}

def test_a_batch_write_task_failing_after_publishing_part_of_its_partition_writes_each_row_once(
        spark, broker, client, tmp_path):
    client.admin("channel", "create", "b", "check")
    flag_path, address = str(tmp_path / "failed-once"), broker.address

    def fail_once_after_a_partial_publish(batches):
        import os

        from broker import Client

        from tests.helpers import wait_for
        from tests.spark_helpers import channel_stats

        ctx = TaskContext.get()
        sent = 0
        for batch in batches:
            for i in range(batch.num_rows):  # row by row, so the writer flushes as it goes
                yield batch.slice(i, 1)
                sent += 1
                if ctx.partitionId() == 0 and sent == 25 and not os.path.exists(flag_path):
                    with Client(address, timeout=10) as c:  # the writer's task has published
                        try:
                            depth = wait_for(lambda: channel_stats(c, "b", "check").depth, 60)
                        except AssertionError:
                            depth = 0
                    with open(flag_path, "w") as f:
                        f.write(str(depth))
                    raise RuntimeError("injected failure after publishing part of the partition")

    # One partition: whatever is in "b" when the task fails, that task published. Rows of
    # 8 KB so that Spark passes the first ones on to the writer before the task ends.
    bodies = [f"MSG-{i}-".ljust(8000, "x") for i in range(N)]
    df = spark.createDataFrame([(b,) for b in bodies], "body STRING").repartition(1)
    df = df.mapInArrow(fail_once_after_a_partial_publish, df.schema)
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "10")
    try:
        (df.write.format("pynsq").option("address", broker.address).option("topic", "b")
         .option("batchSize", 10).mode("append").save())
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    # The failure did happen after part of the partition was published, and Spark retried.
    assert 0 < int((tmp_path / "failed-once").read_text()) < N
    assert assert_exactly_once(client, N) == Counter(b.encode() for b in bodies)


def relay_args(address: str, tmp_path: Path) -> list[str]:
    """A driver relaying topic ``a`` to ``b`` (pub_to_topic), 100 per batch."""
    return ["--address", address, "--topic", "a", "--channel", "spark",
            "--checkpoint", str(tmp_path / "ck"), "--out", str(tmp_path / "ids.txt"),
            "--sink-topic", "b", "--max-per-trigger", "100", "--option", "msgTimeoutMs=2000"]


def relay_driver(address: str, tmp_path: Path, name: str, *extra: str) -> subprocess.Popen:
    """The relay as a Spark driver process of its own."""
    return subprocess.Popen(
        [sys.executable, str(DRIVER), *relay_args(address, tmp_path), *extra],
        start_new_session=True, stdout=subprocess.DEVNULL,
        stderr=open(tmp_path / f"{name}.log", "wb"))


def test_a_driver_frozen_past_msg_timeout_and_replaced_by_a_new_one_duplicates_nothing(
        spark, broker, client, tmp_path):
    client.admin("channel", "create", "b", "check")
    published = publish(client, "a", N)
    marker = tmp_path / "hanging"
    frozen = relay_driver(broker.address, tmp_path, "frozen", "--hang-on-batch", "1",
                          "--marker", str(marker))
    try:
        # Batch 1 has published to "b" and hangs before it commits; then the driver freezes.
        wait_for(marker.exists, 240, interval=0.1, message="the driver to reach batch 1")
        os.killpg(frozen.pid, signal.SIGSTOP)
        # A frozen driver TOUCHes nothing: its batch's lease times out and is requeued.
        wait_for(lambda: channel_stats(client, "a").in_flight_count == 0, 60,
                 interval=0.1, message="the frozen driver's lease to time out")
        frozen_batch = marker.read_text().split()
        assert len(frozen_batch) == 100
        assert channel_stats(client, "a").timeout_count >= len(frozen_batch)
        assert channel_stats(client, "b", "check").depth == 200  # batches 0 and 1 published

        # The successor is this test session's driver: the same relay, same checkpoint.
        stream_to_file.run(spark, stream_to_file.parse(
            relay_args(broker.address, tmp_path) + ["--available-now"]))
    finally:
        os.killpg(frozen.pid, signal.SIGKILL)
        frozen.wait(30)
    assert set((tmp_path / "ids.txt").read_text().split()) == published
    assert_exactly_once(client, N)


def test_a_durable_broker_killed_mid_batch_reads_nothing_twice_and_loses_nothing(
        spark, tmp_path):
    import threading

    from broker import Client

    data = str(tmp_path / "data")
    daemon = Daemon("--data-path", data).wait_ready()
    client = Client(daemon.address, timeout=10)
    try:
        client.admin("channel", "create", "b", "check")
        publish(client, "a", N)
        sink = pub_to_topic(daemon.address, "b", batch_size=10)
        published_batch_1, killed = threading.Event(), threading.Event()
        batch_1: list[bytes] = []

        def relay(df, batch_id):
            sink(df, batch_id)
            if not published_batch_1.is_set() and batch_id == 1:
                # Batch 1 has published to "b"; the broker dies before the batch commits.
                batch_1.extend(r.body.encode() for r in df.select("body").collect())
                published_batch_1.set()
                assert killed.wait(120)

        # failOnDataLoss as by default: a broker back within reconnectTimeoutMs fails nothing,
        # though the commit's FIN and the next Reserve come while it is down.
        df = reader(spark, daemon.address, "a", maxMessagesPerTrigger=100, msgTimeoutMs=2000
                    ).selectExpr("CAST(body AS STRING) AS body")
        query = (df.writeStream.foreachBatch(relay)
                 .option("checkpointLocation", str(tmp_path / "ck"))
                 .trigger(processingTime="100 milliseconds").start())
        try:
            wait_for(published_batch_1.is_set, 180, message="batch 1 to publish")
            daemon.kill()  # SIGKILL mid-batch
            client.close()
            killed.set()  # batch 1 ends; Spark commits it and plans the next while it is down
            daemon = Daemon("--data-path", data, port=daemon.port).wait_ready()
            client = Client(daemon.address, timeout=10)
            wait_for(lambda: channel_stats(client, "b", "check").depth >= N
                     and channel_stats(client, "a").depth == 0
                     and channel_stats(client, "a").in_flight_count == 0
                     or query.exception() is not None, 240, interval=0.2,
                     message="every message relayed")
        finally:
            killed.set()
            query.stop()
        assert query.exception() is None
        bodies = drain(client, "b")
        print("durable broker killed mid-batch:", N, "published,", len(bodies), "distinct,",
              sum(bodies.values()), "relayed, batch 1 read", len(batch_1))
        assert set(bodies) == {f"msg-{i}".encode() for i in range(N)}  # nothing lost
        # The killed batch's lease outlived the broker (its lease journal): the commit's FIN
        # finds it after the restart, so no later batch reads its messages again.
        assert {b for b, n in bodies.items() if n > 1} == set() and len(batch_1) == 100
        assert sum(bodies.values()) == N
    finally:
        client.close()
        daemon.kill()
