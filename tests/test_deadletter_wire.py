"""Dead letters and message TTL as users meet them: gRPC, NSQ's TCP protocol (REQ-driven),
the HTTP API and the CLI, against a real broker on loopback."""

from __future__ import annotations

import json
import time

import grpc
import pytest

from broker.cli import main as pynsq_main
from broker.client import ClientError

from .grpckit import channel_stats, so_far
from .helpers import wait_for
from .test_cli import pynsq
from .test_nsq_compat import Raw, http


def read_all(client, topic: str, channel: str, expected: int) -> dict[str, bytes]:
    """id -> body of ``expected`` messages read from ``channel`` and FINed."""
    got: dict[str, bytes] = {}
    with client.subscribe(topic, channel, rdy=100) as sub:
        deadline = time.monotonic() + 20
        while len(got) < expected:
            assert time.monotonic() < deadline, f"read {len(got)} of {expected} from {topic}"
            msg = sub.get(timeout=0.2)
            if msg is not None:
                got[msg.id] = msg.body
                sub.fin(msg.id)
    return got


def test_grpc_consumer_reqing_poison_messages_sends_them_to_the_dead_letter_topic(broker,
                                                                                   client):
    client.create_channel("orders", "work", max_attempts=3)
    client.create_channel("orders.dead", "audit")
    bodies = [b"ok-1", b"poison-1", b"ok-2", b"poison-2", b"ok-3"]
    ids = dict(zip(client.multi_publish("orders", bodies), bodies))
    poison = {i for i, b in ids.items() if b.startswith(b"poison")}
    attempts: dict[str, list[int]] = {}
    with client.subscribe("orders", "work", rdy=10) as sub:
        def step() -> bool:
            msg = sub.get(timeout=0.1)
            if msg is not None:
                attempts.setdefault(msg.id, []).append(msg.attempts)
                (sub.req if msg.id in poison else sub.fin)(msg.id)
            return channel_stats(client, "orders", "work").dead_letter_count == 2
        wait_for(step, 20, message="two dead letters")
    assert {i: attempts[i] for i in poison} == {i: [1, 2, 3] for i in poison}
    dead = read_all(client, "orders.dead", "audit", 2)
    assert dead == {i: ids[i] for i in poison}
    stats = channel_stats(client, "orders", "work")
    assert (stats.depth, stats.in_flight_count, stats.finish_count) == (0, 0, 3)


def test_tcp_consumer_reqing_until_dead_lettered_with_http_created_channel(broker, client):
    assert http(broker, "POST", "/topic/create?topic=jobs")[0] == 200
    status, _ = http(broker, "POST", "/channel/create?topic=jobs&channel=tcp&max_attempts=2"
                                     "&dead_letter_topic=jobs-failed")
    assert status == 200
    client.create_channel("jobs-failed", "audit")
    raw = Raw(broker.tcp_address)
    raw.send("PUB jobs", b"bad job")
    assert raw.frame() == (0, b"OK")
    raw.send("SUB jobs tcp")
    assert raw.frame() == (0, b"OK")
    raw.send("RDY 1")
    seen = []
    for _ in range(2):
        kind, data = raw.frame()
        assert kind == 2
        msg_id = data[10:26].decode()
        seen.append(int.from_bytes(data[8:10], "big"))
        raw.send(f"REQ {msg_id} 0")
    wait_for(lambda: channel_stats(client, "jobs", "tcp").dead_letter_count == 1, 10,
             message="a dead letter")
    assert seen == [1, 2]
    assert read_all(client, "jobs-failed", "audit", 1) == {msg_id: b"bad job"}
    stats = json.loads(http(broker, "GET", "/stats?format=json&topic=jobs")[1])
    assert stats["topics"][0]["channels"][0]["dead_letter_count"] == 1


def test_a_timed_out_grpc_consumer_counts_toward_max_attempts(broker, client):
    client.create_channel("slow", "work", max_attempts=2)
    client.create_channel("slow.dead", "audit")
    msg_id = client.publish("slow", b"never finished")
    with client.subscribe("slow", "work", rdy=10, msg_timeout_ms=200) as sub:
        wait_for(lambda: channel_stats(client, "slow", "work").dead_letter_count == 1, 20,
                 message="dead-lettered after two timeouts")
        received, _ = so_far(sub)
    assert [msg.attempts for msg in received] == [1, 2]
    assert channel_stats(client, "slow", "work").timeout_count == 2
    assert read_all(client, "slow.dead", "audit", 1) == {msg_id: b"never finished"}


def test_grpc_per_message_ttl_expires_only_those_messages(broker, client):
    client.create_channel("events", "work")
    expiring = client.multi_publish("events", [b"a", b"b"], ttl_ms=[1, 1])
    kept = client.publish("events", b"c", ttl_ms=600_000)
    kept2 = client.publish("events", b"d")
    published_at = time.monotonic()
    wait_for(lambda: time.monotonic() > published_at + 0.01, 5, message="the ttl to pass")
    assert read_all(client, "events", "work", 2) == {kept: b"c", kept2: b"d"}
    wait_for(lambda: channel_stats(client, "events", "work").expired_count == len(expiring),
             10, message="expired count")


def test_http_topic_ttl_applies_to_tcp_publishers_and_expired_go_to_dead_letters(broker,
                                                                                  client):
    assert http(broker, "POST", "/topic/create?topic=metrics&ttl=300ms")[0] == 200
    assert http(broker, "POST", "/channel/create?topic=metrics&channel=work&max_attempts=5")[0] \
        == 200
    client.create_channel("metrics.dead", "audit")
    raw = Raw(broker.tcp_address)
    raw.send("PUB metrics", b"stale")
    assert raw.frame() == (0, b"OK")
    published_at = time.monotonic()
    wait_for(lambda: time.monotonic() > published_at + 0.4, 5, message="the ttl to pass")
    raw.send("PUB metrics", b"fresh")
    assert raw.frame() == (0, b"OK")
    raw.send("SUB metrics work")
    assert raw.frame() == (0, b"OK")
    raw.send("RDY 10")
    kind, data = raw.frame()
    assert kind == 2 and data[26:] == b"fresh"
    assert list(read_all(client, "metrics.dead", "audit", 1).values()) == [b"stale"]
    stats = channel_stats(client, "metrics", "work")
    assert (stats.expired_count, stats.dead_letter_count) == (1, 1)


@pytest.mark.parametrize("path, message", [
    ("/channel/create?topic=t&channel=c&max_attempts=many", "INVALID_MAX_ATTEMPTS"),
    ("/channel/create?topic=t&channel=c&max_attempts=70000", "INVALID_MAX_ATTEMPTS"),
    ("/channel/create?topic=t&channel=c&dead_letter_topic=bad!name", "INVALID_DEAD_LETTER_TOPIC"),
    ("/channel/create?topic=t&channel=c&dead_letter_topic=t", "INVALID_DEAD_LETTER_TOPIC"),
    ("/topic/create?topic=t&ttl=soon", "INVALID_TTL"),
])
def test_http_bad_settings_get_a_400_naming_the_argument(broker, client, path, message):
    client.create_topic("t")   # /channel/create needs the topic, as nsqd
    assert http(broker, "POST", path) == (400, json.dumps({"message": message}).encode())
    assert client.ping() == "OK"


def test_grpc_bad_settings_get_invalid_argument_naming_what_was_wrong(broker, client):
    with pytest.raises(ClientError, match="max_attempts 70000") as err:
        client.create_channel("t", "c", max_attempts=70000)
    assert err.value.status == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(ClientError, match="own topic"):
        client.create_channel("t", "c", dead_letter_topic="t")
    with pytest.raises(ClientError, match="1 ttls for 2 messages"):
        client.multi_publish("t", [b"a", b"b"], ttl_ms=[5])
    assert [t.name for t in client.stats().topics] == []  # nothing was created


def test_cli_channel_create_dead_letter_topic_sends_dead_letters_to_the_topic_it_names(
        broker, client, capsys):
    """``pynsq channel create events work --max-attempts 1 --dead-letter-topic events.failed``
    (run in-process, as the console script runs it)."""
    assert pynsq_main(["--address", broker.address, "channel", "create", "events", "work",
                       "--max-attempts", "1", "--dead-letter-topic", "events.failed"]) == 0
    client.create_channel("events.failed", "audit")
    client.create_channel("events.dead", "audit")
    msg_id = client.publish("events", b"poison")
    with client.subscribe("events", "work", rdy=1) as sub:
        sub.req(sub.get(10).id)
        wait_for(lambda: channel_stats(client, "events", "work").dead_letter_count == 1, 10,
                 message="dead letter")
    assert read_all(client, "events.failed", "audit", 1) == {msg_id: b"poison"}
    assert channel_stats(client, "events.dead", "audit").depth == 0
    assert pynsq_main(["--address", broker.address, "channel", "create", "events", "other",
                       "--dead-letter-topic", "bad name!"]) == 1
    assert "invalid topic name 'bad name!'" in capsys.readouterr().err


def test_cli_creates_a_channel_with_max_attempts_and_a_topic_with_a_ttl(broker, client):
    result = pynsq(broker.address, "channel", "create", "cli", "work", "--max-attempts", "1")
    assert result.returncode == 0, result.stderr
    result = pynsq(broker.address, "topic", "create", "cli", "--ttl", "10m")
    assert result.returncode == 0, result.stderr
    client.create_channel("cli.dead", "audit")
    msg_id = client.publish("cli", b"x")
    with client.subscribe("cli", "work", rdy=1) as sub:
        sub.req(sub.get(10).id)
        wait_for(lambda: channel_stats(client, "cli", "work").dead_letter_count == 1, 10,
                 message="dead letter")
    assert read_all(client, "cli.dead", "audit", 1) == {msg_id: b"x"}
    result = pynsq(broker.address, "stats", "--topic", "cli")
    assert "dead: 1" in result.stdout
    result = pynsq(broker.address, "channel", "pause", "cli", "work", "--max-attempts", "1")
    assert result.returncode != 0 and "only go with create" in result.stderr
