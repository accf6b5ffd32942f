"""pynsq's Spark connector: the ``pynsq`` data source and the writers.

- ``PynsqDataSource``: ``spark.readStream.format("pynsq")`` (at-least-once reads
  that FIN only after the micro-batch commits), ``df.writeStream.format("pynsq")``
  and ``df.write.format("pynsq")``.
- ``pub_to_topic(address, topic, ...)``: a ``foreachBatch`` function that
  publishes each micro-batch from the executors.
"""

try:
    import pyspark  # noqa: F401
except ModuleNotFoundError as err:  # the broker installs without Spark; this package needs it
    raise ModuleNotFoundError(
        "spark_connector needs PySpark (4.0 to 4.3), which is not installed: "
        "pip install 'pynsq-broker[spark]'", name=err.name) from err

from .datasource import SCHEMA, PynsqDataSource
from .options import OptionError
from .writer import PublishError, pub_to_topic

__all__ = ["OptionError", "PublishError", "PynsqDataSource", "SCHEMA", "pub_to_topic"]
