"""Fixtures: a real broker on a loopback port, a client, and one Spark session
shared by the whole test session (each query gets its own checkpoint dir)."""

from __future__ import annotations

import os
import sys

import pytest

from broker import Client, EmbeddedBroker


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

    # local[2,2]: two threads, and a failed task is retried once (as on a cluster).
    session = (SparkSession.builder.master("local[2,2]").appName("pynsq-tests")
               .config("spark.ui.enabled", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.sql.streaming.minBatchesToRetain", "5")
               .config("spark.driver.extraJavaOptions", "-Dlog4j.rootLogger=ERROR")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
