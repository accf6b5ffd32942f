"""From Spark: a poison message stops failing a query after ``maxAttempts`` batches (it goes
to the dead-letter topic), and the writer's per-row ``ttl_ms`` column."""

from __future__ import annotations

import time

from pyspark.errors.exceptions.captured import StreamingQueryException

from spark_connector import pub_to_topic

from .helpers import wait_for
from .spark_helpers import channel_stats, reader


def test_a_poison_message_goes_to_the_dead_letter_topic_after_max_attempts_batches(
        spark, broker, client, tmp_path):
    client.create_channel("events.dead", "audit")
    # one message per batch: every message of a failing batch counts an attempt
    bodies = [b"ok-0", b"ok-1", b"poison", b"ok-2"]
    ids = dict(zip(client.multi_publish("events", bodies), bodies))
    committed: list[str] = []

    def sink(df, batch_id: int) -> None:
        rows = df.select("id", "body").collect()
        if any(bytes(r.body) == b"poison" for r in rows):
            raise RuntimeError("cannot process poison")
        committed.extend(r.id for r in rows)

    failures = 0
    for _ in range(4):  # restarts from the checkpoint, as an operator or a supervisor would
        query = (reader(spark, broker.address, "events", maxAttempts=2,
                        maxMessagesPerTrigger=1)
                 .writeStream.foreachBatch(sink)
                 .option("checkpointLocation", str(tmp_path / "ck"))
                 .trigger(availableNow=True).start())
        try:
            query.awaitTermination(120)
            break
        except StreamingQueryException as err:
            assert "cannot process poison" in str(err)
            failures += 1
            # well within the 60 s grace a dropped driver gets: the failed query gave it back
            wait_for(lambda: channel_stats(client, "events").in_flight_count == 0, 30,
                     message="the failed query to give its batch back")
    assert failures == 2
    assert sorted(committed) == sorted(i for i, b in ids.items() if b != b"poison")
    [poison] = [i for i, b in ids.items() if b == b"poison"]
    with client.subscribe("events.dead", "audit", rdy=10) as sub:
        msg = sub.get(30)
        assert (msg.id, msg.body) == (poison, b"poison")
    assert channel_stats(client, "events").dead_letter_count == 1


def test_the_writers_ttl_ms_column_gives_each_row_its_time_to_live(spark, broker, client):
    client.create_channel("out", "check")
    df = spark.createDataFrame([("short", 1), ("long", 600_000), ("none", None)],
                               "body STRING, ttl INT")
    pub_to_topic(broker.address, "out", ttl_column="ttl")(df, 0)
    published_at = time.monotonic()
    wait_for(lambda: time.monotonic() > published_at + 0.01, 5, message="the ttl to pass")
    got = []
    with client.subscribe("out", "check", rdy=10) as sub:
        while len(got) < 2:
            msg = sub.get(30)
            assert msg is not None, f"got {got}"
            got.append(msg.body)
            sub.fin(msg.id)
    assert sorted(got) == [b"long", b"none"]
    wait_for(lambda: channel_stats(client, "out", "check").expired_count == 1, 10,
             message="the short-lived row to expire")
