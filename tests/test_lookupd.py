"""Registration with the real nsqlookupd (lookup protocol V1), and NSQ's clients
finding pynsqd through it. The wire functions are checked byte by byte first."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from broker import EmbeddedBroker
from broker.lookupd import (identify_command, parse_response, register_command,
                            unregister_command)
from broker.options import Options

from .helpers import wait_for
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
            wait_for(lambda: _listed(lookupd, "early", broker), 30, message="early listed")
            assert "c" in lookupd.channels("early")
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
    assert "spark" in lookupd.channels("events")


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
