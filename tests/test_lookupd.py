"""Registration with the real nsqlookupd (lookup protocol V1), and NSQ's clients
finding pynsqd through it. The wire functions are checked byte by byte first."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from broker import EmbeddedBroker, __version__, lookupd as lookupd_module
from broker.lookupd import (Timing, identify_command, parse_response, register_command,
                            unregister_command)
from broker.options import Options

from .helpers import free_port, wait_for
from .nsqkit import Lookupd, nsq_binary

CLIENTS = Path(__file__).parent / "clients"


# -- the wire, as bytes --------------------------------------------------------
def test_identify_is_the_command_line_then_a_size_prefixed_json_body():
    command = identify_command({"tcp_port": 4150})
    body = b'{"tcp_port": 4150}'
    assert command == b"IDENTIFY\n" + len(body).to_bytes(4, "big") + body


def test_register_and_unregister_name_the_topic_and_optionally_the_channel():
    assert register_command("events") == b"REGISTER events\n"
    assert register_command("events", "spark") == b"REGISTER events spark\n"
    assert unregister_command("events", "tail#ephemeral") == b"UNREGISTER events tail#ephemeral\n"


def test_a_response_is_read_only_once_complete():
    frame = b"\x00\x00\x00\x02OK"
    assert parse_response(frame[:5]) == (None, 0)
    assert parse_response(frame + b"\x00") == (b"OK", 6)


def test_lookupd_address_must_be_host_and_port():
    with pytest.raises(ValueError, match="lookupd-tcp-address"):
        Options(lookupd_tcp_address=("nohost",))
    with pytest.raises(ValueError, match="tcp-address and http-address"):
        Options(lookupd_tcp_address=("127.0.0.1:4160",), tcp_address="")


def test_lookupd_addresses_come_from_toml_as_a_list(tmp_path):
    conf = tmp_path / "pynsqd.toml"
    conf.write_text('lookupd_tcp_address = ["127.0.0.1:4160", "127.0.0.1:4162"]\n'
                    'broadcast_address = "10.0.0.5"\n')
    options = Options.from_toml(conf)
    assert options.lookupd_tcp_address == ("127.0.0.1:4160", "127.0.0.1:4162")
    assert options.broadcast_address == "10.0.0.5"
    conf.write_text("lookupd_tcp_address = [4160]\n")
    with pytest.raises(ValueError, match="lookupd_tcp_address: expected a list of strings"):
        Options.from_toml(conf)


# -- PING and reconnect delays, against a lookup protocol V1 server in the test ----
class LookupV1Server:
    """A real TCP server speaking NSQ's lookup protocol V1 as far as a producer needs:
    it reads the magic and each command (IDENTIFY with its body), answers ``OK``, and
    records (monotonic time, command line); ``answers`` gives another answer to a verb.
    ``drop`` closes the connections it has; with ``refuse`` set it closes each new one
    at once."""

    def __init__(self, port: int = 0, answers: dict[bytes, bytes] | None = None,
                 frames: dict[bytes, bytes] | None = None) -> None:
        self.sock = socket.create_server(("127.0.0.1", port))
        self.address = "127.0.0.1:%d" % self.sock.getsockname()[1]
        self.received: list[tuple[float, bytes]] = []
        self.answers = answers or {}
        self.frames = frames or {}   # verb -> raw bytes sent once instead of a framed answer
        self.identified: dict = {}    # the last IDENTIFY's body
        self.refuse = False
        self._conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def commands(self) -> list[bytes]:
        return [line for _at, line in self.received]

    def drop(self) -> None:
        for conn in self._conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:   # already closed by the other end
                pass
        self._conns.clear()

    def close(self) -> None:
        self.sock.close()
        self.drop()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            if self.refuse:
                conn.close()
                continue
            self._conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        reader = conn.makefile("rb")
        try:
            if reader.read(4) != b"  V1":   # closed before the magic
                return
            while line := reader.readline():
                self.received.append((time.monotonic(), line.strip()))
                if line.startswith(b"IDENTIFY"):
                    self.identified = json.loads(
                        reader.read(int.from_bytes(reader.read(4), "big")))
                verb = line.split()[0]
                if verb in self.frames:
                    conn.sendall(self.frames.pop(verb))
                    continue
                answer = self.answers.get(verb, b"OK")
                conn.sendall(len(answer).to_bytes(4, "big") + answer)
        except OSError:
            pass
        finally:
            conn.close()


def test_nsqds_timing_is_the_default_ping_every_15_s_reconnect_within_a_quarter_to_5_s():
    timing = lookupd_module.NSQD_TIMING
    assert (timing.ping_interval, timing.reconnect_delay_min, timing.reconnect_delay_max) == (
        15.0, 0.25, 5.0)
    assert timing == Timing()


def test_an_idle_registration_pings_each_ping_interval(monkeypatch, caplog):
    caplog.set_level(logging.INFO, "pynsqd")
    server = LookupV1Server()
    monkeypatch.setattr(lookupd_module, "NSQD_TIMING", Timing(ping_interval=0.2))
    try:
        with EmbeddedBroker(lookupd_tcp_address=(server.address,),
                            broadcast_address="127.0.0.1") as broker:
            wait_for(lambda: server.commands().count(b"PING") >= 3, 10, message="three PINGs")
            tcp_port, http_port = _ports(broker)
    finally:
        server.close()
    assert f"nsqlookupd {server.address}: registered" in caplog.messages
    assert server.identified == {"broadcast_address": "127.0.0.1",
                                 "hostname": socket.gethostname(), "tcp_port": tcp_port,
                                 "http_port": http_port, "version": __version__}
    assert server.commands()[0] == b"IDENTIFY"
    assert set(server.commands()[1:]) == {b"PING"}   # a broker with no topics: nothing else
    times = [at for at, _line in server.received]
    assert all(later - earlier >= 0.18 for earlier, later in zip(times, times[1:])), times


def test_an_error_answer_is_logged_naming_the_command_and_the_answer_and_the_rest_goes_on(
        caplog):
    server = LookupV1Server(answers={b"REGISTER": b"E_INVALID no \xff"})
    try:
        with EmbeddedBroker(lookupd_tcp_address=(server.address,),
                            broadcast_address="127.0.0.1") as broker:
            broker.call(broker.broker.create_channel, "events", "spark")
            wait_for(lambda: b"REGISTER events spark" in server.commands(), 10,
                     message="the registration")
            broker.call(broker.broker.delete_topic, "events")
            wait_for(lambda: b"UNREGISTER events" in server.commands(), 10,
                     message="what follows an error answer")
    finally:
        server.close()
    logged = [r.getMessage() for r in caplog.records if "answered" in r.getMessage()]
    assert f"nsqlookupd {server.address}: REGISTER events spark answered E_INVALID no \ufffd" \
        in logged, logged


def test_a_refused_identify_is_logged_with_the_answer_and_nothing_is_registered(
        monkeypatch, caplog):
    server = LookupV1Server(answers={b"IDENTIFY": b"E_BAD_BODY version missing"})
    delays: list[float] = []

    async def sleep(delay: float) -> None:
        delays.append(delay)
        await asyncio.sleep(0.005)

    monkeypatch.setattr(lookupd_module, "NSQD_TIMING", Timing(sleep=sleep))
    try:
        with EmbeddedBroker(lookupd_tcp_address=(server.address,),
                            broadcast_address="127.0.0.1") as broker:
            broker.call(broker.broker.create_channel, "events", "spark")
            wait_for(lambda: len(delays) >= 3, 10, message="three refused attempts")
    finally:
        server.close()
    assert set(server.commands()) == {b"IDENTIFY"}
    assert delays[:3] == [0.25, 0.5, 1.0]
    assert (f"nsqlookupd {server.address}: connection lost (IDENTIFY refused: "
            f"E_BAD_BODY version missing); reconnecting") in caplog.messages


def test_a_frame_declared_over_its_bound_closes_the_connection_logs_once_and_reconnects(
        monkeypatch, caplog):
    """A hostile nsqlookupd answers a PING with a frame that says it is 2 GiB long (and
    sends 64 KiB of it): the broker reads no further, closes that connection with one
    line naming the size, and registers again on a new connection."""
    declared = 2**31 - 1
    server = LookupV1Server(frames={b"PING": declared.to_bytes(4, "big") + b"x" * 65536})
    monkeypatch.setattr(lookupd_module, "NSQD_TIMING", Timing(ping_interval=0.05))
    try:
        with EmbeddedBroker(lookupd_tcp_address=(server.address,),
                            broadcast_address="127.0.0.1") as broker:
            broker.call(broker.broker.create_channel, "events", "spark")
            wait_for(lambda: server.commands().count(b"REGISTER events spark") >= 2, 10,
                     message="the registration on a new connection")
    finally:
        server.close()
    lost = [m for m in caplog.messages if "connection lost" in m]
    assert lost == [f"nsqlookupd {server.address}: connection lost (response of {declared} "
                    f"bytes from nsqlookupd, over the largest {lookupd_module.MAX_RESPONSE} "
                    f"(MAX_RESPONSE)); reconnecting"], lost
    assert server.commands().count(b"IDENTIFY") == 2


def test_reconnect_delays_double_up_to_the_most_and_start_over_once_registered(monkeypatch):
    """nsqd's delays, recorded instead of waited: 0.25 s doubling to 5 s while nothing
    answers or a connection ends before IDENTIFY is answered; after a connection that
    registered, the least again."""
    delays: list[float] = []

    async def sleep(delay: float) -> None:
        delays.append(delay)
        await asyncio.sleep(0.005)

    monkeypatch.setattr(lookupd_module, "NSQD_TIMING", Timing(sleep=sleep))
    port = free_port()
    with EmbeddedBroker(lookupd_tcp_address=(f"127.0.0.1:{port}",),
                        broadcast_address="127.0.0.1") as broker:
        broker.call(broker.broker.create_channel, "events", "spark")
        wait_for(lambda: len(delays) >= 8, 10, message="eight attempts")
        assert delays[:8] == [0.25, 0.5, 1.0, 2.0, 4.0, 5.0, 5.0, 5.0]
        server = LookupV1Server(port)
        try:
            wait_for(lambda: b"REGISTER events spark" in server.commands(), 10,
                     message="the registration")
            before = len(delays)
            server.refuse = True
            server.drop()
            wait_for(lambda: len(delays) >= before + 4, 10, message="attempts after the drop")
            assert delays[before:before + 4] == [0.25, 0.5, 1.0, 2.0]
        finally:
            server.close()


# -- against the real nsqlookupd -------------------------------------------------
@pytest.fixture
def lookupd():
    daemon = Lookupd().start()
    yield daemon
    daemon.stop()


@pytest.fixture
def registered(lookupd):
    with EmbeddedBroker(lookupd_tcp_address=(lookupd.tcp_address,),
                        broadcast_address="127.0.0.1") as broker:
        yield broker


def _ports(broker: EmbeddedBroker) -> tuple[int, int]:
    return (int(broker.tcp_address.rpartition(":")[2]),
            int(broker.http_address.rpartition(":")[2]))


def _listed(lookupd: Lookupd, topic: str, broker: EmbeddedBroker) -> bool:
    return any((p["broadcast_address"], p["tcp_port"], p["http_port"])
               == ("127.0.0.1", *_ports(broker)) for p in lookupd.lookup(topic))


def test_lookup_lists_pynsqd_for_a_topic_it_has_with_its_channels(lookupd, registered):
    registered.call(registered.broker.publish, "events", b"x")
    registered.call(registered.broker.create_channel, "events", "spark")
    wait_for(lambda: _listed(lookupd, "events", registered), 30,
             message="nsqlookupd to list pynsqd for events")
    wait_for(lambda: "spark" in lookupd.channels("events"), 30, message="channel spark")
    assert not _listed(lookupd, "other", registered)


def test_what_the_broker_has_is_registered_once_lookupd_comes_up():
    lookupd = Lookupd()  # not started yet
    with EmbeddedBroker(lookupd_tcp_address=(lookupd.tcp_address,),
                        broadcast_address="127.0.0.1") as broker:
        broker.call(broker.broker.create_channel, "early", "c")
        lookupd.start()
        try:
            # The topic and its channel are two REGISTERs: wait for the one asserted.
            wait_for(lambda: _listed(lookupd, "early", broker), 30, message="early listed")
            wait_for(lambda: "c" in lookupd.channels("early"), 30, message="early/c listed")
        finally:
            lookupd.stop()


def test_a_deleted_topic_disappears_from_lookup(lookupd, registered):
    registered.call(registered.broker.create_channel, "gone", "c")
    registered.call(registered.broker.create_channel, "kept", "c")
    wait_for(lambda: _listed(lookupd, "gone", registered), 30, message="gone listed")
    registered.call(registered.broker.delete_topic, "gone")
    wait_for(lambda: not _listed(lookupd, "gone", registered), 30,
             message="gone to leave nsqlookupd")
    assert _listed(lookupd, "kept", registered)


def test_an_ephemeral_channel_leaves_lookupd_with_its_last_consumer(lookupd, registered):
    from broker import Client

    with Client(registered.address, timeout=10) as client:
        with client.subscribe("events", "tail#ephemeral", rdy=1):
            wait_for(lambda: "tail#ephemeral" in lookupd.channels("events"), 30,
                     message="the ephemeral channel registered")
        wait_for(lambda: "tail#ephemeral" not in lookupd.channels("events"), 30,
                 message="the ephemeral channel unregistered")
    assert _listed(lookupd, "events", registered)


def test_registration_survives_a_lookupd_restart(lookupd, registered):
    registered.call(registered.broker.create_channel, "events", "spark")
    wait_for(lambda: _listed(lookupd, "events", registered), 30, message="events listed")
    lookupd.stop()
    lookupd.start()  # same ports, empty memory
    registered.call(registered.broker.create_channel, "later", "c")
    wait_for(lambda: _listed(lookupd, "events", registered), 30,
             message="pynsqd to register again with the restarted nsqlookupd")
    wait_for(lambda: _listed(lookupd, "later", registered), 30, message="later listed")
    wait_for(lambda: "spark" in lookupd.channels("events"), 30,
             message="events/spark registered again")


def test_nsq_tail_reads_from_pynsqd_found_through_lookupd(lookupd, registered):
    tail = nsq_binary("nsq_tail")
    sent = [f"tail-{i}" for i in range(5)]
    registered.call(registered.broker.multi_publish, "logs", [s.encode() for s in sent])
    wait_for(lambda: _listed(lookupd, "logs", registered), 30, message="logs listed")
    out = subprocess.run([tail, "--lookupd-http-address", lookupd.http_address,
                          "--topic", "logs", "--channel", "tail", "-n", str(len(sent))],
                         capture_output=True, timeout=120, check=True)
    assert sorted(out.stdout.decode().split()) == sorted(sent)


def test_pynsq_reader_with_lookupd_http_addresses_reads_from_pynsqd(lookupd, registered):
    sent = [f"msg-{i}" for i in range(7)]
    registered.call(registered.broker.multi_publish, "orders", [s.encode() for s in sent])
    wait_for(lambda: _listed(lookupd, "orders", registered), 30, message="orders listed")
    out = subprocess.run([sys.executable, str(CLIENTS / "pynsq_lookupd_reader.py"),
                          lookupd.http_address, "orders", "reader", str(len(sent))],
                         capture_output=True, timeout=120, check=True)
    assert sorted(json.loads(out.stdout)) == sorted(sent)


def test_pings_keep_pynsqd_listed_past_nsqlookupds_inactive_producer_timeout(monkeypatch):
    """nsqlookupd lists only producers heard from within ``--inactive-producer-timeout``;
    an idle broker's PINGs keep it listed."""
    monkeypatch.setattr(lookupd_module, "NSQD_TIMING", Timing(ping_interval=0.2))
    daemon = Lookupd("--inactive-producer-timeout", "1s").start()
    try:
        with EmbeddedBroker(lookupd_tcp_address=(daemon.tcp_address,),
                            broadcast_address="127.0.0.1") as broker:
            broker.call(broker.broker.create_channel, "idle", "c")
            wait_for(lambda: _listed(daemon, "idle", broker), 30, message="idle listed")
            deadline = time.monotonic() + 3    # three inactive-producer timeouts
            while time.monotonic() < deadline:
                assert _listed(daemon, "idle", broker), "pynsqd left nsqlookupd while idle"
                time.sleep(0.1)
    finally:
        daemon.stop()


def test_a_stop_that_arrives_as_the_connection_completes_ends_the_registration():
    """The stop (a cancel) lands in the loop turn in which nsqlookupd accepted the
    connection, before the broker's side has seen it complete. Python 3.11's
    ``asyncio.wait_for`` returned the connection and dropped the cancel, and the
    registration loop went on reconnecting forever: a broker's stop never ended."""
    from broker.core import Broker
    from broker.lookupd import LookupdPeer

    async def stop_as_it_connects() -> str:
        peer: LookupdPeer | None = None

        def accepted(_reader, writer) -> None:
            asyncio.get_running_loop().call_soon(peer._task.cancel)
            writer.close()

        server = await asyncio.start_server(accepted, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]

        async def sleep(_delay: float) -> None:
            await asyncio.sleep(0)

        peer = LookupdPeer(f"127.0.0.1:{port}", Broker(Options()), dict, Timing(sleep=sleep))
        peer.start()
        try:
            await asyncio.wait({peer._task}, timeout=5)
            return "ended" if peer._task.done() else "still running 5 s after the stop"
        finally:
            peer._task.cancel()
            server.close()

    for _ in range(5):
        assert asyncio.run(stop_as_it_connects()) == "ended"


def test_the_broker_waits_with_asyncio_timeout_never_wait_for():
    """Every timed wait in the broker is ``asyncio.timeout``: on Python 3.11
    ``asyncio.wait_for`` drops a cancel that arrives as what it waits for completes
    (above: a stop that never ended), so none is left to come back by habit."""
    root = Path(__file__).parent.parent
    found = [f"{path.relative_to(root)}:{n}"
             for folder in ("broker", "spark_connector")
             for path in sorted((root / folder).rglob("*.py"))
             for n, line in enumerate(path.read_text().splitlines(), 1)
             if "asyncio.wait_for(" in line]
    assert found == []
