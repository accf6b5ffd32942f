"""`pynsq` as users type it, against a real broker: in-process, as its console script
runs it (``broker.cli:main``), so that a mutation run sees which tests reach which code;
the console script itself runs in the tests of ``--version`` and of two tails at once."""

from __future__ import annotations

import io
import subprocess
import sys

import pytest

from broker.cli import main

from .grpckit import so_far
from .helpers import bin_path, wait_for


def pynsq(address: str, *args: str, stdin: str = "") -> subprocess.CompletedProcess:
    """``pynsq --address ADDRESS ARGS...`` with ``stdin``; its exit code and what it wrote."""
    argv = ["--address", address, *args]
    stdout = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", write_through=True)
    stderr = io.StringIO()
    saved = sys.stdin, sys.stdout, sys.stderr
    sys.stdin = io.TextIOWrapper(io.BytesIO(stdin.encode()), encoding="utf-8")
    sys.stdout, sys.stderr = stdout, stderr
    try:
        code = main(argv)
    except SystemExit as exit_:   # argparse: usage errors (2), --help (0)
        code = exit_.code if isinstance(exit_.code, int) else int(exit_.code is not None)
    finally:
        sys.stdin, sys.stdout, sys.stderr = saved
    return subprocess.CompletedProcess(argv, code, stdout.buffer.getvalue().decode(),
                                       stderr.getvalue())


def test_pub_with_a_body_publishes_one_message(broker, client):
    result = pynsq(broker.address, "pub", "events", "hello")
    assert result.returncode == 0, result.stderr
    with client.subscribe("events", "check", rdy=1) as sub:
        assert sub.get(10).body == b"hello"


def test_pub_with_a_ttl_publishes_a_message_that_expires(broker, client):
    client.admin("channel", "create", "events", "check")
    result = pynsq(broker.address, "pub", "events", "stale", "--ttl", "1ms")
    assert result.returncode == 0, result.stderr
    assert pynsq(broker.address, "pub", "events", "fresh").returncode == 0
    with client.subscribe("events", "check", rdy=10) as sub:
        msg = sub.get(10)
        sub.fin(msg.id)
        assert msg.body == b"fresh" and so_far(sub) == ([], [])
    stats = client.stats("events").topics[0].channels[0]
    assert (stats.expired_count, stats.depth, stats.finish_count) == (1, 0, 1)


def test_pub_without_a_body_publishes_one_message_per_stdin_line(broker, client):
    client.admin("channel", "create", "events", "check")
    result = pynsq(broker.address, "pub", "events", stdin="a\nb\n\nc\n")
    assert result.returncode == 0, result.stderr
    assert client.stats("events").topics[0].channels[0].depth == 3


def test_pub_of_more_lines_than_one_batch_publishes_each_line_once_in_order(broker, client):
    """stdin is sent in MPUBs of 500 lines: 1,201 lines make three, nothing sent twice."""
    client.admin("channel", "create", "events", "check")
    lines = [f"line-{i}" for i in range(1201)]
    result = pynsq(broker.address, "pub", "events", stdin="\n".join(lines) + "\n")
    assert result.returncode == 0, result.stderr
    got = []
    with client.subscribe("events", "check", rdy=200) as sub:
        while len(got) < len(lines):
            msg = sub.get(10)
            sub.fin(msg.id)
            got.append(msg.body.decode())
        assert so_far(sub) == ([], [])
    assert got == lines


def test_tail_prints_bodies_fins_them_and_stops_after_n(broker, client):
    client.admin("channel", "create", "events", "tail")
    client.multi_publish("events", [b"one", b"two", b"three"])
    result = pynsq(broker.address, "tail", "events", "--channel", "tail", "-n", "2")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["one", "two"]
    wait_for(lambda: client.stats("events").topics[0].channels[0].finish_count == 2, 10,
             message="two FINs")


def test_each_tail_reads_its_own_ephemeral_channel_which_goes_away_after(broker, client):
    client.admin("channel", "create", "events", "archive")
    tails = [subprocess.Popen([bin_path("pynsq"), "--address", broker.address, "tail", "events",
                               "-n", "3"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]
    try:
        def channels() -> list[str]:
            return sorted(c.name for c in client.stats("events").topics[0].channels)

        tail_channels = wait_for(lambda: [c for c in channels() if c != "archive"]
                                 if len(channels()) == 3 else None, 30,
                                 message="both tails subscribed")
        assert all(c.endswith("#ephemeral") for c in tail_channels)
        client.multi_publish("events", [b"one", b"two", b"three"])
        outputs = [t.communicate(timeout=30) for t in tails]
    finally:
        for t in tails:
            if t.poll() is None:
                t.kill()
                t.wait(30)
    for (out, err), t in zip(outputs, tails):
        assert t.returncode == 0, err
        assert out.splitlines() == ["one", "two", "three"]
    wait_for(lambda: channels() == ["archive"], 10, message="the tails' channels to go away")
    assert client.stats("events").topics[0].channels[0].depth == 3


def test_stats_shows_topics_channels_depths_counts_and_latency(broker, client):
    client.admin("channel", "create", "events", "archive")
    with client.subscribe("events", "work", rdy=1) as sub:
        client.multi_publish("events", [b"x", b"y"])
        for _ in range(2):
            sub.fin(sub.get(10).id)
        wait_for(lambda: client.stats("events", "work").topics[0].channels[0].finish_count == 2,
                 10, message="two FINs")
        result = pynsq(broker.address, "stats")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "[events] depth: 0 msgs: 2"
    archive = next(line for line in lines if "[archive]" in line)
    work = next(line for line in lines if "[work]" in line)
    assert "depth: 2 in-flight: 0 deferred: 0 msgs: 2 fin: 0" in archive
    assert archive.endswith(" clients: 0")       # no latency yet, and no trailing space
    assert ("depth: 0 in-flight: 0 deferred: 0 msgs: 2 fin: 2 req: 0 timeout: 0 dead: 0 "
            "expired: 0 clients: 1 p50=") in work
    assert "p95=" in work and "p99=" in work


def test_the_default_address_is_the_local_grpc_port():
    from broker.cli import build_parser

    assert build_parser().parse_args(["stats"]).address == "127.0.0.1:4170"


def test_topic_and_channel_admin(broker, client):
    assert pynsq(broker.address, "topic", "create", "events").returncode == 0
    assert pynsq(broker.address, "channel", "create", "events", "ch").returncode == 0
    assert pynsq(broker.address, "channel", "pause", "events", "ch").returncode == 0
    assert client.stats("events").topics[0].channels[0].paused
    assert "    [ch] (paused) depth: 0" in pynsq(broker.address, "stats").stdout
    assert pynsq(broker.address, "channel", "unpause", "events", "ch").returncode == 0
    assert pynsq(broker.address, "topic", "pause", "events").returncode == 0
    assert client.stats("events").topics[0].paused
    assert pynsq(broker.address, "stats").stdout.startswith("[events] (paused) depth: 0")
    assert pynsq(broker.address, "channel", "empty", "events", "ch").returncode == 0
    assert pynsq(broker.address, "channel", "delete", "events", "ch").returncode == 0
    assert pynsq(broker.address, "topic", "empty", "events").returncode == 0
    assert pynsq(broker.address, "topic", "delete", "events").returncode == 0
    assert client.stats().topics == []


@pytest.mark.parametrize("args, code, text", [
    ((), 2, "required: COMMAND"),
    (("pub",), 2, "the following arguments are required: topic"),
    (("topic", "explode", "t"), 2, "invalid choice: 'explode'"),
    (("pub", "bad name", "x"), 1, "invalid topic name 'bad name'"),
    (("topic", "pause", "missing"), 1, "topic missing does not exist"),
])
def test_wrong_use_prints_a_clear_message_and_exits_non_zero(broker, args, code, text):
    result = pynsq(broker.address, *args)
    assert result.returncode == code
    assert text in result.stderr
    assert "Traceback" not in result.stderr


def test_an_unreachable_address_is_named_without_a_traceback():
    result = pynsq("127.0.0.1:1", "stats")
    assert result.returncode == 1
    assert "cannot reach the broker at 127.0.0.1:1" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("args, text", [
    (("channel", "create", "T", "C", "--max-attempts", "-1"),
     "argument --max-attempts: must be 0 to 65535, got -1"),
    (("channel", "create", "T", "C", "--max-attempts", "99999999999"),
     "argument --max-attempts: must be 0 to 65535, got 99999999999"),
    (("channel", "create", "T", "C", "--max-attempts", "five"),
     "argument --max-attempts: expected a whole number, got 'five'"),
    (("pub", "events", "x", "--defer-ms", "-5"), "argument --defer-ms: must be 0 to"),
    (("pub", "events", "x", "--defer-ms", "99999999999"), "argument --defer-ms: must be 0 to"),
    (("pub", "events", "x", "--ttl", "30"), "a unit is required: '30s' or '30ms'"),
    (("tail", "events", "-n", "-1"), "argument -n: must be 0 to"),
    (("pub",), "the following arguments are required: topic"),
    (("stats", "--topc", "x"), "unrecognized arguments: --topc x (did you mean '--topic'?)"),
    (("stats", "--adress", "127.0.0.1:4170"),
     "unrecognized arguments: --adress 127.0.0.1:4170 (did you mean '--address'?)"),
    (("topic", "pause", "t", "--ttl", "1s"), "--ttl only go with create"),
    (("topic", "delete", "t", "--ttl", "0"), "--ttl only go with create"),   # 0 is a ttl too
    (("channel", "pause", "t", "c", "--dead-letter-topic", "x"),
     "--dead-letter-topic only go with create"),
    (("channel", "empty", "t", "c", "--max-attempts", "0", "--dead-letter-topic", "x"),
     "--max-attempts, --dead-letter-topic only go with create"),
    (("pub", "events", "--defer-ms", "5"), "--defer-ms needs a BODY argument"),
])
def test_usage_and_value_errors_are_one_line_with_exit_code_2(args, text):
    """Checked before any broker is asked: the address answers nothing."""
    result = pynsq("127.0.0.1:1", *args)
    assert result.returncode == 2, result.stderr
    assert text in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "usage:" not in result.stderr and "Traceback" not in result.stderr


def test_number_options_take_both_ends_of_their_range(broker, client):
    for attempts in ("0", "65535"):
        result = pynsq(broker.address, "channel", "create", "events", f"c{attempts}",
                       "--max-attempts", attempts)
        assert result.returncode == 0, result.stderr
    assert {c.name: c.max_attempts for c in client.stats("events").topics[0].channels} == {
        "c0": 0, "c65535": 65535}
    assert pynsq(broker.address, "pub", "events", "now", "--defer-ms", "0").returncode == 0
    assert client.stats("events").topics[0].message_count == 1


@pytest.mark.parametrize("address", ["localhost", "127.0.0.1", "localhost:", "host:99999"])
def test_an_address_without_a_port_is_refused_naming_the_grpc_port(address):
    result = pynsq(address, "stats")
    assert result.returncode == 2
    assert f"address {address!r}: expected host:port of pynsqd's gRPC API" in result.stderr
    assert ":4170" in result.stderr and len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("listener", ["tcp_address", "http_address"])
def test_pointing_at_nsqds_tcp_or_http_port_hints_that_grpc_is_4170(listener):
    from broker import EmbeddedBroker

    with EmbeddedBroker() as broker:
        result = pynsq(getattr(broker, listener), "stats")
    assert result.returncode == 1
    assert "is this pynsqd's gRPC port? pynsqd serves gRPC on 4170" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_version_is_printed():
    result = subprocess.run([bin_path("pynsq"), "--version"], capture_output=True, text=True,
                            timeout=30)
    assert result.returncode == 0 and result.stdout.startswith("pynsq ")


def test_stats_show_each_channels_dead_letter_settings_and_the_topics_ttl():
    """`pynsq stats`, gRPC Stats and HTTP /stats (nsqd's shape, fields added)."""
    import json
    import urllib.request

    from broker import Client, EmbeddedBroker

    with EmbeddedBroker(max_attempts=3) as broker, Client(broker.address) as client:
        assert pynsq(broker.address, "topic", "create", "events", "--ttl", "90s").returncode == 0
        assert pynsq(broker.address, "channel", "create", "events", "work", "--max-attempts",
                     "5", "--dead-letter-topic", "failed").returncode == 0
        client.create_channel("events", "archive")    # the broker's --max-attempts
        client.create_channel("events", "keep", max_attempts=0)
        lines = pynsq(broker.address, "stats").stdout.splitlines()
        with urllib.request.urlopen(f"http://{broker.http_address}/stats?format=json") as r:
            http = json.load(r)
        grpc = {c.name: (c.max_attempts, c.dead_letter_topic)
                for c in client.stats("events").topics[0].channels}
    assert lines[0] == "[events] depth: 0 msgs: 0 ttl: 90s"
    assert "[work] (max-attempts: 5 -> failed) depth:" in lines[lines.index(lines[0]) + 3]
    assert any("[archive] (max-attempts: 3 -> events.dead) depth:" in line for line in lines)
    assert any(line.strip().startswith("[keep] depth:") for line in lines)
    assert grpc == {"archive": (3, "events.dead"), "keep": (0, ""), "work": (5, "failed")}
    topic = next(t for t in http["topics"] if t["topic_name"] == "events")
    assert topic["ttl_ms"] == 90_000
    assert {c["channel_name"]: (c["max_attempts"], c["dead_letter_topic"])
            for c in topic["channels"]} == grpc
    assert {"depth", "in_flight_count", "clients", "paused"} <= set(topic["channels"][0])


# -- against pynsqd --workers, in-process: embedded brokers that report each other as
# workers in their Info (what the supervisor tells each worker), so that a mutation run
# sees these paths too (test_workers.py runs them against the real supervisor).
@pytest.fixture
def workers():
    from broker import EmbeddedBroker

    with EmbeddedBroker() as first, EmbeddedBroker() as second:
        told = tuple({"grpc": b.address, "tcp": b.tcp_address, "http": b.http_address}
                     for b in (first, second))
        for b in (first, second):
            b.call(setattr, b.broker, "workers", told)
        yield first, second


def test_tail_against_workers_reads_every_worker_and_fins_each_message(workers):
    from broker import Client

    sent = {}
    for i, worker in enumerate(workers):
        with Client(worker.address) as client:
            client.create_channel("events", "tail")
            bodies = [f"w{i}-{n}".encode() for n in range(3)]
            sent[worker.address] = bodies
            client.multi_publish("events", bodies)
    result = pynsq(workers[0].address, "tail", "events", "--channel", "tail", "-n", "6")
    assert result.returncode == 0, result.stderr
    assert sorted(result.stdout.splitlines()) == sorted(
        b.decode() for bodies in sent.values() for b in bodies)
    for worker in workers:
        with Client(worker.address) as client:
            wait_for(lambda: client.stats("events").topics[0].channels[0].finish_count == 3,
                     10, message=f"three FINs on {worker.address}")


def test_admin_against_workers_acts_on_every_worker_where_the_topic_is(workers):
    from broker import Client

    first, second = workers
    with Client(first.address) as one, Client(second.address) as two:
        assert pynsq(first.address, "channel", "create", "events", "work").returncode == 0
        assert [t.name for t in one.stats().topics] == ["events"]
        assert [t.name for t in two.stats().topics] == ["events"]
        two.create_topic("only-here")       # a topic that one worker has not seen
        result = pynsq(first.address, "topic", "pause", "only-here")
        assert result.returncode == 0, result.stderr
        assert two.stats("only-here").topics[0].paused
        assert [t.name for t in one.stats().topics] == ["events"]
        result = pynsq(first.address, "topic", "delete", "only-here")
        assert result.returncode == 0, result.stderr
        assert [t.name for t in two.stats().topics] == ["events"]
        # Missing on every worker: the error, as from a single broker.
        result = pynsq(first.address, "topic", "pause", "missing")
        assert result.returncode == 1
        assert "topic missing does not exist" in result.stderr
        stats = pynsq(first.address, "stats").stdout.splitlines()
    assert [line for line in stats if line.startswith("worker-")] == [
        f"worker-0 {first.address}:", f"worker-1 {second.address}:"]
