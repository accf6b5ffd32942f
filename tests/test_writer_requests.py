"""The writers' requests, without Spark: they stay under the broker's --max-body-size
whatever the rows' size, and a partition's replay is known by its producer id wherever
the broker now is."""

from __future__ import annotations

import threading
from collections import Counter

import pytest

from broker import Client, EmbeddedBroker
from broker.client import BrokerUnavailable
from spark_connector.writer import DEFAULT_BATCH_SIZE, PartitionPublisher

from .helpers import Daemon, free_port, wait_for
from .test_spark_writers import drain


@pytest.mark.parametrize("rows, size", [(30, 300 << 10),    # 9 MiB in rows of 300 KiB
                                         (5000, 1200)])        # 6 MB in one default batch
def test_rows_larger_than_the_body_limit_in_total_are_published_in_several_requests(rows, size):
    body = b"x" * size                   # over the 5 MiB limit in all
    with EmbeddedBroker() as broker, Client(broker.address) as client:
        client.admin("channel", "create", "big", "all")
        publisher = PartitionPublisher(broker.address, "big", "test:big:0", DEFAULT_BATCH_SIZE,
                                       "partition 0")
        try:
            for i in range(rows):
                publisher.add(body[:-4] + b"%04d" % i)
            assert publisher.finish() == rows
            assert publisher.sequence > 1      # cut into several MPUBs
        finally:
            publisher.close()
        [topic] = client.stats("big").topics
        assert topic.channels[0].depth == rows


def _publish_rows(address: str, rows: list[bytes], **kwargs) -> int:
    """One partition of batch 3 of query q-1, as the writers name it, in MPUBs of 4 rows."""
    publisher = PartitionPublisher(address, "moved", "q-1:to-moved:3:0", 4, "batch 3 partition 0",
                                   **kwargs)
    try:
        for row in rows:
            publisher.add(row)
        return publisher.finish()
    finally:
        publisher.close()


def test_a_replay_to_a_durable_broker_moved_to_a_new_address_publishes_nothing_twice(tmp_path):
    """A producer id names the writer, not the broker's address: the window comes along
    with the data path, so a replay sent to the broker where it now is finds it."""
    data = str(tmp_path / "data")
    daemon = Daemon("--data-path", data).wait_ready()
    try:
        with Client(daemon.address) as client:
            client.admin("channel", "create", "moved", "check")
        rows = [f"r{i}".encode() for i in range(10)]
        _publish_rows(daemon.address, rows)
        old_address = daemon.address
        daemon.kill()                                            # kill -9, then a new port
        daemon = Daemon("--data-path", data).wait_ready()
        assert daemon.address != old_address
        assert _publish_rows(daemon.address, rows) == 10         # the replay, answered
        with Client(daemon.address) as client:
            assert drain(client, "moved") == Counter(rows)
    finally:
        daemon.kill()


def test_a_writers_broker_killed_mid_partition_and_back_within_reconnect_timeout_is_waited_for(
        tmp_path, caplog):
    """The partition's first MPUB got through; the broker dies (kill -9) and comes back on
    its address: the rest is published once it answers, and a replay of the whole
    partition publishes nothing twice."""
    data = str(tmp_path / "data")
    daemon = Daemon("--data-path", data).wait_ready()
    rows = [f"r{i}".encode() for i in range(10)]
    try:
        with Client(daemon.address) as client:
            client.admin("channel", "create", "moved", "check")
        publisher = PartitionPublisher(daemon.address, "moved", "q-1:to-moved:3:0", 4,
                                       "batch 3 partition 0")
        for row in rows[:4]:
            publisher.add(row)                                   # MPUB 0, published
        daemon.kill()
        result: list[object] = []
        rest = threading.Thread(target=lambda: result.append(
            _finish(publisher, rows[4:])))
        rest.start()
        wait_for(lambda: "waiting up to reconnectTimeoutMs" in caplog.text, 30,
                 message="the writer to find the broker silent")
        daemon = Daemon("--data-path", data, port=daemon.port).wait_ready()
        rest.join(60)
        assert result == [10]
        assert _publish_rows(daemon.address, rows) == 10         # the replay
        with Client(daemon.address) as client:
            assert drain(client, "moved") == Counter(rows)
    finally:
        daemon.kill()


def _finish(publisher: PartitionPublisher, rows: list[bytes]) -> object:
    try:
        for row in rows:
            publisher.add(row)
        return publisher.finish()
    except Exception as err:  # reported to the test, not lost in the thread
        return err
    finally:
        publisher.close()


def test_a_writers_broker_silent_past_reconnect_timeout_fails_naming_it():
    address = f"127.0.0.1:{free_port()}"
    with pytest.raises(BrokerUnavailable, match=f"batch 3 partition 0: cannot reach the broker at "
                                                f"{address}.*reconnectTimeoutMs \\(300 ms\\)"):
        _publish_rows(address, [b"x"], reconnect_timeout_ms=300)
