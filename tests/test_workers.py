"""``pynsqd --workers N``: one broker process per core, used as one service by NSQ's
clients (through the real nsqlookupd), the ``pynsq`` CLI and the Spark writer."""

from __future__ import annotations

import errno
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from broker import Client
from broker.options import Options
from broker.workers import check_data_path, hold_port, uses_worker_layout, worker_for

from .helpers import bin_path, free_port, wait_for
from .nsqkit import Lookupd, http_json, nsq_binary

CLIENTS = Path(__file__).parent / "clients"
WORKER_LINE = re.compile(r"(worker-\d+) \(pid (\d+)\)")


def reserve_port(host: str, port: int) -> None:
    """The port is free: nothing listens on it, nor holds it (a bind as the supervisor's
    hold makes would fail)."""
    hold_port(host, port).close()


class Supervisor:
    """``pynsqd --workers N`` as a subprocess on free loopback ports, registered with
    ``lookupd``; its log is kept to learn each worker's pid."""

    def __init__(self, data: Path, lookupd: Lookupd, workers: int = 2) -> None:
        self.grpc = f"127.0.0.1:{free_port()}"
        self.tcp = f"127.0.0.1:{free_port()}"
        self.http = f"127.0.0.1:{free_port()}"
        self.proc = subprocess.Popen(
            [bin_path("pynsqd"), "--workers", str(workers), "--grpc-address", self.grpc,
             "--tcp-address", self.tcp, "--http-address", self.http, "--data-path", str(data),
             "--lookupd-tcp-address", lookupd.tcp_address, "--broadcast-address", "127.0.0.1"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.log: list[str] = []
        threading.Thread(target=self._read_log, daemon=True).start()
        self.count = workers

    def _read_log(self) -> None:
        for line in self.proc.stderr:
            self.log.append(line)

    def wait_ready(self) -> "Supervisor":
        def ready() -> bool:
            assert self.proc.poll() is None, "".join(self.log)
            # The supervisor says "N workers behind", then a line per worker with its pid.
            named = {m.group(1) for line in self.log if (m := WORKER_LINE.search(line))}
            return (any(f"{self.count} workers behind" in line for line in self.log)
                    and len(named) >= self.count)

        wait_for(ready, 60, interval=0.05, message="the workers to serve")
        return self

    @property
    def workers(self) -> list[dict]:
        """Each worker's own addresses, as the shared HTTP port's /info lists them."""
        return http_json(f"http://{self.http}/info")["workers"]

    def pid(self, name: str) -> int:
        pids = [int(m.group(2)) for line in self.log
                if (m := WORKER_LINE.search(line)) and m.group(1) == name]
        return pids[-1]

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(60)


@pytest.fixture
def lookupd():
    daemon = Lookupd().start()
    yield daemon
    daemon.stop()


@pytest.fixture
def supervisor(tmp_path, lookupd):
    sup = Supervisor(tmp_path / "data", lookupd).wait_ready()
    yield sup
    if sup.proc.poll() is None:
        sup.proc.kill()
        sup.proc.wait(30)


def pynsq(*args: str, address: str, stdin: str | None = None) -> str:
    out = subprocess.run([bin_path("pynsq"), "--address", address, *args], input=stdin,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def http_pub(address: str, topic: str, body: str) -> None:
    request = urllib.request.Request(f"http://{address}/pub?topic={topic}", data=body.encode(),
                                     method="POST")
    with urllib.request.urlopen(request, timeout=10) as response:  # a connection each
        assert response.read() == b"OK"


def message_counts(sup: Supervisor, topic: str) -> list[int]:
    """The topic's message count on each worker, from its own /stats."""
    counts = []
    for worker in sup.workers:
        stats = http_json(f"http://{worker['http']}/stats?format=json&topic={topic}")
        counts.append(sum(t["message_count"] for t in stats["topics"]))
    return counts


def listed_workers(lookupd: Lookupd, topic: str) -> int:
    return len(lookupd.lookup(topic))


# -- planning and the data path (no processes) ----------------------------------------
def test_workers_auto_and_zero_mean_one_per_core_and_a_bad_count_is_named():
    cores = len(os.sched_getaffinity(0))
    assert Options(workers="auto").workers == cores
    assert Options(workers=0).workers == cores
    assert Options(workers="3").workers == 3
    with pytest.raises(ValueError, match="workers: expected a number of workers or auto"):
        Options(workers="many")
    with pytest.raises(ValueError, match="workers: at most 1024"):
        Options(workers=2000)


def test_a_data_path_holding_messages_this_layout_would_not_read_is_refused(tmp_path):
    single = tmp_path / "single"
    (single / "topics").mkdir(parents=True)
    with pytest.raises(ValueError, match="holds a single broker's data"):
        check_data_path(str(single), 2)
    assert not uses_worker_layout(str(single))

    four = tmp_path / "four"
    for i in range(4):
        (four / f"worker-{i}" / "topics").mkdir(parents=True)
    with pytest.raises(ValueError, match="worker-3 holds messages, so --workers must be at "
                                         "least 4"):
        check_data_path(str(four), 2)
    with pytest.raises(ValueError, match=r"at least 4 \(got 1\)"):
        check_data_path(str(four), 1)
    assert uses_worker_layout(str(four))   # served by workers whatever --workers says
    check_data_path(str(four), 4)
    check_data_path(str(four), 8)


def test_pynsqd_on_a_data_path_made_by_workers_says_how_many_workers_it_needs(tmp_path):
    for i in range(2):
        (tmp_path / f"worker-{i}" / "topics").mkdir(parents=True)
    out = subprocess.run([bin_path("pynsqd"), "--data-path", str(tmp_path), "--grpc-address",
                          f"127.0.0.1:{free_port()}", "--tcp-address", "", "--http-address", ""],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 1
    assert "worker-1 holds messages, so --workers must be at least 2 (got 1)" in out.stderr


def test_a_key_belongs_to_the_same_worker_in_every_process():
    addresses = ["h:1", "h:2", "h:3"]
    code = ("from broker.workers import worker_for; "
            "print(worker_for('query:to-out:7:3', ['h:1', 'h:2', 'h:3']))")
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           check=True, env={**os.environ, "PYTHONHASHSEED": "random"})
    assert other.stdout.strip() == worker_for("query:to-out:7:3", addresses)
    assert {worker_for(f"q:w:1:{p}", addresses) for p in range(30)} == set(addresses)


# -- NSQ's clients, the CLI, nsqlookupd --------------------------------------------------
def test_nsq_clients_and_the_cli_use_the_workers_as_one_service(supervisor, lookupd):
    topic = "events"
    # Admin through the shared address reaches every worker.
    pynsq("channel", "create", topic, "tail", address=supervisor.grpc)
    pynsq("channel", "create", topic, "reader", address=supervisor.grpc)
    for worker in supervisor.workers:
        stats = http_json(f"http://{worker['http']}/stats?format=json&topic={topic}")
        channels = {c["channel_name"] for t in stats["topics"] for c in t["channels"]}
        assert channels == {"tail", "reader"}, worker

    sent = [f"http-{i}" for i in range(40)]                # 40 connections to the shared port
    for body in sent:
        http_pub(supervisor.http, topic, body)
    lines = [f"cli-{i}" for i in range(20)]
    pynsq("pub", topic, address=supervisor.grpc, stdin="\n".join(lines) + "\n")
    to_nsq = [f"to-nsq-{i}" for i in range(20)]
    subprocess.run([nsq_binary("to_nsq"), "--nsqd-tcp-address", supervisor.tcp,
                    "--topic", topic], input="\n".join(to_nsq) + "\n", text=True,
                   capture_output=True, timeout=60, check=True)
    out = subprocess.run([sys.executable, str(CLIENTS / "pynsq_client.py"), "publish",
                          supervisor.tcp, topic], capture_output=True, timeout=60, check=True)
    assert json.loads(out.stdout) == ["OK", "OK", "OK"]
    out = subprocess.run([sys.executable, str(CLIENTS / "gnsq_client.py"), "produce",
                          supervisor.tcp, topic], capture_output=True, timeout=60, check=True)
    assert json.loads(out.stdout) == "ok"
    sent += lines + to_nsq + ["one", "two", "three", "four"]
    sent += ["g-one", "g-two", "g-three", "g-deferred"]

    counts = message_counts(supervisor, topic)
    assert sum(counts) == len(sent)
    assert all(counts), f"every worker got some: {counts}"
    wait_for(lambda: listed_workers(lookupd, topic) == 2, 30,
             message="nsqlookupd to list both workers")

    tail = subprocess.run([nsq_binary("nsq_tail"), "--lookupd-http-address",
                           lookupd.http_address, "--topic", topic, "--channel", "tail",
                           "-n", str(len(sent))], capture_output=True, timeout=120, check=True)
    assert sorted(tail.stdout.decode().split()) == sorted(sent)

    out = subprocess.run([sys.executable, str(CLIENTS / "pynsq_lookupd_reader.py"),
                          lookupd.http_address, topic, "reader", str(len(sent)), "ids"],
                         capture_output=True, timeout=120, check=True)
    read = json.loads(out.stdout)
    assert sorted(body for _, body in read) == sorted(sent)
    assert len({message_id for message_id, _ in read}) == len(sent)  # ids never collide
    assert len({int(message_id, 16) & 1023 for message_id, _ in read}) == 2  # two node ids

    # The CLI's stats and tail see every worker.
    stats = pynsq("stats", "--topic", topic, address=supervisor.grpc)
    assert stats.count(f"[{topic}]") == 2
    more = [f"late-{i}" for i in range(10)]
    for body in more:
        http_pub(supervisor.http, topic, body)
    tailed = pynsq("tail", topic, "--channel", "reader", "-n", str(len(more)),
                   address=supervisor.grpc)
    assert sorted(tailed.split()) == sorted(more)


# -- a worker that dies, and the supervisor's own end ----------------------------------
def test_a_worker_killed_with_sigkill_is_restarted_and_its_unfinished_messages_come_back(
        supervisor):
    topic = "orders"
    workers = supervisor.workers
    for worker in workers:
        with Client(worker["grpc"], timeout=10) as client:
            client.create_channel(topic, "work")
    for i in range(40):
        http_pub(supervisor.http, topic, f"order-{i}")
    counts = message_counts(supervisor, topic)
    assert all(counts), counts

    victim = workers[1]
    held = []
    with Client(victim["grpc"], timeout=10) as client:
        with client.subscribe(topic, "work", rdy=100) as sub:
            for msg in sub:                          # in flight, never FINished
                held.append(msg.id)
                if len(held) == counts[1]:
                    break
            pid = supervisor.pid("worker-1")
            os.kill(pid, signal.SIGKILL)

    wait_for(lambda: supervisor.pid("worker-1") != pid, 30,
             message="the supervisor to start worker-1 again")
    assert supervisor.workers == workers              # the same addresses after the restart
    again = []
    with Client(victim["grpc"], timeout=10) as client:
        with client.subscribe(topic, "work", rdy=100) as sub:
            for msg in sub:
                again.append(msg.id)
                sub.fin(msg.id)
                if len(again) == len(held):
                    break
    assert sorted(again) == sorted(held)
    assert supervisor.proc.poll() is None
    assert supervisor.stop() == 0


def test_a_dead_workers_own_ports_are_kept_for_it_until_it_serves_again(supervisor):
    """Between a worker's death and its restart its own ports are the supervisor's:
    another process binding one is refused, and the worker comes back on each."""
    own = supervisor.workers[0]
    pid = supervisor.pid("worker-0")
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: gone(pid), 30, message="worker-0 to end")
    # Its sockets close a few ms after it ends; a squatter keeps trying for a while
    # (unheld, each port was taken within 20 ms, long before the worker came back).
    taken = []
    deadline = time.monotonic() + 0.5
    while time.monotonic() < deadline and not taken:
        for kind in ("grpc", "tcp", "http"):
            host, _, port = own[kind].rpartition(":")
            squatter = socket.socket()
            try:
                squatter.bind((host, int(port)))
            except OSError as refused:
                assert refused.errno == errno.EADDRINUSE, kind
                squatter.close()
            else:
                taken.append((kind, squatter))
    for _, squatter in taken:
        squatter.close()
    assert not taken, f"another process took worker-0's {[kind for kind, _ in taken]} port"
    wait_for(lambda: supervisor.pid("worker-0") != pid, 30,
             message="the supervisor to start worker-0 again")
    assert supervisor.workers[0] == own
    with Client(own["grpc"], timeout=10) as client:
        client.publish("back", b"x")
    assert supervisor.stop() == 0


def test_sigterm_stops_every_worker_cleanly_and_a_restart_loses_nothing(tmp_path, lookupd):
    sup = Supervisor(tmp_path / "data", lookupd).wait_ready()
    pids = [sup.pid("worker-0"), sup.pid("worker-1")]
    for i in range(30):
        http_pub(sup.http, "kept", f"kept-{i}")
    counts = message_counts(sup, "kept")
    assert sup.stop() == 0
    assert all(gone(pid) for pid in pids)
    for address in (sup.grpc, sup.tcp, sup.http):     # nothing holds the shared ports
        host, _, port = address.rpartition(":")
        reserve_port(host, int(port))

    again = Supervisor(tmp_path / "data", lookupd).wait_ready()
    try:
        depths = [sum(t["depth"] for t in http_json(
            f"http://{w['http']}/stats?format=json&topic=kept")["topics"])
            for w in again.workers]
        assert depths == counts
    finally:
        assert again.stop() == 0


@pytest.mark.parametrize("moment", ["restored", "listening on", "sharing"])
def test_a_supervisor_stopped_while_its_workers_start_stops_cleanly(tmp_path, lookupd, moment):
    """A SIGTERM at any moment of the start-up (a worker still loading Python, one
    restoring its data path, one opening its ports) ends every worker and exits 0:
    nothing is called unclean for having been asked to stop early. Each moment is
    when the first worker logs it; the other is then at another point of its start."""
    data = tmp_path / "data"
    for _ in range(2):
        sup = Supervisor(data, lookupd)
        wait_for(lambda: sup.proc.poll() is not None or any(
            "worker-" in line and moment in line for line in sup.log), 60,
            interval=0.005, message=f"a worker to log {moment!r}")
        assert sup.stop() == 0, "".join(sup.log)
        assert not any("did not stop cleanly" in line or "ERROR" in line for line in sup.log), \
            "".join(sup.log)
        for address in (sup.grpc, sup.tcp, sup.http):     # nothing holds the shared ports
            host, _, port = address.rpartition(":")
            reserve_port(host, int(port))
    again = Supervisor(data, lookupd).wait_ready()    # and the data path starts again
    assert again.stop() == 0


def gone(pid: int) -> bool:
    """The process has exited (a zombie left to an init that does not reap counts)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_workers_of_a_supervisor_killed_with_sigkill_stop_and_free_the_ports(tmp_path,
                                                                              lookupd):
    sup = Supervisor(tmp_path / "data", lookupd).wait_ready()
    pids = [sup.pid("worker-0"), sup.pid("worker-1")]
    sup.proc.kill()
    sup.proc.wait(30)
    wait_for(lambda: all(gone(pid) for pid in pids), 30, message="the workers to stop")
    for address in (sup.grpc, sup.tcp, sup.http):
        host, _, port = address.rpartition(":")
        reserve_port(host, int(port))


def test_a_shared_port_already_in_use_stops_the_supervisor_with_its_name(tmp_path):
    with Daemonless() as busy:
        out = subprocess.run([bin_path("pynsqd"), "--workers", "2", "--grpc-address",
                              f"127.0.0.1:{free_port()}", "--tcp-address", busy.address,
                              "--http-address", f"127.0.0.1:{free_port()}"],
                             capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    assert f"cannot listen on {busy.address} (tcp)" in out.stderr


class Daemonless:
    """A socket listening on a free loopback port, as another program would."""

    def __enter__(self) -> "Daemonless":
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.address = f"127.0.0.1:{self.sock.getsockname()[1]}"
        return self

    def __exit__(self, *exc) -> None:
        self.sock.close()


# -- the Spark writer: a replay meets its own de-duplication window -------------------
def test_a_writers_replays_reach_the_worker_that_holds_its_window(supervisor):
    from spark_connector.writer import PartitionPublisher

    rows = [f"row-{i}" for i in range(50)]

    def publish(producer_id: str) -> None:  # one attempt of one partition: a new connection
        publisher = PartitionPublisher(supervisor.grpc, "out", producer_id, 20, "partition 0")
        try:
            for row in rows:
                publisher.add(row)
            publisher.finish()
        finally:
            publisher.close()

    for _ in range(10):                     # the first attempt and nine replays
        publish("query:to-out:7:0")
    assert sum(message_counts(supervisor, "out")) == len(rows)

    for partition in range(1, 9):           # other partitions spread over the workers
        publish(f"query:to-out:7:{partition}")
    counts = message_counts(supervisor, "out")
    assert sum(counts) == 9 * len(rows) and all(counts), counts


# -- the Spark source: a shared address is read as every worker -------------------------
def test_the_spark_sources_lease_keeper_reads_every_worker_behind_a_shared_address(
        supervisor):
    from spark_connector.options import ReaderOptions
    from spark_connector.session import LeaseKeeper

    keeper = LeaseKeeper(ReaderOptions.parse({"address": supervisor.grpc, "topic": "clicks",
                                              "channel": "spark"}))
    try:
        assert keeper.brokers() == [w["grpc"] for w in supervisor.workers]
        keeper.ensure_channel()
        for i in range(40):
            http_pub(supervisor.http, "clicks", f"click-{i}")
        leases = keeper.reserve(1, 1000, 1 << 20)
        assert sum(lease["count"] for lease in leases.values()) == 40
        assert {lease["address"] for lease in leases.values()} == set(keeper.brokers())
        keeper.finish_through(1, leases)
    finally:
        keeper.close()
    assert sum(message_counts(supervisor, "clicks")) == 40


# -- Spark end to end: a relay through the workers, a failed batch replayed --------------
def test_a_spark_relay_through_the_workers_publishes_each_message_once_across_a_replay(
        spark, supervisor, tmp_path):
    from pyspark.errors import StreamingQueryException

    from spark_connector import pub_to_topic

    workers = supervisor.workers
    for i, worker in enumerate(workers):
        with Client(worker["grpc"], timeout=10) as client:
            client.create_channel("b", "check")
            client.multi_publish("a", [f"msg-{i}-{n}".encode() for n in range(150)])
    publish_b = pub_to_topic(supervisor.grpc, "b", batch_size=20)
    failed = []

    def publish_then_fail_once(df, batch_id):
        publish_b(df, batch_id)
        if batch_id == 1 and not failed:
            failed.append(batch_id)
            raise RuntimeError("injected failure after publishing batch 1")

    def relay():
        df = (spark.readStream.format("pynsq").option("address", supervisor.grpc)
              .option("topic", "a").option("channel", "spark")
              .option("maxMessagesPerTrigger", 150).load()
              .selectExpr("CAST(body AS STRING) AS body"))
        return (df.writeStream.foreachBatch(publish_then_fail_once)
                .option("checkpointLocation", str(tmp_path / "ck"))
                .trigger(availableNow=True).start())

    with pytest.raises(StreamingQueryException, match="injected failure"):
        relay().awaitTermination(120)
    assert relay().awaitTermination(120)

    bodies = []
    for worker in workers:
        with Client(worker["grpc"], timeout=10) as client:
            depth = client.stats("b", "check").topics[0].channels[0].depth
            with client.subscribe("b", "check", rdy=1000) as sub:
                for _ in range(depth):
                    msg = sub.get(timeout=10)
                    assert msg is not None
                    bodies.append(msg.body.decode())
                    sub.fin(msg.id)
    assert sorted(bodies) == sorted(f"msg-{i}-{n}" for i in range(2) for n in range(150))


def test_the_planned_ports_are_held_from_every_other_process_until_the_plan_is_released():
    """Each port planned (shared and each worker's own) is held from the plan until the
    supervisor ends: no other bind gets it, so no worker, at its start or at a restart,
    finds its port taken; and no port is planned twice."""
    from broker import workers

    plan = workers.plan_workers(Options(workers=3, grpc_address="127.0.0.1:0",
                                        tcp_address="127.0.0.1:0",
                                        http_address="127.0.0.1:0"))
    try:
        ports = [int(a.rsplit(":", 1)[1])
                 for a in [*plan.shared.values(), *(a for own in plan.own for a in own.values())]]
        assert len(set(ports)) == len(ports) == 12
        for port in ports:
            with socket.socket() as other, pytest.raises(OSError) as refused:
                other.bind(("127.0.0.1", port))
            assert refused.value.errno == errno.EADDRINUSE
        offered = set()
        for _ in range(2000):          # the OS offers none of them to a bind of port 0
            with socket.socket() as other:
                other.bind(("127.0.0.1", 0))
                offered.add(other.getsockname()[1])
        assert not offered & set(ports)
    finally:
        plan.release()
    for port in ports:
        reserve_port("127.0.0.1", port)
