"""The source's driver half without Spark: how ``latestOffset`` spreads a batch over
several brokers, what its offsets name, and which leases a commit FINs, called as
Spark's driver calls them. Real brokers on loopback."""

from __future__ import annotations

import pytest

from broker import Client, EmbeddedBroker
from spark_connector.options import ReaderOptions
from spark_connector.session import LeaseKeeper

from .grpckit import channel_stats


def options(*addresses: str) -> ReaderOptions:
    return ReaderOptions.parse({"address": ",".join(addresses), "topic": "events",
                                "channel": "spark", "timeoutMs": "5000"})


def per_broker(leases: dict[str, dict]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for lease in leases.values():
        counts[lease["address"]] = counts.get(lease["address"], 0) + lease["count"]
    return counts


@pytest.fixture
def two(broker, client):
    """Two brokers, each with a channel ``events/spark`` and 100 messages of 10 bytes;
    a keeper reading both: (keeper, [address a, address b], [client a, client b])."""
    with EmbeddedBroker() as other, Client(other.address) as other_client:
        for c in (client, other_client):
            c.create_channel("events", "spark")
            c.multi_publish("events", [b"0123456789"] * 100)
        keeper = LeaseKeeper(options(broker.address, other.address))
        try:
            yield keeper, [broker.address, other.address], [client, other_client]
        finally:
            keeper.close()


def test_each_broker_is_offered_an_equal_share_first_then_what_the_others_left(two):
    keeper, (a, b), (client_a, client_b) = two
    client_b.admin("channel", "empty", "events", "spark")
    client_b.multi_publish("events", [b"x"] * 10)
    leases = keeper.reserve(1, 60, 1 << 20)
    assert per_broker(leases) == {a: 50, b: 10}
    assert sum(lease["count"] for lease in leases.values()) == 60
    assert sorted(leases) == [str(i) for i in range(len(leases))]


def test_the_last_message_left_to_reserve_is_taken_too(two):
    keeper, (a, b), (_, client_b) = two
    client_b.admin("channel", "empty", "events", "spark")
    client_b.publish("events", b"x")
    leases = keeper.reserve(1, 5, 1 << 20)          # b first: 1 of its share of 3
    assert per_broker(leases) == {a: 4, b: 1}


def test_the_broker_asked_first_turns_with_each_batch(two):
    keeper, (a, b), _ = two
    first = keeper.reserve(1, 5, 1 << 20)
    second = keeper.reserve(2, 5, 1 << 20)
    third = keeper.reserve(3, 5, 1 << 20)
    assert [(lease["address"], lease["count"]) for lease in first.values()] == [(b, 3), (a, 2)]
    assert [(lease["address"], lease["count"]) for lease in second.values()] == [(a, 3), (b, 2)]
    assert [(lease["address"], lease["count"]) for lease in third.values()] == [(b, 3), (a, 2)]


def test_the_byte_limit_is_shared_like_the_message_limit(two):
    keeper, (a, b), (_, client_b) = two
    leases = keeper.reserve(1, 1000, 100)        # 10 messages of 10 bytes
    assert per_broker(leases) == {a: 5, b: 5}
    client_b.admin("channel", "empty", "events", "spark")
    assert per_broker(keeper.reserve(2, 1000, 100)) == {a: 10}


def test_over_two_brokers_a_byte_limit_is_passed_by_one_message_per_broker_at_most(two):
    """docs/spark.md, maxBytesPerTrigger: a batch holds one message at least, and each
    broker asked for its share gives one at least, so over two brokers of 10-byte
    messages a batch holds at most the limit plus one message of each."""
    keeper, _, _ = two
    for batch, limit in enumerate((1, 5, 10, 15, 25, 59, 95), start=1):
        held = 10 * sum(lease["count"] for lease in keeper.reserve(batch, 1000, limit).values())
        assert 10 <= held <= limit + 2 * 10, (limit, held)


def test_available_now_reads_no_more_than_each_broker_held_at_start(two):
    keeper, (a, b), (client_a, _) = two
    keeper.target = target = {a: 7, b: 0}
    client_a.multi_publish("events", [b"later"] * 5)  # published after the start
    leases = keeper.reserve(1, 1000, 1 << 20)
    assert per_broker(leases) == {a: 7} and target == {a: 0, b: 0}
    assert keeper.reserve(2, 1000, 1 << 20) == {}
    assert keeper.planned(2) is None


def test_a_batch_of_as_many_messages_as_brokers_takes_one_from_each(two):
    keeper, (a, b), _ = two
    assert per_broker(keeper.reserve(1, 2, 1 << 20)) == {a: 1, b: 1}


def test_the_bytes_a_broker_left_go_to_one_that_filled_its_byte_share_exactly(two):
    keeper, (a, b), (_, client_b) = two
    client_b.admin("channel", "empty", "events", "spark")
    client_b.publish("events", b"0123456789")
    # b (asked first) gives its one body of 10 bytes; a fills its share of 50 exactly and
    # is asked again for the 40 left.
    leases = keeper.reserve(1, 1000, 100)
    assert per_broker(leases) == {a: 9, b: 1}


def test_a_broker_that_gave_less_than_its_share_is_not_asked_again_for_that_batch(two):
    """It had nothing more ready: what is published meanwhile is the next batch's."""
    keeper, (a, b), (_, client_b) = two
    client_b.admin("channel", "empty", "events", "spark")
    client_b.publish("events", b"x")
    asked = []
    real = keeper._sessions[b].client.reserve
    keeper._sessions[b].client.reserve = lambda *args, **kwargs: (
        asked.append(args[3]), real(*args, **kwargs))[1]
    leases = keeper.reserve(1, 60, 1 << 20)
    assert per_broker(leases) == {a: 59, b: 1}
    assert asked == [30]                  # its share, once


def test_a_batch_from_one_broker_is_one_lease_of_the_whole_limit(broker, client):
    client.create_channel("events", "spark")
    client.multi_publish("events", [b"0123456789"] * 30)
    keeper = LeaseKeeper(options(broker.address))
    try:
        assert [lease["count"] for lease in keeper.reserve(1, 10, 1 << 20).values()] == [10]
        assert [lease["count"] for lease in keeper.reserve(2, 1000, 100).values()] == [10]
    finally:
        keeper.close()


def test_with_three_brokers_the_one_asked_first_turns_through_each_in_order(two):
    _, (a, b), _ = two
    with EmbeddedBroker() as third, Client(third.address) as client_c:
        client_c.create_channel("events", "spark")
        client_c.multi_publish("events", [b"0123456789"] * 100)
        keeper = LeaseKeeper(options(a, b, third.address))
        try:
            firsts = [next(iter(keeper.reserve(n, 3, 1 << 20).values()))["address"]
                      for n in (1, 2, 3, 4)]
            assert firsts == [b, third.address, a, b]
        finally:
            keeper.close()


def test_what_two_empty_brokers_of_three_left_goes_to_the_third_messages_and_bytes_alike(
        two):
    _, (a, b), (client_a, client_b) = two
    for c in (client_a, client_b):
        c.admin("channel", "empty", "events", "spark")
    with EmbeddedBroker() as third, Client(third.address) as client_c:
        client_c.create_channel("events", "spark")
        client_c.multi_publish("events", [b"0123456789"] * 100)
        keeper = LeaseKeeper(options(a, b, third.address))
        try:
            assert per_broker(keeper.reserve(1, 30, 1 << 20)) == {third.address: 30}
            assert per_broker(keeper.reserve(2, 1000, 300)) == {third.address: 30}
        finally:
            keeper.close()


@pytest.mark.parametrize("gives_nothing", ["empty", "down"])
def test_a_broker_that_gives_nothing_leaves_the_others_their_equal_shares(two, gives_nothing):
    _, (a, b), _ = two
    third = EmbeddedBroker().start()
    try:
        with Client(third.address) as client_c:
            client_c.create_channel("events", "spark")
        keeper = LeaseKeeper(ReaderOptions.parse({
            "address": f"{a},{b},{third.address}", "topic": "events", "channel": "spark",
            "timeoutMs": "5000", "failOnDataLoss": "false", "reconnectTimeoutMs": "0"}))
        try:
            assert per_broker(keeper.reserve(1, 1, 1 << 20)) == {b: 1}    # b asked first
            if gives_nothing == "down":
                third.stop()
            # Now the third is asked first, then a, then b: shares of 4; the 2 left go to
            # a, which filled its share.
            assert per_broker(keeper.reserve(2, 10, 1 << 20)) == {a: 6, b: 4}
        finally:
            keeper.close()
    finally:
        third.stop()


def test_available_now_reads_nothing_from_a_broker_not_there_at_its_start(two):
    keeper, (a, b), _ = two
    keeper.target = {a: 5}            # b joined the fleet after the start
    assert per_broker(keeper.reserve(1, 1000, 1 << 20)) == {a: 5}


def test_a_broker_a_reserve_or_a_create_cannot_reach_is_logged_once_and_the_others_read(
        broker, client, caplog):
    import logging

    caplog.set_level(logging.WARNING, "pynsq.spark")
    client.create_channel("events", "spark")
    client.multi_publish("events", [b"m"] * 10)
    with EmbeddedBroker() as other, Client(other.address) as other_client:
        gone = other.address
        other_client.create_channel("events", "spark")
        keeper = LeaseKeeper(ReaderOptions.parse({
            "address": f"{broker.address},{gone}", "topic": "events", "channel": "spark",
            "timeoutMs": "5000", "failOnDataLoss": "false", "reconnectTimeoutMs": "0"}))
    try:
        assert per_broker(keeper.reserve(1, 10, 1 << 20)) == {broker.address: 10}
        failed = [m for m in caplog.messages if gone in m]
        assert len(failed) == 1 and failed[0].startswith(f"pynsq: reserve on {gone} failed: ")
        keeper.ensure_channel()
        failed = [m for m in caplog.messages if gone in m][1:]
        assert len(failed) == 1 and failed[0].startswith(
            f"pynsq: creating the channel on {gone} failed: ")
    finally:
        keeper.close()


def test_a_commit_fins_every_batch_up_to_it_and_leaves_later_ones_held(broker, client):
    client.create_channel("events", "spark")
    client.multi_publish("events", [b"m"] * 30)
    keeper = LeaseKeeper(options(broker.address))
    try:
        first = keeper.reserve(1, 10, 1 << 20)
        second = keeper.reserve(2, 10, 1 << 20)
        keeper.reserve(3, 10, 1 << 20)
        assert keeper.planned(1) == {"batch": 1, "leases": first}
        keeper.finish_through(2, second)
        stats = channel_stats(client, "events", "spark")
        assert (stats.finish_count, stats.in_flight_count) == (20, 10)
        assert keeper.planned(1) is None and keeper.planned(2) is None
        assert keeper.planned(3) is not None
        keeper.finish_through(3, {})
        assert channel_stats(client, "events", "spark").finish_count == 30
    finally:
        keeper.close()


def test_a_commit_fins_the_leases_its_offset_names_even_if_this_run_did_not_plan_them(
        broker, client):
    client.create_channel("events", "spark")
    client.multi_publish("events", [b"m"] * 10)
    planner = LeaseKeeper(options(broker.address))
    leases = planner.reserve(1, 10, 1 << 20)
    restarted = LeaseKeeper(options(broker.address))
    try:
        restarted.finish_through(1, leases)           # the offset from the checkpoint
        stats = channel_stats(client, "events", "spark")
        assert (stats.finish_count, stats.in_flight_count) == (10, 0)
    finally:
        restarted.close()
        planner.close()


# -- the stream reader's offsets, called as Spark's driver calls them -------------------

def test_the_readers_offsets_name_each_batchs_leases_and_a_commit_fins_them(broker, client):
    from pyspark.sql.streaming.datasource import ReadMaxBytes, ReadMaxRows

    from spark_connector.fetch import fetch_slice
    from spark_connector.reader import PynsqStreamReader

    client.create_channel("events", "spark")
    ids = client.multi_publish("events", [b"0123456789"] * 25)
    reader = PynsqStreamReader({"address": broker.address, "topic": "events",
                                "channel": "spark", "numPartitions": "3",
                                "timeoutMs": "5000", "maxMessagesPerTrigger": "10"})
    try:
        start = reader.initialOffset()
        assert start == {"batch": 0, "leases": {}}
        assert reader.getDefaultReadLimit().max_rows == 10
        assert reader.reportLatestOffset()["depth"] == 25
        first = reader.latestOffset(start, ReadMaxRows(20))
        assert (first["batch"], [lease["count"] for lease in first["leases"].values()]) == (1, [20])
        assert reader.latestOffset(start, ReadMaxRows(20)) == first   # planned: the same
        parts = reader.partitions(start, first)
        assert [(p.partition, p.num_partitions, p.timeout_s) for p in parts] == [
            (0, 3, 5.0), (1, 3, 5.0), (2, 3, 5.0)]
        read = [i for p in parts for b in fetch_slice(p) for i in b.column(0).to_pylist()]
        assert sorted(read) == sorted(ids[:20])
        second = reader.latestOffset(first, ReadMaxBytes(30))       # 3 bodies of 10 bytes
        assert (second["batch"], second["leases"]["0"]["count"]) == (2, 3)
        reader.commit(first)
        stats = channel_stats(client, "events", "spark")
        assert (stats.finish_count, stats.in_flight_count, stats.depth) == (20, 3, 2)
        third = reader.latestOffset(second, reader.getDefaultReadLimit())   # FINs batch 2
        assert (third["batch"], third["leases"]["0"]["count"]) == (3, 2)
        assert channel_stats(client, "events", "spark").finish_count == 23
        reader.commit(third)
        assert reader.latestOffset(third, ReadMaxRows(10)) == third  # nothing new: no batch
        assert reader.partitions(third, third) == []
        assert channel_stats(client, "events", "spark").finish_count == 25
    finally:
        reader.stop()


def test_a_stopped_reader_gives_back_the_leases_of_batches_not_known_committed(broker, client):
    from pyspark.sql.streaming.datasource import ReadMaxRows

    from spark_connector.reader import PynsqStreamReader

    client.create_channel("events", "spark")
    client.multi_publish("events", [b"m"] * 10)
    reader = PynsqStreamReader({"address": broker.address, "topic": "events",
                                "channel": "spark"})
    first = reader.latestOffset(reader.initialOffset(), ReadMaxRows(4))
    reader.latestOffset(first, ReadMaxRows(4))
    reader.commit(first)
    reader.stop()
    stats = channel_stats(client, "events", "spark")
    assert (stats.finish_count, stats.in_flight_count, stats.depth) == (4, 0, 6)


# -- what a trigger asks of the broker ---------------------------------------------------

def calls_of(reader, address: str, method: str) -> list[tuple]:
    """Record the arguments of every ``method`` call the reader's client of ``address``
    makes from now on (the real call still goes to the broker)."""
    client = reader.keeper._sessions[address].client
    real, seen = getattr(client, method), []

    def counted(*args, **kwargs):
        seen.append(args)
        return real(*args, **kwargs)

    setattr(client, method, counted)
    return seen


def test_a_trigger_reports_the_depth_its_reserve_left_without_a_stats_call(broker, client):
    from pyspark.sql.streaming.datasource import ReadMaxRows

    from spark_connector.reader import PynsqStreamReader

    client.create_channel("events", "spark")
    client.multi_publish("events", [b"m"] * 25)
    reader = PynsqStreamReader({"address": broker.address, "topic": "events",
                                "channel": "spark", "timeoutMs": "5000"})
    try:
        start = reader.initialOffset()
        stats_calls = calls_of(reader, broker.address, "stats")
        first = reader.latestOffset(start, ReadMaxRows(10))
        assert reader.reportLatestOffset()["depth"] == 15
        assert stats_calls == []
        # A trigger that plans nothing new (the batch was reserved already) asks the
        # broker: what was published since counts.
        client.multi_publish("events", [b"m"] * 5)
        assert reader.latestOffset(start, ReadMaxRows(10)) == first
        assert reader.reportLatestOffset()["depth"] == 20
        assert len(stats_calls) == 1
        reader.latestOffset(first, ReadMaxRows(30))
        assert reader.reportLatestOffset()["depth"] == 0
        assert len(stats_calls) == 1
    finally:
        reader.stop()


def test_a_committed_batch_is_fined_once_though_the_next_trigger_names_it_again(
        broker, client):
    from pyspark.sql.streaming.datasource import ReadMaxRows

    from spark_connector.reader import PynsqStreamReader

    client.create_channel("events", "spark")
    client.multi_publish("events", [b"m"] * 20)
    reader = PynsqStreamReader({"address": broker.address, "topic": "events",
                                "channel": "spark", "timeoutMs": "5000"})
    try:
        first = reader.latestOffset(reader.initialOffset(), ReadMaxRows(10))
        fins = calls_of(reader, broker.address, "finish_leases")
        reader.commit(first)
        second = reader.latestOffset(first, ReadMaxRows(10))   # Spark names batch 1 again
        lease = first["leases"]["0"]["lease"]
        assert [ids for (ids,) in fins if lease in ids] == [[lease]]
        assert second["batch"] == 2
        reader.commit(second)
        stats = channel_stats(client, "events", "spark")
        assert (stats.finish_count, stats.in_flight_count, stats.depth) == (20, 0, 0)
    finally:
        reader.stop()


def test_the_depth_of_a_broker_the_trigger_did_not_reserve_from_is_asked_for(two):
    from pyspark.sql.streaming.datasource import ReadMaxRows

    from spark_connector.reader import PynsqStreamReader

    keeper, (a, b), (client_a, client_b) = two
    reader = PynsqStreamReader({"address": f"{a},{b}", "topic": "events",
                                "channel": "spark", "timeoutMs": "5000"})
    try:
        start = reader.initialOffset()
        client_b.admin("channel", "empty", "events", "spark")
        reader.prepareForTriggerAvailableNow()     # availableNow: nothing to read from b
        client_b.multi_publish("events", [b"x"] * 7)
        stats_a, stats_b = calls_of(reader, a, "stats"), calls_of(reader, b, "stats")
        first = reader.latestOffset(start, ReadMaxRows(30))
        assert per_broker(first["leases"]) == {a: 30}
        assert reader.reportLatestOffset()["depth"] == 70 + 7
        assert (len(stats_a), len(stats_b)) == (0, 1)
    finally:
        reader.stop()
