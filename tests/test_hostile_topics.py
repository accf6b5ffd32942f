"""Topics and channels a client makes are counted: past --max-topics or
--max-channels-per-topic one more is refused at creation on every listener, naming the
option, and everyone else is served; what the broker makes itself (a restart restoring
what it accepted, a dead-letter topic) is never refused for the count. The edges
(limit - 1, limit, limit + 1) are tests/LIMITS.md's rows."""

from __future__ import annotations

import json
import socket
import struct
import urllib.error
import urllib.request

import grpc
import pytest

from broker import Client, ClientError, EmbeddedBroker, Options
from broker.errors import TooManyChannels, TooManyTopics

from .corekit import new_broker, subscribe
from .helpers import wait_for
from .test_storage_readahead import start


def tcp_answer(address: str, line: bytes, body: bytes | None = None) -> bytes:
    """The first frame's data the broker sends after one V2 command."""
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(b"  V2" + line + b"\n" +
                     (b"" if body is None else struct.pack(">i", len(body)) + body))
        data = b""
        while len(data) < 4 or len(data) < 4 + struct.unpack(">i", data[:4])[0]:
            chunk = sock.recv(65536)
            assert chunk, "closed without a frame"
            data += chunk
        return data[8:4 + struct.unpack(">i", data[:4])[0]]


def http_post(address: str, path: str, body: bytes = b"") -> tuple[int, dict | bytes]:
    request = urllib.request.Request(f"http://{address}{path}", data=body, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_one_topic_or_channel_more_is_refused_on_every_listener_naming_the_option():
    with EmbeddedBroker(max_topics=2, max_channels_per_topic=1) as b, \
            Client(b.address) as client:
        client.publish("kept", b"first")
        client.create_channel("kept", "work")
        client.create_topic("second")

        with pytest.raises(ClientError) as refused:
            client.create_topic("third")
        assert refused.value.status == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert refused.value.code == "E_TOO_MANY_TOPICS"
        assert "--max-topics" in str(refused.value)
        with pytest.raises(ClientError) as refused:
            client.publish("third", b"x")
        assert refused.value.status == grpc.StatusCode.RESOURCE_EXHAUSTED
        with pytest.raises(ClientError) as refused:
            client.create_channel("kept", "more")
        assert refused.value.status == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert refused.value.code == "E_TOO_MANY_CHANNELS"
        assert "--max-channels-per-topic" in str(refused.value)

        answer = tcp_answer(b.tcp_address, b"PUB third", b"x")
        assert answer.startswith(b"E_TOO_MANY_TOPICS ") and b"--max-topics" in answer, answer
        answer = tcp_answer(b.tcp_address, b"SUB kept more")
        assert answer.startswith(b"E_TOO_MANY_CHANNELS ") and \
            b"--max-channels-per-topic" in answer, answer

        status, body = http_post(b.http_address, "/pub?topic=third", b"x")
        assert status == 400 and body["message"] == "TOO_MANY_TOPICS", body
        assert "--max-topics" in body["error"]
        status, body = http_post(b.http_address, "/topic/create?topic=third")
        assert status == 400 and body["message"] == "TOO_MANY_TOPICS", body
        status, body = http_post(b.http_address, "/channel/create?topic=kept&channel=more")
        assert status == 400 and body["message"] == "TOO_MANY_CHANNELS", body
        assert "--max-channels-per-topic" in body["error"]

        # Nothing was made by a refusal, and everything accepted is served.
        stats = client.stats()
        assert sorted(t.name for t in stats.topics) == ["kept", "second"]
        assert [c.name for t in stats.topics for c in t.channels] == ["work"]
        client.publish("kept", b"second")
        with client.subscribe("kept", "work", rdy=10) as sub:
            got = [sub.get(timeout=30).body for _ in range(2)]
        assert got == [b"first", b"second"]

        # One deleted, one more can be made.
        client.admin("topic", "delete", "second")
        client.create_topic("third")


def test_one_channel_more_than_max_channels_over_all_topics_is_refused_on_every_listener():
    """--max-channels counts the channels of every topic: the one past it is refused on
    each listener naming the option, its topic is not made either, and every channel given
    back (deleted, its topic deleted, an ephemeral one left) makes room for one more."""
    with EmbeddedBroker(max_channels=3) as b, Client(b.address) as client:
        client.publish("a", b"kept")
        client.create_channel("a", "work")
        client.create_channel("b", "work")
        client.create_channel("b", "audit")

        with pytest.raises(ClientError) as refused:
            client.create_channel("a", "more")
        assert refused.value.status == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert refused.value.code == "E_TOO_MANY_CHANNELS"
        assert "--max-channels " in str(refused.value)
        answer = tcp_answer(b.tcp_address, b"SUB c work")
        assert answer.startswith(b"E_TOO_MANY_CHANNELS ") and b"--max-channels " in answer, \
            answer
        status, body = http_post(b.http_address, "/channel/create?topic=a&channel=more")
        assert status == 400 and body["message"] == "TOO_MANY_CHANNELS", body
        assert "--max-channels " in body["error"]

        # Nothing was made by a refusal (not topic c either); what was accepted is served.
        stats = client.stats()
        assert {t.name: sorted(c.name for c in t.channels) for t in stats.topics} == {
            "a": ["work"], "b": ["audit", "work"]}
        with client.subscribe("a", "work", rdy=1) as sub:
            assert sub.get(timeout=30).body == b"kept"

        client.admin("channel", "delete", "b", "audit")     # a channel given back
        client.create_channel("c", "work#ephemeral")
        with pytest.raises(ClientError):
            client.create_channel("c", "more")
        client.admin("topic", "delete", "b")                # its channel given back
        with client.subscribe("d", "work#ephemeral", rdy=1):
            pass                                            # made, then left: gone
        wait_for(lambda: not client.stats("d").topics[0].channels)
        client.admin("channel", "delete", "c", "work#ephemeral")
        client.create_channel("e", "one")
        client.create_channel("e", "two")
        with pytest.raises(ClientError) as refused:
            client.create_channel("e", "three")
        assert "--max-channels " in str(refused.value)


def test_a_limit_of_0_is_no_limit():
    broker, _ = new_broker(max_topics=0, max_channels_per_topic=0, max_channels=0)
    defaults = Options()
    for i in range(defaults.max_topics + 1):
        broker.create_topic(f"t{i}")
    for i in range(defaults.max_channels_per_topic + 1):
        broker.create_channel("t0", f"c{i}")
    for i in range(defaults.max_channels - defaults.max_channels_per_topic):
        broker.create_channel(f"t{1 + i % 100}", f"c{i}")
    assert len(broker.topics) == defaults.max_topics + 1
    assert len(broker.topics["t0"].channels) == defaults.max_channels_per_topic + 1
    assert sum(len(t.channels) for t in broker.topics.values()) == defaults.max_channels + 1


def test_a_restart_restores_every_topic_and_channel_past_a_lowered_limit(tmp_path):
    broker = start(tmp_path)
    for topic in ("a", "b", "c"):
        for channel in ("x", "y"):
            broker.create_channel(topic, channel)
        broker.publish(topic, topic.encode())
    broker.storage.close()

    broker = start(tmp_path, max_topics=1, max_channels_per_topic=1, max_channels=1)
    assert {name: sorted(t.channels) for name, t in broker.topics.items()} == {
        "a": ["x", "y"], "b": ["x", "y"], "c": ["x", "y"]}
    assert broker.channel_count == 6
    assert [m.body for m in subscribe(broker, "b", "y").received] == [b"b"]
    with pytest.raises(TooManyTopics):
        broker.create_topic("d")
    with pytest.raises(TooManyChannels):
        broker.create_channel("a", "z")
    broker.storage.close()


def test_a_dead_letter_topic_is_made_past_max_topics():
    broker, _ = new_broker(max_topics=1)
    broker.create_channel("events", "work", max_attempts=1)
    [published] = broker.multi_publish("events", [b"poison"])
    consumer = subscribe(broker, "events", "work", rdy=1)
    consumer.channel.requeue(consumer, published)
    assert sorted(broker.topics) == ["events", "events.dead"]
    dead = subscribe(broker, "events.dead", "audit").received
    assert [(m.id, m.body) for m in dead] == [(published, b"poison")]
