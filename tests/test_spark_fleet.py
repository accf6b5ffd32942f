"""The source reads a fleet of brokers found through a real nsqlookupd
(option ``lookupdHttpAddress``). The driver is a process of its own; its executors'
Python workers are processes of their own too, so what they read comes through the
planned partitions, not the driver's memory. (Separate executor JVMs are
test_auth_spark.py's local-cluster test.)"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from broker import Client
from spark_connector.options import OptionError, ReaderOptions

from .helpers import Daemon, wait_for
from .nsqkit import Lookupd
from .spark_helpers import channel_stats, publish

DRIVER = Path(__file__).parent / "drivers" / "stream_to_file.py"
TOPIC = "events"


def test_lookupd_http_address_replaces_address():
    o = ReaderOptions.parse({"lookupdHttpAddress": "127.0.0.1:4161, 127.0.0.1:4162",
                             "topic": TOPIC, "channel": "spark"})
    assert (o.addresses, o.lookupd_addresses) == ([], ("127.0.0.1:4161", "127.0.0.1:4162"))


@pytest.mark.parametrize("options, error", [
    ({}, "option address or lookupdHttpAddress is required"),
    ({"address": "127.0.0.1:4170", "lookupdHttpAddress": "127.0.0.1:4161"},
     "options address and lookupdHttpAddress exclude each other"),
    ({"lookupdHttpAddress": "127.0.0.1"}, "option lookupdHttpAddress: '127.0.0.1' is not"),
    ({"lookupdHttpAddress": "127.0.0.1:4161", "lookupdPollIntervalMs": "5"},
     "option lookupdPollIntervalMs: must be at least 100"),
])
def test_broker_options_errors_name_the_option(options, error):
    with pytest.raises(OptionError, match=error):
        ReaderOptions.parse({"topic": TOPIC, "channel": "spark", **options})


class Fleet:
    """pynsqd processes registered with one nsqlookupd, each with its own data."""

    def __init__(self, lookupd: Lookupd, root: Path) -> None:
        self.lookupd = lookupd
        self.root = root
        self.daemons: list[Daemon] = []

    def start(self, index: int, port: int | None = None) -> Daemon:
        daemon = Daemon("--lookupd-tcp-address", self.lookupd.tcp_address,
                        "--broadcast-address", "127.0.0.1",
                        "--data-path", str(self.root / f"broker{index}"), port=port)
        self.daemons.append(daemon)
        return daemon.wait_ready()

    def kill_all(self) -> None:
        for daemon in self.daemons:
            daemon.kill()


def drive(tmp_path: Path, lookupd: Lookupd, *extra: str) -> subprocess.Popen:
    log = open(tmp_path / "driver.log", "ab")  # a file: a pipe left unread could fill up
    driver = subprocess.Popen(
        [sys.executable, str(DRIVER),
         "--topic", TOPIC, "--channel", "spark", "--checkpoint", str(tmp_path / "ck"),
         "--out", str(tmp_path / "ids.txt"), "--max-per-trigger", "200",
         "--option", f"lookupdHttpAddress={lookupd.http_address}",
         "--option", "lookupdPollIntervalMs=200", "--option", "failOnDataLoss=false",
         "--option", "msgTimeoutMs=5000", *extra],
        start_new_session=True, stdout=subprocess.DEVNULL, stderr=log)
    log.close()
    return driver


def driver_log(tmp_path: Path) -> str:
    return (tmp_path / "driver.log").read_text(errors="replace")[-3000:]


def read_ids(tmp_path: Path) -> list[str]:
    out = tmp_path / "ids.txt"
    return out.read_text().split() if out.exists() else []


def finished_everything(address: str, count: int) -> bool:
    with Client(address, timeout=10) as client:
        stats = channel_stats(client, TOPIC)
    return (stats.finish_count, stats.depth, stats.in_flight_count, stats.deferred_count) == (
        count, 0, 0, 0)


def test_a_fleet_found_through_nsqlookupd_is_read_once_as_it_changes(tmp_path):
    lookupd = Lookupd().start()  # skips, saying why, without NSQ's binaries
    fleet = Fleet(lookupd, tmp_path)
    driver = None
    try:
        brokers = [fleet.start(i) for i in range(3)]
        published: dict[str, set[str]] = {}
        for i, daemon in enumerate(brokers):
            with Client(daemon.address, timeout=10) as client:
                published[daemon.address] = publish(client, TOPIC, 100 * (i + 1))
        wait_for(lambda: len(lookupd.lookup(TOPIC)) == 3, 60,
                 message="the three brokers registered with nsqlookupd")

        # availableNow: the backlog of all three, in batches of at most 200; then the
        # driver streams on from the same checkpoint (one cluster for both queries).
        backlog_read = tmp_path / "backlog-read"
        driver = drive(tmp_path, lookupd, "--available-now", "--then-stream", str(backlog_read))
        wait_for(lambda: backlog_read.exists() or driver.poll() is not None, 600,
                 interval=0.1, message="the availableNow query to end")
        assert driver.poll() is None, driver_log(tmp_path)
        ids = read_ids(tmp_path)
        everything = set().union(*published.values())
        assert len(ids) == len(set(ids)) == len(everything) == 600
        assert set(ids) == everything

        for daemon in brokers:
            assert finished_everything(daemon.address, len(published[daemon.address]))

        # Streaming from the same checkpoint; it is running once it reads what comes next.
        with Client(brokers[2].address, timeout=10) as client:
            first = publish(client, TOPIC, 20)
        published[brokers[2].address] |= first
        everything |= first
        wait_for(lambda: first <= set(read_ids(tmp_path)), 300, interval=0.2,
                 message="the streaming query to read")

        # A fourth broker joins the fleet mid-stream.
        fourth = fleet.start(3)
        with Client(fourth.address, timeout=10) as client:
            published[fourth.address] = publish(client, TOPIC, 150)
        everything |= published[fourth.address]
        wait_for(lambda: set(read_ids(tmp_path)) == everything, 300, interval=0.2,
                 message="the fourth broker's messages read")

        # One broker stops mid-stream with messages still to come (deferred, so that none
        # is read before it stops): the query goes on with the others, and reads them once
        # it is back.
        stopped = brokers[0]
        with Client(stopped.address, timeout=10) as client:
            late = set(client.multi_publish(TOPIC, [b"late-%d" % i for i in range(50)],
                                            defer_ms=[5_000] * 50))
        published[stopped.address] |= late
        stopped.stop()
        with Client(brokers[1].address, timeout=10) as client:
            more = publish(client, TOPIC, 100)
        published[brokers[1].address] |= more
        everything |= more
        wait_for(lambda: more <= set(read_ids(tmp_path)), 300, interval=0.2,
                 message="the other brokers read while one is down")
        assert driver.poll() is None, driver_log(tmp_path)
        fleet.start(0, port=stopped.port)
        everything |= late
        wait_for(lambda: set(read_ids(tmp_path)) == everything, 300, interval=0.2,
                 message="the returned broker's messages read")
        for daemon in brokers[1:] + [fourth]:
            wait_for(lambda: finished_everything(daemon.address,
                                                 len(published[daemon.address])), 300,
                     interval=0.2, message=f"every message of {daemon.address} FINed")
        # The returned broker is a new instance: it counts the FINs since its start.
        wait_for(lambda: finished_everything(stopped.address, len(late)), 300,
                 interval=0.2, message="the returned broker's messages FINed")
        ids = read_ids(tmp_path)
        assert len(ids) == len(set(ids)) == len(everything)
        assert driver.poll() is None, driver_log(tmp_path)
    finally:
        if driver is not None and driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait(30)
        fleet.kill_all()
        lookupd.stop()
