"""A relay/enrichment job for spark-submit: read a pynsq channel, enrich each
JSON event, publish it to another topic. At least once in, once out on replay.

    spark-submit --master local[2] examples/relay_job.py \\
        --address 127.0.0.1:4170 --source-topic events --channel relay \\
        --sink-topic enriched --checkpoint checkpoints/relay [--available-now]

Each output body is the input's JSON object with three fields added: the pynsq
message id (``source_id``), the publish time (``published_at``) and how many
deliveries it took (``attempts``). Bodies that are not JSON objects are wrapped
as ``{"raw": "..."}``.
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
    text = F.col("body").cast("string")
    fields = F.from_json(text, "map<string,string>")
    obj = F.when(fields.isNotNull(), fields).otherwise(F.create_map(F.lit("raw"), text))
    enriched = F.map_concat(obj, F.create_map(
        F.lit("source_id"), F.col("id"),
        F.lit("published_at"), F.date_format("timestamp", "yyyy-MM-dd'T'HH:mm:ss.SSSXXX"),
        F.lit("attempts"), F.col("attempts").cast("string")))
    return df.select(F.to_json(enriched).alias("body"))


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
