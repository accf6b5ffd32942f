"""The broker's options as users write them: nsqd's names and defaults,
durations such as ``500ms`` or ``1h``, a TOML file, and clear errors naming the
option. (The daemon's flags are exercised end to end in ``test_daemon.py``.)"""

from __future__ import annotations

import dataclasses
import re
import tomllib
from pathlib import Path

import pytest

from broker import Options
from broker.options import parse_duration_ms

SHIPPED_CONFIG = Path(__file__).parent.parent / "conf" / "pynsqd.toml"


@pytest.mark.parametrize("text, ms", [
    ("500ms", 500), ("60s", 60_000), ("15m", 900_000), ("1h", 3_600_000),
    ("1.5s", 1_500), ("1m30s", 90_000), ("1.5h", 5_400_000), ("2h45m10s", 9_910_000),
    ("300us", 0), ("1500us", 2), ("2000000ns", 2), (".5s", 500), ("0", 0), (750, 750),
])
def test_durations_are_read_as_go_and_nsqd_read_them(text, ms):
    assert parse_duration_ms(text) == ms
    if ms:
        assert Options(max_req_timeout=text).max_req_timeout == ms


@pytest.mark.parametrize("text", ["soon", "5x", "-1s", "", "1 h 2", "ms", "30", "1.5", "1h 30m"])
def test_a_malformed_duration_is_refused_naming_the_option(text):
    with pytest.raises(ValueError, match=f"msg-timeout: expected a duration .*got {text!r}"):
        Options(msg_timeout=text)


def test_a_duration_without_a_unit_is_refused_with_the_units_to_choose_from():
    """nsqd refuses ``--msg-timeout 30``; taking it as 30 ms would be a silent surprise."""
    with pytest.raises(ValueError, match=r"a unit is required: '30s' or '30ms'\?"):
        Options(msg_timeout="30")


@pytest.mark.parametrize("ms, text", [(60_000, "60s"), (900_000, "15m"), (3_600_000, "1h"),
                                      (2_000, "2s"), (250, "250ms"), (90_000, "90s")])
def test_a_duration_is_shown_in_the_unit_a_user_writes(ms, text):
    from broker.options import format_duration

    assert format_duration(ms) == text
    assert parse_duration_ms(text) == ms


def test_defaults_are_nsqds_and_listeners_are_on_loopback():
    o = Options()
    assert (o.grpc_address, o.tcp_address, o.http_address) == (
        "127.0.0.1:4170", "127.0.0.1:4150", "127.0.0.1:4151")
    assert (o.mem_queue_size, o.max_msg_size, o.max_rdy_count) == (10_000, 1024 * 1024, 2500)
    assert (o.msg_timeout, o.max_msg_timeout, o.max_req_timeout) == (
        60_000, 15 * 60_000, 60 * 60_000)
    assert (o.max_bytes_per_file, o.sync_every, o.sync_timeout) == (104_857_600, 2500, 2000)
    assert (o.data_path, o.log_level) == ("", "info")


def test_the_shipped_config_file_lists_every_option_at_its_default_under_nsqds_key():
    from broker.options import option_aliases

    keys = {option_aliases().get(k, k) for k in tomllib.loads(SHIPPED_CONFIG.read_text())}
    assert keys == {f.name for f in dataclasses.fields(Options)}
    assert "nsqlookupd_tcp_addresses" in SHIPPED_CONFIG.read_text()
    assert Options.from_toml(SHIPPED_CONFIG) == Options()


def test_a_toml_file_sets_options_and_its_durations(tmp_path):
    path = tmp_path / "pynsqd.toml"
    path.write_text('msg_timeout = "500ms"\nmax_req_timeout = "1h"\nsync_timeout = "250ms"\n'
                    'max_msg_timeout = 120000\nmem_queue_size = 7\nlog_level = "debug"\n')
    o = Options.from_toml(path)
    assert (o.msg_timeout, o.max_req_timeout, o.sync_timeout, o.max_msg_timeout) == (
        500, 3_600_000, 250, 120_000)
    assert (o.mem_queue_size, o.log_level, o.max_rdy_count) == (7, "debug", 2500)


def test_values_given_over_the_file_override_it(tmp_path):
    path = tmp_path / "pynsqd.toml"
    path.write_text('msg_timeout = "30s"\nmax_rdy_count = 10\n')
    o = Options.from_toml(path, msg_timeout="500ms")
    assert (o.msg_timeout, o.max_rdy_count) == (500, 10)


@pytest.mark.parametrize("content, message", [
    ("mem_queue_sise = 5\n", "unknown option 'mem_queue_sise' .did you mean 'mem_queue_size'"),
    ("nsqlookupd_tcp_address = []\n",
     "unknown option 'nsqlookupd_tcp_address' .did you mean 'nsqlookupd_tcp_addresses'"),
    ('max_msg_size = "big"\n', "max_msg_size: expected a whole number, got 'big'"),
    ("grpc_address = 4170\n", "grpc_address: expected a string, got 4170"),
    ('msg_timeout = "soon"\n', "msg-timeout: expected a duration"),
    ("msg_timeout = true\n", "msg-timeout: expected a duration such as '60s', got True"),
    ("msg_timeout = \n", "pynsqd.toml"),
], ids=["unknown key", "unknown nsqd-like key", "text for a number", "number for text",
        "bad duration", "boolean duration",
        "bad TOML"])
def test_a_bad_config_file_is_refused_naming_the_key(tmp_path, content, message):
    path = tmp_path / "pynsqd.toml"
    path.write_text(content)
    with pytest.raises(ValueError, match=message):
        Options.from_toml(path)


@pytest.mark.parametrize("name", ["mem_queue_size", "max_msg_size", "max_rdy_count",
                                  "sync_every", "max_bytes_per_file"])
def test_a_negative_count_is_refused_naming_the_option(name):
    flag = name.replace("_", "-")
    with pytest.raises(ValueError, match=f"^{flag} must not be negative$"):
        Options(**{name: -1})
    lowest = 1024 if name == "max_bytes_per_file" else 0   # a file holds a record at least
    assert getattr(Options(**{name: lowest}), name) == lowest


def test_msg_timeout_must_be_positive_and_within_max_msg_timeout():
    with pytest.raises(ValueError, match="^msg-timeout must be positive$"):
        Options(msg_timeout=0)
    with pytest.raises(ValueError, match="^msg-timeout must not exceed max-msg-timeout$"):
        Options(msg_timeout="16m")
    assert Options(msg_timeout="15m").msg_timeout == Options().max_msg_timeout
    assert Options(msg_timeout="1ms").msg_timeout == 1


def test_a_toml_key_may_also_be_spelled_as_its_flag(tmp_path):
    path = tmp_path / "pynsqd.toml"
    path.write_text('mem-queue-size = 5\nmsg-timeout = "2s"\n')
    o = Options.from_toml(path)
    assert (o.mem_queue_size, o.msg_timeout) == (5, 2000)


def test_every_option_is_a_flag_and_duration_flags_take_units():
    from broker.daemon import build_parser, options_from_args

    args = build_parser().parse_args(["--msg-timeout", "500ms", "--max-req-timeout", "1h",
                                      "--sync-timeout", "250ms", "--mem-queue-size", "7",
                                      "--grpc-address", "127.0.0.1:5000"])
    o = options_from_args(args)
    assert (o.msg_timeout, o.max_req_timeout, o.sync_timeout) == (500, 3_600_000, 250)
    assert (o.mem_queue_size, o.grpc_address) == (7, "127.0.0.1:5000")
    flags = {a.dest for a in build_parser()._actions}
    assert {f.name for f in dataclasses.fields(Options)} <= flags


@pytest.mark.parametrize("level", ["debug", "INFO", "warning", "error"])
def test_log_levels_are_accepted_in_any_case(level):
    assert Options(log_level=level).log_level == level


def test_an_unknown_event_loop_is_refused_naming_the_choices():
    with pytest.raises(ValueError, match="event-loop: expected asyncio, uvloop, auto, got 'fast'"):
        Options(event_loop="fast")


def test_an_unknown_log_level_is_refused_naming_it():
    with pytest.raises(ValueError, match="log-level: expected debug, info, warning or error, "
                                         "got 'loud'"):
        Options(log_level="loud")


def test_an_nsqd_config_file_is_read_under_nsqds_keys(tmp_path):
    """nsqd's own sample config keys: the list of lookupds, the node id, the
    percentiles left empty and the nsqd-only options at nsqd's values."""
    path = tmp_path / "nsqd.toml"
    path.write_text('nsqlookupd_tcp_addresses = ["127.0.0.1:4160", "10.0.0.2:4160"]\n'
                    'id = 7\nbroadcast_address = "10.0.0.1"\nbroadcast_tcp_port = 14150\n'
                    'e2e_processing_latency_percentiles = []\nmax_channel_consumers = 0\n'
                    'max_heartbeat_interval = "60s"\nmax_output_buffer_size = 65536\n'
                    'max_output_buffer_timeout = "30s"\nstatsd_exclude_ephemeral = true\n'
                    'msg_timeout = "1m30s"\nlog_prefix = "[nsqd] "\n')
    o = Options.from_toml(path)
    assert o.lookupd_tcp_address == ("127.0.0.1:4160", "10.0.0.2:4160")
    assert (o.node_id, o.broadcast_tcp_port, o.msg_timeout) == (7, 14150, 90_000)
    assert o.statsd_exclude_ephemeral is True and o.log_prefix == "[nsqd] "


def test_an_option_under_both_its_names_is_refused(tmp_path):
    path = tmp_path / "pynsqd.toml"
    path.write_text('nsqlookupd_tcp_addresses = ["a:1"]\nlookupd_tcp_address = ["b:2"]\n')
    with pytest.raises(ValueError, match="repeats an option given under another name"):
        Options.from_toml(path)


@pytest.mark.parametrize("name, value, why", [
    ("max_channel_consumers", 10, "does not limit consumers per channel"),
    ("max_heartbeat_interval", "2m", "caps it at 60s"),
    ("max_output_buffer_size", 1 << 20, "caps it at 64 KiB"),
    ("max_output_buffer_timeout", "1m", "caps it at 30s"),
    ("e2e_processing_latency_percentiles", ("0.99",), "p50, p95 and p99"),
    ("statsd_mem_stats", True, "no Go runtime"),
    ("deflate", True, "declines compression"),
    ("snappy", "true", "declines compression"),
])
def test_an_nsqd_option_pynsqd_does_not_implement_is_refused_saying_why(name, value, why):
    flag = name.replace("_", "-")
    with pytest.raises(ValueError, match=f"^{flag}: only .* is supported .*{why}"):
        Options(**{name: value})
    default = dataclasses.fields(Options)[[f.name for f in dataclasses.fields(Options)]
                                          .index(name)].default
    assert getattr(Options(**{name: default}), name) == default  # nsqd's value is fine


@pytest.mark.parametrize("address", ["127.0.0.1:99999", "127.0.0.1", "127.0.0.1:http", ""])
def test_a_listener_address_without_a_port_from_0_to_65535_is_refused(address):
    if not address:
        assert Options(tcp_address="").tcp_address == ""   # empty: off
        return
    with pytest.raises(ValueError, match=re.escape(
            f"tcp-address: expected host:port with a port from 0 to 65535 (an IPv6 host in "
            f"brackets: [::1]:4150), got {address!r}")):
        Options(tcp_address=address)


@pytest.mark.parametrize("value, expected", [("true", True), ("f", False), ("1", True),
                                             (False, False), ("FALSE", False)])
def test_boolean_options_read_gos_forms(value, expected):
    assert Options(statsd_exclude_ephemeral=value).statsd_exclude_ephemeral is expected


def test_statsd_exclude_ephemeral_leaves_ephemeral_topics_and_channels_out():
    from broker.statsd import statsd_lines

    from .corekit import new_broker

    broker, _ = new_broker()
    for topic, channel in (("t", "c"), ("t", "e#ephemeral"), ("x#ephemeral", "c")):
        broker.create_channel(topic, channel)
    every, _ = statsd_lines("p.", broker.stats(), {})
    kept, _ = statsd_lines("p.", broker.stats(), {}, exclude_ephemeral=True)
    assert any("#ephemeral" in line for line in every)
    assert kept and not any("#ephemeral" in line for line in kept)
    assert any(line.startswith("p.topic.t.channel.c.") for line in kept)


def test_broadcast_ports_are_what_is_registered_with_nsqlookupd():
    from broker.lookupd import LookupdRegistration

    from .corekit import new_broker

    listening = {"tcp": "0.0.0.0:4150", "http": "0.0.0.0:4151"}
    broker, _ = new_broker(broadcast_tcp_port=14150, broadcast_http_port=14151)
    assert (LookupdRegistration(broker, listening).peer_info()["tcp_port"],
            LookupdRegistration(broker, listening).peer_info()["http_port"]) == (14150, 14151)
    broker, _ = new_broker()
    info = LookupdRegistration(broker, listening).peer_info()
    assert (info["tcp_port"], info["http_port"]) == (4150, 4151)


def test_the_default_node_id_is_within_nsqds_range_and_differs_between_ports_of_one_host():
    """Message ids carry the node id in 10 bits (``--node-id`` 0 to 1023); brokers on
    one host listening on different ports differ unless 1024 ports apart."""
    o = Options()
    ids = [o.node_id_for(f"127.0.0.1:{port}") for port in range(65536)]
    assert min(ids) >= 0 and max(ids) <= 1023
    assert len(set(ids[4000:5024])) == 1024
    assert ids[4150] == ids[4150 + 1024]
    assert Options(node_id=7).node_id_for("127.0.0.1:4170") == 7


@pytest.mark.parametrize("name", ["grpc_address", "tcp_address", "http_address", "https_address"])
def test_a_bad_listener_address_is_refused_naming_its_flag(name):
    flag = name.replace("_", "-")
    with pytest.raises(ValueError, match=f"^{flag}: expected host:port"):
        Options(**{name: "127.0.0.1:http"})


@pytest.mark.parametrize("address, expected", [
    ("[::1]:4150", ("::1", 4150)), ("[fe80::1%eth0]:0", ("fe80::1%eth0", 0)),
    (":4150", ("", 4150)), ("localhost:4150", ("localhost", 4150)),
])
def test_a_listen_address_is_read_with_an_ipv6_host_in_brackets_or_no_host(address, expected):
    from broker.options import split_listen_address

    assert split_listen_address(address, "tcp-address") == expected
    assert Options(tcp_address=address).tcp_address == address


@pytest.mark.parametrize("address", ["statsd", "statsd:0", ":8125", "[::1]8125"])
def test_a_statsd_address_without_host_and_port_is_refused_naming_it(address):
    with pytest.raises(ValueError, match="^statsd-address: expected host:port"):
        Options(statsd_address=address)
    assert Options(statsd_address="[::1]:8125").statsd_address == "[::1]:8125"


def test_workers_are_a_count_or_auto_in_any_case():
    import os

    from broker.options import parse_workers

    cores = len(os.sched_getaffinity(0))
    assert [parse_workers(v) for v in (3, " 3 ", "1024", "auto", "AUTO", 0)] == [
        3, 3, 1024, cores, cores, cores]
    for value in ("many", "-1", True, "2.5"):
        with pytest.raises(ValueError, match=f"workers: expected a number of workers or auto, "
                                             f"got {re.escape(repr(value))}"):
            parse_workers(value)
    with pytest.raises(ValueError, match="workers: at most 1024 .one node id each., got 1025"):
        parse_workers(1025)


def test_a_config_file_that_cannot_be_read_is_refused_naming_it_and_why(tmp_path):
    path = tmp_path / "missing.toml"
    with pytest.raises(ValueError, match=f"^{re.escape(str(path))}: No such file or directory$"):
        Options.from_toml(path)


def test_every_option_has_a_help_line_and_a_fixed_one_says_why():
    from broker.options import option_help

    helps = option_help()
    assert set(helps) == {f.name for f in dataclasses.fields(Options)}
    assert all(help_ for _, help_, _ in helps.values())
    assert helps["msg_timeout"][0] == 60_000 and helps["msg_timeout"][2] is True
    assert helps["mem_queue_size"][2] is False
    assert "declines compression" in helps["deflate"][1]


@pytest.mark.parametrize("name, value, shown", [
    ("deflate", True, "'false'"), ("max_heartbeat_interval", "2m", "'60s'"),
    ("max_channel_consumers", 10, "0"),
])
def test_a_fixed_option_names_the_one_value_it_takes_as_a_flag_would_write_it(name, value, shown):
    flag = name.replace("_", "-")
    with pytest.raises(ValueError, match=f"^{flag}: only {shown} is supported "):
        Options(**{name: value})


@pytest.mark.parametrize("content, message", [
    ('statsd_exclude_ephemeral = "yes"\n',
     "statsd_exclude_ephemeral: expected true or false, got 'yes'"),
    ("nsqlookupd_tcp_addresses = [4160]\n",
     "nsqlookupd_tcp_addresses: expected a list of strings, got [4160]"),
    ('nsqlookupd_tcp_addresses = "127.0.0.1:4160"\n', None),
])
def test_a_config_file_value_of_the_wrong_kind_is_refused_naming_the_kind(tmp_path, content,
                                                                          message):
    path = tmp_path / "pynsqd.toml"
    path.write_text(content)
    if message is None:   # one string for a repeatable option: a list of one
        assert Options.from_toml(path).lookupd_tcp_address == ("127.0.0.1:4160",)
        return
    with pytest.raises(ValueError, match=f"pynsqd.toml: {re.escape(message)}$"):
        Options.from_toml(path)
