"""Fixtures: a real broker on a loopback port, a client, and one Spark session
shared by the whole test session (each query gets its own checkpoint dir)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from _pytest.nodeid import NodeId   # pytest 9: a node id is parsed, see below

import broker as broker_package
from broker import Client, EmbeddedBroker

# Under mutmut the tests import its mutated copy (mutants/); the pynsqd and pynsq
# subprocesses they start import that copy too, so a planted bug is in both.
_SOURCE_ROOT = Path(broker_package.__file__).resolve().parent.parent
if _SOURCE_ROOT.name == "mutants":
    os.environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(_SOURCE_ROOT), os.environ.get("PYTHONPATH")]))


@pytest.fixture
def broker():
    """A fresh embedded broker on a free 127.0.0.1 port."""
    with EmbeddedBroker() as b:
        yield b


@pytest.fixture
def client(broker):
    c = Client(broker.address, timeout=10)
    yield c
    c.close()


@pytest.fixture(scope="session")
def spark():
    """One local Spark session for the test session; executors run this interpreter."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    from .spark_helpers import install_start_past_worker_start

    # local[2,2]: two threads, and a failed task is retried once (as on a cluster).
    builder = (SparkSession.builder.master("local[2,2]").appName("pynsq-tests")
               .config("spark.ui.enabled", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.sql.streaming.minBatchesToRetain", "5")
               .config("spark.driver.extraJavaOptions", "-Dlog4j.rootLogger=ERROR")
               # A Python worker that connected back while the host is busy gets a minute,
               # not 15 s, for its handshake. (The 10 s it has to connect back at all, for
               # the process behind a streaming source, is Spark's own: see spark_helpers.)
               .config("spark.python.authenticate.socketTimeout", "60s"))
    try:
        session = builder.getOrCreate()
    except Exception as err:        # a JVM that exited at start (a busy host): once more
        if "JAVA_GATEWAY_EXITED" not in str(err) and "gateway" not in str(err).lower():
            raise
        session = builder.getOrCreate()
    install_start_past_worker_start()
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(items):
    """Under ``pytest -n N --dist loadgroup`` every test on the shared Spark
    session runs in one worker, so the run still has one Spark session.

    pytest-xdist marks a group by renaming ``item._nodeid`` to ``id@group``, which
    pytest 9 no longer reads (a node's id lives in ``item._id``): without the step
    after ``yield`` no test is grouped and each worker starts a Spark session."""
    for item in items:
        if "spark" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("spark"))
    result = yield
    for item in items:
        renamed = item.__dict__.get("_nodeid")
        if renamed is not None and renamed != item.nodeid:
            item._id = NodeId.parse(renamed)
    return result
