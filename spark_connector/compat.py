"""What the installed PySpark offers the connector, found once, here.

The connector supports PySpark 4.0 through 4.3. Each feature a newer PySpark adds is
looked up by what it is (a module, a class), never by comparing version numbers, and
the rest of the connector imports it from here:

- ``pyspark.sql.streaming.datasource`` (``ReadLimit``, ``ReadAllAvailable``, ``ReadMaxRows``,
  ``ReadMaxBytes``, ``SupportsTriggerAvailableNow``), PySpark 4.2 on: admission control and
  ``availableNow`` for Python streaming sources, whose ``latestOffset(start, limit)`` is told the offset
  Spark committed. The stream reader is built on that offset (it FINs what Spark
  committed before it reserves the next batch), so on 4.0 and 4.1, which call
  ``latestOffset()`` with no offset at all, there is no nearest behaviour that keeps
  at-least-once: the source refuses at ``load()``, naming the version it needs
  (`require_stream_reader`).
- ``DataSourceStreamArrowWriter`` (4.1 on): the native sink fed Arrow batches. PySpark 4.0 has
  no such class, but feeds any writer that is a ``DataSourceArrowWriter`` Arrow batches,
  streaming ones included: the same writer, made of those two classes.

The writers (``pub_to_topic``, ``writeStream.format("pynsq")``, ``df.write``) work on
every supported version.
"""

from __future__ import annotations

import pyspark
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamWriter

PYSPARK_VERSION = pyspark.__version__
# The oldest PySpark with what the stream reader is built on.
STREAM_READER_SINCE = "4.2"


class UnsupportedSparkVersion(RuntimeError):
    """The installed PySpark lacks what a part of the connector needs."""


try:
    from pyspark.sql.streaming.datasource import (ReadAllAvailable, ReadLimit, ReadMaxBytes,
                                                  ReadMaxRows, SupportsTriggerAvailableNow)
    HAS_STREAM_READER = True
except ImportError:  # PySpark 4.0 and 4.1: stand-ins, so the reader's module imports and says why
    HAS_STREAM_READER = False

    class ReadLimit:  # type: ignore[no-redef]
        pass

    class ReadAllAvailable(ReadLimit):  # type: ignore[no-redef]
        pass

    class ReadMaxRows(ReadLimit):  # type: ignore[no-redef]
        def __init__(self, max_rows: int) -> None:
            self.max_rows = max_rows

    class ReadMaxBytes(ReadLimit):  # type: ignore[no-redef]
        def __init__(self, max_bytes: int) -> None:
            self.max_bytes = max_bytes

    class SupportsTriggerAvailableNow:  # type: ignore[no-redef]
        pass

try:
    from pyspark.sql.datasource import DataSourceStreamArrowWriter
except ImportError:  # PySpark 4.0
    class DataSourceStreamArrowWriter(DataSourceStreamWriter,  # type: ignore[no-redef]
                                      DataSourceArrowWriter):
        """PySpark 4.0 hands a writer Arrow batches when it is a ``DataSourceArrowWriter``,
        in a stream too; ``commit``/``abort`` take the batch id, as a stream writer's."""


def require_stream_reader() -> None:
    """Refuse, naming the version needed, where the stream reader cannot keep its promise."""
    if not HAS_STREAM_READER:
        raise UnsupportedSparkVersion(
            f"spark.readStream.format(\"pynsq\") needs PySpark {STREAM_READER_SINCE} or newer "
            f"(admission control for Python streaming sources); this is PySpark "
            f"{PYSPARK_VERSION}. Upgrade with pip install 'pyspark>={STREAM_READER_SINCE}'. "
            f"The writers (pub_to_topic, writeStream.format(\"pynsq\"), df.write) work on it.")


__all__ = ["DataSourceStreamArrowWriter", "HAS_STREAM_READER", "PYSPARK_VERSION",
           "ReadAllAvailable", "ReadLimit",
           "ReadMaxBytes", "ReadMaxRows", "STREAM_READER_SINCE", "SupportsTriggerAvailableNow",
           "UnsupportedSparkVersion", "require_stream_reader"]
