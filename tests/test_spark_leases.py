"""The source's leases under trouble: `once` runs that FIN what Spark committed,
a task whose lease is gone, a lease session cut by the network, brokers that
do not answer. Each counts message ids against what was published."""

from __future__ import annotations

import threading

import pytest

from broker import Client
from spark_connector.fetch import LeaseLost, fetch_slice
from spark_connector.options import ReaderOptions
from spark_connector.reader import LeaseSlice
from spark_connector.session import BrokerUnreachable, LeaseKeeper

from .faultproxy import FaultProxy
from .helpers import wait_for
from .spark_helpers import Recorder, channel_stats, publish, reader


def run_once(spark, address, checkpoint, recorder, **options):
    (reader(spark, address, "events", **options).writeStream.foreachBatch(recorder)
     .option("checkpointLocation", str(checkpoint)).trigger(once=True).start()
     .awaitTermination(120))


def test_two_once_runs_on_one_checkpoint_read_each_message_once_and_drain_the_channel(
        spark, broker, client, tmp_path):
    published = publish(client, "events", 300)
    first, second, third = Recorder(), Recorder(), Recorder()
    run_once(spark, broker.address, tmp_path / "ck", first, maxMessagesPerTrigger=200)
    run_once(spark, broker.address, tmp_path / "ck", second, maxMessagesPerTrigger=200)
    assert len(first.ids) == 200 and len(second.ids) == 100
    assert set(first.ids) | set(second.ids) == published
    assert set(first.ids).isdisjoint(second.ids)
    run_once(spark, broker.address, tmp_path / "ck", third, maxMessagesPerTrigger=200)
    assert third.ids == []
    stats = channel_stats(client, "events")
    assert (stats.depth, stats.in_flight_count, stats.finish_count) == (0, 0, 300)


def keeper_options(*addresses: str, **extra) -> ReaderOptions:
    options = {"address": ",".join(addresses), "topic": "events", "channel": "spark",
               "msgTimeoutMs": "60000", "timeoutMs": "2000"}
    options.update(extra)
    return ReaderOptions.parse(options)


def a_slice(lease: dict, **extra) -> LeaseSlice:
    return LeaseSlice(lease["address"], lease["lease"], 0, 1, "events", "spark", 5.0,
                      lease["broker"], **extra)


def rows(part: LeaseSlice) -> list[str]:
    return [i for batch in fetch_slice(part) for i in batch.column(0).to_pylist()]


def test_a_task_whose_lease_is_gone_fails_instead_of_reading_nothing(broker, client):
    published = publish(client, "events", 20)
    keeper = LeaseKeeper(keeper_options(broker.address))
    try:
        keeper.ensure_channel()
        lease = keeper.reserve(1, 100, 1 << 20)["0"]
        assert set(rows(a_slice(lease))) == published
        client.requeue_leases([lease["lease"]])
        with pytest.raises(LeaseLost, match=f"lease {lease['lease']} on .* is gone"):
            rows(a_slice(lease))
        assert rows(a_slice(lease, fail_on_data_loss=False)) == []
    finally:
        keeper.close()


def test_a_slice_fetched_from_another_broker_instance_fails_loudly(broker, client):
    publish(client, "events", 5)
    keeper = LeaseKeeper(keeper_options(broker.address))
    try:
        keeper.ensure_channel()
        lease = keeper.reserve(1, 100, 1 << 20)["0"]
        # as if another broker behind the same address made it: unknown here
        lease.update(lease="f" * 24, broker="0123456789abcdef")
        with pytest.raises(LeaseLost, match="another broker, or this one restarted"):
            rows(a_slice(lease, fail_on_data_loss=False))
    finally:
        keeper.close()


def test_a_cut_lease_session_is_resumed_and_its_lease_still_read(broker, client):
    published = publish(client, "events", 50)
    with FaultProxy(broker.address) as proxy:
        keeper = LeaseKeeper(keeper_options(proxy.address, msgTimeoutMs="2000"))
        try:
            keeper.ensure_channel()
            leases = keeper.reserve(1, 100, 1 << 20)
            session = keeper._sessions[proxy.address]
            first_id = session.session.session_id
            old_stream = session.session
            proxy.cut()
            wait_for(lambda: session.session is not old_stream and session.session.alive, 30,
                     message="the keeper to reconnect")
            assert session.session.resumed and session.session.session_id == first_id
            assert set(rows(a_slice(leases["0"]))) == published
            keeper.finish_through(1, {})
            stats = channel_stats(client, "events")
            assert (stats.finish_count, stats.requeue_count, stats.depth) == (50, 0, 0)
        finally:
            keeper.close()


def test_an_unreachable_broker_fails_the_query_by_default_naming_it(broker):
    dead = "127.0.0.1:1"
    with pytest.raises(BrokerUnreachable, match="127.0.0.1:1 \\(option address\\)"):
        LeaseKeeper(keeper_options(broker.address, dead))


def test_without_fail_on_data_loss_the_other_brokers_are_read(broker, client):
    published = publish(client, "events", 30)
    keeper = LeaseKeeper(keeper_options("127.0.0.1:1", broker.address, failOnDataLoss="false"))
    try:
        keeper.ensure_channel()
        leases = keeper.reserve(1, 100, 1 << 20)
        assert [lease["address"] for lease in leases.values()] == [broker.address]
        assert set(rows(a_slice(leases["0"]))) == published
    finally:
        keeper.close()


def reserve_in_a_thread(keeper: LeaseKeeper) -> tuple[threading.Thread, dict]:
    """keeper.reserve(batch 1, up to 100 messages) in a thread: its result or its error."""
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["leases"] = keeper.reserve(1, 100, 1 << 20)
        except Exception as err:  # noqa: BLE001 - the test asserts on it
            outcome["error"] = err

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def test_a_broker_restarted_within_reconnect_timeout_is_waited_for_and_read(tmp_path):
    from broker import EmbeddedBroker

    data = str(tmp_path / "data")
    first = EmbeddedBroker(data_path=data).start()
    address = first.address
    keeper = LeaseKeeper(keeper_options(address, reconnectTimeoutMs="120000"))
    try:
        keeper.ensure_channel()
        with Client(address, timeout=10) as c:
            published = publish(c, "events", 20)
        first.stop()
        # Reserve comes while the broker is down (default failOnDataLoss=true) ...
        thread, outcome = reserve_in_a_thread(keeper)
        wait_for(lambda: keeper._sessions[address].silent_since is not None or outcome, 30,
                 message="the reserve to find the broker silent")
        # ... and the broker comes back, a new instance with what it stored.
        with EmbeddedBroker(data_path=data, grpc_address=address) as second:
            thread.join(120)
            assert "error" not in outcome, outcome.get("error")
            lease = outcome["leases"]["0"]
            assert lease["count"] == 20
            assert lease["broker"] == second.broker.instance_id != ""
            assert set(rows(a_slice(lease))) == published
    finally:
        keeper.close()


@pytest.mark.parametrize("fail_on_data_loss", ["true", "false"])
def test_a_broker_silent_longer_than_reconnect_timeout_is_unreachable(fail_on_data_loss):
    from broker import EmbeddedBroker

    gone = EmbeddedBroker().start()
    address = gone.address
    keeper = LeaseKeeper(keeper_options(address, reconnectTimeoutMs="300",
                                        failOnDataLoss=fail_on_data_loss))
    try:
        keeper.ensure_channel()
        gone.stop()
        if fail_on_data_loss == "true":
            with pytest.raises(BrokerUnreachable, match=f"{address} \\(option address\\), "
                               "silent for longer than reconnectTimeoutMs \\(300 ms\\)"):
                keeper.reserve(1, 100, 1 << 20)
        else:  # the query goes on without it, and its next call does not wait again
            assert keeper.reserve(1, 100, 1 << 20) == {}
            assert keeper.reserve(2, 100, 1 << 20) == {}
    finally:
        keeper.close()


def test_reserve_spreads_the_read_limit_over_the_brokers(broker, client):
    from broker import EmbeddedBroker

    with EmbeddedBroker() as other, Client(other.address) as other_client:
        publish(client, "events", 100)
        publish(other_client, "events", 100)
        keeper = LeaseKeeper(keeper_options(broker.address, other.address))
        try:
            keeper.ensure_channel()
            leases = keeper.reserve(1, 60, 1 << 30)
            assert sorted(lease["count"] for lease in leases.values()) == [30, 30]
        finally:
            keeper.close()


def test_a_broker_short_of_its_share_leaves_the_rest_of_the_batch_to_the_others(broker, client):
    from broker import EmbeddedBroker

    with EmbeddedBroker() as other, Client(other.address) as other_client:
        publish(client, "events", 10)
        publish(other_client, "events", 100)
        keeper = LeaseKeeper(keeper_options(broker.address, other.address))
        try:
            keeper.ensure_channel()
            read: dict[str, int] = {}
            for lease in keeper.reserve(1, 60, 1 << 30).values():
                read[lease["address"]] = read.get(lease["address"], 0) + lease["count"]
            assert read == {broker.address: 10, other.address: 50}
        finally:
            keeper.close()


def test_while_messages_keep_arriving_a_batch_holds_one_lease_per_broker(broker, client):
    """A broker that gave less than its share had nothing more ready: it is not asked again
    in the same trigger, so what arrives meanwhile is the next batch's, not a second lease
    (each lease is read by its own tasks: a second one doubles the batch's tasks)."""
    keeper = LeaseKeeper(keeper_options(broker.address))
    stop = threading.Event()

    def keep_publishing() -> None:
        with Client(broker.address) as c:
            while not stop.is_set():
                c.multi_publish("events", [b"x"] * 5)

    publisher = threading.Thread(target=keep_publishing, daemon=True)
    try:
        keeper.ensure_channel()
        publisher.start()
        wait_for(lambda: channel_stats(client, "events").depth > 0, 10,
                 message="messages to arrive")
        counts = []
        for batch in range(1, 31):
            leases = keeper.reserve(batch, 1_000_000, 1 << 30)
            counts.append(len(leases))
            keeper.finish_through(batch, {})
        assert max(counts) == 1 and sum(counts) >= 25, counts
    finally:
        stop.set()
        publisher.join(10)
        keeper.close()


def test_reader_option_defaults_bound_every_batch():
    o = ReaderOptions.parse({"address": "127.0.0.1:4170", "topic": "events", "channel": "spark"})
    assert (o.max_messages_per_trigger, o.max_bytes_per_trigger) == (1_000_000, 128 << 20)
    assert (o.num_partitions, o.timeout_ms, o.msg_timeout_ms, o.client_id,
            o.fail_on_data_loss) == (2, 10_000, 60_000, "", True)


@pytest.mark.parametrize("options, name", [({}, "spark:events/spark"),
                                           ({"clientId": "nightly-etl"}, "nightly-etl")])
def test_the_lease_session_is_named_by_client_id_by_default_topic_and_channel(
        broker, options, name):
    keeper = LeaseKeeper(keeper_options(broker.address, **options))
    try:
        # The name the broker knows the session by (and names it by in its log).
        assert broker.call(lambda: [s.client_id for s in broker.broker._sessions.values()]) \
            == [name]
    finally:
        keeper.close()


def test_an_offset_names_each_lease_with_its_address_count_broker_instance_and_identity(
        broker, client):
    publish(client, "events", 7)
    keeper = LeaseKeeper(keeper_options(broker.address))
    try:
        keeper.ensure_channel()
        leases = keeper.reserve(1, 100, 1 << 20)
        session = keeper._sessions[broker.address]
        assert leases == {"0": {"address": broker.address, "lease": leases["0"]["lease"],
                                "count": 7, "broker": session.broker_id,
                                "identity": broker.broker.identity}}
        assert len(session.broker_id) == 16
    finally:
        keeper.close()


def test_max_bytes_per_trigger_bounds_a_batch(broker, client):
    client.multi_publish("events", [b"x" * 1000] * 10)
    keeper = LeaseKeeper(keeper_options(broker.address))
    try:
        keeper.ensure_channel()
        assert keeper.reserve(1, 100, 3500)["0"]["count"] == 3
    finally:
        keeper.close()


def test_a_worker_fetches_the_next_batchs_slices_over_the_connection_it_kept(broker, client):
    from spark_connector import fetch

    keeper = LeaseKeeper(keeper_options(broker.address))
    try:
        keeper.ensure_channel()
        read, kept = set(), set()
        for batch in (1, 2, 3):
            published = publish(client, "events", 10)
            lease = keeper.reserve(batch, 100, 1 << 20)["0"]
            assert set(rows(a_slice(lease))) == published
            keeper.finish_through(batch, {})
            read |= published
            kept |= {c for (address, _), c in fetch._clients.items()
                     if address == broker.address}
        assert len(kept) == 1  # one client (one connection) for the three batches
        assert channel_stats(client, "events").finish_count == len(read) == 30
    finally:
        keeper.close()


def test_a_fetch_that_failed_leaves_no_connection_for_the_next_task_to_reuse(broker, client):
    from spark_connector import fetch

    publish(client, "events", 5)
    keeper = LeaseKeeper(keeper_options(broker.address))
    try:
        keeper.ensure_channel()
        lease = keeper.reserve(1, 100, 1 << 20)["0"]
        rows(a_slice(lease))
        kept = fetch._clients[(broker.address, ())]
        client.requeue_leases([lease["lease"]])
        with pytest.raises(LeaseLost):
            rows(a_slice(lease))
        assert fetch._clients.get((broker.address, ())) is not kept
        # A slice read half-way (a LIMIT, a cancelled task) is not kept either.
        lease = keeper.reserve(2, 100, 1 << 20)["0"]
        next(fetch_slice(a_slice(lease))).num_rows  # noqa: B018
        assert (broker.address, ()) not in fetch._clients
    finally:
        keeper.close()


def test_a_kept_connection_reads_from_a_broker_restarted_on_its_address(tmp_path):
    from broker import EmbeddedBroker
    from spark_connector import fetch

    data = str(tmp_path / "data")
    with EmbeddedBroker(data_path=data) as first:
        address = first.address
        keeper = LeaseKeeper(keeper_options(address))
        keeper.ensure_channel()
        with Client(address) as c:
            published = publish(c, "events", 10)
        lease = keeper.reserve(1, 100, 1 << 20)["0"]
        assert set(rows(a_slice(lease))) == published
        keeper.finish_through(1, {})
        keeper.close()
    kept = fetch._clients[(address, ())]
    with EmbeddedBroker(data_path=data, grpc_address=address):
        keeper = LeaseKeeper(keeper_options(address))
        try:
            keeper.ensure_channel()
            with Client(address) as c:
                published = publish(c, "events", 10)
            lease = keeper.reserve(1, 100, 1 << 20)["0"]
            assert set(rows(a_slice(lease))) == published
            assert fetch._clients[(address, ())] is kept
        finally:
            keeper.close()


def read_batch(source, start: dict, end: dict) -> list[str]:
    """What Spark does with a planned batch: ``partitions``, then each task's ``read``."""
    return [i for part in source.partitions(start, end) for batch in source.read(part)
            for i in batch.column(0).to_pylist()]


def test_a_replay_fins_the_batch_before_it_when_the_driver_died_before_that_fin_got_through(
        broker, client):
    """A committed batch's FIN that did not get through (its broker did not answer it) is
    kept to be sent again; a driver that dies before that, with the next batch planned,
    leaves that batch in the offset log: its replay FINs the committed batch first, so the
    committed batch's lease is not requeued and read again."""
    from collections import Counter

    from pyspark.sql.streaming.datasource import ReadMaxRows

    from spark_connector.reader import PynsqStreamReader

    options = {"address": broker.address, "topic": "events", "channel": "spark",
               "msgTimeoutMs": "1000", "timeoutMs": "5000", "numPartitions": "1"}
    published = publish(client, "events", 30)
    first = PynsqStreamReader(options)
    start = first.initialOffset()
    end1 = first.latestOffset(start, ReadMaxRows(100))
    read = read_batch(first, start, end1)              # batch 1 is in the commit log
    published |= publish(client, "events", 20)
    # Batch 2 is planned (in the offset log), batch 1's FIN not through; the driver dies.
    end2 = {"batch": 2, "leases": first.keeper.reserve(2, 100, 1 << 20)}
    first.keeper.close()
    second = PynsqStreamReader(options)                # the restart replays batch 2
    offset = end1
    try:
        read += read_batch(second, end1, end2)
        offset = end2

        def drained() -> bool:  # the dead driver's session ends after its grace (1 s)
            nonlocal offset, read
            end = second.latestOffset(offset, ReadMaxRows(100))
            if end != offset:
                read += read_batch(second, offset, end)
                offset = end
                return False
            stats = channel_stats(client, "events")
            return stats.depth == 0 and stats.in_flight_count == 0

        wait_for(drained, 30, interval=0.1, message="the channel to be drained")
    finally:
        second.stop()
    duplicates = {i: n for i, n in Counter(read).items() if n > 1}
    assert not duplicates and set(read) == published, (
        f"published {len(published)}, read {len(set(read))} distinct, "
        f"{len(duplicates)} read twice")
    assert channel_stats(client, "events").finish_count == len(published)


def test_a_committed_batch_whose_lease_timed_out_is_not_read_again_by_the_next_batch(
        broker, client):
    """A hung driver's lease times out and its messages wait in the channel again: the next
    trigger's FIN takes them back before its reserve can lease them to the next batch."""
    import time
    from collections import Counter

    from pyspark.sql.streaming.datasource import ReadMaxRows

    from spark_connector.reader import PynsqStreamReader

    def time_out() -> None:
        broker.broker.topics["events"].channels["spark"].tick(time.monotonic() + 3600)

    source = PynsqStreamReader({"address": broker.address, "topic": "events",
                                "channel": "spark", "numPartitions": "1"})
    published: set[str] = set()
    read: list[str] = []
    offset = source.initialOffset()
    try:
        for _ in range(10):
            published |= publish(client, "events", 20)
            end = source.latestOffset(offset, ReadMaxRows(1000))
            read += read_batch(source, offset, end)    # the batch commits
            offset = end
            broker.call(time_out)                      # ... and then its lease times out
        end = source.latestOffset(offset, ReadMaxRows(1000))
        if end != offset:
            read += read_batch(source, offset, end)
    finally:
        source.stop()
    twice = sum(n - 1 for n in Counter(read).values())
    assert twice == 0 and set(read) == published, f"{twice} message(s) read twice"
