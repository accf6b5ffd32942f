"""A relay/enrichment job for spark-submit: read a pynsq channel, enrich each
JSON event, publish it to another topic. At least once in, once out on replay.

    spark-submit --master local[2] examples/relay_job.py \\
        --address 127.0.0.1:4170 --source-topic events --channel relay \\
        --sink-topic enriched --checkpoint checkpoints/relay [--available-now]

Each output body is the input's JSON object, its fields and their JSON values kept
as they were, with three fields added: the pynsq message id (``source_id``), the
publish time (``published_at``) and ``attempts`` (the deliveries it took when its
batch first read it: a replay reads the same). Bodies that are not JSON objects
are wrapped as ``{"raw": "...", ...}``. Exactly once end to end: a replayed batch
reads the same rows, and ``pub_to_topic`` publishes nothing twice.
"""

from __future__ import annotations

import argparse

from pyspark.sql import SparkSession, functions as F

from spark_connector import pub_to_topic


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Relay and enrich a pynsq topic.")
    parser.add_argument("--address", required=True, help="broker host:port (gRPC)")
    parser.add_argument("--source-topic", required=True)
    parser.add_argument("--channel", required=True)
    parser.add_argument("--sink-topic", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--max-per-trigger", type=int, default=10_000)
    parser.add_argument("--available-now", action="store_true",
                        help="process what is there, then stop")
    return parser.parse_args(argv)


def enrich(df):
    """Each body as a JSON object with ``source_id``, ``published_at`` and ``attempts``
    added; its own fields keep their JSON values (objects, arrays, numbers) as they were.
    Every added value comes from the source's columns, which a replay reads unchanged."""
    text = F.trim(F.col("body").cast("string"))
    fields = [F.col("id").alias("source_id"),
              F.date_format("timestamp", "yyyy-MM-dd'T'HH:mm:ss.SSSXXX").alias("published_at"),
              F.col("attempts")]
    added = F.to_json(F.struct(*fields))
    is_object = text.startswith("{") & F.from_json(text, "map<string,string>").isNotNull()
    # A JSON object's text is kept whole: the added fields go in before its closing brace.
    inner = F.regexp_replace(text, r"\s*}$", "")
    body = (F.when(is_object & text.rlike(r"^\{\s*\}$"), added)
            .when(is_object, F.concat(inner, F.lit(","), F.regexp_replace(added, r"^\{", "")))
            .otherwise(F.to_json(F.struct(F.col("body").cast("string").alias("raw"),
                                          *fields))))
    return df.select(body.alias("body"))


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    spark = SparkSession.builder.appName("pynsq-relay").getOrCreate()
    spark.sparkContext.setLogLevel("WARN")  # the job's own summary, not Spark's INFO lines
    source = (spark.readStream.format("pynsq").option("address", args.address)
              .option("topic", args.source_topic).option("channel", args.channel)
              .option("maxMessagesPerTrigger", args.max_per_trigger).load())
    writer = (enrich(source).writeStream
              .foreachBatch(pub_to_topic(args.address, args.sink_topic))
              .option("checkpointLocation", args.checkpoint))
    writer = (writer.trigger(availableNow=True) if args.available_now
              else writer.trigger(processingTime="1 second"))
    query = writer.start()
    query.awaitTermination()
    relayed = sum(p["numInputRows"] for p in query.recentProgress)
    print(f"relay: {relayed} messages from {args.source_topic}/{args.channel} to "
          f"{args.sink_topic} in {len(query.recentProgress)} micro-batches")
    spark.stop()


if __name__ == "__main__":
    main()
