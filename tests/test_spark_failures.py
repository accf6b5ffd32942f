"""At least once under failure: every test counts distinct message ids against
what was published (real broker on loopback, real Spark, checkpoints on disk)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from pyspark import TaskContext
from pyspark.errors.exceptions.captured import StreamingQueryException

from .drivers import stream_to_file
from .helpers import wait_for
from .spark_helpers import Recorder, channel_stats, publish, reader

DRIVER = Path(__file__).parent / "drivers" / "stream_to_file.py"


def start(df, recorder, checkpoint, **trigger):
    return (df.writeStream.foreachBatch(recorder).option("checkpointLocation", str(checkpoint))
            .trigger(**(trigger or {"availableNow": True})).start())


def test_a_failing_batch_fails_the_query_and_a_restart_delivers_every_message(
        spark, broker, client, tmp_path):
    published = publish(client, "events", 400)  # batches 0-1 commit, 2 fails, 2-3 on restart
    checkpoint = tmp_path / "ck"
    failing = Recorder(fail_on=lambda batch_id: batch_id == 2)
    query = start(reader(spark, broker.address, "events", maxMessagesPerTrigger=100),
                  failing, checkpoint)
    with pytest.raises(StreamingQueryException, match="injected failure in batch 2"):
        query.awaitTermination(120)
    assert len(failing.batches) == 2
    # The failed query gave its batch back at once (well within the 60 s grace of a driver
    # that vanished); the restart adopts that lease again and replays the same batch.
    wait_for(lambda: channel_stats(client, "events").in_flight_count == 0, 30,
             message="the failed query to give its batch back")

    restarted = Recorder()
    start(reader(spark, broker.address, "events", maxMessagesPerTrigger=100),
          restarted, checkpoint).awaitTermination(120)
    assert set(failing.ids) | set(restarted.ids) == published
    # Batches that committed are not seen again, and the replay is the failed batch itself.
    assert set(failing.ids).isdisjoint(restarted.ids)
    assert restarted.batches[0][0] == 2 and len(restarted.batches[0][1]) == 100
    assert restarted.duplicates() == {}
    assert channel_stats(client, "events").finish_count >= len(published)


def test_a_query_stopped_mid_stream_and_restarted_loses_nothing(spark, broker, client, tmp_path):
    published = publish(client, "events", 800)
    checkpoint = tmp_path / "ck"
    first = Recorder()
    query = start(reader(spark, broker.address, "events", maxMessagesPerTrigger=100,
                         msgTimeoutMs=120_000),
                  first, checkpoint, processingTime="50 milliseconds")
    wait_for(lambda: len(first.batches) >= 3, 120, message="three batches")
    query.stop()
    assert len(set(first.ids)) < len(published)
    # A query that stops gives its uncommitted leases back at once, not after their
    # grace period (msgTimeoutMs, two minutes here).
    wait_for(lambda: channel_stats(client, "events").in_flight_count == 0, 30,
             message="the stopped query's leases to be requeued")
    stats = channel_stats(client, "events")
    assert stats.depth == len(published) - stats.finish_count

    second = Recorder()
    start(reader(spark, broker.address, "events", maxMessagesPerTrigger=500),
          second, checkpoint).awaitTermination(120)
    assert set(first.ids) | set(second.ids) == published
    stats = channel_stats(client, "events")
    assert (stats.depth, stats.in_flight_count) == (0, 0)


def _driver(broker, tmp_path, out, *extra):
    return subprocess.Popen(
        [sys.executable, str(DRIVER), "--address", broker.address, "--topic", "events",
         "--channel", "spark", "--checkpoint", str(tmp_path / "ck"), "--out", str(out), *extra],
        start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def test_a_driver_killed_mid_batch_restarts_from_the_checkpoint_and_loses_nothing(
        spark, broker, client, tmp_path):
    published = publish(client, "events", 400)
    out, marker = tmp_path / "ids.txt", tmp_path / "hanging"
    # The killed driver's lease session outlives it by msgTimeoutMs: ten minutes, so that
    # however slowly the restarted driver starts, the lease is there to adopt (never waited).
    driver = _driver(broker, tmp_path, out, "--max-per-trigger", "200",
                     "--hang-on-batch", "1", "--marker", str(marker),
                     "--option", "msgTimeoutMs=600000")
    try:
        wait_for(marker.exists, 180, message="the driver to reach batch 1")
    finally:
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait(30)
    before = out.read_text().split()
    assert len(before) == 200  # batch 0 completed; batch 1 was killed mid-way
    killed_batch = marker.read_text().split()
    # The killed driver's session is kept for its grace period: its lease is still held.
    assert channel_stats(client, "events").in_flight_count == len(killed_batch) == 200

    # The new driver is this test session's: the same query from the same checkpoint.
    stream_to_file.run(spark, stream_to_file.parse([
        "--address", broker.address, "--topic", "events", "--channel", "spark",
        "--checkpoint", str(tmp_path / "ck"), "--out", str(out), "--max-per-trigger", "200",
        "--available-now", "--option", "msgTimeoutMs=600000"]))
    after = out.read_text().split()
    assert set(after) == published
    # The restarted driver replays batch 1 first, with the very messages it held.
    assert set(after[200:200 + len(killed_batch)]) == set(killed_batch)


def test_a_task_that_fails_once_is_retried_without_loss_or_duplicates(
        spark, broker, client, tmp_path):
    published = publish(client, "events", 400)

    def fail_first_attempt(batches):
        ctx = TaskContext.get()
        if ctx.partitionId() == 0 and ctx.attemptNumber() == 0:
            raise RuntimeError("injected task failure")
        yield from batches

    df = reader(spark, broker.address, "events", maxMessagesPerTrigger=200, numPartitions=2)
    df = df.mapInArrow(fail_first_attempt, df.schema)
    recorder = Recorder()
    start(df, recorder, tmp_path / "ck").awaitTermination(180)
    assert recorder.duplicates() == {}
    assert set(recorder.ids) == published
    assert channel_stats(client, "events").finish_count == len(published)


def test_a_batch_running_longer_than_msg_timeout_keeps_its_messages(
        spark, broker, client, tmp_path):
    published = publish(client, "events", 200)
    seen_attempts = []

    def slow(df, batch_id):
        rows = df.select("id", "attempts").collect()
        seen_attempts.extend((r.id, r.attempts) for r in rows)
        # A sink whose work outlasts msgTimeoutMs (2 s) twice over: the lease keeper's
        # TOUCHes (every 0.5 s at this timeout) have a margin of four intervals.
        time.sleep(4.5)

    query = (reader(spark, broker.address, "events", msgTimeoutMs=2000).writeStream
             .foreachBatch(slow).option("checkpointLocation", str(tmp_path / "ck"))
             .trigger(availableNow=True).start())
    query.awaitTermination(120)
    assert {i for i, _ in seen_attempts} == published
    assert all(attempts == 1 for _, attempts in seen_attempts)
    stats = channel_stats(client, "events")
    assert (stats.timeout_count, stats.finish_count) == (0, len(published))
