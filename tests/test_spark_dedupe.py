"""De-duplication from Spark: a writer's key names the writer, and a replay whose
rows differ fails loudly instead of being answered with the first ids (which
would FIN rows that were never published)."""

from __future__ import annotations

from collections import Counter

import pytest

from spark_connector import pub_to_topic

from .spark_helpers import publish, reader
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
