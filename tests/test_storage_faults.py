"""Disk faults, injected under a real broker (``tests/faultfs.py``): a publish the
disk cannot take gets an error on every API and corrupts nothing acknowledged;
reads go on; publishing resumes when the disk does; a failed fsync stops
acknowledgements until a sync succeeds; a failed start changes nothing."""

from __future__ import annotations

import errno
import json
import logging
import os
import socket
import struct
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import pytest

from broker import Client, ClientError, EmbeddedBroker
from broker.storage import MemoryStore, fileops

from .faultfs import FaultyFiles
from .grpckit import drain
from .helpers import wait_for


@pytest.fixture
def files(monkeypatch) -> FaultyFiles:
    faulty = FaultyFiles()
    monkeypatch.setattr(fileops, "current", faulty)
    return faulty


def consume_all(address: str, topic: str, channel: str, fin: bool = True) -> dict[str, bytes]:
    """Every message the channel has ready, read until its stats say none is left."""
    with Client(address) as client, client.subscribe(topic, channel, rdy=500) as sub:
        return drain(client, sub, topic, channel, fin=fin)


class Raw:
    """Just enough of NSQ's V2 protocol: send a command, read a frame."""

    def __init__(self, address: str) -> None:
        host, port = address.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=10)
        self.sock.sendall(b"  V2")
        self.buf = b""

    def send(self, line: str, body: bytes) -> tuple[int, bytes]:
        self.sock.sendall(line.encode() + b"\n" + struct.pack(">i", len(body)) + body)
        while len(self.buf) < 4 or len(self.buf) < 4 + struct.unpack(">i", self.buf[:4])[0]:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("closed")
            self.buf += chunk
        size = struct.unpack(">i", self.buf[:4])[0]
        frame = struct.unpack(">i", self.buf[4:8])[0], self.buf[8:4 + size]
        self.buf = self.buf[4 + size:]
        return frame


def crash(core) -> None:
    """Let go of the data path as ``kill -9`` would: no flush, no fsync."""
    core.storage.abandon()
    core.storage = MemoryStore()


def http_pub(broker: EmbeddedBroker, topic: str, body: bytes) -> int:
    request = urllib.request.Request(f"http://{broker.http_address}/pub?topic={topic}",
                                     data=body, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as err:
        return err.code


def mpub(*bodies: bytes) -> bytes:
    return struct.pack(">i", len(bodies)) + b"".join(struct.pack(">i", len(b)) + b
                                                     for b in bodies)


@pytest.mark.parametrize("short", [False, True], ids=["enospc", "short-write"])
def test_a_full_disk_fails_each_publish_with_an_error_and_loses_nothing_acknowledged(
        files, tmp_path, short):
    data = str(tmp_path / "data")
    with EmbeddedBroker(data_path=data, mem_queue_size=5) as broker:
        with Client(broker.address) as client:
            client.admin("channel", "create", "events", "work")
            before = client.multi_publish("events", [f"before-{i}".encode() for i in range(20)])
            if short:  # every write stops half-way, and the rest gets ENOSPC
                files.short_writes = True
            else:
                files.fail("write", errno.ENOSPC)
            with pytest.raises(ClientError) as refused:
                client.publish("events", b"refused-grpc")
            assert refused.value.status == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "No space left on device" in str(refused.value)
            # Over TCP the error frame comes before nsqd's close of the connection.
            kind, frame = Raw(broker.tcp_address).send("PUB events", b"refused-tcp")
            assert (kind, frame.split(b" ")[0]) == (1, b"E_PUB_FAILED")
            kind, frame = Raw(broker.tcp_address).send("MPUB events",
                                                       mpub(b"refused-1", b"refused-2"))
            assert (kind, frame.split(b" ")[0]) == (1, b"E_MPUB_FAILED")
            assert http_pub(broker, "events", b"refused-http") == 500
            # Reads go on while the disk is full: ten of the earlier messages.
            with client.subscribe("events", "work", rdy=10) as sub:
                read = [sub.get(timeout=10) for _ in range(10)]
                sub.fin(*[m.id for m in read])
            files.heal()
            assert Raw(broker.tcp_address).send("PUB events", b"after-tcp") == (0, b"OK")
            after = client.multi_publish("events", [f"after-{i}".encode() for i in range(20)])
            assert http_pub(broker, "events", b"after-http") == 200
        expected = {i: f"before-{n}".encode() for n, i in enumerate(before)}
        expected.update({i: f"after-{n}".encode() for n, i in enumerate(after)})
        for msg in read:
            del expected[msg.id]
        # Read back while running (most wait on disk past --mem-queue-size), not FINed...
        live = consume_all(broker.address, "events", "work", fin=False)
        broker.call(crash, broker.broker)
    # ... and again after a crash.
    with EmbeddedBroker(data_path=data) as restarted:
        back = consume_all(restarted.address, "events", "work")
    for got in (live, back):
        assert {i: got.get(i) for i in expected} == expected
        assert sorted(got.values()) == sorted([*expected.values(), b"after-tcp", b"after-http"])


def test_after_a_failed_fsync_publishes_are_refused_until_a_sync_succeeds(files, tmp_path,
                                                                         caplog):
    caplog.set_level(logging.ERROR, logger="pynsqd")
    with EmbeddedBroker(data_path=str(tmp_path / "data"), sync_timeout=10) as broker:
        with Client(broker.address) as client:
            client.publish("events", b"first")
            files.fail("fsync", errno.EIO)

            def refused() -> bool:
                try:
                    client.publish("events", b"probe")
                except ClientError as err:
                    return "cannot be synced" in str(err)
                return False

            wait_for(refused, 10, message="publishes to be refused after the failed fsync")
            assert any("fsync of the data path failed" in r.getMessage()
                       and "Input/output error" in r.getMessage() for r in caplog.records)
            files.heal()

            def accepted() -> bool:
                try:
                    client.publish("events", b"again")
                except ClientError:
                    return False
                return True

            wait_for(accepted, 10, message="publishes to be accepted after a good fsync")


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and p.name != "LOCK"}


def test_a_start_that_fails_leaves_the_data_path_as_it_found_it(files, tmp_path):
    data = tmp_path / "data"
    with EmbeddedBroker(data_path=str(data), mem_queue_size=2) as broker:
        with Client(broker.address) as client:
            held = {topic: client.publish(topic, f"{topic}-held".encode())  # no channel: held
                    for topic in ("alpha", "beta", "gamma")}
            client.admin("channel", "create", "beta", "work")
            beta = client.multi_publish("beta", [f"beta-{i}".encode() for i in range(6)])
    before = snapshot(data)
    files.fail("pread", errno.EIO, after=1)  # the first read goes through, the next fails
    with pytest.raises(OSError):
        EmbeddedBroker(data_path=str(data)).start()
    assert snapshot(data) == before
    files.heal()
    with EmbeddedBroker(data_path=str(data)) as restarted:
        got = {t: consume_all(restarted.address, t, "work") for t in ("alpha", "beta", "gamma")}
    assert set(got["beta"]) == {held["beta"], *beta}
    assert list(got["alpha"].values()) == [b"alpha-held"]
    assert list(got["gamma"].values()) == [b"gamma-held"]


def topic_stats(broker: EmbeddedBroker, topic: str) -> dict | None:
    """The topic's entry in /stats (JSON), or None when it does not exist."""
    with urllib.request.urlopen(f"http://{broker.http_address}/stats?format=json",
                                timeout=10) as response:
        topics = json.load(response)["topics"]
    return next((t for t in topics if t["topic_name"] == topic), None)


@pytest.mark.parametrize("call,err", [("pread", errno.EMFILE), ("pread", errno.EIO),
                                      ("open", errno.ENFILE)])
def test_a_read_error_of_spilled_messages_loses_none_and_a_later_read_delivers_all(
        files, tmp_path, caplog, call, err):
    caplog.set_level(logging.WARNING, logger="pynsqd")
    data = str(tmp_path / "data")
    with EmbeddedBroker(data_path=data, mem_queue_size=10) as broker:
        with Client(broker.address) as client:
            client.admin("channel", "create", "events", "work")
            ids = client.multi_publish("events", [f"m{i}".encode() * 20 for i in range(3000)])
            files.fail(call, err, times=5)  # reading back what waits on disk fails, 5 times
            got = consume_all(broker.address, "events", "work")
        assert files.failures == 5
        assert sorted(got) == sorted(ids)   # every message, each once
        assert topic_stats(broker, "events")["disk_read_errors"] >= 1
    assert not [r for r in caplog.records if "lost" in r.getMessage()]
    assert any("reading messages waiting on disk failed" in r.getMessage()
               and os.strerror(err) in r.getMessage() for r in caplog.records)
    # Nothing was released either: after a restart every file is still accounted for.
    with EmbeddedBroker(data_path=data) as restarted:
        assert consume_all(restarted.address, "events", "work") == {}


def http_admin(broker: EmbeddedBroker, kind: str, action: str, topic: str,
               channel: str = "") -> tuple[int, str]:
    query = f"topic={topic}" + (f"&channel={channel}" if channel else "")
    request = urllib.request.Request(f"http://{broker.http_address}/{kind}/{action}?{query}",
                                     data=b"", method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def admin_state(broker: EmbeddedBroker) -> dict:
    """Each topic's paused state and depth, and each channel's, as /stats says."""
    with urllib.request.urlopen(f"http://{broker.http_address}/stats?format=json",
                                timeout=10) as response:
        topics = json.load(response)["topics"]
    return {t["topic_name"]: (t["paused"], t["depth"], {
        c["channel_name"]: (c["paused"], c["depth"]) for c in t["channels"]}) for t in topics}


@pytest.mark.parametrize("kind,action,topic,channel,call", [
    ("channel", "pause", "events", "work", "write"),
    ("channel", "unpause", "events", "idle", "write"),
    ("channel", "empty", "events", "work", "write"),
    ("channel", "delete", "events", "work", "write"),
    ("channel", "create", "events", "fresh", "write"),
    ("topic", "pause", "events", "", "write"),
    ("topic", "unpause", "waiting", "", "write"),
    ("topic", "empty", "waiting", "", "write"),
    ("topic", "delete", "events", "", "rename"),
    ("topic", "create", "fresh", "", "write"),
])
def test_an_admin_call_whose_record_cannot_be_written_fails_and_changes_nothing(
        files, tmp_path, kind, action, topic, channel, call):
    data = str(tmp_path / "data")
    with EmbeddedBroker(data_path=data, mem_queue_size=10) as broker:
        with Client(broker.address) as client:
            client.admin("channel", "create", "events", "work")
            client.admin("channel", "create", "events", "idle")
            client.admin("channel", "pause", "events", "idle")
            client.multi_publish("events", [f"m{i}".encode() for i in range(200)])
            client.multi_publish("waiting", [f"w{i}".encode() for i in range(50)])  # held
            client.admin("topic", "pause", "waiting")
        before = admin_state(broker)
        files.fail(call, errno.ENOSPC)
        status, answer = http_admin(broker, kind, action, topic, channel)
        body = json.loads(answer)
        assert (status, body["message"]) == (500, "STORAGE_FAILED")   # nsqd's code, and why
        assert "No space left on device" in body["error"] and "nothing was changed" in body["error"]
        assert admin_state(broker) == before
        files.heal()
        broker.call(crash, broker.broker)
    with EmbeddedBroker(data_path=data) as restarted:
        assert admin_state(restarted) == before


def test_a_start_that_cannot_write_names_the_path_and_changes_nothing(files, tmp_path):
    data = tmp_path / "data"
    with EmbeddedBroker(data_path=str(data)) as broker:
        with Client(broker.address) as client:
            ids = client.multi_publish("events", [b"a", b"b", b"c"])
        broker.call(crash, broker.broker)  # killed
    before = snapshot(data)
    files.fail("write", errno.ENOSPC)  # and the disk is full
    with pytest.raises(OSError) as refused:
        EmbeddedBroker(data_path=str(data)).start()
    message = str(refused.value)
    assert str(data / "topics" / "t-events") in message and "No space left" in message
    assert snapshot(data) == before
    files.heal()
    with EmbeddedBroker(data_path=str(data)) as restarted:
        assert sorted(consume_all(restarted.address, "events", "work")) == sorted(ids)


@pytest.mark.parametrize("good_writes", [0, 1, 2])
def test_a_topic_created_with_a_ttl_is_made_with_it_or_not_at_all(files, tmp_path, good_writes):
    # /topic/create?ttl= on a disk that fills at its first, second or third write: the
    # answer is 500 and there is no topic, or 200 and the topic has its ttl; never a topic
    # without the ttl it was asked for, in memory or after kill -9.
    data = str(tmp_path / "data")

    def ttls(core):
        return {name: t.ttl_ms for name, t in core.topics.items()}

    with EmbeddedBroker(data_path=data) as broker:
        files.fail("write", errno.ENOSPC, after=good_writes)
        request = urllib.request.Request(
            f"http://{broker.http_address}/topic/create?topic=fresh&ttl=60s", data=b"",
            method="POST")
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                status = response.status
        except urllib.error.HTTPError as err:
            status = err.code
        files.heal()
        made = broker.call(ttls, broker.broker)
        assert (status, made) in [(500, {}), (200, {"fresh": 60000})]
        broker.call(crash, broker.broker)
    with EmbeddedBroker(data_path=data) as restarted:
        assert restarted.call(ttls, restarted.broker) == made
