"""The connector on each supported PySpark (4.0 through 4.3): the writers everywhere, the
stream source where PySpark has what it is built on, and elsewhere a refusal at load()
that names the version it needs. `make test` runs this file, with the writers' and the
options' tests, on the oldest PySpark too (`make test-lowest`)."""

from __future__ import annotations

import json
from collections import Counter

import pyspark
import pytest

from spark_connector import compat, pub_to_topic

from .test_spark_writers import drain

ROWS = 120


def file_stream(spark, folder):
    """A stream that is not pynsq's, so the writers are tested on a PySpark the source
    refuses: JSON lines in files, read with availableNow."""
    folder.mkdir()
    for part in range(3):
        lines = (json.dumps({"body": f"row-{i}"}) for i in range(part, ROWS, 3))
        (folder / f"part-{part}.json").write_text("\n".join(lines) + "\n")
    return spark.readStream.schema("body STRING").json(str(folder))


def expected() -> Counter:
    return Counter(f"row-{i}".encode() for i in range(ROWS))


def test_the_native_stream_sink_publishes_every_row_once(spark, broker, client, tmp_path):
    client.admin("channel", "create", "out", "check")
    query = (file_stream(spark, tmp_path / "in").writeStream.format("pynsq")
             .option("address", broker.address).option("topic", "out")
             .option("checkpointLocation", str(tmp_path / "ck"))
             .trigger(availableNow=True).start())
    assert query.awaitTermination(120) is not False and query.exception() is None
    assert drain(client, "out") == expected()


def test_pub_to_topic_publishes_every_row_once(spark, broker, client, tmp_path):
    client.admin("channel", "create", "out", "check")
    query = (file_stream(spark, tmp_path / "in").writeStream
             .foreachBatch(pub_to_topic(broker.address, "out", batch_size=50))
             .option("checkpointLocation", str(tmp_path / "ck"))
             .trigger(availableNow=True).start())
    assert query.awaitTermination(120) is not False and query.exception() is None
    assert drain(client, "out") == expected()


@pytest.mark.skipif(compat.HAS_STREAM_READER,
                    reason=f"PySpark {pyspark.__version__} has what the source needs "
                           f"(tests/test_spark_source.py reads with it)")
def test_the_stream_source_is_refused_at_load_naming_the_pyspark_it_needs(spark, broker):
    with pytest.raises(Exception) as caught:
        (spark.readStream.format("pynsq").option("address", broker.address)
         .option("topic", "events").option("channel", "spark").load())
    message = str(caught.value)
    assert f"needs PySpark {compat.STREAM_READER_SINCE} or newer" in message
    assert f"this is PySpark {pyspark.__version__}" in message
    assert "The writers (pub_to_topic" in message


def test_the_source_is_refused_exactly_where_pyspark_lacks_admission_control():
    """The one switch: present in PySpark 4.2 and later, absent in 4.0 and 4.1."""
    major_minor = tuple(int(p) for p in pyspark.__version__.split(".")[:2])
    assert compat.HAS_STREAM_READER == (major_minor >= (4, 2))
    if compat.HAS_STREAM_READER:
        compat.require_stream_reader()
    else:
        with pytest.raises(compat.UnsupportedSparkVersion, match="needs PySpark 4.2"):
            compat.require_stream_reader()


def test_without_pyspark_the_connector_says_which_extra_to_install():
    import subprocess
    import sys

    # ``None`` in sys.modules makes ``import pyspark`` fail as a missing package does.
    result = subprocess.run([sys.executable, "-c", "import sys; sys.modules['pyspark'] = None; "
                             "import spark_connector"], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last == ("ModuleNotFoundError: spark_connector needs PySpark (4.0 to 4.3), which is "
                    "not installed: pip install 'pynsq-broker[spark]'")
