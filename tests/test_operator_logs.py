"""What an operator reads: pynsqd's first log line says what runs (version, config file,
storage mode); an error at start is the broker's own line, naming the flag at fault,
with no third-party line before it; `pynsqd --help` is grouped as an operator looks for
things; `pynsq` describes its positionals; a restart says it restores what it had."""

from __future__ import annotations

import json
import logging
import socket
import struct
import subprocess

from broker import Broker, Client, EmbeddedBroker, Options, __version__
from broker.clock import ManualClock
from broker.storage import DiskStore
from broker.cli import build_parser as cli_parser
from broker.daemon import HELP_GROUPS, IGNORED_GROUP, build_parser

from .helpers import Daemon, bin_path, wait_for

PREFIX = "[pynsqd] "


def pynsqd(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([bin_path("pynsqd"), "--tcp-address", "", "--http-address", "",
                           *args], capture_output=True, text=True, timeout=60)


def test_the_first_line_says_version_config_file_and_durable_storage(tmp_path):
    config = tmp_path / "pynsqd.toml"
    config.write_text(subprocess.run([bin_path("pynsqd"), "--print-config"], check=True,
                                     capture_output=True, text=True).stdout)
    daemon = Daemon("--config", str(config), "--data-path", str(tmp_path / "data"),
                    "--sync-every", "100").wait_ready()
    assert daemon.stop() == 0
    first = daemon.output().splitlines()[0]
    assert f"pynsqd {__version__}; config file: {config}; storage: durable in " \
           f"{tmp_path / 'data'} (fsync every 100 messages or 2s)" in first


def test_the_first_line_says_memory_only_without_a_data_path():
    daemon = Daemon().wait_ready()
    assert daemon.stop() == 0
    first = daemon.output().splitlines()[0]
    assert "config file: none" in first and "storage: memory only" in first


def test_a_grpc_port_in_use_is_one_line_of_the_brokers_own_naming_the_flag():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = "127.0.0.1:%d" % taken.getsockname()[1]
        result = pynsqd("--grpc-address", address)
    assert result.returncode == 1
    lines = result.stderr.splitlines()
    assert all(line.startswith(PREFIX) for line in lines), lines  # gRPC's E... line is not
    errors = [line for line in lines if " ERROR: " in line]
    assert len(errors) == 1 and f"cannot listen on {address} (gRPC, --grpc-address)" in errors[0]


def test_a_data_path_that_is_a_file_is_refused_naming_the_flag(tmp_path):
    (tmp_path / "data").write_text("")
    result = pynsqd("--grpc-address", "127.0.0.1:0", "--data-path", str(tmp_path / "data"))
    assert result.returncode == 1
    assert (f"ERROR: --data-path {tmp_path / 'data'}: is a file; it must be a directory"
            in result.stderr)
    assert "Errno" not in result.stderr


def test_a_missing_config_file_is_refused_naming_the_flag(tmp_path):
    result = pynsqd("--config", str(tmp_path / "nope.toml"))
    assert result.returncode == 2
    assert f"--config {tmp_path / 'nope.toml'}: No such file or directory" in result.stderr


def test_help_is_grouped_listeners_first_and_nsqds_ignored_options_last():
    text = build_parser().format_help()
    titles = [line[:-1] for line in text.splitlines() if line and not line[0].isspace()
              and line.endswith(":") and not line.startswith("usage")]
    assert titles == ["options", *HELP_GROUPS, IGNORED_GROUP]
    ignored = text[text.index(IGNORED_GROUP):]
    for flag in ("--deflate", "--snappy", "--max-channel-consumers", "--statsd-mem-stats"):
        assert flag in ignored
    listeners = text[text.index("\nlisteners:"):text.index("\nstorage:")]
    assert "--grpc-address" in listeners and "--data-path" not in listeners


def test_every_option_is_in_the_help_once():
    from broker.options import option_flag, option_help

    text = build_parser().format_help()
    for name in option_help():
        assert text.count(f"  {option_flag(name)} ") + text.count(f"  {option_flag(name)}\n") \
            + text.count(f"  {option_flag(name)},") >= 1, name


def test_pub_help_describes_its_positionals(capsys):
    sub = cli_parser()._subparsers._group_actions[0].choices
    for command, positionals in {"pub": ("topic", "body"), "tail": ("topic",),
                                 "topic": ("action", "topic"),
                                 "channel": ("action", "topic", "channel")}.items():
        helps = {a.dest: a.help for a in sub[command]._actions if not a.option_strings}
        for name in positionals:
            assert helps[name], f"pynsq {command}: {name} has no help"


def test_a_restart_logs_its_topics_and_channels_as_restored_not_created(tmp_path):
    data = str(tmp_path / "data")
    first = Daemon("--data-path", data).wait_ready()
    client = Client(first.address)
    try:
        client.create_channel("events", "spark")
        client.publish("events", b"hello")
    finally:
        client.close()
    assert first.stop() == 0
    assert "TOPIC(events): created" in first.output()

    again = Daemon("--data-path", data).wait_ready()
    assert again.stop() == 0
    lines = again.output().splitlines()
    assert any(line.endswith("TOPIC(events): restored") for line in lines), lines
    assert any(line.endswith("CHANNEL(events/spark): restored") for line in lines), lines
    assert not any(": created" in line for line in lines), lines


def test_a_restored_topic_and_channel_are_still_announced_to_listeners_as_made(tmp_path):
    """What nsqlookupd hears at a restart is what it heard before: topics and channels
    made (it registers them); only the log says they were restored."""
    def start() -> Broker:
        opts = Options(data_path=str(tmp_path / "data"))
        broker = Broker(opts, clock=ManualClock())
        broker.storage = DiskStore(broker, opts)
        broker.listeners.append(lambda event, topic, channel: heard.append((event, topic, channel)))
        broker.storage.recover()
        return broker

    heard: list = []
    broker = start()
    broker.create_channel("events", "spark")
    broker.storage.close()
    heard.clear()
    start().storage.close()
    assert heard == [("topic_created", "events", None), ("channel_created", "events", "spark")]


def test_a_tcp_client_is_named_by_its_address_in_every_line_and_its_client_id_said_once(caplog):
    """An operator follows one client through the log by one name: the address it
    connected from, from `new client` to `gone`; IDENTIFY's client_id is said once, on
    the line that says it identified."""
    caplog.set_level(logging.INFO, logger="pynsqd")
    body = json.dumps({"client_id": "worker-7", "hostname": "box-7"}).encode()
    with EmbeddedBroker() as broker:
        host, port = broker.tcp_address.rsplit(":", 1)
        with socket.create_connection((host, int(port))) as sock:
            name = "%s:%d" % sock.getsockname()
            sock.sendall(b"  V2IDENTIFY\n" + struct.pack(">i", len(body)) + body)
            assert sock.recv(64).endswith(b"OK")
            sock.sendall(b"SUB events nsq\n")
            assert sock.recv(64).endswith(b"OK")
        wait_for(lambda: any("gone" in r.getMessage() for r in caplog.records), 10)
    about = [r.getMessage() for r in caplog.records
             if name in r.getMessage() or "worker-7" in r.getMessage()]
    assert all(name in line for line in about), about
    assert [line for line in about if line.startswith("TCP:")] == [
        f"TCP: new client({name})",
        f"TCP: client({name}): identified as client_id worker-7",
        f"TCP: client({name}) gone"], about
