"""Lets ``spark.readStream.format("pynsq")`` work with no ``register`` call.

PySpark registers every importable top-level module whose name starts with
``pyspark_`` and that defines ``DefaultSource``.
"""

from spark_connector.datasource import PynsqDataSource as DefaultSource

__all__ = ["DefaultSource"]
