"""The real nsqadmin against pynsqd: directly (``--nsqd-http-address``) and through the
real nsqlookupd. Checked through nsqadmin's own HTTP API, which is what its web
pages call, and once by loading its topic page in headless Chromium."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
import urllib.error

import pytest

from broker import EmbeddedBroker

from .helpers import free_port, wait_for
from .nsqkit import Lookupd, NsqProcess, http_json, nsq_binary


class Nsqadmin(NsqProcess):
    def __init__(self, *source: str) -> None:
        self.http_address = f"127.0.0.1:{free_port()}"
        super().__init__([nsq_binary("nsqadmin"), "--http-address", self.http_address,
                          "--log-level", "warn", *source],
                         f"http://{self.http_address}/ping")

    def get(self, path: str) -> dict:
        return http_json(f"http://{self.http_address}/api/{path}")

    def post(self, path: str, body: dict) -> dict:
        return http_json(f"http://{self.http_address}/api/{path}", "POST",
                         json.dumps(body).encode())

    def delete(self, path: str) -> dict:
        return http_json(f"http://{self.http_address}/api/{path}", "DELETE")


@pytest.fixture
def pynsqd():
    with EmbeddedBroker(broadcast_address="127.0.0.1") as broker:
        yield broker


@pytest.fixture
def admin(pynsqd):
    daemon = Nsqadmin("--nsqd-http-address", pynsqd.http_address).start()
    yield daemon
    daemon.stop()


def _fill(broker: EmbeddedBroker) -> None:
    broker.call(broker.broker.create_channel, "events", "spark")
    broker.call(broker.broker.create_channel, "events", "audit")
    broker.call(broker.broker.multi_publish, "events", [b"a", b"b", b"c"])


def test_nsqadmin_lists_topics_channels_depths_and_clients(pynsqd, admin):
    from broker import Client

    _fill(pynsqd)
    with Client(pynsqd.address, timeout=10) as client, \
            client.subscribe("events", "spark", rdy=1, msg_timeout_ms=60_000) as sub:
        assert sub.get(timeout=10) is not None  # one in flight, not FINed
        assert admin.get("topics")["topics"] == ["events"]
        topic = admin.get("topics/events")
        assert topic["topic_name"] == "events"
        assert topic["message_count"] == 3
        assert [n["node"] for n in topic["nodes"]] == [pynsqd.http_address]
        channels = {c["channel_name"]: c for c in topic["channels"]}
        assert set(channels) == {"spark", "audit"}
        assert channels["audit"]["depth"] == 3
        assert channels["spark"]["depth"] == 2
        assert channels["spark"]["in_flight_count"] == 1
        assert channels["spark"]["client_count"] == 1
        spark = admin.get("topics/events/spark")
        assert len(spark["clients"]) == 1
        assert spark["clients"][0]["in_flight_count"] == 1
        # nsqadmin shows how long a client has been connected: from its connect_ts
        assert spark["clients"][0]["connected"] < 3600 * 10**9
        # and who the client is: its address, protocol and user agent
        shown = spark["clients"][0]
        assert re.fullmatch(r"127\.0\.0\.1:\d+", shown["remote_address"])
        assert (shown["hostname"], shown["version"]) == ("127.0.0.1", "grpc")
        assert shown["user_agent"].startswith("grpc-python/")
        nodes = admin.get("nodes")["nodes"]
        assert [(n["broadcast_address"], n["http_port"]) for n in nodes] == \
            [("127.0.0.1", int(pynsqd.http_address.rpartition(":")[2]))]


def test_nsqadmin_pause_empty_and_delete_act_on_pynsqd(pynsqd, admin):
    _fill(pynsqd)
    core = pynsqd.broker

    admin.post("topics/events/spark", {"action": "pause"})
    assert pynsqd.call(lambda: core.topics["events"].channels["spark"].paused)
    assert admin.get("topics/events/spark")["paused"] is True
    admin.post("topics/events/spark", {"action": "unpause"})
    assert not pynsqd.call(lambda: core.topics["events"].channels["spark"].paused)

    admin.post("topics/events/spark", {"action": "empty"})
    assert pynsqd.call(lambda: core.topics["events"].channels["spark"].depth) == 0
    assert pynsqd.call(lambda: core.topics["events"].channels["audit"].depth) == 3

    admin.post("topics/events", {"action": "pause"})
    assert pynsqd.call(lambda: core.topics["events"].paused)
    assert admin.get("topics/events")["paused"] is True
    admin.post("topics/events", {"action": "unpause"})
    assert not pynsqd.call(lambda: core.topics["events"].paused)

    admin.delete("topics/events/audit")
    assert pynsqd.call(lambda: sorted(core.topics["events"].channels)) == ["spark"]
    admin.delete("topics/events")
    assert pynsqd.call(lambda: list(core.topics)) == []
    assert not admin.get("topics")["topics"]  # null when there are none


def test_nsqadmin_through_lookupd_sees_and_deletes_pynsqd_topics():
    lookupd = Lookupd().start()
    admin = None
    try:
        with EmbeddedBroker(lookupd_tcp_address=(lookupd.tcp_address,),
                            broadcast_address="127.0.0.1") as pynsqd:
            _fill(pynsqd)
            admin = Nsqadmin("--lookupd-http-address", lookupd.http_address).start()
            wait_for(lambda: admin.get("topics")["topics"] == ["events"], 30,
                     message="nsqadmin to list events through nsqlookupd")
            topic = admin.get("topics/events")
            assert {c["channel_name"]: c["depth"] for c in topic["channels"]} == \
                {"spark": 3, "audit": 3}
            assert [p["tcp_port"] for p in admin.get("nodes")["nodes"]] == \
                [int(pynsqd.tcp_address.rpartition(":")[2])]
            # the node page's "tombstone": the topic goes from that node
            pynsqd.call(pynsqd.broker.create_channel, "other", "c")
            wait_for(lambda: "other" in admin.get("topics")["topics"], 30, message="other")
            http_json(f"http://{admin.http_address}/api/nodes/{pynsqd.http_address}", "DELETE",
                      json.dumps({"topic": "other"}).encode())
            assert pynsqd.call(lambda: sorted(pynsqd.broker.topics)) == ["events"]
            admin.delete("topics/events")
            assert pynsqd.call(lambda: list(pynsqd.broker.topics)) == []
            wait_for(lambda: lookupd.lookup("events") == [], 30,
                     message="events to leave nsqlookupd")
    finally:
        if admin is not None:
            admin.stop()
        lookupd.stop()


def test_nsqadmin_action_on_a_topic_pynsqd_lacks_creates_nothing(pynsqd, admin):
    admin.post("topics/nothing", {"action": "pause"})
    admin.post("topics/nothing/c", {"action": "empty"})
    assert pynsqd.call(lambda: list(pynsqd.broker.topics)) == []
    with pytest.raises(urllib.error.HTTPError) as err:
        admin.post("topics/events", {"action": "explode"})
    assert err.value.code == 400


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(CHROMIUM is None,
                    reason="chromium not installed (apt-get install -y chromium)")
def test_nsqadmin_topic_page_shows_pynsqd_topic_and_its_depth(pynsqd, admin):
    pynsqd.call(pynsqd.broker.create_channel, "pagetopic", "viewers")
    pynsqd.call(pynsqd.broker.multi_publish, "pagetopic", [b"x"] * 1000)
    pynsqd.call(pynsqd.broker.create_channel, "pagetopic", "late")
    pynsqd.call(pynsqd.broker.multi_publish, "pagetopic", [b"y"] * 234)
    with tempfile.TemporaryDirectory() as profile:
        dom = subprocess.run(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
             "--no-first-run", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", f"--user-data-dir={profile}",
             "--virtual-time-budget=15000", "--dump-dom",
             f"http://{admin.http_address}/topics/pagetopic"],
            capture_output=True, timeout=120, check=True).stdout.decode()
    text = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", dom))
    assert "pagetopic" in text
    # each channel's row starts with its depth, as nsqadmin formats numbers
    assert re.search(r"\bviewers 1,234 ", text), text[:2000]
    assert re.search(r"\blate 234 ", text), text[:2000]
