"""The Spark source and both writers against a TLS + auth broker: the options
``tlsCaFile`` and ``authSecret`` reach the executors, every message arrives once,
and the secret shows in no plan and no error."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from pyspark.errors.exceptions.captured import StreamingQueryException

from broker import Client, EmbeddedBroker

from .authserver import AuthServer, reply
from .grpckit import collect
from .securitykit import make_certs

SECRET = "spark-s3cret-value"
DRIVER = Path(__file__).parent / "drivers" / "stream_to_file.py"


@pytest.fixture(scope="module")
def secure(tmp_path_factory):
    certs = make_certs(tmp_path_factory.mktemp("certs"))
    secrets = {SECRET: reply(publish="^sp-", subscribe="^sp-"),
               "checker": reply(subscribe=".*")}
    with AuthServer(secrets) as auth, \
            EmbeddedBroker(tls_cert=certs.server_cert, tls_key=certs.server_key,
                           auth_http_addresses=[auth.address]) as b:
        yield b, certs


def test_source_and_writers_over_tls_with_auth_deliver_every_message_once(spark, secure,
                                                                          tmp_path):
    broker, certs = secure
    security = {"tlsCaFile": certs.ca, "authSecret": SECRET}
    n = 60
    with Client(broker.address, tls_ca=certs.ca, auth_secret="checker", timeout=10) as c:
        c.admin("channel", "create", "sp-out", "check")
    (spark.createDataFrame([(f"m{i}",) for i in range(n)], "body STRING").repartition(2)
     .write.format("pynsq").option("address", broker.address).option("topic", "sp-in")
     .options(**security).mode("append").save())
    stream = (spark.readStream.format("pynsq").option("address", broker.address)
              .option("topic", "sp-in").option("channel", "relay").options(**security).load())
    assert SECRET not in stream._jdf.queryExecution().toString()
    query = (stream.selectExpr("body").writeStream.format("pynsq")
             .option("address", broker.address).option("topic", "sp-out").options(**security)
             .option("checkpointLocation", str(tmp_path / "ck"))
             .trigger(availableNow=True).start())
    assert query.awaitTermination(180), "the availableNow query did not finish"
    assert SECRET not in str(query.lastProgress)
    with Client(broker.address, tls_ca=certs.ca, auth_secret="checker", timeout=10) as c:
        with c.subscribe("sp-out", "check", rdy=100) as sub:
            got = collect([sub], n, timeout=60)
        assert c.stats("sp-out").topics[0].message_count == n
    assert sorted(m.body for _, m in got) == sorted(f"m{i}".encode() for i in range(n))
    assert len({m.id for _, m in got}) == n


def test_a_wrong_secret_fails_the_query_without_showing_the_secret(spark, secure, tmp_path):
    broker, certs = secure
    wrong = "not-the-secret-4242"
    query = (spark.readStream.format("pynsq").option("address", broker.address)
             .option("topic", "sp-in").option("channel", "other")
             .option("tlsCaFile", certs.ca).option("authSecret", wrong).load()
             .writeStream.format("noop").option("checkpointLocation", str(tmp_path / "ck"))
             .start())
    with pytest.raises(StreamingQueryException) as caught:
        query.awaitTermination(120)
    assert "E_AUTH_FAILED" in str(caught.value)
    assert wrong not in str(caught.value)


def test_local_cluster_executors_read_over_tls_with_auth_and_finish_every_message(secure,
                                                                                 tmp_path):
    """A real cluster (separate executor JVMs and Python workers, so nothing can rely on
    the driver's process): every message read once over TLS with auth, and FINed."""
    broker, certs = secure
    with Client(broker.address, tls_ca=certs.ca, auth_secret=SECRET, timeout=10) as c:
        c.admin("channel", "create", "sp-cluster", "spark")
        published = set(c.multi_publish("sp-cluster", [f"c{i}".encode() for i in range(400)]))
    out = tmp_path / "ids.txt"
    driver = subprocess.Popen(
        [sys.executable, str(DRIVER), "--master", "local-cluster[2,1,1024]",
         "--address", broker.address, "--topic", "sp-cluster", "--channel", "spark",
         "--checkpoint", str(tmp_path / "ck"), "--out", str(out), "--num-partitions", "4",
         "--max-per-trigger", "200", "--available-now", "--option", f"tlsCaFile={certs.ca}",
         "--option", f"authSecret={SECRET}"],
        start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        assert driver.wait(600) == 0, driver.stderr.read().decode()[-3000:]
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
    ids = out.read_text().split()
    assert len(ids) == len(published) and set(ids) == published
    with Client(broker.address, tls_ca=certs.ca, auth_secret=SECRET, timeout=10) as c:
        [channel] = c.stats("sp-cluster", "spark").topics[0].channels
    assert (channel.finish_count, channel.depth, channel.in_flight_count) == (400, 0, 0)
