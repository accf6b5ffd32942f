"""A start fits the limits the running broker accepted: under a low open-file limit
(``RLIMIT_NOFILE``, set in a child process) the broker accepts only the durable topics
it can keep open and restart, refuses the next one at creation with an error naming
the open-file limit, and restarts every topic it accepted, each with its channel and
message. EMFILE is reported as the open-file limit, never as disk space."""

from __future__ import annotations

import errno
import json
import resource
import subprocess
import sys
import textwrap

import pytest

from broker.storage import fileops

LIMIT = 256

CHILD = textwrap.dedent("""
    import json, os, sys
    from broker import Broker, Options
    from broker.clock import ManualClock
    from broker.errors import AdminFailed
    from broker.storage import DiskStore

    def start(path):
        opts = Options(data_path=path)
        broker = Broker(opts, clock=ManualClock())
        broker.storage = DiskStore(broker, opts)
        broker.storage.recover()
        return broker

    path = sys.argv[1]
    broker = start(path)
    accepted, refused = 0, ""
    while True:
        try:
            broker.create_channel(f"t{accepted}", "c")
        except AdminFailed as err:
            refused = str(err)
            break
        broker.publish(f"t{accepted}", f"m{accepted}".encode())
        accepted += 1
    serving = len(os.listdir("/proc/self/fd"))
    broker.storage.close()
    broker = start(path)
    restarted = sum(1 for t in broker.topics.values() if t.channels["c"].depth == 1)
    print(json.dumps({"accepted": accepted, "refused": refused, "restarted": restarted,
                      "serving_fds": serving,
                      "restarted_fds": len(os.listdir("/proc/self/fd"))}))
""")


def limited(nofile: int):
    def preexec() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))
    return preexec


def test_under_a_low_open_file_limit_every_accepted_topic_restarts(tmp_path):
    out = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path / "data")],
                         preexec_fn=limited(LIMIT), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout)
    assert got["accepted"] > LIMIT // 2                 # most of the limit is usable
    assert got["restarted"] == got["accepted"]
    assert "open-file limit" in got["refused"] and f"({LIMIT}" in got["refused"]
    assert "ulimit -n" in got["refused"] and "space" not in got["refused"]
    assert got["restarted_fds"] <= got["serving_fds"]


def test_emfile_is_named_as_the_open_file_limit_never_as_disk_space():
    said = fileops.describe(OSError(errno.EMFILE, "Too many open files"))
    assert "open-file limit" in said and "ulimit -n" in said and "space" not in said
    assert fileops.describe(OSError(errno.ENOSPC, "No space left on device")) == \
        "No space left on device"


def test_a_start_reads_into_memory_at_most_mem_queue_size_of_a_topic_shared_by_its_channels(
        tmp_path):
    """Many channels with a short backlog each: the start reads at most
    ``--mem-queue-size`` bodies of the topic in all (the rest wait as locations, read
    ahead when consumed), so its time follows the log, not channels x pending; every
    copy is there, and is delivered with its body."""
    from broker.clock import ManualClock

    from .test_storage_recovery import clean, drain, start

    clock = ManualClock()
    broker = start(tmp_path, clock, mem_queue_size=100)
    for i in range(50):
        broker.create_channel("events", f"c{i}")
    ids = broker.multi_publish("events", [f"m{i}".encode() for i in range(40)])
    clean(broker)
    broker = start(tmp_path, clock, mem_queue_size=100)
    channels = broker.topic("events").channels
    stats = [c.stats() for c in channels.values()]
    assert sum(s.depth for s in stats) == 50 * 40
    assert sum(s.memory_count for s in stats) <= 100
    for name in ("c0", "c49"):
        got = drain(broker, "events", name)
        assert sorted(got) == sorted(ids) and got[ids[7]] == b"m7"


HTTP_CHILD = textwrap.dedent("""
    import json, sys, urllib.error, urllib.request
    from broker import EmbeddedBroker

    broker = EmbeddedBroker(data_path=sys.argv[1]).start()
    made = 0
    while True:
        url = f"http://{broker.http_address}/topic/create?topic=t{made}"
        try:
            urllib.request.urlopen(urllib.request.Request(url, method="POST"), timeout=10)
        except urllib.error.HTTPError as err:
            print(json.dumps({"made": made, "status": err.code,
                              "body": json.loads(err.read())}))
            break
        made += 1
    broker.stop()
""")


def test_over_http_the_topic_past_the_open_file_limit_is_refused_naming_the_limit(tmp_path):
    """nsqd's code for the client that reads codes, and the sentence for the one who reads
    it: which limit, and that `ulimit -n` raises it."""
    out = subprocess.run([sys.executable, "-c", HTTP_CHILD, str(tmp_path / "data")],
                         preexec_fn=limited(LIMIT), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout)
    assert got["made"] > LIMIT // 2 and got["status"] == 500
    assert got["body"]["message"] == "STORAGE_FAILED"
    assert "open-file limit" in got["body"]["error"] and "ulimit -n" in got["body"]["error"]
