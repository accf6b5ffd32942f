"""A Spark Connect client run as its own process by the tests: through a local
Spark Connect server (``SparkSession.builder.remote("local[2]")``), read a pynsq
topic with the source (``availableNow``) and write each body, upper-cased, to
another topic with the native sink; publish a static DataFrame with
``df.write.format("pynsq")``; then relay IN_TOPIC (channel ``shapes``) through
every DataFrame shape of ``writer_shapes`` with ``pub_to_topic`` in
``foreachBatch``, failing once after batch 1, and restart it from its checkpoint.
Batch 0 also calls ``pub_to_topic`` without ``producer``, which Connect must
refuse. Prints one JSON line of what it did.

Each query with ``foreachBatch`` starts a Python process on the server that must
connect back within Spark's fixed 10 s: the driver starts no more of them than
the two runs of the shapes relay.

    python spark_connect_roundtrip.py ADDRESS IN_TOPIC OUT_TOPIC CHECKPOINT_DIR
"""

from __future__ import annotations

import json
import os
import sys


def main(address: str, in_topic: str, out_topic: str, checkpoint: str) -> None:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.remote("local[2]").appName("pynsq-connect-test")
             .config("spark.sql.shuffle.partitions", "2")
             # Python workers get a minute, not 15 s, to authenticate on a busy host.
             .config("spark.python.authenticate.socketTimeout", "60s")
             .config("spark.ui.enabled", "false")
             .getOrCreate())
    is_connect = type(spark).__module__.startswith("pyspark.sql.connect")
    source = (spark.readStream.format("pynsq").option("address", address)
              .option("topic", in_topic).option("channel", "connect").load())
    query = (source.selectExpr("upper(CAST(body AS STRING)) AS body")
             .writeStream.format("pynsq").option("address", address)
             .option("topic", out_topic)
             .option("checkpointLocation", checkpoint)
             .trigger(availableNow=True).start())
    query.awaitTermination()
    (spark.createDataFrame([("static-1",), ("static-2",)], "body STRING")
     .write.format("pynsq").option("address", address).option("topic", out_topic)
     .mode("append").save())
    from tests.drivers.writer_shapes import run_shapes

    unnamed = checkpoint + "-unnamed-error"
    shapes_error = run_shapes(spark, address, in_topic, checkpoint + "-shapes",
                              checkpoint + "-shapes-failed",
                              unnamed=(f"{out_topic}-unnamed", unnamed))
    with open(unnamed) as f:
        unnamed_error = f.read()
    print(json.dumps({"connect": is_connect, "shapes_error": shapes_error,
                      "unnamed_error": unnamed_error}))
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:5])
