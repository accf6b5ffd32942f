"""The connector's Spark-facing functions, called in-process as Spark calls them, without a
Spark session: the stream reader's driver methods as the driver calls them (a replay from
the checkpoint included), the sinks' and ``pub_to_topic``'s per-partition publish as an
executor runs it, and nsqlookupd's answers read by the driver. Real brokers on loopback."""

from __future__ import annotations

import signal
import socket
import threading
import time

import pyarrow as pa
import pytest
from pyspark import TaskContext
from pyspark.sql.streaming.datasource import ReadMaxRows
from pyspark.sql.types import LongType, StringType, StructField, StructType

from broker import Client, EmbeddedBroker
from broker.client import BrokerUnavailable
from broker.security.client import ClientSecurity
from spark_connector.discovery import DiscoveryError, Fleet, discover, grpc_address
from spark_connector.fetch import fetch_slice
from spark_connector.options import OptionError, ReaderOptions
from spark_connector.reader import LeaseSlice, PynsqStreamReader, _stop_on_sigterm
from spark_connector.session import BrokerUnreachable, DataLoss, LeaseKeeper
from spark_connector.writer import (PynsqBatchWriter, PynsqStreamWriter, pub_to_topic,
                                    publish_partition)

from .grpckit import channel_stats
from .helpers import free_port, json_http_server, wait_for


def reader_of(address: str, **options: str) -> PynsqStreamReader:
    return PynsqStreamReader({"address": address, "topic": "events", "channel": "spark",
                              "timeoutMs": "5000", **options})


def ids_read(parts: list[LeaseSlice]) -> list[str]:
    return sorted(i for p in parts for b in fetch_slice(p) for i in b.column(0).to_pylist())


# -- the source's driver -----------------------------------------------------------------

def test_the_source_worker_exits_once_on_sigterm_so_that_stop_runs():
    before = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        errors: list[BaseException] = []

        def in_a_thread():
            try:
                _stop_on_sigterm()
            except BaseException as err:  # noqa: BLE001 - the test reports it
                errors.append(err)

        thread = threading.Thread(target=in_a_thread)
        thread.start()
        thread.join()
        assert errors == [] and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
        _stop_on_sigterm()                                   # the worker's main thread
        handler = signal.getsignal(signal.SIGTERM)
        assert callable(handler)
        with pytest.raises(SystemExit) as exited:
            handler(signal.SIGTERM, None)
        assert exited.value.code == 128 + signal.SIGTERM
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN  # a second one: ignored
        _stop_on_sigterm()                                   # not the default: left alone
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGTERM, before)


def test_a_replay_fins_the_batch_before_it_and_reads_what_the_failed_run_planned(
        broker, client):
    client.create_channel("events", "spark")
    ids = client.multi_publish("events", [b"m"] * 10)
    failed = reader_of(broker.address, numPartitions="2", failOnDataLoss="false")
    first = failed.latestOffset(failed.initialOffset(), ReadMaxRows(4))
    # The failed driver planned batch 2, and died before batch 1's FIN got through.
    second = {"batch": 2, "leases": failed.keeper.reserve(2, 4, 1 << 20)}
    failed.keeper.close()                                   # gone, not stopped
    failed._keepers = None
    # An offset written by an earlier version names no broker instance, nor identity.
    for lease in second["leases"].values():
        del lease["broker"], lease["identity"]
    replay = reader_of(broker.address, numPartitions="2", failOnDataLoss="false")
    try:
        parts = replay.partitions(first, second)
        stats = channel_stats(client, "events", "spark")
        assert (stats.finish_count, stats.in_flight_count) == (4, 4)
        lease = second["leases"]["0"]
        security = replay.options.security
        assert parts == [LeaseSlice(broker.address, lease["lease"], p, 2, "events", "spark",
                                    5.0, "", False, security, 30.0) for p in range(2)]
        assert ids_read(parts) == sorted(ids[4:8])
    finally:
        replay.stop()


def test_a_replayed_lease_of_a_memory_only_broker_since_restarted_is_data_loss(broker, client):
    client.create_channel("events", "spark")
    client.multi_publish("events", [b"m"] * 4)
    failed = reader_of(broker.address)
    start = failed.initialOffset()
    first = failed.latestOffset(start, ReadMaxRows(4))
    failed.stop()
    # The broker restarted since: a memory-only broker's instance and identity both change.
    first["leases"]["0"].update(broker="an-earlier-instance", identity="n1-an-earlier-one")
    replay = reader_of(broker.address)
    try:
        with pytest.raises(DataLoss, match=r"batch 1 planned to read 4 message\(s\) of lease "
                                           r".* keeps messages in memory only .* those 4 "
                                           r"message\(s\) are lost\. Set failOnDataLoss=false "
                                           r"to go on without them"):
            replay.partitions(start, first)
    finally:
        replay.stop()


def test_a_replayed_lease_of_a_durable_broker_since_restarted_is_adopted_there(tmp_path):
    with EmbeddedBroker(data_path=str(tmp_path)) as broker, \
            Client(broker.address, timeout=10) as client:
        client.create_channel("events", "spark")
        ids = client.multi_publish("events", [b"m"] * 4)
        failed = reader_of(broker.address, numPartitions="1")
        start = failed.initialOffset()
        first = failed.latestOffset(start, ReadMaxRows(4))
        failed.keeper.close()                               # gone, not stopped
        failed._keepers = None
        first["leases"]["0"]["broker"] = "an-earlier-instance"  # it kept its leases
        replay = reader_of(broker.address, numPartitions="1")
        try:
            parts = replay.partitions(start, first)
            assert [p.lease_id for p in parts] == [first["leases"]["0"]["lease"]]
            assert ids_read(parts) == sorted(ids)
        finally:
            replay.stop()


def test_max_attempts_is_set_on_the_channel_the_source_creates(broker, client):
    reader = reader_of(broker.address, maxAttempts="3")
    try:
        reader.initialOffset()
        assert channel_stats(client, "events", "spark").max_attempts == 3
    finally:
        reader.stop()


def test_a_broker_not_answering_at_the_start_is_named_as_option_address():
    dead = f"127.0.0.1:{free_port()}"
    with pytest.raises(BrokerUnreachable, match=rf"cannot reach the broker at {dead} "
                                                rf"\(option address\): "):
        reader_of(dead, timeoutMs="1000").initialOffset()


def test_a_broker_that_stops_answering_is_waited_for_reconnect_timeout_then_named():
    broker = EmbeddedBroker().start()
    try:
        with Client(broker.address, timeout=10) as client:
            client.create_channel("events", "spark")
            client.multi_publish("events", [b"m"] * 4)
        reader = reader_of(broker.address, reconnectTimeoutMs="500", timeoutMs="1000")
        start = reader.initialOffset()
    finally:
        broker.stop()
    try:
        with pytest.raises(BrokerUnreachable, match=r"silent for longer than "
                                                    r"reconnectTimeoutMs \(500 ms\)"):
            reader.latestOffset(start, ReadMaxRows(4))
    finally:
        reader.stop()


def test_stopping_does_not_wait_for_a_broker_that_stopped_answering():
    broker = EmbeddedBroker().start()
    try:
        with Client(broker.address, timeout=10) as client:
            client.create_channel("events", "spark")
            client.multi_publish("events", [b"m"] * 4)
        reader = reader_of(broker.address, reconnectTimeoutMs="30000", timeoutMs="1000")
        reader.latestOffset(reader.initialOffset(), ReadMaxRows(4))
    finally:
        broker.stop()
    began = time.monotonic()
    reader.stop()
    assert time.monotonic() - began < 10     # not the 30 s a running query would wait


# -- the sinks and pub_to_topic, as an executor runs them ------------------------------------

def rows(*columns: tuple[str, list, pa.DataType]) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays([pa.array(values, kind) for _, values, kind in columns],
                                      names=[name for name, _, _ in columns])


@pytest.fixture
def topics(client):
    for topic in ("lines", "other"):
        client.create_channel(topic, "all")
    return client


def test_a_partition_publishes_string_bodies_routed_by_the_topic_column(broker, topics):
    batch = rows(("body", ["a", "b", "c"], pa.string()),
                 ("topic", ["other", None, "other"], pa.string()),
                 ("defer_ms", [None, 60_000, None], pa.int64()),
                 ("ttl_ms", [None, None, 60_000], pa.int64()))
    assert publish_partition(broker.address, "lines", "q:w:1", 2, "batch 1",
                             [batch], ClientSecurity()) == 3
    lines, other = channel_stats(topics, "lines", "all"), channel_stats(topics, "other", "all")
    assert (lines.deferred_count, other.depth) == (1, 2)
    with topics.subscribe("other", "all", rdy=10) as sub:
        assert sorted(sub.get(10).body for _ in range(2)) == [b"a", b"c"]


def test_a_topic_column_routes_nothing_when_the_sink_was_given_a_topic(broker, topics):
    batch = rows(("body", [b"a", b"b"], pa.binary()),
                 ("topic", ["other", "other"], pa.string()))
    assert publish_partition(broker.address, "lines", "q:w:1", 500, "batch 1", [batch],
                             None, topic_column=False) == 2
    assert (channel_stats(topics, "lines", "all").depth,
            channel_stats(topics, "other", "all").depth) == (2, 0)


BODIES = StructType([StructField("body", StringType()), StructField("ttl_ms", LongType())])


def test_a_batch_writes_task_retried_publishes_nothing_twice_and_a_new_write_does(
        broker, topics):
    options = {"address": broker.address, "topic": "lines", "batchSize": "2"}
    batch = rows(("body", ["a", "b", "c"], pa.string()), ("ttl_ms", [0, None, 0], pa.int64()))
    writer = PynsqBatchWriter(options, BODIES)
    assert writer.write(iter([batch])).published == 3
    assert writer.write(iter([batch])).published == 3      # the task, retried
    assert channel_stats(topics, "lines", "all").depth == 3
    assert PynsqBatchWriter(options, BODIES).write(iter([batch])).published == 3
    assert channel_stats(topics, "lines", "all").depth == 6


@pytest.fixture
def task():
    """The task context Spark's Python worker sets before it runs a sink's ``write``."""
    context = TaskContext()
    context._partitionId = 0
    context._localProperties = {"sql.streaming.queryId": "q1"}
    TaskContext._setTaskContext(context)
    yield context
    TaskContext._setTaskContext(None)


def test_a_stream_sinks_batch_replayed_publishes_nothing_twice_and_the_next_batch_does(
        broker, topics, task):
    writer = PynsqStreamWriter({"address": broker.address, "topic": "lines"}, BODIES)
    batch = rows(("body", ["a", "b", "c"], pa.string()), ("ttl_ms", [None] * 3, pa.int64()))
    task._localProperties["streaming.sql.batchId"] = "5"
    assert writer.write(iter([batch])).published == 3
    assert writer.write(iter([batch])).published == 3       # batch 5 replayed
    assert channel_stats(topics, "lines", "all").depth == 3
    task._localProperties["streaming.sql.batchId"] = "6"
    assert writer.write(iter([batch])).published == 3
    assert channel_stats(topics, "lines", "all").depth == 6


def test_pub_to_topic_takes_batches_of_one_and_refuses_fewer():
    assert callable(pub_to_topic("127.0.0.1:4170", "lines", batch_size=1))
    with pytest.raises(OptionError, match="batch_size must be at least 1, got 0"):
        pub_to_topic("127.0.0.1:4170", "lines", batch_size=0)


# -- nsqlookupd's answers -----------------------------------------------------------------

def test_a_host_name_in_info_is_kept_as_given():
    assert grpc_address({"grpc_address": "boX:4170"}, "10.0.0.5") == "boX:4170"


@pytest.fixture
def silent_lookupd():
    """An address that accepts connections and never answers."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        yield "127.0.0.1:%d" % listener.getsockname()[1]


def test_a_lookupd_that_does_not_answer_within_the_timeout_fails_naming_it(silent_lookupd):
    began = time.monotonic()
    with pytest.raises(DiscoveryError, match=f"no nsqlookupd answered .*{silent_lookupd}"):
        discover([silent_lookupd], "events", timeout=0.5)
    with pytest.raises(DiscoveryError, match=silent_lookupd):
        Fleet([silent_lookupd], "events", timeout=0.5).brokers()
    assert time.monotonic() - began < 4     # two timeouts of 0.5 s, not of 5 s or none


@pytest.fixture
def failing_lookupd():
    """An HTTP server that answers every request with HTTP 500."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Failing(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_error(500)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Failing)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield "127.0.0.1:%d" % server.server_address[1]
    server.shutdown()
    server.server_close()


def test_a_lookupd_that_fails_or_does_not_know_the_topic_leaves_the_others_asked(
        failing_lookupd):
    from .nsqkit import Lookupd

    unaware, aware = Lookupd().start(), Lookupd().start()
    try:
        with EmbeddedBroker(lookupd_tcp_address=(aware.tcp_address,),
                            broadcast_address="127.0.0.1") as broker, \
                Client(broker.address, timeout=10) as client:
            client.create_channel("events", "spark")
            wait_for(lambda: discover([aware.http_address], "events") == [broker.address], 30,
                     message="the broker registered with nsqlookupd")
            assert discover([failing_lookupd, unaware.http_address, aware.http_address],
                            "events") == [broker.address]
    finally:
        unaware.stop()
        aware.stop()


def test_a_broker_joining_the_fleet_is_found_within_the_poll_interval_and_gets_the_channel(
        caplog):
    import logging

    from .nsqkit import Lookupd

    caplog.set_level(logging.INFO, "pynsq.spark")
    lookupd = Lookupd().start()
    registered = {"lookupd_tcp_address": (lookupd.tcp_address,),
                  "broadcast_address": "127.0.0.1"}
    try:
        with EmbeddedBroker(**registered) as first, EmbeddedBroker(**registered) as second, \
                Client(first.address, timeout=10) as client, \
                Client(second.address, timeout=10) as joining:
            client.create_channel("events", "spark")
            wait_for(lambda: discover([lookupd.http_address], "events") == [first.address], 30,
                     message="the first broker registered")
            keeper = LeaseKeeper(ReaderOptions.parse({
                "lookupdHttpAddress": lookupd.http_address, "topic": "events",
                "channel": "spark", "lookupdPollIntervalMs": "100"}))
            try:
                joining.publish("events", b"x")
                wait_for(lambda: discover([lookupd.http_address], "events") == sorted(
                    [first.address, second.address]), 30, message="the second registered")
                began = time.monotonic()
                batch = iter(range(1, 1000))
                wait_for(lambda: keeper.reserve(next(batch), 10, 1 << 20) is not None and
                         f"pynsq: broker {second.address} joined the fleet of topic events"
                         in caplog.messages, 10, interval=0.05, message="the second joined")
                assert time.monotonic() - began < 3       # 100 ms, not the default 5 s
                assert channel_stats(joining, "events", "spark") is not None
            finally:
                keeper.close()
    finally:
        lookupd.stop()


def test_a_fin_that_did_not_get_through_is_sent_with_the_next_commit(tmp_path):
    port = free_port()
    where = {"data_path": str(tmp_path), "grpc_address": f"127.0.0.1:{port}"}
    broker = EmbeddedBroker(**where).start()
    try:
        with Client(broker.address, timeout=10) as client:
            client.create_channel("events", "spark")
            client.multi_publish("events", [b"m"] * 6)
        keeper = LeaseKeeper(ReaderOptions.parse({
            "address": broker.address, "topic": "events", "channel": "spark",
            "timeoutMs": "1000", "reconnectTimeoutMs": "0"}))
        keeper.reserve(1, 4, 1 << 20)
    finally:
        broker.stop()
    try:
        keeper.finish_through(1, {})                 # the broker is down: kept for later
        with EmbeddedBroker(**where) as restarted, \
                Client(restarted.address, timeout=10) as client:
            def answers() -> bool:
                try:
                    return client.ping() is not None
                except BrokerUnavailable:             # reconnecting (gRPC's backoff)
                    return False

            wait_for(answers, 15, interval=0.2, message="the restarted broker answering")
            keeper.finish_through(2, {})             # the next commit: nothing of its own
            stats = channel_stats(client, "events", "spark")
            assert (stats.depth, stats.in_flight_count) == (2, 0)
    finally:
        keeper.close()


@pytest.mark.parametrize("reserve_finishes", [True, False],
                         ids=["in_the_reserve", "an_older_broker_on_its_own_first"])
def test_a_trigger_fins_the_committed_batch_then_reserves_in_one_call_per_broker(
        broker, client, reserve_finishes):
    """Each trigger FINs the batch Spark committed and reserves the next: a broker whose
    Reserve FINs first (Info's ``reserve_finishes``) gets both in one call; an older one
    gets a FinishLeases first. Either way a committed batch whose lease timed out (a hung
    driver) is not read again by the next batch."""
    from collections import Counter

    def time_out() -> None:
        broker.broker.topics["events"].channels["spark"].tick(time.monotonic() + 3600)

    source = reader_of(broker.address, numPartitions="1")
    offset = source.initialOffset()
    [session] = source.keeper._sessions.values()
    assert session.reserve_finishes  # this broker says it can
    session.reserve_finishes = reserve_finishes
    calls: list[str] = []
    for name in ("reserve", "finish_leases"):
        def counted(*args, _real=getattr(session.client, name), _name=name, **kwargs):
            calls.append(_name)
            return _real(*args, **kwargs)
        setattr(session.client, name, counted)
    published: set[str] = set()
    read: list[str] = []
    per_trigger: list[list[str]] = []
    try:
        for _ in range(6):
            published |= set(client.multi_publish("events", [b"m"] * 20))
            calls.clear()
            end = source.latestOffset(offset, ReadMaxRows(1000))
            per_trigger.append(list(calls))
            read += [i for part in source.partitions(offset, end) for batch in source.read(part)
                     for i in batch.column(0).to_pylist()]   # ... and the batch commits
            offset = end
            broker.call(time_out)                             # then its lease times out
        end = source.latestOffset(offset, ReadMaxRows(1000))
        read += [i for part in source.partitions(offset, end) for batch in source.read(part)
                 for i in batch.column(0).to_pylist()]
    finally:
        source.stop()
    twice = sum(n - 1 for n in Counter(read).values())
    assert twice == 0 and set(read) == published, f"{twice} message(s) read twice"
    one_trigger = ["reserve"] if reserve_finishes else ["finish_leases", "reserve"]
    assert per_trigger == [["reserve"]] + [one_trigger] * 5


def test_a_listed_broker_that_does_not_answer_info_is_left_out_and_logged(caplog):
    """nsqlookupd lists a broker whose HTTP port is gone (it stopped since it registered)."""
    import logging

    gone = free_port()
    listing = {"producers": [{"broadcast_address": "127.0.0.1", "http_port": gone,
                              "tcp_port": 4150}]}
    caplog.set_level(logging.WARNING, "pynsq.discovery")
    with json_http_server(lambda path, port: listing) as lookupd:
        assert discover([lookupd], "events", 2) == []
    [warning] = [r.getMessage() for r in caplog.records if r.name == "pynsq.discovery"]
    assert warning.startswith(f"broker 127.0.0.1:{gone} listed by nsqlookupd did not answer "
                              f"/info: ") and "refused" in warning.lower()


# -- what a broker restart under a running query leaves: what is read, what the log says --------

def durable_broker_at(tmp_path) -> dict:
    """Where a durable broker is started again after a restart (same data path and port)."""
    return {"data_path": str(tmp_path), "grpc_address": f"127.0.0.1:{free_port()}"}


def forget_leases(tmp_path) -> None:
    """The broker's lease journal lost (a power loss takes its unsynced tail): after the
    restart it knows none of the leases made before, and their messages wait in the channel."""
    (tmp_path / "leases.journal").unlink()


def spark_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "pynsq.spark" and r.levelno >= 30]


def test_an_available_now_run_reads_again_what_a_restarted_broker_forgot_and_then_ends(
        tmp_path):
    where = durable_broker_at(tmp_path)
    broker = EmbeddedBroker(**where).start()
    reader = None
    try:
        with Client(broker.address, timeout=10) as client:
            client.create_channel("events", "spark")
            ids = client.multi_publish("events", [b"m"] * 6)
        reader = reader_of(broker.address, numPartitions="1")
        start = reader.initialOffset()
        reader.prepareForTriggerAvailableNow()
        offset = reader.latestOffset(start, ReadMaxRows(4))
        read = ids_read(reader.partitions(start, offset))    # batch 1 read, not yet FINed
    finally:
        broker.stop()
    forget_leases(tmp_path)
    try:
        with EmbeddedBroker(**where) as restarted, \
                Client(restarted.address, timeout=10) as client:
            for _ in range(10):                               # the run's next batches
                end = reader.latestOffset(offset, ReadMaxRows(4))
                if end == offset:
                    break                                     # the run ends
                read += ids_read(reader.partitions(offset, end))
                offset = end
            else:
                pytest.fail("the availableNow run did not end")
            reader.commit(offset)
            assert set(read) == set(ids)                      # batch 1's 4 read again
            stats = channel_stats(client, "events", "spark")
            assert (stats.depth, stats.in_flight_count) == (0, 0)
    finally:
        reader.stop()


def test_a_replayed_lease_a_restarted_durable_broker_forgot_is_logged_as_back_in_the_channel(
        tmp_path, caplog):
    import logging
    caplog.set_level(logging.WARNING, "pynsq.spark")
    where = durable_broker_at(tmp_path)
    broker = EmbeddedBroker(**where).start()
    try:
        with Client(broker.address, timeout=10) as client:
            client.create_channel("events", "spark")
            client.multi_publish("events", [b"m"] * 4)
        failed = reader_of(broker.address, numPartitions="1")
        start = failed.initialOffset()
        first = failed.latestOffset(start, ReadMaxRows(4))
        failed.keeper.close()                                # gone, not stopped
        failed._keepers = None
    finally:
        broker.stop()
    forget_leases(tmp_path)
    lease = first["leases"]["0"]
    with EmbeddedBroker(**where) as restarted:
        replay = reader_of(restarted.address, numPartitions="1")
        try:
            assert replay.partitions(start, first) == []      # nothing of it to read here
            address = restarted.address
            now = replay.keeper.broker_id(address)
        finally:
            replay.stop()
    assert (f"replaying batch 1: lease {lease['lease']} was made by broker instance "
            f"{lease['broker']}, now {now} answers at {address} (restarted): its 4 "
            f"message(s) are back in the channel and a later batch reads them"
            ) in spark_warnings(caplog)


def test_a_replay_whose_broker_stopped_answering_logs_the_adopt_that_failed(caplog):
    import logging
    caplog.set_level(logging.WARNING, "pynsq.spark")
    broker = EmbeddedBroker().start()
    address = broker.address
    try:
        with Client(address, timeout=10) as client:
            client.create_channel("events", "spark")
            client.multi_publish("events", [b"m"] * 4)
        failed = reader_of(address)
        start = failed.initialOffset()
        first = failed.latestOffset(start, ReadMaxRows(4))
        failed.keeper.close()                                # gone, not stopped
        failed._keepers = None
        replay = reader_of(address, failOnDataLoss="false", reconnectTimeoutMs="0",
                           timeoutMs="1000")
        replay.keeper                                         # connected, then it stops
    finally:
        broker.stop()
    try:
        replay.partitions(start, first)
    finally:
        replay.stop()
    assert any(w.startswith(f"pynsq: adopting leases on {address} failed: ")
               for w in spark_warnings(caplog)), spark_warnings(caplog)


def test_a_memory_only_broker_restart_under_held_leases_is_logged_naming_the_broker(caplog):
    import logging
    caplog.set_level(logging.WARNING, "pynsq.spark")
    where = {"grpc_address": f"127.0.0.1:{free_port()}"}
    broker = EmbeddedBroker(**where).start()
    address = broker.address
    with Client(address, timeout=10) as client:
        client.create_channel("events", "spark")
        client.multi_publish("events", [b"m"] * 4)
    reader = reader_of(address, msgTimeoutMs="1000", timeoutMs="1000")
    try:
        reader.latestOffset(reader.initialOffset(), ReadMaxRows(4))   # held, touched
        broker.stop()
        touch_failed = f"pynsq: touching leases on {address} failed: "
        wait_for(lambda: any(w.startswith(touch_failed) for w in spark_warnings(caplog)), 15,
                 interval=0.1, message="the failed touch logged")
        with EmbeddedBroker(**where):
            ended = (f"pynsq: lease session on {address} had ended (the broker "
                     f"restarted, or its grace period passed); opened a new one")
            wait_for(lambda: ended in spark_warnings(caplog), 15, interval=0.1,
                     message="the ended session logged")
    finally:
        reader.stop()
        broker.stop()
