"""The demo: an embedded broker, a producer, and a Spark stream reading ``pynsq``.

    make demo

A producer publishes JSON click events to topic ``events`` while a Structured
Streaming query reads channel ``spark`` with ``format("pynsq")``, aggregates
each micro-batch and prints it. Every message is FINed once its batch commits;
the demo stops cleanly when all of them are.
"""

from __future__ import annotations

import json
import os
import random
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from pyspark.sql import SparkSession, functions as F  # noqa: E402

from broker import Client, EmbeddedBroker  # noqa: E402

EVENTS = 5000
# Spark's log at ERROR from the JVM's first line (setLogLevel comes after its start-up).
QUIET_LOG = Path(__file__).resolve().parent.parent / "conf" / "spark-log4j2.properties"
ACTIONS = ["view", "click", "purchase"]


def produce(address: str, events: int = EVENTS) -> None:
    client = Client(address)
    rng = random.Random(7)
    for start in range(0, events, 250):
        batch = [json.dumps({"user": f"user-{rng.randrange(20)}",
                             "action": rng.choice(ACTIONS),
                             "amount": rng.randrange(1, 100)}).encode()
                 for _ in range(250)]
        client.multi_publish("events", batch)
        time.sleep(0.1)
    client.close()


def main(spark: SparkSession | None = None, published: int = EVENTS) -> None:
    """Run the demo in ``spark`` (kept running), or in a local session of its own."""
    own = spark is None
    if own:
        spark = (SparkSession.builder.master("local[2]").appName("pynsq-demo")
                 .config("spark.ui.enabled", "false")
                 .config("spark.ui.showConsoleProgress", "false")   # no progress bars
                 .config("spark.driver.extraJavaOptions",           # no start-up WARN lines
                         f"-Dlog4j2.configurationFile={QUIET_LOG}")
                 .config("spark.sql.shuffle.partitions", "2").getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
    totals = {"rows": 0}

    def show(batch, batch_id: int) -> None:
        n = batch.count()
        if n == 0:
            return
        totals["rows"] += n
        print(f"--- batch {batch_id}: {n} events ---")
        (batch.groupBy("action").agg(F.count("*").alias("events"),
                                     F.sum("amount").alias("amount"))
         .orderBy("action").show(truncate=False))

    with EmbeddedBroker() as broker, tempfile.TemporaryDirectory() as checkpoint:
        print(f"embedded broker on {broker.address}")
        client = Client(broker.address)
        client.admin("channel", "create", "events", "spark")
        producer = threading.Thread(target=produce, args=(broker.address, published))
        producer.start()

        schema = "user STRING, action STRING, amount INT"
        events = (spark.readStream.format("pynsq")
                  .option("address", broker.address)
                  .option("topic", "events").option("channel", "spark")
                  .option("maxMessagesPerTrigger", 1000)
                  .load()
                  .select(F.from_json(F.col("body").cast("string"), schema).alias("e"))
                  .select("e.*"))
        query = (events.writeStream.foreachBatch(show)
                 .option("checkpointLocation", checkpoint)
                 .trigger(processingTime="500 milliseconds").start())

        producer.join()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            channel = client.stats("events", "spark").topics[0].channels[0]
            if channel.finish_count >= published:
                break
            time.sleep(0.2)
        query.stop()
        print(f"published {published} events; Spark read {totals['rows']}; "
              f"broker FINed {channel.finish_count}, depth {channel.depth}, "
              f"in flight {channel.in_flight_count}")
        client.close()
    if own:
        spark.stop()


if __name__ == "__main__":
    main()
