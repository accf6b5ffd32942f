"""De-duplication from Spark: a writer's key names the writer, and a replay whose
rows differ fails loudly instead of being answered with the first ids (which
would FIN rows that were never published)."""

from __future__ import annotations

from collections import Counter

import pytest
from pyspark.errors.exceptions.captured import StreamingQueryException

from spark_connector import pub_to_topic
from spark_connector.options import OptionError

from .drivers.writer_shapes import SHAPES, expected_bodies, run_shapes
from .spark_helpers import channel_stats, publish, reader
from .test_spark_writers import drain


@pytest.fixture
def in_query(spark):
    """Run as inside foreachBatch of the query with id ``q-1`` (as Spark sets it)."""
    sc = spark.sparkContext
    sc.setLocalProperty("sql.streaming.queryId", "q-1")
    yield
    sc.setLocalProperty("sql.streaming.queryId", None)


def bodies_df(spark, bodies, partitions=1):
    return spark.createDataFrame([(b,) for b in bodies], "body STRING").coalesce(partitions)


def test_two_pub_to_topic_calls_in_one_foreach_batch_both_publish(spark, broker, client,
                                                                   tmp_path):
    for topic in ("b", "c"):
        client.admin("channel", "create", topic, "check")
    publish(client, "a", 200)
    to_b, to_c = pub_to_topic(broker.address, "b"), pub_to_topic(broker.address, "c")

    def fan_out(df, batch_id):
        to_b(df, batch_id)
        to_c(df, batch_id)

    df = reader(spark, broker.address, "a", maxMessagesPerTrigger=100).selectExpr(
        "CAST(body AS STRING) AS body")
    (df.writeStream.foreachBatch(fan_out).option("checkpointLocation", str(tmp_path / "ck"))
     .trigger(availableNow=True).start().awaitTermination(120))
    expected = Counter(f"msg-{i}".encode() for i in range(200))
    assert drain(client, "b") == expected
    assert drain(client, "c") == expected


@pytest.mark.parametrize("first, replay", [
    ({"batch_size": 2}, {"batch_size": 3}),                       # another batchSize
    ({"rows": ["r0", "r1", "r2", "r3"]}, {"rows": ["r1", "r2", "r3", "r4"]}),  # rows shifted
    ({"rows": ["r0", "r1"]}, {"rows": ["other-0", "other-1"]}),   # a copied checkpoint
])
def test_a_replay_with_other_rows_fails_naming_the_producer_and_publishes_nothing_wrong(
        spark, broker, client, in_query, first, replay):
    client.admin("channel", "create", "b", "check")
    rows = first.get("rows", ["r0", "r1", "r2", "r3"])
    pub_to_topic(broker.address, "b", batch_size=first.get("batch_size", 500))(
        bodies_df(spark, rows), 7)
    with pytest.raises(Exception, match="producer 'q-1:to-b:7:0' sequence 0 already published "
                                        "other content"):
        pub_to_topic(broker.address, "b", batch_size=replay.get("batch_size", 500))(
            bodies_df(spark, replay.get("rows", rows)), 7)
    assert drain(client, "b") == Counter(r.encode() for r in rows)


def test_the_same_replay_publishes_nothing_twice(spark, broker, client, in_query):
    client.admin("channel", "create", "b", "check")
    df = bodies_df(spark, [f"r{i}" for i in range(10)], partitions=2)
    publish_b = pub_to_topic(broker.address, "b", batch_size=3)
    publish_b(df, 4)
    publish_b(df, 4)
    assert drain(client, "b") == Counter(f"r{i}".encode() for i in range(10))


def test_two_writers_to_one_topic_need_their_own_producer_names(spark, broker, client,
                                                                in_query):
    client.admin("channel", "create", "b", "check")
    pub_to_topic(broker.address, "b", producer="left")(bodies_df(spark, ["x"]), 1)
    pub_to_topic(broker.address, "b", producer="right")(bodies_df(spark, ["y"]), 1)
    with pytest.raises(Exception, match="producer 'q-1:left:1:0'"):
        pub_to_topic(broker.address, "b", producer="left")(bodies_df(spark, ["z"]), 1)
    assert drain(client, "b") == Counter([b"x", b"y"])


@pytest.mark.timeout(600)  # eight small jobs a batch: a busy host's share of 2 cores
def test_a_replayed_batch_of_every_dataframe_shape_is_published_once(spark, broker, client,
                                                                     tmp_path):
    """Classic Spark's half of the shapes matrix (the Connect half: test_spark_connect.py):
    batch 1 publishes every shape, each to its own writer, fails, and is replayed from the
    checkpoint."""
    for name in SHAPES:
        client.admin("channel", "create", f"shape-{name}", "check")
    client.admin("channel", "create", "a", "shapes")
    publish(client, "a", 20)
    error = run_shapes(spark, broker.address, "a", str(tmp_path / "ck"), str(tmp_path / "failed"))
    assert "injected failure after batch 1 published every shape" in error
    for name in SHAPES:
        got, want = drain(client, f"shape-{name}"), expected_bodies(name, 20)
        print(f"classic {name}: published {sum(got.values())}, distinct {len(got)}, "
              f"duplicates {sum(got.values()) - len(got)}, lost {len(set(want) - set(got))}")
        assert got == want, name


def test_at_least_once_publishes_a_replay_with_other_rows_once_per_content(spark, broker, client,
                                                                          in_query):
    client.admin("channel", "create", "b", "check")
    write = pub_to_topic(broker.address, "b", batch_size=2, delivery="at-least-once")
    write(bodies_df(spark, ["r0", "r1", "r2"]), 7)
    write(bodies_df(spark, ["r0", "r1", "r2"]), 7)       # the same rows: nothing again
    write(bodies_df(spark, ["r0", "r1", "s2"]), 7)       # request 1 differs: published
    write(bodies_df(spark, ["r0", "r1", "s2"]), 7)       # that content once only
    assert drain(client, "b") == Counter([b"r0", b"r1", b"r2", b"s2"])


def test_a_bad_delivery_is_refused_naming_both_choices(spark, broker):
    with pytest.raises(OptionError, match="delivery: 'exactly-once' .* or 'at-least-once', "
                                          "got 'at-most-once'"):
        pub_to_topic(broker.address, "b", delivery="at-most-once")
    with pytest.raises(Exception, match="option delivery: 'exactly-once'"):
        (bodies_df(spark, ["x"]).write.format("pynsq").option("address", broker.address)
         .option("topic", "b").option("delivery", "twice").mode("append").save())


def test_a_timestamp_taken_inside_foreach_batch_fails_its_replay_saying_what_to_change(
        spark, broker, client, tmp_path):
    """A replay whose rows differ (current_timestamp() evaluated inside foreachBatch):
    exactly once refuses it with an error naming the cause and both fixes, publishing
    nothing of it; the query restarted with delivery='at-least-once' goes on at once, and
    only the replayed batch is delivered twice. The same timestamp taken in the streaming
    query, before foreachBatch (the fix the error proposes), is replayed as it was: once."""
    from pyspark.sql.functions import current_timestamp

    for topic in ("b", "fixed"):
        client.admin("channel", "create", topic, "check")
    publish(client, "a", 30)
    failed: list[int] = []

    def stamped_relay(delivery: str):
        write_fixed = pub_to_topic(broker.address, "fixed")
        write = pub_to_topic(broker.address, "b", delivery=delivery)

        def relay(df, batch_id):
            write_fixed(df.selectExpr("concat(CAST(body AS STRING), '@', CAST(at AS STRING)) "
                                      "AS body"), batch_id)
            write(df.selectExpr("concat(CAST(body AS STRING), '@', "
                                "CAST(current_timestamp() AS STRING)) AS body"), batch_id)
            if batch_id == 1 and not failed:
                failed.append(batch_id)
                raise RuntimeError("injected failure after publishing batch 1")
        return relay

    def run(delivery: str):
        return (reader(spark, broker.address, "a", maxMessagesPerTrigger=10)
                .withColumn("at", current_timestamp())   # Spark fixes it per batch
                .writeStream.foreachBatch(stamped_relay(delivery))
                .option("checkpointLocation", str(tmp_path / "ck"))
                .trigger(availableNow=True).start())

    with pytest.raises(StreamingQueryException, match="injected failure"):
        run("exactly-once").awaitTermination(120)
    with pytest.raises(StreamingQueryException) as refused:
        run("exactly-once").awaitTermination(120)
    for said in ("batch 1 partition", "already published other content",
                 "a value computed inside foreachBatch", "current_timestamp(), now()",
                 "before foreachBatch", "delivery='at-least-once'"):
        assert said in str(refused.value)
    assert channel_stats(client, "b", "check").depth == 20   # batches 0 and 1, nothing more
    assert run("at-least-once").awaitTermination(120)
    for topic in ("b", "fixed"):
        by_message = Counter(b.split(b"@")[0] for b in drain(client, topic).elements())
        print(f"current_timestamp() relay to {topic}: published {sum(by_message.values())}, "
              f"distinct {len(by_message)}, "
              f"duplicates {sum(by_message.values()) - len(by_message)}, "
              f"lost {30 - len(by_message)}")
        assert set(by_message) == {f"msg-{i}".encode() for i in range(30)}   # nothing lost
        if topic == "b":
            assert sorted(by_message.values()) == [1] * 20 + [2] * 10        # batch 1 twice
        else:
            assert set(by_message.values()) == {1}                           # exactly once
