"""A Spark Connect client run as its own process by the tests: through a local
Spark Connect server (``SparkSession.builder.remote("local[2]")``), read a pynsq
topic with the source (``availableNow``) and write each body, upper-cased, to
another topic with the native sink; read it again on a second channel and write
each body, lower-cased, to ``OUT_TOPIC-fb`` with ``pub_to_topic`` in
``foreachBatch``; then publish a static DataFrame with ``df.write.format("pynsq")``.
Then relay IN_TOPIC (channel ``shapes``) through every DataFrame shape of
``writer_shapes`` with a failure after batch 1, and (channel ``unnamed``) through
``pub_to_topic`` without ``producer``, which Connect must refuse.
Prints one JSON line of what it did.

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
             # The server's foreachBatch worker gets a minute, not 15 s, to connect back
             # to its JVM on a busy host.
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
    from spark_connector import pub_to_topic

    second = (spark.readStream.format("pynsq").option("address", address)
              .option("topic", in_topic).option("channel", "connect-fb").load()
              .selectExpr("lower(CAST(body AS STRING)) AS body")
              .writeStream.foreachBatch(pub_to_topic(address, f"{out_topic}-fb",
                                                     producer="connect-relay"))
              .option("checkpointLocation", checkpoint + "-fb")
              .trigger(availableNow=True).start())
    second.awaitTermination()
    (spark.createDataFrame([("static-1",), ("static-2",)], "body STRING")
     .write.format("pynsq").option("address", address).option("topic", out_topic)
     .mode("append").save())
    from tests.drivers.writer_shapes import run_shapes

    shapes_error = run_shapes(spark, address, in_topic, checkpoint + "-shapes",
                              checkpoint + "-shapes-failed")
    unnamed = (spark.readStream.format("pynsq").option("address", address)
               .option("topic", in_topic).option("channel", "unnamed").load()
               .writeStream.foreachBatch(pub_to_topic(address, f"{out_topic}-unnamed"))
               .option("checkpointLocation", checkpoint + "-unnamed")
               .trigger(availableNow=True).start())
    try:
        unnamed.awaitTermination()
        unnamed_error = ""
    except Exception as e:
        unnamed_error = str(e)
    print(json.dumps({"connect": is_connect, "shapes_error": shapes_error,
                      "unnamed_error": unnamed_error}))
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:5])
