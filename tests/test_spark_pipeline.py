"""pynsq -> Spark -> pynsq pipelines as the README writes them, with real Spark: the
relay example exactly once through a failed batch, the native sink fed straight from
the source, batch writes, and a committed batch never read again across a broker
restart. Each counts distinct message ids against what was published."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from pyspark.errors.exceptions.captured import StreamingQueryException

from broker import Client, EmbeddedBroker
from examples.relay_job import enrich
from spark_connector import pub_to_topic

from .helpers import free_port
from .spark_helpers import Recorder, channel_stats, publish, reader
from .test_spark_writers import drain


def test_the_relay_job_is_exactly_once_through_a_failed_batch(spark, broker, client, tmp_path):
    """The batch that failed after publishing is replayed with the same rows, attempts
    included, so the writer's de-duplication publishes nothing twice."""
    client.admin("channel", "create", "enriched", "check")
    inputs = [json.dumps({"n": i, "nested": {"b": [i, "x"]}}).encode() for i in range(300)]
    ids = client.multi_publish("events", inputs)
    publish_enriched = pub_to_topic(broker.address, "enriched")
    failed: list[int] = []

    def relay_then_fail_once(df, batch_id):
        publish_enriched(df, batch_id)
        if batch_id == 1 and not failed:
            failed.append(batch_id)
            raise RuntimeError("injected failure after batch 1 published")

    def start():
        source = reader(spark, broker.address, "events", "relay", maxMessagesPerTrigger=100)
        return (enrich(source).writeStream.foreachBatch(relay_then_fail_once)
                .option("checkpointLocation", str(tmp_path / "ck"))
                .trigger(availableNow=True).start())

    with pytest.raises(StreamingQueryException, match="injected failure"):
        start().awaitTermination(120)
    assert start().awaitTermination(120)
    out = [json.loads(body) for body in drain(client, "enriched").elements()]
    counts = Counter(o["source_id"] for o in out)
    assert set(counts) == set(ids)                              # nothing lost
    assert [i for i, n in counts.items() if n > 1] == []        # nothing twice
    by_id = {o["source_id"]: o for o in out}
    # the body's own JSON values are kept as they were; the added fields are typed
    assert by_id[ids[7]]["nested"] == {"b": [7, "x"]} and by_id[ids[7]]["n"] == 7
    assert {o["attempts"] for o in out} == {1}                  # as the first run read them


def test_the_native_sink_fed_by_the_source_writes_to_its_topic_option_not_back(
        spark, broker, client, tmp_path):
    """The source's rows carry a ``topic`` column; the sink's ``topic`` option wins."""
    client.admin("channel", "create", "lines", "check")
    sent = publish(client, "events", 30)
    query = (reader(spark, broker.address, "events").writeStream.format("pynsq")
             .option("address", broker.address).option("topic", "lines")
             .option("checkpointLocation", str(tmp_path / "ck"))
             .trigger(availableNow=True).start())
    assert query.awaitTermination(120)
    assert sum(drain(client, "lines").values()) == len(sent) == 30
    stats = channel_stats(client, "events")
    assert (stats.message_count, stats.depth, stats.finish_count) == (30, 0, 30)  # no loop


def test_a_batch_write_appends_and_refuses_overwrite_by_name(spark, broker, client):
    client.admin("channel", "create", "lines", "check")
    df = spark.createDataFrame([("a",), ("b",)], "body STRING")
    df.write.format("pynsq").option("address", broker.address).option("topic", "lines") \
        .mode("append").save()
    assert drain(client, "lines") == Counter({b"a": 1, b"b": 1})
    with pytest.raises(Exception, match=r'the pynsq sink only appends: write with '
                                        r'\.mode\("append"\)'):
        df.write.format("pynsq").option("address", broker.address).option("topic", "lines") \
            .mode("overwrite").save()


def test_a_committed_once_batch_is_not_read_again_after_a_clean_broker_restart(
        spark, tmp_path):
    """``once`` never tells the source its batch committed; the query stops and gives
    the lease back; the broker restarts; the next run still FINs that batch."""
    port = free_port()

    def start_broker() -> EmbeddedBroker:
        return EmbeddedBroker(grpc_address=f"127.0.0.1:{port}", tcp_address="",
                              http_address="", data_path=str(tmp_path / "data")).start()

    embedded = start_broker()
    try:
        with Client(embedded.address) as client:
            sent = publish(client, "events", 900)
        runs = [Recorder(), Recorder(), Recorder()]
        for recorder in runs:
            (reader(spark, embedded.address, "events", maxMessagesPerTrigger=300)
             .writeStream.foreachBatch(recorder)
             .option("checkpointLocation", str(tmp_path / "ck")).trigger(once=True).start()
             .awaitTermination(120))
            embedded.stop()
            embedded = start_broker()
        read = Counter(i for run in runs for i in run.ids)
        assert [len(run.ids) for run in runs] == [300, 300, 300]
        assert set(read) == sent and max(read.values()) == 1   # 900 read, each once
    finally:
        embedded.stop()
