"""The ``pynsq`` Spark data source: read a channel as a stream, write DataFrames to a topic.

    df = (spark.readStream.format("pynsq")
            .option("address", "127.0.0.1:4170")
            .option("topic", "events").option("channel", "spark")
            .load())

Schema of the source (cast ``body`` as with Kafka's ``value``)::

    id STRING, body BINARY, timestamp TIMESTAMP, attempts INT, topic STRING, channel STRING

Installing the distribution makes ``format("pynsq")`` work in any new
SparkSession (through the ``pyspark_pynsq`` module); ``spark.dataSource.register(
PynsqDataSource)`` works too.
"""

from __future__ import annotations

from pyspark.sql.datasource import DataSource
from pyspark.sql.types import (BinaryType, IntegerType, StringType, StructField, StructType,
                               TimestampType)

SCHEMA = StructType([
    StructField("id", StringType()),
    StructField("body", BinaryType()),
    StructField("timestamp", TimestampType()),
    StructField("attempts", IntegerType()),
    StructField("topic", StringType()),
    StructField("channel", StringType()),
])


class PynsqDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "pynsq"

    def schema(self) -> StructType:
        # Spark asks for the schema in load(), and only for a read: checking the
        # read's options here makes a bad one fail load(), as Kafka's source does,
        # instead of the query's start.
        from .compat import require_stream_reader
        from .options import ReaderOptions

        require_stream_reader()
        ReaderOptions.parse(self.options)
        return SCHEMA

    def reader(self, schema):
        from .options import OptionError

        raise OptionError(
            "pynsq reads a channel as a stream: spark.read.format(\"pynsq\") is not "
            "supported; use spark.readStream.format(\"pynsq\") and "
            "writeStream.trigger(availableNow=True) to read what the channel holds, then stop")

    def streamReader(self, schema):
        from .compat import require_stream_reader
        from .reader import PynsqStreamReader

        require_stream_reader()

        return PynsqStreamReader(self.options)

    def writer(self, schema, overwrite: bool):
        from .options import OptionError
        from .writer import PynsqBatchWriter

        if overwrite:
            # A topic is a log: there is nothing to overwrite, only messages to add.
            raise OptionError('the pynsq sink only appends: write with .mode("append")')

        return PynsqBatchWriter(self.options, schema)

    def streamWriter(self, schema, overwrite: bool):
        from .writer import PynsqStreamWriter

        return PynsqStreamWriter(self.options, schema)
