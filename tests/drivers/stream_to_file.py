"""A Spark driver run as its own process by the tests: read a pynsq channel and
append the ids of every completed micro-batch to a file.

    python stream_to_file.py [--address A] --topic T --channel C --checkpoint DIR --out FILE
        [--master local[2]] [--max-per-trigger N] [--available-now [--then-stream FILE]]
        [--hang-on-batch N --marker FILE] [--option KEY=VALUE ...] [--sink-topic T]

With --hang-on-batch, batch N writes the marker file once its rows are read and
then hangs, so that a test can kill the driver mid-batch. With --sink-topic, each
batch is first relayed to that topic with ``pub_to_topic`` (batches of 10). With
--then-stream, the ``availableNow`` query writes FILE once it has ended and a
streaming query goes on from the same checkpoint, in the same session (one
cluster started, not two). A test may run the same query in its own session:
``run(spark, parse(argv))``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time


# A driver (or executor) JVM of this script lives a minute or two and moves a few hundred
# rows: most of its CPU goes to starting up. The JIT's quick tier only and the serial
# collector start it sooner (measured on 2 busy cores: a driver reached its third batch
# in 68-120 s, against 114-166 s with the JVM's defaults, started side by side).
FAST_START_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    for name in ("topic", "channel", "checkpoint", "out"):
        parser.add_argument(f"--{name}", required=True)
    parser.add_argument("--address", default="", help="else --option lookupdHttpAddress=...")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--max-per-trigger", type=int, default=0)
    parser.add_argument("--num-partitions", type=int, default=2)
    parser.add_argument("--available-now", action="store_true")
    parser.add_argument("--then-stream", default="")
    parser.add_argument("--hang-on-batch", type=int, default=-1)
    parser.add_argument("--marker", default="")
    parser.add_argument("--sink-topic", default="")
    parser.add_argument("--option", action="append", default=[],
                        help="KEY=VALUE: another option of the source (tlsCaFile, authSecret)")
    return parser.parse_args(argv)


def main() -> None:
    args = parse()
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    builder = (SparkSession.builder.master(args.master).appName("pynsq-test-driver")
               .config("spark.ui.enabled", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.python.authenticate.socketTimeout", "60s")  # a busy host
               .config("spark.executorEnv.PYSPARK_PYTHON", sys.executable)
               .config("spark.driver.extraJavaOptions", FAST_START_JVM)
               .config("spark.executor.extraJavaOptions", FAST_START_JVM))
    if os.environ.get("PYTHONPATH"):  # executors of a cluster import the same code as the driver
        paths = [os.path.abspath(p) for p in os.environ["PYTHONPATH"].split(os.pathsep) if p]
        builder = builder.config("spark.executorEnv.PYTHONPATH", os.pathsep.join(paths))
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))))
    from tests.spark_helpers import install_start_past_worker_start

    install_start_past_worker_start()    # Spark's fixed 10 s for its worker to connect back
    run(spark, args)
    spark.stop()


def run(spark, args: argparse.Namespace) -> None:
    """The driver's query (or its two: ``--then-stream``), until it ends."""
    reader = spark.readStream.format("pynsq")
    if args.address:
        reader = reader.option("address", args.address)
    reader = (reader.option("topic", args.topic).option("channel", args.channel)
              .option("numPartitions", args.num_partitions))
    reader = reader.options(**dict(o.split("=", 1) for o in args.option))
    if args.max_per_trigger:
        reader = reader.option("maxMessagesPerTrigger", args.max_per_trigger)

    sink = None
    if args.sink_topic:
        from spark_connector import pub_to_topic

        sink = pub_to_topic(args.address, args.sink_topic, batch_size=10)

    def record(df, batch_id: int) -> None:
        if sink is not None:
            sink(df.selectExpr("CAST(body AS STRING) AS body"), batch_id)
        ids = [row.id for row in df.select("id").collect()]
        if batch_id == args.hang_on_batch:
            # Written whole, then renamed: the test acts as soon as the marker exists.
            with open(args.marker + ".tmp", "w") as f:
                f.writelines(f"{i}\n" for i in ids)
            os.replace(args.marker + ".tmp", args.marker)
            time.sleep(3600)
        with open(args.out, "a") as f:
            f.writelines(f"{i}\n" for i in ids)
            f.flush()
            os.fsync(f.fileno())

    df = reader.load()

    def query(available_now: bool) -> None:
        writer = (df.writeStream.foreachBatch(record)
                  .option("checkpointLocation", args.checkpoint))
        writer = (writer.trigger(availableNow=True) if available_now
                  else writer.trigger(processingTime="200 milliseconds"))
        writer.start().awaitTermination()

    query(args.available_now)
    if args.available_now and args.then_stream:
        open(args.then_stream, "w").close()
        query(False)


if __name__ == "__main__":
    main()
