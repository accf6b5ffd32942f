"""Writers: pub_to_topic, the native sink and batch writes, round trips through a real
broker, and replays that publish nothing twice."""

from __future__ import annotations

import os
from collections import Counter

import pytest
from pyspark import TaskContext
from pyspark.errors.exceptions.captured import StreamingQueryException

from spark_connector import PublishError, pub_to_topic

from .helpers import wait_for
from .spark_helpers import channel_stats, publish, reader


def drain(client, topic: str, channel: str = "check") -> Counter:
    """Every body in ``topic``/``channel`` (FINed), counted."""
    bodies: Counter = Counter()
    depth = channel_stats(client, topic, channel).depth
    with client.subscribe(topic, channel, rdy=1000) as sub:
        while sum(bodies.values()) < depth:
            msg = sub.get(timeout=10)
            assert msg is not None, f"got {sum(bodies.values())} of {depth}"
            bodies[msg.body] += 1
            sub.fin(msg.id)
    return bodies


def relay(spark, address, checkpoint, sink, source="a"):
    """Topic A -> pynsq source -> upper-case -> ``sink``; availableNow."""
    df = reader(spark, address, source, maxMessagesPerTrigger=100).selectExpr(
        "upper(CAST(body AS STRING)) AS body")
    return sink(df.writeStream.option("checkpointLocation", str(checkpoint))
                .trigger(availableNow=True)).start()


def expected_bodies(n: int) -> Counter:
    return Counter(f"MSG-{i}".encode() for i in range(n))


def test_pub_to_topic_relays_every_message_once(spark, broker, client, tmp_path):
    client.admin("channel", "create", "b", "check")
    publish(client, "a", 300)  # three batches
    query = relay(spark, broker.address, tmp_path / "ck",
                  lambda w: w.foreachBatch(pub_to_topic(broker.address, "b", batch_size=64)))
    assert query.awaitTermination(120)
    assert drain(client, "b") == expected_bodies(300)


def test_the_native_sink_relays_every_message_once(spark, broker, client, tmp_path):
    client.admin("channel", "create", "b", "check")
    publish(client, "a", 300)  # three batches
    query = relay(spark, broker.address, tmp_path / "ck",
                  lambda w: w.format("pynsq").option("address", broker.address)
                  .option("topic", "b"))
    assert query.awaitTermination(120)
    assert drain(client, "b") == expected_bodies(300)


def test_a_failure_between_publish_and_commit_leaves_each_message_once(
        spark, broker, client, tmp_path):
    client.admin("channel", "create", "b", "check")
    publish(client, "a", 300)  # batch 1 fails after publishing; the restart replays it, then 2
    publish_b = pub_to_topic(broker.address, "b")
    failed = []

    def publish_then_fail_once(df, batch_id):
        publish_b(df, batch_id)
        if batch_id == 1 and not failed:
            failed.append(batch_id)
            raise RuntimeError("injected failure after publishing batch 1")

    checkpoint = tmp_path / "ck"
    first = relay(spark, broker.address, checkpoint, lambda w: w.foreachBatch(publish_then_fail_once))
    with pytest.raises(StreamingQueryException, match="injected failure"):
        first.awaitTermination(120)
    assert channel_stats(client, "b", "check").depth == 200  # batches 0 and 1 published
    second = relay(spark, broker.address, checkpoint, lambda w: w.foreachBatch(publish_then_fail_once))
    assert second.awaitTermination(120)
    bodies = drain(client, "b")
    assert bodies == expected_bodies(300)
    assert max(bodies.values()) == 1


def test_a_batch_that_fails_after_some_partitions_published_is_replayed_without_duplicates(
        spark, broker, client, tmp_path):
    client.admin("channel", "create", "b", "check")
    publish(client, "a", 300)
    flag = tmp_path / "fail"
    flag.write_text("on")
    address = broker.address

    def fail_partition_1_after_partition_0_published(batches):
        from broker import Client as C

        ctx = TaskContext.get()
        if ctx.partitionId() == 1 and os.path.exists(str(flag)):
            with C(address) as c:
                wait_for(lambda: any(t.name == "b" and t.channels and t.channels[0].depth > 0
                                     for t in c.stats().topics), 60, message="partition 0")
            raise RuntimeError("injected failure in partition 1")
        yield from batches

    def sink(w):
        return w.format("pynsq").option("address", address).option("topic", "b")

    df = reader(spark, address, "a").selectExpr("upper(CAST(body AS STRING)) AS body")
    df = df.mapInArrow(fail_partition_1_after_partition_0_published, df.schema)
    checkpoint = str(tmp_path / "ck")
    first = sink(df.writeStream.option("checkpointLocation", checkpoint)
                 .trigger(availableNow=True)).start()
    with pytest.raises(StreamingQueryException, match="injected failure in partition 1"):
        first.awaitTermination(180)
    published_before = channel_stats(client, "b", "check").depth
    assert 0 < published_before < 300
    flag.unlink()
    second = sink(df.writeStream.option("checkpointLocation", checkpoint)
                  .trigger(availableNow=True)).start()
    assert second.awaitTermination(180)
    bodies = drain(client, "b")
    assert bodies == expected_bodies(300)


def test_batch_write_with_a_topic_column_routes_rows(spark, broker, client):
    for topic in ("x", "y"):
        client.admin("channel", "create", topic, "check")
    rows = [(f"to-{t}-{i}", t) for i in range(20) for t in ("x", "y")]
    (spark.createDataFrame(rows, "body STRING, topic STRING").repartition(3)
     .write.format("pynsq").option("address", broker.address).mode("append").save())
    assert drain(client, "x") == Counter(f"to-x-{i}".encode() for i in range(20))
    assert drain(client, "y") == Counter(f"to-y-{i}".encode() for i in range(20))


def test_batch_write_of_binary_bodies_with_a_defer_column(spark, broker, client):
    client.admin("channel", "create", "d", "check")
    df = spark.createDataFrame([(bytearray(b"now"), 0), (bytearray(b"later"), 60_000)],
                               "body BINARY, defer_ms INT")
    df.write.format("pynsq").option("address", broker.address).option("topic", "d") \
        .mode("append").save()
    stats = channel_stats(client, "d", "check")
    assert (stats.depth, stats.deferred_count) == (1, 1)


def test_a_missing_body_column_is_named(spark, broker):
    df = spark.createDataFrame([("x",)], "value STRING")
    with pytest.raises(PublishError, match="column 'body' is required"):
        pub_to_topic(broker.address, "b")(df, 0)
    with pytest.raises(Exception, match="column 'body' is required"):
        df.write.format("pynsq").option("address", broker.address).option("topic", "b") \
            .mode("append").save()


def test_a_null_body_fails_naming_the_row(spark, broker):
    df = spark.createDataFrame([("ok",), (None,)], "body STRING").coalesce(1)
    with pytest.raises(Exception, match="row 1: column 'body' is null"):
        pub_to_topic(broker.address, "b")(df, 0)


def test_an_oversize_body_fails_naming_the_limit(spark, broker):
    df = spark.createDataFrame([("x" * (1024 * 1024 + 1),)], "body STRING")
    with pytest.raises(Exception, match="over the broker's max-msg-size of 1048576"):
        pub_to_topic(broker.address, "b")(df, 0)


@pytest.mark.parametrize("options, text", [
    ({"topic": "b", "colour": "red"}, "unknown option(s) for the pynsq sink: colour"),
    ({}, "option topic is required"),
    ({"topic": "bad name"}, "invalid topic name"),
])
def test_bad_sink_options_are_named(spark, broker, options, text):
    w = spark.createDataFrame([("x",)], "body STRING").write.format("pynsq") \
        .option("address", broker.address)
    for key, value in options.items():
        w = w.option(key, value)
    with pytest.raises(Exception, match=text.replace("(", r"\(").replace(")", r"\)")):
        w.mode("append").save()


def test_the_spark_submit_relay_job_runs_for_real(broker, client, tmp_path):
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).parent.parent
    client.admin("channel", "create", "enriched", "check")
    client.multi_publish("events", [json.dumps({"n": i}).encode() for i in range(100)]
                         + [b"not json"])
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    result = subprocess.run(
        [str(Path(sys.executable).parent / "spark-submit"), "--master", "local[2]",
         "--conf", "spark.ui.enabled=false", str(root / "examples" / "relay_job.py"),
         "--address", broker.address, "--source-topic", "events", "--channel", "relay",
         "--sink-topic", "enriched", "--checkpoint", str(tmp_path / "ck"), "--available-now"],
        capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "relay: 101 messages from events/relay to enriched" in result.stdout
    assert len((result.stdout + result.stderr).splitlines()) < 80  # Spark's INFO lines: 223
    out = [json.loads(body) for body in drain(client, "enriched").elements()]
    assert sorted(int(o["n"]) for o in out if "n" in o) == list(range(100))
    assert [o["raw"] for o in out if "raw" in o] == ["not json"]
    assert all(o["attempts"] == 1 and len(o["source_id"]) == 16 for o in out)


def test_calling_pub_to_topic_twice_outside_a_stream_publishes_twice(spark, broker, client):
    client.admin("channel", "create", "b", "check")
    df = spark.createDataFrame([("x",)], "body STRING")
    publish_b = pub_to_topic(broker.address, "b")
    publish_b(df, 0)
    publish_b(df, 0)
    assert drain(client, "b") == Counter({b"x": 2})


def test_pub_to_topic_reads_bodies_from_its_body_column(spark, broker, client):
    client.admin("channel", "create", "b", "check")
    df = spark.createDataFrame([(f"p-{i}", "not this") for i in range(30)],
                               "payload STRING, other STRING")
    pub_to_topic(broker.address, "b", body_column="payload")(df, 0)
    assert drain(client, "b") == Counter(f"p-{i}".encode() for i in range(30))


def test_pub_to_topic_defers_each_row_by_its_defer_column(spark, broker, client):
    client.admin("channel", "create", "d", "check")
    df = spark.createDataFrame([("now", 0), ("later", 60_000), ("also later", 90_000)],
                               "body STRING, wait_ms INT")
    pub_to_topic(broker.address, "d", defer_column="wait_ms")(df, 0)
    stats = channel_stats(client, "d", "check")
    assert (stats.depth, stats.deferred_count) == (1, 2)
    assert drain(client, "d") == Counter({b"now": 1})


def test_pub_to_topic_routes_each_row_by_its_topic_column_and_a_null_goes_to_topic(
        spark, broker, client):
    for topic in ("x", "y", "fallback"):
        client.admin("channel", "create", topic, "check")
    rows = [(f"{t}-{i}", t) for i in range(10) for t in ("x", "y")] + [("none-0", None)]
    df = spark.createDataFrame(rows, "body STRING, dest STRING").repartition(2)
    pub_to_topic(broker.address, "fallback", topic_column="dest")(df, 0)
    assert drain(client, "x") == Counter(f"x-{i}".encode() for i in range(10))
    assert drain(client, "y") == Counter(f"y-{i}".encode() for i in range(10))
    assert drain(client, "fallback") == Counter({b"none-0": 1})


def test_the_sinks_topic_option_wins_over_a_topic_column_as_in_kafka(spark, broker, client):
    for topic in ("x", "chosen"):
        client.admin("channel", "create", topic, "check")
    df = spark.createDataFrame([("to-x-0", "x"), ("to-x-1", "x"), ("no-topic", None)],
                               "body STRING, topic STRING")
    df.write.format("pynsq").option("address", broker.address).option("topic", "chosen") \
        .mode("append").save()
    assert drain(client, "chosen") == Counter({b"to-x-0": 1, b"to-x-1": 1, b"no-topic": 1})
    assert channel_stats(client, "x", "check").depth == 0


def test_without_a_topic_option_a_null_topic_column_fails_naming_the_row(spark, broker):
    df = spark.createDataFrame([("ok", "x"), ("no-topic", None)], "body STRING, topic STRING")
    with pytest.raises(Exception, match="row 1: column 'topic' is null and no topic option"):
        df.coalesce(1).write.format("pynsq").option("address", broker.address) \
            .mode("append").save()


@pytest.mark.parametrize("writer", ["pub_to_topic batch_size", "sink batchSize"])
def test_the_batch_size_sets_how_many_rows_each_mpub_holds(spark, broker, client, writer):
    """25 rows in one partition, 10 per MPUB: three requests, each one de-duplication entry."""
    client.admin("channel", "create", "b", "check")
    df = spark.createDataFrame([(f"r-{i}",) for i in range(25)], "body STRING").coalesce(1)
    if writer.startswith("pub_to_topic"):
        pub_to_topic(broker.address, "b", batch_size=10)(df, 0)
    else:
        df.write.format("pynsq").option("address", broker.address).option("topic", "b") \
            .option("batchSize", 10).mode("append").save()
    assert broker.call(len, broker.broker.dedupe) == 3
    assert drain(client, "b") == Counter(f"r-{i}".encode() for i in range(25))


def test_a_mistyped_body_column_fails_naming_it_before_any_task_runs(spark, broker, client):
    sc = spark.sparkContext
    df = spark.createDataFrame([(1,), (2,)], "body INT")
    sc.setJobGroup("mistyped-body", "a write that must fail on the driver")
    try:
        with pytest.raises(PublishError, match="column 'body' must be BINARY or STRING, not int"):
            pub_to_topic(broker.address, "b")(df, 0)
        with pytest.raises(Exception, match="column 'body' must be BINARY or STRING, not int"):
            df.write.format("pynsq").option("address", broker.address).option("topic", "b") \
                .mode("append").save()
        assert sc.statusTracker().getJobIdsForGroup("mistyped-body") == []
    finally:
        sc.setJobGroup(None, None)
    assert "b" not in {t.name for t in client.stats().topics}


def test_a_replay_after_the_dedupe_window_expired_publishes_its_batch_again(
        spark, broker, client, tmp_path):
    """The exactly-once boundary: past the window a replay is a new publish (README)."""
    client.admin("channel", "create", "b", "check")
    publish(client, "a", 300)
    publish_b = pub_to_topic(broker.address, "b")
    failed: list[bytes] = []

    def publish_then_fail_once(df, batch_id):
        publish_b(df, batch_id)
        if batch_id == 1 and not failed:
            failed.extend(r.body.encode() for r in df.collect())
            raise RuntimeError("injected failure after publishing batch 1")

    checkpoint = tmp_path / "ck"
    first = relay(spark, broker.address, checkpoint, lambda w: w.foreachBatch(publish_then_fail_once))
    with pytest.raises(StreamingQueryException, match="injected failure"):
        first.awaitTermination(120)
    # Ten minutes pass, as far as de-duplication knows: its entries expire.
    broker.call(setattr, broker.broker.dedupe, "window", 0.0)
    second = relay(spark, broker.address, checkpoint, lambda w: w.foreachBatch(publish_then_fail_once))
    assert second.awaitTermination(120)
    bodies = drain(client, "b")
    assert set(bodies) == set(expected_bodies(300))               # nothing lost
    assert {b for b, n in bodies.items() if n > 1} == set(failed)  # the replayed batch, twice
    assert len(failed) == 100 and sum(bodies.values()) == 400
