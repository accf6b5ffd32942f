"""Durability with a real `pynsqd` process: what was acknowledged survives kill -9,
clean shutdowns keep in-flight and deferred messages, damage is skipped."""

from __future__ import annotations

import json
import signal
import time
import urllib.request

import pytest

from broker import Client, EmbeddedBroker
from broker.storage import DataPathLocked

from .grpckit import drain
from .helpers import Daemon, free_port, wait_for


@pytest.fixture
def daemons(tmp_path):
    started: list[Daemon] = []

    def start(*args: str, port: int | None = None) -> Daemon:
        d = Daemon("--data-path", str(tmp_path / "data"), *args, port=port)
        started.append(d)
        return d.wait_ready()

    yield start
    for d in started:
        d.kill()


def consume_all(address: str, topic: str, channel: str, fin: bool = True) -> dict[str, bytes]:
    """Every message the channel has ready, read until its stats say none is left."""
    with Client(address) as client, client.subscribe(topic, channel, rdy=1000) as sub:
        return drain(client, sub, topic, channel, fin=fin)


def publish_n(address: str, topic: str, n: int) -> list[str]:
    with Client(address) as client:
        ids = []
        for start in range(0, n, 250):
            ids += client.multi_publish(topic, [f"m-{i}".encode()
                                                for i in range(start, min(n, start + 250))])
        return ids


def test_acknowledged_messages_survive_kill_9_and_unfinished_ones_come_back(daemons):
    d = daemons()
    with Client(d.address) as client:
        client.admin("channel", "create", "events", "work")
    ids = publish_n(d.address, "events", 2000)
    finished, in_flight = set(), set()
    with Client(d.address) as client, client.subscribe("events", "work", rdy=700) as sub:
        for i in range(700):
            msg = sub.get(10)
            (finished if i < 500 else in_flight).add(msg.id)
        sub.fin(*finished)
        wait_for(lambda: client.stats("events").topics[0].channels[0].finish_count == 500, 10,
                 message="500 FINs")
        d.proc.kill()  # SIGKILL, with 200 messages in flight
        d.proc.wait(10)
    restarted = daemons(port=d.port)
    back = consume_all(restarted.address, "events", "work")
    assert set(back) == set(ids) - finished
    assert in_flight <= set(back)


DELAY_MS = 8000


def test_a_clean_shutdown_keeps_in_flight_and_deferred_messages_and_their_delays(daemons):
    d = daemons()
    with Client(d.address) as client:
        client.admin("channel", "create", "events", "work")
        ids = client.multi_publish("events", [b"a", b"b", b"c"])
        deferred_at = time.monotonic()   # no later than either delay starts
        late = client.publish("events", b"later", defer_ms=DELAY_MS)
        with client.subscribe("events", "work", rdy=3) as sub:
            held = [sub.get(10) for _ in range(3)]
            sub.req(held[0].id, delay_ms=DELAY_MS)
            wait_for(lambda: client.stats("events").topics[0].channels[0].deferred_count == 2,
                     10, message="two deferred")
            assert d.stop(signal.SIGTERM) == 0
    restarted = daemons(port=d.port)
    with Client(restarted.address) as client:
        asked_at = time.monotonic()
        deferred = client.stats("events").topics[0].channels[0].deferred_count
    # the REQ'd and the DPUB'd message come back deferred, not ready (on a host so busy
    # that the stop and start outlasted their delay, they are rightly ready by now)
    if asked_at - deferred_at < DELAY_MS / 1000:
        assert deferred == 2
    with Client(restarted.address) as client, client.subscribe("events", "work", rdy=4) as sub:
        back = {m.id: m.attempts for m in (sub.get(timeout=30) for _ in range(4))}
    # every message is kept with its delivery count: in flight at shutdown (delivered once),
    # the REQ'd one (delivered once), the DPUB'd one (never delivered). That a deferred
    # message keeps the rest of its delay, not all of it, is checked under a controllable
    # clock by the model-based crash test (tests/test_storage_model.py).
    assert back == {ids[1]: 2, ids[2]: 2, ids[0]: 2, late: 1}


def test_topics_channels_and_paused_state_survive_a_restart(daemons):
    d = daemons()
    with Client(d.address) as client:
        client.admin("channel", "create", "events", "archive")
        client.admin("channel", "create", "events", "metrics")
        client.admin("channel", "pause", "events", "metrics")
        client.admin("topic", "create", "audit")
        client.admin("topic", "pause", "audit")
        client.admin("channel", "create", "events", "tmp#ephemeral")
    d.kill()
    restarted = daemons(port=d.port)
    with Client(restarted.address) as client:
        topics = {t.name: t for t in client.stats().topics}
    assert set(topics) == {"events", "audit"}
    assert topics["audit"].paused
    assert {c.name: c.paused for c in topics["events"].channels} == {"archive": False,
                                                                     "metrics": True}


def test_a_channel_created_later_does_not_get_older_messages_after_a_crash(daemons):
    d = daemons()
    with Client(d.address) as client:
        client.admin("channel", "create", "events", "first")
        old = client.publish("events", b"old")
        client.admin("channel", "create", "events", "second")
        new = client.publish("events", b"new")
    d.kill()
    restarted = daemons(port=d.port)
    assert set(consume_all(restarted.address, "events", "first")) == {old, new}
    assert set(consume_all(restarted.address, "events", "second")) == {new}


def test_a_torn_record_at_the_end_of_a_file_is_skipped(daemons, tmp_path):
    d = daemons()
    ids = publish_n(d.address, "events", 300)  # the topic holds them: no channel yet
    d.kill()
    [segment] = (tmp_path / "data" / "topics" / "t-events").glob("*.log")
    with open(segment, "r+b") as f:
        f.truncate(segment.stat().st_size - 30)  # cut the last record (MPUB) short
    restarted = daemons(port=d.port)
    back = consume_all(restarted.address, "events", "work")
    assert set(back) == set(ids[:250])  # an MPUB is kept whole or not at all


def test_damaged_bytes_in_the_middle_lose_only_the_damaged_record(daemons, tmp_path):
    d = daemons()
    with Client(d.address) as client:
        client.admin("channel", "create", "events", "work")
    ids = publish_n(d.address, "events", 1000)   # four MPUBs of 250
    d.kill()
    [segment] = (tmp_path / "data" / "topics" / "t-events").glob("*.log")
    data = bytearray(segment.read_bytes())
    middle = data.find(b"m-600")
    data[middle:middle + 4] = b"XXXX"  # the MPUB of message 600 no longer matches its CRC
    segment.write_bytes(bytes(data))
    restarted = daemons(port=d.port)
    back = consume_all(restarted.address, "events", "work")
    assert set(back) == set(ids) - set(ids[500:750])
    restarted.stop()
    assert "damaged" in restarted.output()


def test_disk_space_returns_after_consumption(daemons, tmp_path):
    d = daemons("--max-bytes-per-file", "10000")
    with Client(d.address) as client:
        client.admin("channel", "create", "events", "work")
    publish_n(d.address, "events", 3000)
    directory = tmp_path / "data" / "topics" / "t-events"

    def size() -> int:  # files are deleted meanwhile, by the storage thread
        total = 0
        for p in directory.glob("*.log"):
            try:
                total += p.stat().st_size
            except FileNotFoundError:
                pass
        return total

    before = size()
    assert len(list(directory.glob("*.log"))) > 5
    assert len(consume_all(d.address, "events", "work")) == 3000
    wait_for(lambda: size() < before / 5, 10, message="segments to be reclaimed")


def test_messages_past_mem_queue_size_wait_on_disk_and_come_back_intact(daemons):
    d = daemons("--mem-queue-size", "50")
    with Client(d.address) as client:
        client.admin("channel", "create", "events", "work")
    ids = publish_n(d.address, "events", 1000)
    back = consume_all(d.address, "events", "work")
    assert list(back) == ids
    assert list(back.values()) == [f"m-{i}".encode() for i in range(1000)]


def test_grpc_stats_show_disk_bytes_and_messages_waiting_on_disk(daemons, tmp_path):
    d = daemons("--mem-queue-size", "50")
    with Client(d.address) as client:
        client.admin("channel", "create", "events", "work")
        client.admin("channel", "create", "events", "idle")
        publish_n(d.address, "events", 1000)
        files = sum(p.stat().st_size for p in (tmp_path / "data" / "topics" / "t-events")
                    .glob("*.log"))
        topic = client.stats("events").topics[0]
        channels = {c.name: c for c in topic.channels}
        assert topic.disk_bytes == files > 1000 * len(b"m-999")
        assert channels["work"].disk_bytes == channels["idle"].disk_bytes == files
        assert channels["work"].on_disk_count == channels["idle"].on_disk_count == 1000 - 50
        assert len(consume_all(d.address, "events", "work")) == 1000
        channels = {c.name: c for c in client.stats("events").topics[0].channels}
        assert channels["work"].disk_bytes == channels["work"].on_disk_count == 0
        assert channels["idle"].disk_bytes >= files  # FIN records add to the files


def test_deleting_a_topic_removes_its_files_and_ephemeral_topics_write_none(daemons, tmp_path):
    d = daemons()
    publish_n(d.address, "events", 10)
    publish_n(d.address, "scratch#ephemeral", 10)
    topics = tmp_path / "data" / "topics"
    assert [p.name for p in topics.iterdir()] == ["t-events"]
    with Client(d.address) as client:
        client.admin("topic", "delete", "events")
    wait_for(lambda: list(topics.iterdir()) == [], 10, message="the topic's files to go")


def test_a_second_broker_on_the_same_data_path_is_refused(daemons, tmp_path):
    daemons()
    second = Daemon("--data-path", str(tmp_path / "data"))
    try:
        assert second.proc.wait(30) == 1
        assert f"data path {tmp_path / 'data'} is in use by another pynsqd" in second.output()
    finally:
        second.kill()
    with pytest.raises(DataPathLocked):
        EmbeddedBroker(data_path=str(tmp_path / "data")).start()


def test_a_message_waiting_on_disk_that_is_damaged_meanwhile_is_dropped_not_fatal(tmp_path):
    with EmbeddedBroker(data_path=str(tmp_path / "data"), mem_queue_size=5) as broker:
        with Client(broker.address) as client:
            client.admin("channel", "create", "events", "work")
            ids = [i for start in range(0, 20, 5) for i in client.multi_publish(
                "events", [f"m-{i:02d}".encode() for i in range(start, start + 5)])]
        [segment] = (tmp_path / "data" / "topics" / "t-events").glob("*.log")
        data = bytearray(segment.read_bytes())
        where = data.find(b"m-12")
        data[where:where + 4] = b"XXXX"  # past mem-queue-size: only on disk
        segment.write_bytes(bytes(data))
        back = consume_all(broker.address, "events", "work")
    assert set(back) == set(ids) - set(ids[10:15])  # the MPUB of m-12 is lost whole


def test_a_replayed_mpub_after_kill_9_returns_the_first_ids_and_publishes_nothing(daemons,
                                                                                tmp_path):
    d = daemons("--max-bytes-per-file", "4096")
    with Client(d.address) as client:
        client.admin("channel", "create", "events", "work")
        first = client.multi_publish("events", [b"a", b"b"], producer_id="job:1:0", sequence=3)
    publish_n(d.address, "events", 300)  # rolls past the file that holds the MPUB...
    consume_all(d.address, "events", "work")  # ... which is then deleted
    directory = tmp_path / "data" / "topics" / "t-events"
    wait_for(lambda: "00000001.log" not in {p.name for p in directory.iterdir()}, 10,
             message="the first segment to be deleted")
    d.proc.kill()
    d.proc.wait(10)
    restarted = daemons(port=d.port)
    with Client(restarted.address) as client:
        again = client.multi_publish("events", [b"a", b"b"], producer_id="job:1:0", sequence=3)
    assert again == first
    assert consume_all(restarted.address, "events", "work") == {}


def http_channel_stats(port: int, topic: str) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/stats?format=json&topic={topic}",
                                timeout=10) as reply:
        return json.loads(reply.read())["topics"][0]["channels"][0]


def test_requeued_and_deferred_messages_keep_memory_within_mem_queue_size(daemons):
    # What the broker holds in memory, by its own count: at most --mem-queue-size ready
    # messages plus what it reads ahead and was given back (3 x 1,024), and as many
    # deferred, for 20,000 messages REQed, then 20,000 deferred, across a kill -9.
    http_port = free_port()
    d = daemons("--mem-queue-size", "20", "--http-address", f"127.0.0.1:{http_port}")
    bound = 20 + 3 * 1024 + 20
    body = b"x" * 200
    with Client(d.address) as client:
        client.admin("channel", "create", "events", "work")
        for _ in range(40):
            client.multi_publish("events", [body] * 500)
        with client.subscribe("events", "work", rdy=500) as sub:
            for _ in range(20_000):
                sub.req(sub.get(10).id)
            stats = wait_for(lambda: (lambda s: s if s["requeue_count"] == 20_000 else None)(
                http_channel_stats(http_port, "events")), 10, message="20,000 REQs")
            assert stats["memory_count"] <= bound
        later = client.multi_publish("events", [body] * 500, defer_ms=[600_000] * 500)
        for _ in range(39):
            later += client.multi_publish("events", [body] * 500, defer_ms=[600_000] * 500)
        stats = http_channel_stats(http_port, "events")
        assert stats["deferred_count"] == 20_000
        assert stats["memory_count"] <= bound
    d.proc.kill()
    d.proc.wait(10)
    d = daemons("--mem-queue-size", "20", "--http-address", f"127.0.0.1:{http_port}",
                port=d.port)
    stats = http_channel_stats(http_port, "events")
    assert (stats["deferred_count"], stats["depth"]) == (20_000, 20_000)
    assert stats["memory_count"] <= bound
