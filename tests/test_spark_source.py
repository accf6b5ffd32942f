"""The pynsq Spark source, end to end: a real broker on loopback, a real local Spark."""

from __future__ import annotations

from collections import Counter

import pytest
from chispa import assert_df_equality
from pyspark.errors.exceptions.captured import StreamingQueryException
from pyspark.sql.functions import spark_partition_id

from spark_connector import SCHEMA, PynsqDataSource

from .helpers import wait_for
from .spark_helpers import Recorder, channel_stats, publish, reader


def run_available_now(df, checkpoint, recorder: Recorder, timeout: float = 120):
    query = (df.writeStream.foreachBatch(recorder).option("checkpointLocation", str(checkpoint))
             .trigger(availableNow=True).start())
    assert query.awaitTermination(timeout), "the availableNow query did not finish"
    return query


FRESH_SESSION = """
import sys
from pyspark.sql import SparkSession
spark = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
         .getOrCreate())
df = (spark.readStream.format("pynsq").option("address", sys.argv[1])
      .option("topic", "events").option("channel", "spark").load())
print(df.isStreaming, df.schema.simpleString())
spark.stop()
"""


def test_format_pynsq_works_without_register_and_has_the_documented_schema(broker):
    # A fresh process: no other test can have registered the source before.
    import os
    import subprocess
    import sys

    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    result = subprocess.run([sys.executable, "-c", FRESH_SESSION, broker.address],
                            capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["True", SCHEMA.simpleString()]
    assert [f.name for f in SCHEMA.fields] == ["id", "body", "timestamp", "attempts", "topic",
                                               "channel"]


def test_explicit_register_works_too(spark, broker):
    spark.dataSource.register(PynsqDataSource)
    assert reader(spark, broker.address, "events").schema == SCHEMA


def test_without_failures_every_message_is_delivered_exactly_once_and_finished(
        spark, broker, client, tmp_path):
    published = publish(client, "events", 900)  # three batches of three partitions
    recorder = Recorder()
    run_available_now(reader(spark, broker.address, "events", maxMessagesPerTrigger=300,
                             numPartitions=3), tmp_path / "ck", recorder)
    assert recorder.duplicates() == {}
    assert set(recorder.ids) == published
    stats = channel_stats(client, "events")
    assert (stats.depth, stats.in_flight_count, stats.finish_count) == (0, 0, 900)


def test_rows_carry_body_publish_time_attempts_topic_and_channel(spark, broker, client, tmp_path):
    msg_id = client.publish("events", b"hello")
    rows = []

    def collect(df, batch_id):
        rows.extend(df.collect())

    query = (reader(spark, broker.address, "events").writeStream.foreachBatch(collect)
             .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True)
             .start())
    query.awaitTermination(120)
    [row] = rows
    assert (row.id, row.body, row.attempts, row.topic, row.channel) == (
        msg_id, bytearray(b"hello"), 1, "events", "spark")
    assert row.timestamp.year >= 2024


def test_bodies_cast_to_strings_equal_what_was_published(spark, broker, client, tmp_path):
    bodies = [f"event-{i}" for i in range(50)]
    client.multi_publish("events", bodies)
    query = (reader(spark, broker.address, "events").selectExpr(
                "CAST(body AS STRING) AS line", "attempts", "topic", "channel")
             .writeStream.format("memory").queryName("cast_lines")
             .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True)
             .start())
    query.awaitTermination(120)
    expected = spark.createDataFrame([(b, 1, "events", "spark") for b in bodies],
                                     "line STRING, attempts INT, topic STRING, channel STRING")
    assert_df_equality(spark.table("cast_lines"), expected, ignore_row_order=True,
                       ignore_nullable=True)


def test_max_messages_per_trigger_caps_every_batch(spark, broker, client, tmp_path):
    publish(client, "events", 750)
    recorder = Recorder()
    query = run_available_now(reader(spark, broker.address, "events",
                                     maxMessagesPerTrigger=250), tmp_path / "ck", recorder)
    sizes = [len(ids) for _, ids in recorder.batches if ids]
    assert sizes == [250, 250, 250]
    assert all(p["numInputRows"] <= 250 for p in query.recentProgress)


def test_available_now_reads_what_was_there_at_start_and_stops(spark, broker, client, tmp_path):
    published = publish(client, "events", 300)
    recorder = Recorder()
    query = run_available_now(reader(spark, broker.address, "events",
                                     maxMessagesPerTrigger=100), tmp_path / "ck", recorder)
    assert not query.isActive
    assert set(recorder.ids) == published


def test_available_now_on_an_empty_channel_stops_at_once(spark, broker, tmp_path):
    recorder = Recorder()
    query = run_available_now(reader(spark, broker.address, "empty"), tmp_path / "ck", recorder,
                              timeout=60)
    assert not query.isActive
    assert recorder.ids == []


def test_trigger_once_reads_one_batch_of_everything(spark, broker, client, tmp_path):
    published = publish(client, "events", 300)
    recorder = Recorder()
    query = (reader(spark, broker.address, "events").writeStream.foreachBatch(recorder)
             .option("checkpointLocation", str(tmp_path / "ck")).trigger(once=True).start())
    assert query.awaitTermination(120)
    assert set(recorder.ids) == published


def test_processing_time_trigger_picks_up_messages_published_while_running(
        spark, broker, client, tmp_path):
    recorder = Recorder()
    query = (reader(spark, broker.address, "live").writeStream.foreachBatch(recorder)
             .option("checkpointLocation", str(tmp_path / "ck"))
             .trigger(processingTime="100 milliseconds").start())
    try:
        # The channel exists once the query has started; publish into it while it runs.
        wait_for(lambda: client.stats("live").topics if "live" in
                 {t.name for t in client.stats().topics} else None, 60, message="channel")
        first = publish(client, "live", 200)
        wait_for(lambda: set(recorder.ids) >= first, 60, message="first messages")
        second = publish(client, "live", 200)
        wait_for(lambda: set(recorder.ids) >= first | second, 60, message="second messages")
        # An idle trigger FINs the last batch.
        wait_for(lambda: channel_stats(client, "live").finish_count == 400, 60,
                 message="all FINed")
    finally:
        query.stop()
    assert recorder.duplicates() == {}


def test_progress_reports_the_backlog_per_broker_as_latest_offset(
        spark, broker, client, tmp_path):
    import json

    publish(client, "events", 600)
    recorder = Recorder()
    query = run_available_now(reader(spark, broker.address, "events",
                                     maxMessagesPerTrigger=200), tmp_path / "ck", recorder)
    latest = [json.loads(p["sources"][0]["latestOffset"]) for p in query.recentProgress
              if p["sources"][0]["latestOffset"]]
    assert latest[0]["source"] == "pynsq topic events channel spark"
    # The first batch's progress: 200 in flight, 400 waiting, a lag of 600.
    assert latest[0]["brokers"][broker.address] == {
        "identity": broker.broker.identity, "depth": 400, "inFlight": 200, "lag": 600}


@pytest.mark.parametrize("options, named", [
    ({"channel": "spark"}, "topic"),
    ({"topic": "events", "channel": "spark", "maxMessagesPerTriger": "5"}, "maxmessagespertriger"),
    ({"topic": "bad name!", "channel": "spark"}, "topic"),
    ({"topic": "events", "channel": "spark", "numPartitions": "zero"}, "numPartitions"),
    ({"topic": "events"}, "channel"),
])
def test_bad_options_fail_the_query_at_start_naming_the_option(spark, broker, tmp_path,
                                                               options, named):
    r = spark.readStream.format("pynsq").option("address", broker.address)
    for key, value in options.items():
        r = r.option(key, value)
    with pytest.raises(Exception) as caught:
        query = (r.load().writeStream.format("noop")
                 .option("checkpointLocation", str(tmp_path / "ck")).start())
        query.awaitTermination(60)
    assert named in str(caught.value)


def test_an_unreachable_broker_fails_the_query_naming_the_address(spark, tmp_path):
    address = "127.0.0.1:1"
    query = (spark.readStream.format("pynsq").option("address", address)
             .option("topic", "events").option("channel", "spark").load()
             .writeStream.format("noop").option("checkpointLocation", str(tmp_path / "ck"))
             .start())
    with pytest.raises(StreamingQueryException) as caught:
        query.awaitTermination(120)
    assert address in str(caught.value)


class Bodies:
    """foreachBatch: every body read, counted, and the Spark partitions each batch read in."""

    def __init__(self) -> None:
        self.bodies: Counter = Counter()
        self.partitions: list[set[int]] = []
        self.topics: set[str] = set()

    def __call__(self, df, batch_id: int) -> None:
        rows = df.select("body", "topic", spark_partition_id().alias("p")).collect()
        self.bodies.update(bytes(r.body) for r in rows)
        self.partitions.append({r.p for r in rows})
        self.topics.update(r.topic for r in rows)


def test_several_comma_separated_addresses_and_topics_are_each_read_by_one_query(
        spark, broker, client, tmp_path):
    from broker import Client, EmbeddedBroker

    with EmbeddedBroker() as other, Client(other.address, timeout=10) as other_client:
        client.create_channel("audit", "spark")
        client.multi_publish("events", [f"first-{i}" for i in range(100)])
        other_client.multi_publish("events", [f"second-{i}" for i in range(100)])
        client.multi_publish("audit", [f"third-{i}" for i in range(50)])
        seen = Bodies()
        run_available_now(reader(spark, f"{broker.address}, {other.address}", "events,audit",
                                 maxMessagesPerTrigger=200), tmp_path / "ck", seen)
        assert seen.bodies == Counter([f"first-{i}".encode() for i in range(100)]
                                      + [f"second-{i}".encode() for i in range(100)]
                                      + [f"third-{i}".encode() for i in range(50)])
        assert seen.topics == {"events", "audit"}
        for c, topic, n in ((client, "events", 100), (other_client, "events", 100),
                            (client, "audit", 50)):
            stats = channel_stats(c, topic)
            assert (stats.depth, stats.in_flight_count, stats.finish_count) == (0, 0, n)


def test_by_default_a_batch_from_one_broker_is_read_in_two_tasks(spark, broker, client, tmp_path):
    publish(client, "events", 10)
    seen = Bodies()
    run_available_now(reader(spark, broker.address, "events"), tmp_path / "ck", seen)
    assert sum(seen.bodies.values()) == 10
    assert seen.partitions == [{0, 1}]


def test_offsets_in_the_checkpoint_are_the_documented_json(spark, broker, client, tmp_path):
    import json
    import re

    from spark_connector.reader import PynsqStreamReader

    publish(client, "events", 7)
    run_available_now(reader(spark, broker.address, "events"), tmp_path / "ck", Recorder())
    # Spark's offset log: a version line, its own metadata, then this source's offset.
    offset = json.loads((tmp_path / "ck" / "offsets" / "0").read_text().splitlines()[-1])
    lease = offset["leases"]["0"]
    assert offset == {"batch": 1, "leases": {"0": {
        "address": broker.address, "lease": lease["lease"], "count": 7,
        "broker": broker.broker.instance_id, "identity": broker.broker.identity,
        "topic": "events"}}}
    assert re.fullmatch("[0-9a-f]{24}", lease["lease"])
    source = PynsqStreamReader({"address": broker.address, "topic": "events",
                                "channel": "spark"})
    try:
        assert source.initialOffset() == {"batch": 0, "leases": {}}
    finally:
        source.stop()
