"""The connector's pure parts, without Spark: options read once and checked, nsqlookupd's
and the broker's answers parsed, and a partition's rows cut into MPUB requests.

Each bad value must be refused naming the option (or column, or row) it came from."""

from __future__ import annotations

import pytest
from pyspark.sql.types import (BinaryType, IntegerType, LongType, StringType, StructField,
                               StructType)

from spark_connector.discovery import _base_url, _join, grpc_address, producer_http_addresses
from spark_connector.options import OptionError, ReaderOptions, parse_addresses
from spark_connector.writer import (MAX_REQUEST_BYTES, PartitionPublisher, PublishError,
                                    WriterOptions, check_columns)

from .grpckit import channel_stats

BASE = {"address": "127.0.0.1:4170", "topic": "events", "channel": "spark"}


def parse(**options) -> ReaderOptions:
    return ReaderOptions.parse({**BASE, **options})


def test_source_option_names_are_case_insensitive_and_spark_own_options_are_ignored():
    o = ReaderOptions.parse({"ADDRESS": "h:1", "Topic": "t", "CHANNEL": "c",
                             "maxmessagespertrigger": "7", "NUMPARTITIONS": "3",
                             "path": "ignored", "checkpointLocation": "ignored"})
    assert (o.addresses, o.topic, o.channel, o.max_messages_per_trigger,
            o.num_partitions) == (["h:1"], "t", "c", 7, 3)


def test_every_source_option_is_read_from_its_own_name():
    o = parse(maxMessagesPerTrigger="11", maxBytesPerTrigger="12", msgTimeoutMs="1300",
              numPartitions="14", timeoutMs="150", clientId="me", failOnDataLoss="FALSE",
              maxAttempts="0")
    assert (o.max_messages_per_trigger, o.max_bytes_per_trigger, o.msg_timeout_ms,
            o.num_partitions, o.timeout_ms, o.client_id, o.fail_on_data_loss,
            o.max_attempts) == (11, 12, 1300, 14, 150, "me", False, 0)
    assert parse(failOnDataLoss=" true ").fail_on_data_loss is True
    assert parse().max_attempts is None and parse(maxAttempts="5").max_attempts == 5


def test_several_comma_separated_addresses_are_each_kept_in_order():
    assert parse_addresses(" h1:4170, [::1]:4171 ,h3:1,") == ["h1:4170", "[::1]:4171", "h3:1"]
    assert parse(address="a:1,b:2").addresses == ["a:1", "b:2"]


@pytest.mark.parametrize("address", ["h", "h:", ":4170", "h:x", "h:0", "h:65536", "h:-1"])
def test_an_address_that_is_not_host_and_port_is_refused_naming_it(address):
    with pytest.raises(OptionError, match=f"option address: '{address}' is not host:port"):
        parse(address=f"ok:1,{address}")


def test_the_highest_port_is_a_port():
    assert parse(address="h:65535").addresses == ["h:65535"]


@pytest.mark.parametrize("name, value, message", [
    ("msgTimeoutMs", "999", "option msgTimeoutMs: must be at least 1000, got 999"),
    ("timeoutMs", "99", "option timeoutMs: must be at least 100, got 99"),
    ("lookupdPollIntervalMs", "99", "option lookupdPollIntervalMs: must be at least 100"),
    ("numPartitions", "0", "option numPartitions: must be at least 1, got 0"),
    ("maxMessagesPerTrigger", "0", "option maxMessagesPerTrigger: must be at least 1"),
    ("maxBytesPerTrigger", "0", "option maxBytesPerTrigger: must be at least 1"),
    ("maxAttempts", "-1", "option maxAttempts: must be at least 0, got -1"),
    ("numPartitions", "two", "option numPartitions: expected an integer, got 'two'"),
    ("failOnDataLoss", "yes", "option failOnDataLoss: expected true or false, got 'yes'"),
    ("topic", "bad topic", "option topic: invalid topic name 'bad topic'"),
    ("channel", "", "option channel is required"),
    ("tlsCertFile", "me.pem", "tlsCertFile and tlsKeyFile go together"),
    ("colour", "red", r"unknown option\(s\) for the pynsq source: colour \(known: "),
    ("adress", "h:1", r"unknown option\(s\) for the pynsq source: adress \(did you mean address\?\)$"),
    ("maxOffsetPerTrigger", "5", r"maxoffsetpertrigger \(did you mean maxOffsetsPerTrigger\?\)$"),
    ("maxTriggerDelay", "soon", "option maxTriggerDelay: expected a duration such as 15m"),
    ("minOffsetsPerTrigger", "-1", "option minOffsetsPerTrigger: must be at least 0"),
])
def test_a_bad_source_option_is_refused_naming_it(name, value, message):
    with pytest.raises(OptionError, match=message):
        parse(**{name: value})


def test_kafkas_option_names_mean_what_they_mean_there():
    o = parse(maxOffsetsPerTrigger="7", minOffsetsPerTrigger="3", maxTriggerDelay="30s")
    assert (o.max_messages_per_trigger, o.min_messages_per_trigger,
            o.max_trigger_delay_ms) == (7, 3, 30_000)
    assert parse().max_trigger_delay_ms == 15 * 60_000            # Kafka's default, 15m
    assert parse(maxTriggerDelay="250ms").max_trigger_delay_ms == 250
    assert parse(maxTriggerDelay="2h").max_trigger_delay_ms == 7_200_000
    assert parse(maxOffsetsPerTrigger="7", maxMessagesPerTrigger="7").max_messages_per_trigger == 7
    with pytest.raises(OptionError, match="maxOffsetsPerTrigger and maxMessagesPerTrigger are "
                                          "the same option, given two values"):
        parse(maxOffsetsPerTrigger="7", maxMessagesPerTrigger="8")


def test_the_smallest_allowed_values_are_accepted():
    o = parse(msgTimeoutMs="1000", timeoutMs="100", lookupdPollIntervalMs="100",
              numPartitions="1")
    assert (o.msg_timeout_ms, o.timeout_ms, o.num_partitions) == (1000, 100, 1)


def test_address_and_lookupd_http_address_exclude_each_other_and_one_is_required():
    o = ReaderOptions.parse({"lookupdHttpAddress": "l1:4161,l2:4161", "topic": "t",
                             "channel": "c", "lookupdPollIntervalMs": "250"})
    assert (o.addresses, o.lookupd_addresses, o.lookupd_poll_interval_ms) == (
        [], ("l1:4161", "l2:4161"), 250)
    assert parse().lookupd_addresses == () and parse().lookupd_poll_interval_ms == 5000
    with pytest.raises(OptionError, match="address and lookupdHttpAddress exclude each other"):
        parse(lookupdHttpAddress="l:4161")
    with pytest.raises(OptionError, match="option address or lookupdHttpAddress is required"):
        ReaderOptions.parse({"address": " ", "topic": "t", "channel": "c"})
    with pytest.raises(OptionError, match="option lookupdHttpAddress: 'l' is not host:port"):
        ReaderOptions.parse({"lookupdHttpAddress": "l", "topic": "t", "channel": "c"})


# -- the sink's options and columns --------------------------------------------------

def schema(**columns) -> StructType:
    return StructType([StructField(name, kind) for name, kind in columns.items()])


BODY = schema(body=BinaryType())


def test_sink_options_default_to_batches_of_5000_from_the_writer_named_sink():
    o = WriterOptions.parse({"ADDRESS": "h:1", "Topic": "lines"}, BODY)
    assert (o.address, o.topic, o.batch_size, o.producer) == ("h:1", "lines", 5000, "sink")
    o = WriterOptions.parse({"address": "h:1", "topic": "t", "batchSize": "7",
                             "producer": "mine"}, BODY)
    assert (o.batch_size, o.producer) == (7, "mine")


def test_a_topic_column_stands_in_for_the_topic_option_but_the_option_still_counts():
    with_column = schema(body=StringType(), topic=StringType())
    assert WriterOptions.parse({"address": "h:1"}, with_column).topic is None
    assert WriterOptions.parse({"address": "h:1", "topic": "t"}, with_column).topic == "t"
    with pytest.raises(OptionError, match="option topic is required"):
        WriterOptions.parse({"address": "h:1"}, BODY)


@pytest.mark.parametrize("options, message", [
    ({"address": "a:1,b:2", "topic": "t"}, "the pynsq sink publishes to one broker"),
    ({"address": "h:1", "topic": "t", "producer": "a:b"}, "option producer: a writer name"),
    ({"address": "h:1", "topic": "t", "producer": ""}, "option producer: a writer name"),
    ({"address": "h:1", "topic": "t", "batchSize": "0"}, "option batchSize: must be at least 1"),
    ({"address": "h:1", "topic": "t", "numPartitions": "2"},
     r"unknown option\(s\) for the pynsq sink: numpartitions"),
])
def test_a_bad_sink_option_is_refused_naming_it(options, message):
    with pytest.raises(OptionError, match=message):
        WriterOptions.parse(options, BODY)


@pytest.mark.parametrize("columns, message", [
    (schema(value=BinaryType()), "column 'body' is required .* the DataFrame has value"),
    (schema(), "column 'body' is required .* has no columns"),
    (schema(body=IntegerType()), "column 'body' must be BINARY or STRING, not int"),
    (schema(body=BinaryType(), defer_ms=StringType()), "defer column 'defer_ms' must"),
    (schema(body=BinaryType(), topic=BinaryType()), "topic column 'topic' must"),
    (schema(body=BinaryType(), ttl_ms=StringType()), "ttl column 'ttl_ms' must"),
])
def test_a_missing_or_mistyped_column_is_refused_naming_it(columns, message):
    # A topic column is read (and checked) only when no topic option is given.
    options = {"address": "h:1"} if "topic" in columns.names else {"address": "h:1", "topic": "t"}
    with pytest.raises(PublishError, match=message):
        WriterOptions.parse(options, columns)


def test_the_sinks_topic_option_wins_over_a_topic_column():
    given = WriterOptions.parse({"address": "h:1", "topic": "out"},
                                schema(body=BinaryType(), topic=StringType()))
    routed = WriterOptions.parse({"address": "h:1"}, schema(body=BinaryType(), topic=StringType()))
    assert (given.topic, routed.topic) == ("out", None)


def test_columns_of_the_right_types_are_accepted():
    check_columns(schema(b=StringType(), d=LongType(), t=StringType(), l=IntegerType()),
                  "b", "d", "t", "l")
    with pytest.raises(PublishError, match="defer column 'd' must exist"):
        check_columns(schema(b=StringType()), "b", "d", None)


# -- what nsqlookupd and a broker's /info say ----------------------------------------

def test_lookup_producers_without_an_address_or_http_port_are_left_out():
    producers = [{"broadcast_address": "a", "http_port": "4151"},
                 {"broadcast_address": "", "http_port": 4151},
                 {"broadcast_address": "c"},
                 {"http_port": 4151}]
    assert producer_http_addresses({"producers": producers}) == [("a", 4151)]
    assert producer_http_addresses({"producers": None}) == []
    assert producer_http_addresses({}) == []
    assert producer_http_addresses([]) == []


@pytest.mark.parametrize("given, expected", [
    ("[::]:4170", "10.0.0.5:4170"),
    (":4170", "10.0.0.5:4170"),
    ("::1:4170", "[::1]:4170"),
    ("[fe80::1]:4170", "[fe80::1]:4170"),
    ("h:417x", None),
    ("h", None),
    ("", None),
])
def test_a_grpc_address_is_read_from_info_with_ipv6_hosts_bracketed(given, expected):
    assert grpc_address({"grpc_address": given}, "10.0.0.5") == expected


def test_an_ipv6_broadcast_address_is_bracketed():
    assert grpc_address({"grpc_address": "0.0.0.0:4170"}, "fe80::2") == "[fe80::2]:4170"
    assert _join("h", 1) == "h:1" and _join("::1", 2) == "[::1]:2"


def test_a_lookupd_address_may_be_a_url():
    assert _base_url(" l:4161/ ") == "http://l:4161"
    assert _base_url("https://l:4161/") == "https://l:4161"
    assert _base_url("http://l:4161") == "http://l:4161"


# -- a partition's rows, cut into MPUBs ------------------------------------------------

@pytest.fixture
def publisher(broker, client):
    client.create_channel("lines", "all")
    client.create_channel("other", "all")
    p = PartitionPublisher(broker.address, "lines", "test:w:0", 3, "batch partition 4")
    yield p
    p.close()


def test_rows_are_published_in_mpubs_of_batch_size_with_one_sequence_each(publisher, client):
    for i in range(7):
        publisher.add(f"row {i}")
    assert (publisher.sequence, publisher.published) == (2, 6)   # two full MPUBs so far
    assert publisher.finish() == 7 and publisher.sequence == 3
    assert channel_stats(client, "lines", "all").depth == 7


def test_rows_for_each_topic_are_batched_apart_and_the_topic_column_wins(publisher, client):
    publisher.add(b"a", topic="other")
    publisher.add(b"b")
    publisher.add(b"c", topic="other", defer_ms=60_000)
    publisher.add(b"d", topic=None, ttl_ms=0)
    assert publisher.sequence == 0
    assert publisher.finish() == 4 and publisher.sequence == 2
    lines, other = channel_stats(client, "lines", "all"), channel_stats(client, "other", "all")
    assert (lines.depth, lines.deferred_count) == (2, 0)
    assert (other.depth, other.deferred_count) == (1, 1)


def test_an_mpub_is_cut_before_its_bodies_pass_the_request_limit(broker, client):
    client.create_channel("big", "all")
    body = b"x" * (MAX_REQUEST_BYTES // 4)
    p = PartitionPublisher(broker.address, "big", "test:big:0", 500, "partition 0")
    try:
        for _ in range(4):
            p.add(body)
        assert p.sequence == 0                      # exactly the limit: one request
        p.add(b"y")
        assert p.sequence == 1
        assert p.finish() == 5 and p.sequence == 2
    finally:
        p.close()
    assert channel_stats(client, "big", "all").depth == 5


def test_a_replayed_partition_publishes_nothing_twice_and_keeps_each_rows_ttl(broker, client):
    client.create_channel("lines", "all")
    for _ in range(2):                      # the same partition, written twice
        p = PartitionPublisher(broker.address, "lines", "q:w:7:0", 2, "partition 0")
        try:
            p.add(b"a", ttl_ms=1)
            p.add(b"b")
            p.add(b"c")
            assert p.finish() == 3
        finally:
            p.close()
    stats = channel_stats(client, "lines", "all")
    assert stats.message_count == 3
    with client.subscribe("lines", "all", rdy=10) as sub:     # "a" has expired by now
        got = sorted(sub.get(10).body for _ in range(2))
    assert got == [b"b", b"c"]
    assert channel_stats(client, "lines", "all").expired_count == 1


class _Recording(PartitionPublisher):
    """A publisher that remembers each MPUB it sends (topic, bodies), then sends it."""

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.requests: list[tuple[str, list[bytes]]] = []

    def _flush(self, topic: str) -> None:
        self.requests.append((topic, list(self._pending[topic][0])))
        super()._flush(topic)


def test_arrow_batches_are_cut_into_the_same_mpubs_as_the_same_rows_one_by_one(
        broker, monkeypatch):
    """Whole Arrow batches of bodies are checked and cut at once; a replay must name the
    same requests whichever way its rows came, so the cuts (by count and by bytes, rows
    pending from before included) are those of ``add`` row by row."""
    import pyarrow as pa
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from spark_connector import writer

    monkeypatch.setattr(writer, "MAX_REQUEST_BYTES", 64)   # bodies of 1-80 bytes cross it
    examples = iter(range(10_000))

    @settings(max_examples=60, deadline=None)
    @given(sizes=st.lists(st.integers(1, 80), min_size=1, max_size=40),
           batch_size=st.integers(1, 6), before=st.integers(0, 5),
           cuts=st.lists(st.integers(0, 40), max_size=4), as_text=st.booleans())
    def same_requests(sizes, batch_size, before, cuts, as_text):
        n = next(examples)
        bodies = [bytes([65 + i % 26]) * size for i, size in enumerate(sizes)]
        one_by_one = _Recording(broker.address, "cut", f"rows:{n}", batch_size, "p 0")
        in_bulk = _Recording(broker.address, "cut", f"arrow:{n}", batch_size, "p 0")
        try:
            for body in bodies:
                one_by_one.add(body)
            for body in bodies[:before]:            # pending when the batches come
                in_bulk.add(body)
            rest = bodies[before:]
            edges = sorted({0, len(rest), *(c for c in cuts if c < len(rest))})
            column = [b.decode() for b in rest] if as_text else rest
            in_bulk.add_arrow(pa.RecordBatch.from_pydict({"body": column[a:b]})
                              for a, b in zip(edges, edges[1:]))
            assert in_bulk.finish() == one_by_one.finish() == len(bodies)
            assert in_bulk.requests == one_by_one.requests
            assert (in_bulk.sequence, in_bulk.row) == (one_by_one.sequence, one_by_one.row)
        finally:
            one_by_one.close()
            in_bulk.close()

    same_requests()


@pytest.mark.parametrize("body, message", [
    (None, "p 0, row 3: column 'body' is null"),
    ("", "p 0, row 3: column 'body' is empty"),
])
def test_a_bad_row_in_an_arrow_batch_is_refused_naming_its_row(broker, body, message):
    import pyarrow as pa

    p = PartitionPublisher(broker.address, "lines", "test:w:0", 3, "p 0")
    try:
        p.add_arrow([pa.RecordBatch.from_pydict({"body": ["a", "b"]})])
        with pytest.raises(PublishError, match=message):
            p.add_arrow([pa.RecordBatch.from_pydict({"body": ["c", body, "d"]})])
    finally:
        p.close()


@pytest.mark.parametrize("row, message", [
    ({"body": None}, "batch partition 4, row 1: column 'body' is null"),
    ({"body": b""}, "batch partition 4, row 1: column 'body' is empty"),
    ({"body": ""}, "batch partition 4, row 1: column 'body' is empty"),
    ({"body": b"x", "ttl_ms": -1}, "batch partition 4, row 1: column 'ttl_ms' is negative"),
])
def test_a_bad_row_is_refused_naming_its_partition_and_row(publisher, row, message):
    publisher.add(b"first")
    with pytest.raises(PublishError, match=message):
        publisher.add(**row)


def test_a_body_over_max_msg_size_is_refused_naming_both_sizes(broker, client):
    p = PartitionPublisher(broker.address, "lines", "test:w:0", 3, "partition 0")
    try:
        limit = p.max_size
        p.add(b"x" * limit)
        with pytest.raises(PublishError, match=f"row 1: column 'body' has {limit + 1} bytes, "
                                               f"over the broker's max-msg-size of {limit}"):
            p.add(b"x" * (limit + 1))
    finally:
        p.close()


def test_a_row_without_a_topic_when_no_topic_option_was_given_is_refused(broker):
    p = PartitionPublisher(broker.address, None, "test:w:0", 3, "partition 0")
    try:
        with pytest.raises(PublishError, match="row 0: column 'topic' is null and no topic"):
            p.add(b"x", topic=None)
    finally:
        p.close()
