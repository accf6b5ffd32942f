"""Every shape of DataFrame a ``foreachBatch`` may hand to ``pub_to_topic``, replayed.

``SHAPES`` maps a name to what a user's ``foreachBatch`` does with its batch before
publishing it (nothing, ``select``, ``selectExpr``, ``withColumn``, ``filter``, ``union``,
a join with a static frame, a cached frame); ``expected_bodies`` says what each shape
publishes for the source bodies ``msg-0`` ... ``msg-<n-1>``. ``run_shapes`` relays a
pynsq topic through every shape at once (topic ``shape-<name>``, writer ``shapes-<name>``,
MPUBs of 4 rows), the first run failing right after batch 1 published every shape, the
second restarting from the checkpoint: each shape's topic must then hold each expected
body once. Used by the classic test in this process and by the Spark Connect driver
(``spark_connect_roundtrip.py``), whose ``foreachBatch`` runs in the server's own Python
process: so the failure is remembered in a file, not in memory.
"""

from __future__ import annotations

import os
from collections import Counter

FAIL_BATCH = 1
PER_TRIGGER = 10


def _strings(df):
    return df.selectExpr("CAST(body AS STRING) AS body")


def _with_column(df):
    from pyspark.sql import functions as F

    return df.withColumn("body", F.expr("concat(CAST(body AS STRING), '-w')"))


def _join(df):
    static = df.sparkSession.createDataFrame([(0, "even"), (1, "odd")], "k INT, parity STRING")
    keyed = df.selectExpr("CAST(body AS STRING) AS body",
                          "CAST(substring(CAST(body AS STRING), 5) AS INT) % 2 AS k")
    # A join may shuffle, and rows fetched after a shuffle can come in another order when
    # the batch is replayed (seen under classic Spark): sorted within partitions, as the
    # writer's ProducerConflict advises, the replay is the same.
    return (keyed.join(static, "k").selectExpr("concat(body, '-', parity) AS body")
            .sortWithinPartitions("body"))


SHAPES = {
    "given": lambda df: df,
    "select": lambda df: df.select("body"),
    "selectExpr": lambda df: df.selectExpr("upper(CAST(body AS STRING)) AS body"),
    "withColumn": _with_column,
    "filter": lambda df: df.filter("CAST(substring(CAST(body AS STRING), 5) AS INT) % 2 = 0"),
    "union": lambda df: _strings(df).union(_strings(df).selectExpr("concat(body, '-u') AS body")),
    "join": _join,
    "cached": lambda df: _strings(df).selectExpr("concat(body, '-c') AS body").persist(),
}


def expected_bodies(shape: str, n: int) -> Counter:
    bodies = {
        "given": [f"msg-{i}" for i in range(n)],
        "select": [f"msg-{i}" for i in range(n)],
        "selectExpr": [f"MSG-{i}" for i in range(n)],
        "withColumn": [f"msg-{i}-w" for i in range(n)],
        "filter": [f"msg-{i}" for i in range(0, n, 2)],
        "union": [f"msg-{i}{s}" for i in range(n) for s in ("", "-u")],
        "join": [f"msg-{i}-{('even', 'odd')[i % 2]}" for i in range(n)],
        "cached": [f"msg-{i}-c" for i in range(n)],
    }[shape]
    return Counter(b.encode() for b in bodies)


def shapes_relay(address: str, flag: str, unnamed: tuple[str, str] | None = None):
    """A foreachBatch function publishing every shape of its batch, failing once after
    batch ``FAIL_BATCH`` published them all. ``unnamed`` (topic, file): batch 0 also
    calls ``pub_to_topic`` to that topic without ``producer`` and writes what it raised
    to the file (under Connect, a query of its own would cost another worker start)."""
    from spark_connector import pub_to_topic

    writers = {name: pub_to_topic(address, f"shape-{name}", producer=f"shapes-{name}",
                                  batch_size=4) for name in SHAPES}

    def relay(df, batch_id: int) -> None:
        if unnamed and batch_id == 0:
            try:
                pub_to_topic(address, unnamed[0])(df, batch_id)
                said = ""
            except Exception as e:
                said = str(e)
            with open(unnamed[1], "w") as f:
                f.write(said)
        for name, shape in SHAPES.items():
            out = shape(df)
            writers[name](out, batch_id)
            if name == "cached":
                out.unpersist()
        if batch_id == FAIL_BATCH and not os.path.exists(flag):
            open(flag, "w").close()
            raise RuntimeError(f"injected failure after batch {batch_id} published every shape")

    return relay


def run_shapes(spark, address: str, topic: str, checkpoint: str, flag: str,
               unnamed: tuple[str, str] | None = None) -> str:
    """Relay ``topic`` (channel ``shapes``) through every shape, availableNow, twice from
    one checkpoint; returns the first run's error (the injected failure)."""
    def start():
        return (spark.readStream.format("pynsq").option("address", address)
                .option("topic", topic).option("channel", "shapes")
                .option("maxMessagesPerTrigger", PER_TRIGGER).load()
                .writeStream.foreachBatch(shapes_relay(address, flag, unnamed))
                .option("checkpointLocation", checkpoint)
                .trigger(availableNow=True).start())

    first = start()
    try:
        first.awaitTermination()
        error = ""
    except Exception as e:  # the injected failure, as StreamingQueryException
        error = str(e)
    start().awaitTermination()
    return error
