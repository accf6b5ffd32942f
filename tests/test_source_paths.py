"""The source's driver and executor halves on the paths a broker takes: moved to a new
address, down for a while, down for good; called as Spark calls them, without Spark.
Real brokers on loopback, real data paths; each counts message ids."""

from __future__ import annotations

import logging
import socket
import threading

import pytest

from broker import Client, EmbeddedBroker
from spark_connector.fetch import fetch_slice
from spark_connector.options import ReaderOptions
from spark_connector.reader import LeaseSlice
from spark_connector.session import BrokerUnreachable, LeaseKeeper

from .helpers import wait_for
from .spark_helpers import channel_stats, publish


def keeper_options(*addresses: str, **extra) -> ReaderOptions:
    options = {"address": ",".join(addresses), "topic": "events", "channel": "spark",
               "msgTimeoutMs": "60000", "timeoutMs": "2000"}
    options.update(extra)
    return ReaderOptions.parse(options)


def free_address() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def leased_ids(address: str, leases: dict[str, dict]) -> set[str]:
    with Client(address) as c:
        return {i for lease in leases.values() if lease["address"] == address
                for frame in c.fetch_lease(lease["lease"], 0, 1) for i in _ids(frame)}


def _ids(frame) -> list[str]:
    return [frame.ids[i:i + 16].decode() for i in range(0, len(frame.ids), 16)]


def two_once_runs(address: str) -> tuple[set[str], dict, dict]:
    """What two ``once`` runs leave: batch 1 committed and FINed, batch 2 committed but
    not FINed (a ``once`` run FINs it at the next start), its lease requeued as the run
    stops. Returns (ids of both batches, offset of batch 1, offset of batch 2)."""
    first = LeaseKeeper(keeper_options(address))
    first.ensure_channel()
    batch1 = first.reserve(1, 10, 1 << 20)
    read = leased_ids(address, batch1)
    first.finish_through(1, batch1)
    first.requeue_open()
    first.close()
    second = LeaseKeeper(keeper_options(address))
    batch2 = second.reserve(2, 10, 1 << 20, finish_through=(1, batch1))
    read |= leased_ids(address, batch2)
    second.requeue_open()
    second.close()
    return read, batch1, batch2


def test_offsets_name_each_lease_by_its_brokers_identity_kept_in_its_data_path(tmp_path):
    data = str(tmp_path / "data")
    with EmbeddedBroker(data_path=data) as first:
        identity, first_address = first.broker.identity, first.address
        keeper = LeaseKeeper(keeper_options(first.address))
        try:
            keeper.ensure_channel()
            with Client(first.address) as c:
                publish(c, "events", 5)
                assert c.info().identity == identity
            assert keeper.reserve(1, 10, 1 << 20)["0"]["identity"] == identity
        finally:
            keeper.close()
    with EmbeddedBroker(data_path=data) as moved, EmbeddedBroker() as memory_only:
        assert moved.address != first_address and moved.broker.identity == identity
        assert memory_only.broker.identity not in ("", identity)


def test_a_checkpoint_reused_after_its_broker_moved_fins_what_was_committed_there(tmp_path):
    """Two ``once`` runs read 20; the durable broker restarts on new ports with the same
    data path; a run from the same checkpoint, given the new address, reads the other 20
    and none of the first (the FIN of batch 2 reaches the broker where it is now)."""
    data = str(tmp_path / "data")
    with EmbeddedBroker(data_path=data) as old:
        with Client(old.address) as c:
            c.create_channel("events", "spark")
            published = publish(c, "events", 40)
        old_address = old.address
        read, _, batch2 = two_once_runs(old_address)
    assert len(read) == 20
    with EmbeddedBroker(data_path=data) as moved:
        assert moved.address != old_address
        keeper = LeaseKeeper(keeper_options(moved.address))
        try:
            batch3 = keeper.reserve(3, 100, 1 << 20, finish_through=(2, batch2))
            assert [lease["address"] for lease in batch3.values()] == [moved.address]
            later = leased_ids(moved.address, batch3)
            assert later == published - read          # 0 duplicates, 0 lost
        finally:
            keeper.close()


def test_a_fin_whose_broker_is_not_found_is_kept_and_sent_once_it_is_found(tmp_path):
    """Its broker is down when the run starts (failOnDataLoss=false reads the others): the
    FIN of its committed batch is kept, and sent when it answers at its new address,
    before anything is reserved from it."""
    data = str(tmp_path / "data")
    with EmbeddedBroker(data_path=data) as old:
        with Client(old.address) as c:
            c.create_channel("events", "spark")
            published = publish(c, "events", 40)
        read, _, batch2 = two_once_runs(old.address)
    new_address = free_address()
    with EmbeddedBroker() as other:
        keeper = LeaseKeeper(keeper_options(other.address, new_address,
                                            failOnDataLoss="false"))
        try:
            keeper.ensure_channel()
            assert keeper.reserve(3, 100, 1 << 20, finish_through=(2, batch2)) == {}
            with EmbeddedBroker(data_path=data, grpc_address=new_address):
                batch4 = keeper.reserve(4, 100, 1 << 20, finish_through=(3, {}))
                later = leased_ids(new_address, batch4)
            assert later == published - read          # 0 duplicates, 0 lost
        finally:
            keeper.close()


def test_a_fetch_cut_by_a_broker_restart_waits_for_it_and_yields_each_row_once(tmp_path):
    """A task's fetch has yielded its first frame when its broker stops; it waits (it does
    not fail), the broker comes back on its address within reconnectTimeoutMs, and the
    fetch yields the rest: every message of the slice once."""
    data = str(tmp_path / "data")
    old = EmbeddedBroker(data_path=data).start()
    address = old.address
    # msgTimeoutMs 2 s: the keeper touches (and so finds the restart) every 0.5 s.
    keeper = LeaseKeeper(keeper_options(address, msgTimeoutMs="2000"))
    warned = Caught("pynsq.spark", "trying again")
    try:
        keeper.ensure_channel()
        with Client(address) as c:    # 20 MiB: ten frames, more than gRPC buffers ahead
            published = {i for _ in range(10) for i in c.multi_publish(
                "events", [b"%1024d" % n for n in range(2000)])}
        lease = keeper.reserve(1, 20_000, 1 << 30)["0"]
        part = LeaseSlice(address, lease["lease"], 0, 1, "events", "spark", 5.0,
                          lease["broker"], reconnect_timeout_s=60.0)
        stream = fetch_slice(part)
        got = next(stream).column(0).to_pylist()
        old.stop()
        rest: dict = {}

        def read_on() -> None:
            try:
                rest["ids"] = [i for b in stream for i in b.column(0).to_pylist()]
            except Exception as err:  # noqa: BLE001 - the test asserts there was none
                rest["error"] = err

        thread = threading.Thread(target=read_on, daemon=True)
        thread.start()
        wait_for(lambda: warned.records or not thread.is_alive(), 60,
                 message="the fetch to find its broker gone")
        with EmbeddedBroker(data_path=data, grpc_address=address):
            thread.join(120)
            assert "error" not in rest, rest.get("error")
            got += rest["ids"]
            assert len(got) == len(set(got))      # 0 duplicates
            assert set(got) == published            # 0 lost
    finally:
        warned.close()
        keeper.close()
        old.stop()


class Caught(logging.Handler):
    """Log records of ``logger`` whose message holds ``text``."""

    def __init__(self, logger: str, text: str) -> None:
        super().__init__()
        self.text, self.records = text, []
        self.logger = logging.getLogger(logger)
        self.logger.addHandler(self)

    def emit(self, record: logging.LogRecord) -> None:
        if self.text in record.getMessage():
            self.records.append(record)

    def close(self) -> None:
        self.logger.removeHandler(self)
        super().close()


def test_a_fleet_with_a_durable_broker_down_reads_the_others_and_its_messages_once_back(
        tmp_path, broker, client):
    """One durable broker of two stops answering: past reconnectTimeoutMs the batches read
    the other one, the progress says which is down, and once it is back its messages are
    read: late, not lost, none twice."""
    data = str(tmp_path / "data")
    down = EmbeddedBroker(data_path=data).start()
    address = down.address
    keeper = LeaseKeeper(keeper_options(broker.address, address, reconnectTimeoutMs="300"))
    try:
        keeper.ensure_channel()
        with Client(address) as c:
            published = publish(c, "events", 30)
        down.stop()
        published |= publish(client, "events", 20)
        batch1 = keeper.reserve(1, 100, 1 << 20)
        assert [lease["address"] for lease in batch1.values()] == [broker.address]
        got = leased_ids(broker.address, batch1)
        progress = keeper.progress()
        assert progress["brokersDown"] == 1
        assert "late, not lost" in progress["brokers"][address]["down"]
        assert progress["brokers"][broker.address]["inFlight"] == 20
        with EmbeddedBroker(data_path=data, grpc_address=address):
            batches = [batch1]

            def a_trigger_reads_it() -> bool:  # as a processing-time trigger goes on
                n = len(batches)
                batches.append(keeper.reserve(n + 1, 100, 1 << 20,
                                              finish_through=(n, batches[-1])))
                return any(lease["address"] == address for lease in batches[-1].values())

            wait_for(a_trigger_reads_it, 60, message="a batch read from the broker back")
            later = [i for b in batches[1:] for a in (broker.address, address)
                     for i in leased_ids(a, b)]
            assert keeper.progress()["brokersDown"] == 0
        every = sorted(got) + later
        assert len(every) == len(set(every)) == 50 and set(every) == published
    finally:
        keeper.close()
        down.stop()


def test_fail_on_broker_down_stops_the_query_naming_the_broker_and_the_option(tmp_path, broker):
    data = str(tmp_path / "data")
    down = EmbeddedBroker(data_path=data).start()
    address = down.address
    keeper = LeaseKeeper(keeper_options(broker.address, address, reconnectTimeoutMs="300",
                                        failOnBrokerDown="true"))
    try:
        keeper.ensure_channel()
        down.stop()
        with pytest.raises(BrokerUnreachable, match=f"{address} .*failOnBrokerDown=true"):
            keeper.reserve(1, 100, 1 << 20)
    finally:
        keeper.close()


def test_the_progress_names_topic_and_channel_and_each_brokers_depth_in_flight_and_lag(
        broker, client):
    publish(client, "events", 30)
    keeper = LeaseKeeper(keeper_options(broker.address))
    try:
        keeper.ensure_channel()
        batch1 = keeper.reserve(1, 10, 1 << 20)
        progress = keeper.progress()
        assert progress["source"] == "pynsq topic events channel spark"
        assert progress["brokers"] == {broker.address: {
            "identity": broker.broker.identity, "depth": 20, "inFlight": 10, "lag": 30}}
        assert (progress["depth"], progress["lag"], progress["brokersDown"]) == (20, 30, 0)
        keeper.planned(2)
        keeper.reserve(2, 5, 1 << 20, finish_through=(1, batch1))
        assert keeper.progress()["brokers"][broker.address] == {
            "identity": broker.broker.identity, "depth": 15, "inFlight": 5, "lag": 20}
    finally:
        keeper.close()


def test_min_offsets_per_trigger_holds_a_batch_back_until_enough_or_max_trigger_delay(
        broker, client):
    from pyspark.sql.streaming.datasource import ReadMaxRows

    from spark_connector.reader import PynsqStreamReader

    source = PynsqStreamReader({"address": broker.address, "topic": "events",
                                "channel": "spark", "minOffsetsPerTrigger": "50",
                                "maxTriggerDelay": "1h"})
    hurried = PynsqStreamReader({"address": broker.address, "topic": "events",
                                 "channel": "hurried", "minOffsetsPerTrigger": "50",
                                 "maxTriggerDelay": "300ms"})
    try:
        start, early = source.initialOffset(), hurried.initialOffset()
        publish(client, "events", 30)
        assert source.latestOffset(start, ReadMaxRows(1000)) == start        # 30 < 50: wait
        publish(client, "events", 30)
        batch = source.latestOffset(start, ReadMaxRows(1000))
        assert sum(lease["count"] for lease in batch["leases"].values()) == 60
        # Fewer than the minimum, but maxTriggerDelay passes: a batch of what is there.
        later = wait_for(lambda: hurried.latestOffset(early, ReadMaxRows(1000)).get("leases"),
                         30, message="maxTriggerDelay to pass")
        assert sum(lease["count"] for lease in later.values()) == 60
    finally:
        source.stop()
        hurried.stop()


def test_one_source_reads_several_topics_sharing_the_limit_and_naming_each_rows_topic(
        broker, client):
    from pyspark.sql.streaming.datasource import ReadMaxRows

    from spark_connector.reader import PynsqStreamReader

    source = PynsqStreamReader({"address": broker.address, "subscribe": "events, audit",
                                "channel": "spark"})
    try:
        start = source.initialOffset()
        published = {"events": publish(client, "events", 30),
                     "audit": publish(client, "audit", 30)}
        read: dict[str, list[str]] = {"events": [], "audit": []}

        def run(start_: dict, end: dict) -> None:   # as Spark runs a planned batch
            for part in source.partitions(start_, end):
                for batch in source.read(part):
                    for i, topic in zip(batch.column(0).to_pylist(),
                                        batch.column(4).to_pylist()):
                        read[topic].append(i)

        first = source.latestOffset(start, ReadMaxRows(40))     # 20 of each
        assert [(lease["topic"], lease["count"]) for lease in first["leases"].values()] == [
            ("events", 20), ("audit", 20)]
        run(start, first)
        second = source.latestOffset(first, ReadMaxRows(40))    # the 10 left of each
        run(first, second)
        assert {t: set(ids) for t, ids in read.items()} == published
        assert sum(map(len, read.values())) == 60                 # none twice
        source.commit(second)
        for topic in ("events", "audit"):
            stats = channel_stats(client, topic)
            assert (stats.depth, stats.in_flight_count, stats.finish_count) == (0, 0, 30)
        assert set(source.reportLatestOffset()["topics"]) == {"events", "audit"}
    finally:
        source.stop()


def test_a_checkpoint_reused_after_its_broker_moved_finds_it_through_nsqlookupd(tmp_path):
    """As with option address, but the new address is what nsqlookupd lists."""
    from spark_connector.discovery import discover

    from .nsqkit import Lookupd

    lookupd = Lookupd().start()
    data = str(tmp_path / "data")
    registered = dict(data_path=data, lookupd_tcp_address=(lookupd.tcp_address,),
                      broadcast_address="127.0.0.1", http_address="127.0.0.1:0")
    try:
        with EmbeddedBroker(**registered) as old:
            with Client(old.address) as c:
                c.create_channel("events", "spark")
                published = publish(c, "events", 40)
            read, _, batch2 = two_once_runs(old.address)
        with EmbeddedBroker(**registered) as moved:
            wait_for(lambda: discover([lookupd.http_address], "events") == [moved.address],
                     60, message="nsqlookupd to list the broker at its new address")
            keeper = LeaseKeeper(ReaderOptions.parse({
                "lookupdHttpAddress": lookupd.http_address, "topic": "events",
                "channel": "spark", "timeoutMs": "2000"}))
            try:
                batch3 = keeper.reserve(3, 100, 1 << 20, finish_through=(2, batch2))
                assert leased_ids(moved.address, batch3) == published - read
            finally:
                keeper.close()
    finally:
        lookupd.stop()
