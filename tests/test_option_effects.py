"""What an option's value does, falsy values first (0, false, empty): each test sets the value
on a real broker (or the connector's driver part) and checks the effect a user would see, so
that a 0 read as "not given" or an option wired to the wrong setting goes red. The table of
every option and the test that observes it is tests/OPTIONS.md (checked by
``test_every_option_has_a_row_naming_a_test_that_observes_it`` below)."""

from __future__ import annotations

import inspect
import re
from dataclasses import fields
from pathlib import Path

import grpc
import pytest

from broker import Client, ClientError, EmbeddedBroker, Options
from broker.api import broker_pb2 as pb
from broker.errors import BrokerError

from .authserver import AuthServer
from .grpckit import SENTINEL_ID, channel_stats
from .securitykit import http as auth_http

TESTS = Path(__file__).parent
TABLE = TESTS / "OPTIONS.md"
ROW = re.compile(r"^\|([^|]+)\|([^|]+)\|([^|]+)\|([^|]+)\|([^|]+)\|\s*$")
FALSY = {"0", "false", "''", "[]"}


def rows() -> list[tuple[str, str, str, str, str]]:
    """(option, kind, value, effect, tests) of every row of OPTIONS.md."""
    out = []
    for line in TABLE.read_text().splitlines():
        match = ROW.match(line)
        if match and not line.startswith(("| option ", "|---")):
            option, kind, value, effect, tests = (g.strip() for g in match.groups())
            out.append((option.strip("`"), kind, value.strip("`"), effect, tests))
    return out


# -- the table against the product ----------------------------------------------------

def broker_options() -> dict[str, object]:
    return {f.name.replace("_", "-"): f.default for f in fields(Options)}


def fixed_options() -> set[str]:
    return {f.name.replace("_", "-") for f in fields(Options) if "fixed" in f.metadata}


def every_option() -> set[tuple[str, str]]:
    """(option, kind) of every option and setting the product has."""
    from spark_connector.options import ReaderOptions
    from spark_connector.writer import WriterOptions, pub_to_topic

    found = {(name, "pynsqd") for name in broker_options()}
    found |= {(name, "spark source") for name in ReaderOptions.NAMES}
    found |= {(name, "spark sink") for name in WriterOptions.NAMES}
    found |= {(name, "pub_to_topic") for name in inspect.signature(pub_to_topic).parameters}
    for message, kind in ((pb.ChannelRequest, "channel"), (pb.TopicRequest, "topic")):
        found |= {(f.name, kind) for f in message.DESCRIPTOR.fields
                  if f.name not in ("topic", "channel")}
    return found


def test_every_option_has_a_row_naming_a_test_that_observes_it():
    from .test_promises import NAMED, collected

    table = rows()
    missing = sorted(every_option() - {(option, kind) for option, kind, *_ in table})
    assert not missing, f"options and settings with no row in OPTIONS.md: {missing}"
    unknown = sorted({(option, kind) for option, kind, *_ in table} - every_option())
    assert not unknown, f"OPTIONS.md rows naming no option the product has: {unknown}"
    silent = [f"{option} = {value}" for option, _kind, value, _effect, tests in table
              if not NAMED.search(tests)]
    assert not silent, f"rows naming no test: {silent}"
    gone = [f"{file}::{name}" for *_, tests in table for file, name in NAMED.findall(tests)
            if not (TESTS / file).exists() or (name and name not in collected(TESTS / file))]
    assert not gone, f"tests OPTIONS.md names that are not collected: {gone}"


def falsy_values(default: object) -> list[tuple[str, object]]:
    if isinstance(default, bool):
        return [("false", False)]
    if isinstance(default, int):
        return [("0", 0)]
    if isinstance(default, str):
        return [("''", ""), ("0", "0")] if default.isdigit() else [("''", "")]
    if isinstance(default, tuple):
        return [("[]", ())]
    return []


def test_every_falsy_value_a_broker_option_takes_has_a_row():
    """0, false, '' or [] where the option takes it and it is not the default: the row says
    what it does and names the test that sees it."""
    table = {(option, value) for option, kind, value, *_ in table_rows("pynsqd")}
    missing = []
    for name, default in broker_options().items():
        for shown, value in falsy_values(default):
            if value == default or name in fixed_options():
                continue
            try:
                Options(**{name.replace("-", "_"): value})
            except ValueError:
                continue            # refused: not a value the option takes
            if (name, shown) not in table:
                missing.append(f"{name} = {shown}")
    assert not missing, f"falsy values broker options take, with no row: {missing}"


def test_every_falsy_value_a_spark_option_takes_has_a_row():
    from spark_connector.options import OptionError, ReaderOptions

    table = {(option, value) for option, kind, value, *_ in table_rows("spark source")}
    base = {"address": "127.0.0.1:4170", "topic": "t", "channel": "c"}
    missing = []
    for name in ReaderOptions.NAMES:
        for shown in ("0", "false"):
            given = {**base, name: shown}
            if name.startswith("lookupd"):
                given.pop("address")
                given.setdefault("lookupdHttpAddress", "127.0.0.1:4161")
            try:
                ReaderOptions.parse(given)
            except (OptionError, ValueError):
                continue
            if (name, shown) not in table and name not in ("address", "topic", "channel",
                                                           "clientId", *SECRETS_AND_FILES):
                missing.append(f"{name} = {shown}")
    assert not missing, f"falsy values Spark options take, with no row: {missing}"


SECRETS_AND_FILES = ("tlsCaFile", "tlsCertFile", "tlsKeyFile", "authSecret")


def table_rows(kind: str) -> list[tuple[str, str, str, str, str]]:
    return [row for row in rows() if row[1] == kind]


# -- falsy values of the broker's options, by their effect -----------------------------

def test_a_max_rdy_count_of_0_refuses_every_rdy_but_0():
    with EmbeddedBroker(max_rdy_count=0) as b, Client(b.address, timeout=10) as c:
        c.publish("t", b"x")
        with c.subscribe("t", "ch", rdy=0) as sub:
            sub.fin(SENTINEL_ID)                 # RDY 0 taken: the sentinel is answered
            assert sub.error(timeout=10).id == SENTINEL_ID
            sub.rdy(1)
            with pytest.raises(BrokerError) as refused:
                while sub.get(timeout=10) is not None:
                    pass
        assert refused.value.code == "E_INVALID"
        assert "max-rdy-count" in str(refused.value)


def test_a_max_req_timeout_of_0_refuses_every_defer_but_0():
    with EmbeddedBroker(max_req_timeout="0") as b, Client(b.address, timeout=10) as c:
        c.publish("t", b"now", defer_ms=0)
        with pytest.raises(BrokerError, match="max-req-timeout"):
            c.publish("t", b"later", defer_ms=1)
        assert channel_depth(c, "t") == 1


def channel_depth(c: Client, topic: str) -> int:
    [t] = c.stats(topic).topics
    return t.depth


def test_a_max_msg_size_of_0_refuses_every_message():
    with EmbeddedBroker(max_msg_size=0) as b, Client(b.address, timeout=10) as c:
        with pytest.raises(BrokerError, match="max-msg-size of 0"):
            c.publish("t", b"x")


def test_a_max_body_size_of_0_refuses_every_request_with_a_body_and_serves_pings():
    with EmbeddedBroker(max_body_size=0) as b, Client(b.address, timeout=10) as c:
        assert c.ping() == "OK"
        with pytest.raises(ClientError) as refused:
            c.publish("t", b"x")
        assert refused.value.status == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_a_dedupe_window_of_0_remembers_no_publish():
    with EmbeddedBroker(dedupe_window="0") as b, Client(b.address, timeout=10) as c:
        c.create_channel("t", "ch")
        first = c.multi_publish("t", [b"a"], producer_id="w", sequence=1)
        again = c.multi_publish("t", [b"a"], producer_id="w", sequence=1)
        assert first != again
        assert channel_stats(c, "t", "ch").depth == 2


@pytest.mark.parametrize("node_id", [0, 5])
def test_the_node_id_given_is_in_every_message_id_0_included(node_id):
    from broker.message import NODE_ID_BITS

    with EmbeddedBroker(node_id=node_id) as b, Client(b.address, timeout=10) as c:
        ids = c.multi_publish("t", [b"a", b"b", b"c"])
    assert {int(i, 16) & ((1 << NODE_ID_BITS) - 1) for i in ids} == {node_id}


def test_an_empty_grpc_address_is_refused_naming_the_option():
    with pytest.raises(ValueError, match="grpc-address"):
        Options(grpc_address="")


# -- channel settings: a falsy value is a change, authorised as one --------------------

def grant(topic: str, *permissions: str, identity: str) -> dict:
    return {"ttl": 3600, "identity": identity, "authorizations": [
        {"topic": topic, "channels": [".*"], "permissions": list(permissions)}]}


@pytest.fixture(scope="module")
def guarded():
    secrets = {"admin": grant("^s-", "publish", "subscribe", identity="admin"),
               "reader": grant("^s-", "subscribe", identity="reader")}
    with AuthServer(secrets) as server, \
            EmbeddedBroker(auth_http_addresses=[server.address], max_attempts=2) as b:
        yield b


def test_setting_a_channels_max_attempts_to_0_is_a_change_only_an_admin_may_make(guarded):
    admin = Client(guarded.address, auth_secret="admin", timeout=10)
    reader = Client(guarded.address, auth_secret="reader", timeout=10)
    try:
        admin.create_channel("s-jobs", "work", max_attempts=5)
        with pytest.raises(ClientError, match="AUTH"):
            reader.create_channel("s-jobs", "work", max_attempts=0)
        status, _ = auth_http(guarded, "/channel/create?topic=s-jobs&channel=work"
                                       "&max_attempts=0", "reader", b"")
        assert status == 403
        assert channel_stats(admin, "s-jobs", "work").max_attempts == 5
        admin.create_channel("s-jobs", "work", max_attempts=0)
        assert channel_stats(admin, "s-jobs", "work").max_attempts == 0
        reader.create_channel("s-jobs", "work", max_attempts=0)   # the same value: no change
    finally:
        admin.close()
        reader.close()


def test_a_channel_with_max_attempts_0_never_dead_letters_over_the_brokers_default():
    with EmbeddedBroker(max_attempts=1) as b, Client(b.address, timeout=10) as c:
        c.create_channel("jobs", "own", max_attempts=0)
        c.publish("jobs", b"poison")
        with c.subscribe("jobs", "own", rdy=1) as sub:
            for attempt in (1, 2, 3):
                msg = sub.get(timeout=10)
                assert msg is not None and msg.attempts == attempt
                sub.req(msg.id)
        stats = channel_stats(c, "jobs", "own")
        assert (stats.dead_letter_count, stats.max_attempts) == (0, 0)


# -- the Spark source's falsy values (its driver part, no Spark session) ----------------

def test_the_source_sets_max_attempts_0_on_its_channel_over_the_brokers_default():
    from .test_connector_calls import reader_of

    with EmbeddedBroker(max_attempts=3) as b, Client(b.address, timeout=10) as c:
        c.create_channel("events", "spark", max_attempts=4)
        reader = reader_of(b.address, maxAttempts="0")
        try:
            reader.initialOffset()
            assert channel_stats(c, "events", "spark").max_attempts == 0
        finally:
            reader.stop()


def test_a_reconnect_timeout_of_0_names_a_silent_broker_at_once(caplog):
    import logging

    from pyspark.sql.streaming.datasource import ReadMaxRows

    from spark_connector.session import BrokerUnreachable

    from .test_connector_calls import reader_of

    broker = EmbeddedBroker().start()
    try:
        with Client(broker.address, timeout=10) as client:
            client.create_channel("events", "spark")
            client.multi_publish("events", [b"m"] * 4)
        reader = reader_of(broker.address, reconnectTimeoutMs="0", timeoutMs="1000")
        start = reader.initialOffset()
    finally:
        broker.stop()
    caplog.set_level(logging.WARNING, "pynsq.spark")
    try:
        with pytest.raises(BrokerUnreachable, match=r"reconnectTimeoutMs \(0 ms\)"):
            reader.latestOffset(start, ReadMaxRows(4))
    finally:
        reader.stop()
    # Not waited for: 0 is no wait, not "the default wait" (30 s).
    assert not [r for r in caplog.records if "waiting up to reconnectTimeoutMs" in r.getMessage()]


# -- what reaches statsd, the log and the auth server ----------------------------------

@pytest.mark.parametrize("prefix", ["", "app."])
def test_the_statsd_prefix_starts_every_key_and_the_packet_size_bounds_every_datagram(
        prefix):
    import socket

    from .helpers import wait_for

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        udp.bind(("127.0.0.1", 0))
        udp.settimeout(0.5)
        address = f"127.0.0.1:{udp.getsockname()[1]}"
        with EmbeddedBroker(statsd_address=address, statsd_interval="100ms",
                            statsd_prefix=prefix, statsd_udp_packet_size=120) as b:
            b.call(b.broker.create_channel, "events", "spark")
            b.call(b.broker.multi_publish, "events", [b"a", b"b", b"c"])
            seen: list[str] = []
            sizes: list[int] = []

            def pushed() -> bool:
                try:
                    datagram = udp.recv(65536)
                except TimeoutError:
                    return False
                sizes.append(len(datagram))
                seen.extend(datagram.decode().splitlines())
                return "topic.events.channel.spark.depth:3|g" in [
                    line.removeprefix(prefix) for line in seen if line.startswith(prefix)]

            wait_for(pushed, 30, interval=0, message="a push showing depth 3")
    assert f"{prefix}topic.events.channel.spark.depth:3|g" in seen
    assert all(line.startswith(prefix) for line in seen)
    if not prefix:      # nothing before the names: not the default's "nsq.HOST_PORT."
        assert not [line for line in seen if line.startswith("nsq.")]
    assert max(sizes) <= 120


@pytest.mark.parametrize("prefix", ["", "<edge> "])
def test_the_log_prefix_starts_every_log_line_and_empty_is_none(prefix):
    from .helpers import Daemon

    d = Daemon("--log-prefix", prefix, "--log-level", "info")
    try:
        d.wait_ready()
    finally:
        d.stop()
    lines = [line for line in d.output().splitlines() if line.strip()]
    assert lines, "pynsqd logged nothing"
    assert all(line.startswith(prefix) for line in lines)
    if not prefix:
        assert all(re.match(r"\d{4}-\d\d-\d\d ", line) for line in lines), lines[:3]


def test_the_auth_servers_timeouts_are_the_two_options_each_its_own():
    from broker.security.auth import Authenticator

    given = Options(auth_http_addresses=("127.0.0.1:1",), http_client_connect_timeout="0",
                    http_client_request_timeout="3s")
    authenticator = Authenticator.from_options(given)
    assert (authenticator.connect_timeout, authenticator.request_timeout) == (0, 3.0)
    given = Options(auth_http_addresses=("127.0.0.1:1",), http_client_connect_timeout="1500ms",
                    http_client_request_timeout="0")
    authenticator = Authenticator.from_options(given)
    assert (authenticator.connect_timeout, authenticator.request_timeout) == (1.5, 0)


# -- storage: falsy values of the fsync policy and the file size ------------------------

@pytest.mark.parametrize("policy", [{"sync_every": 0, "sync_timeout": 3_600_000},
                                    {"sync_every": 1_000_000, "sync_timeout": 0}],
                         ids=["sync-every-0", "sync-timeout-0"])
def test_a_sync_every_or_sync_timeout_of_0_fsyncs_each_publish_and_a_power_loss_keeps_it(
        tmp_path, monkeypatch, policy):
    from broker.clock import ManualClock
    from broker.storage import fileops

    from .faultfs import FaultyFiles
    from .helpers import wait_for
    from .test_storage_recovery import drain, start

    files = FaultyFiles()
    monkeypatch.setattr(fileops, "current", files)
    broker = start(tmp_path, ManualClock(), **policy)
    broker.create_channel("events", "work")
    broker.storage.wait_synced()
    kept = broker.publish("events", b"one")
    broker.storage.tick()                      # one message, no time passed: due at 0
    wait_for(lambda: files.unsynced_bytes(tmp_path) == 0, 30, message="the fsync of one")
    broker.storage.abandon()
    files.power_loss(tmp_path)
    broker = start(tmp_path, ManualClock())
    assert set(drain(broker, "events", "work")) == {kept}


def test_an_empty_tls_required_is_false_and_needs_no_certificate():
    assert Options(tls_required="").tls_required == Options().tls_required
    with EmbeddedBroker(tls_required="") as b, Client(b.address, timeout=10) as c:
        assert c.ping() == "OK"
    with pytest.raises(ValueError, match="tls"):
        Options(tls_required="true")


# -- the defaults the documentation states ----------------------------------------------

def documented_defaults() -> dict[str, str]:
    """option -> the default cell of the Spark source's option table (README or docs/): the
    first row naming it, as the writers' table after it names some options again."""
    from .test_limits import documentation

    rows = re.findall(r"^\| `([a-zA-Z]+)`(?: \(or Kafka's `[a-zA-Z]+`\))? \| ([^|]+) \|",
                      documentation(), flags=re.M)
    stated: dict[str, str] = {}
    for name, cell in rows:     # the source's table comes first; the writers' repeats names
        stated.setdefault(name, cell.strip())
    return stated


def test_a_spark_source_option_left_out_takes_its_documented_default():
    from spark_connector.options import ReaderOptions

    parsed = ReaderOptions.parse({"address": "127.0.0.1:4170", "topic": "t", "channel": "c"})
    stated = documented_defaults()
    checked = []
    for name in ReaderOptions.NAMES:
        cell = stated.get(name, "")
        number = re.match(r"`?(\d+|true|false)`?(\s|$)", cell)
        if not number:
            continue            # required, or a default that is not one value
        field = re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()
        value = getattr(parsed, field)
        expected = {"true": True, "false": False}.get(number[1], number[1])
        assert str(value) == str(expected), f"{name}: {value!r}, documented {cell!r}"
        checked.append(name)
    assert {"maxMessagesPerTrigger", "maxBytesPerTrigger", "msgTimeoutMs", "numPartitions",
            "timeoutMs", "lookupdPollIntervalMs", "reconnectTimeoutMs",
            "failOnDataLoss"} <= set(checked), checked
    assert parsed.client_id == "" and parsed.max_attempts is None   # the session's, the channel's


def test_a_channel_given_only_its_dead_letter_topic_takes_it_and_keeps_its_max_attempts():
    with EmbeddedBroker() as b, Client(b.address, timeout=10) as c:
        c.create_channel("jobs", "work", max_attempts=2)
        c.create_channel("jobs", "work", dead_letter_topic="jobs.failed")   # attempts: None
        stats = channel_stats(c, "jobs", "work")
        assert (stats.max_attempts, stats.dead_letter_topic) == (2, "jobs.failed")
        c.create_channel("jobs", "fresh", dead_letter_topic="jobs.failed")
        assert channel_stats(c, "jobs", "fresh").dead_letter_topic == "jobs.failed"


def test_changing_only_a_channels_dead_letter_topic_is_a_change_only_an_admin_may_make(guarded):
    admin = Client(guarded.address, auth_secret="admin", timeout=10)
    reader = Client(guarded.address, auth_secret="reader", timeout=10)
    try:
        admin.create_channel("s-mail", "work", dead_letter_topic="s-mail-failed")
        with pytest.raises(ClientError, match="AUTH"):
            reader.create_channel("s-mail", "work", dead_letter_topic="s-elsewhere")
        status, _ = auth_http(guarded, "/channel/create?topic=s-mail&channel=work"
                                       "&dead_letter_topic=s-elsewhere", "reader", b"")
        assert status == 403
        assert channel_stats(admin, "s-mail", "work").dead_letter_topic == "s-mail-failed"
        reader.create_channel("s-mail", "work", dead_letter_topic="s-mail-failed")  # the same
    finally:
        admin.close()
        reader.close()


# -- the options added for Kafka users and for the writers' replays -----------------------

def test_min_messages_per_trigger_0_makes_a_batch_of_one_and_max_trigger_delay_0_holds_none_back():
    from pyspark.sql.streaming.datasource import ReadMaxRows

    from .test_connector_calls import reader_of

    with EmbeddedBroker() as b, Client(b.address, timeout=10) as client:
        eager = reader_of(b.address, minMessagesPerTrigger="0", channel="eager")
        undelayed = reader_of(b.address, minMessagesPerTrigger="50", maxTriggerDelay="0",
                              channel="undelayed")
        try:
            starts = eager.initialOffset(), undelayed.initialOffset()
            client.publish("events", b"one")
            for reader, start in zip((eager, undelayed), starts):
                batch = reader.latestOffset(start, ReadMaxRows(1000))
                assert sum(lease["count"] for lease in batch["leases"].values()) == 1
        finally:
            eager.stop()
            undelayed.stop()


def test_the_writers_reconnect_timeout_is_the_one_given_to_pub_to_topic_and_the_sink(spark):
    from spark_connector import pub_to_topic

    from .helpers import free_port

    silent = f"127.0.0.1:{free_port()}"     # nothing listens there
    df = spark.createDataFrame([("x",)], "body STRING")
    with pytest.raises(Exception, match=r"reconnectTimeoutMs \(300 ms\)"):
        pub_to_topic(silent, "t", reconnect_timeout_ms=300)(df, 0)
    with pytest.raises(Exception, match=r"reconnectTimeoutMs \(400 ms\)"):
        (df.write.format("pynsq").option("address", silent).option("topic", "t")
         .option("reconnectTimeoutMs", "400").mode("append").save())


def test_the_sinks_delivery_is_read_into_its_own_field_and_exactly_once_by_default():
    from pyspark.sql.types import StringType, StructField, StructType

    from spark_connector.writer import WriterOptions

    schema = StructType([StructField("body", StringType())])
    given = {"address": "127.0.0.1:4170", "topic": "t"}
    assert WriterOptions.parse(given, schema).delivery == "exactly-once"
    assert WriterOptions.parse({**given, "delivery": "at-least-once"},
                               schema).delivery == "at-least-once"


def test_a_topic_created_again_without_a_ttl_keeps_the_ttl_it_has():
    """Only a ttl given changes it: a create naming none is not a ttl of 0."""
    with EmbeddedBroker() as b, Client(b.address, timeout=10) as c:
        c.create_topic("events", ttl_ms=60_000)
        c.create_topic("events")
        assert c.stats("events").topics[0].ttl_ms == 60_000
        c.create_topic("events", ttl_ms=0)
        assert c.stats("events").topics[0].ttl_ms == 0
        c.create_topic("plain")
        assert c.stats("plain").topics[0].ttl_ms == 0


def test_a_ttl_or_max_attempts_of_0_given_over_http_is_set_and_one_left_out_is_kept():
    """The HTTP creates as the gRPC ones: `ttl=0` and `max_attempts=0` are values (set back
    to none, never dead-lettered), not "no change"; a setting the query leaves out is kept."""
    with EmbeddedBroker(max_attempts=2) as b, Client(b.address, timeout=10) as c:
        def post(path: str) -> tuple[int, bytes]:
            return auth_http(b, path, body=b"")

        assert post("/topic/create?topic=events&ttl=60s") == (200, b"")
        assert post("/topic/create?topic=events") == (200, b"")
        assert c.stats("events").topics[0].ttl_ms == 60_000
        assert post("/topic/create?topic=events&ttl=0") == (200, b"")
        assert c.stats("events").topics[0].ttl_ms == 0

        assert post("/channel/create?topic=events&channel=work&max_attempts=5"
                    "&dead_letter_topic=events.failed") == (200, b"")
        assert post("/channel/create?topic=events&channel=work") == (200, b"")
        stats = channel_stats(c, "events", "work")
        assert (stats.max_attempts, stats.dead_letter_topic) == (5, "events.failed")
        assert post("/channel/create?topic=events&channel=work&max_attempts=0") == (200, b"")
        stats = channel_stats(c, "events", "work")
        assert (stats.max_attempts, stats.dead_letter_topic) == (0, "events.failed")
        assert post("/channel/create?topic=events&channel=plain") == (200, b"")
        stats = channel_stats(c, "events", "plain")     # the broker's, as none was given
        assert (stats.max_attempts, stats.dead_letter_topic) == (2, "events.dead")
