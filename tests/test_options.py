"""The broker's options as users write them: nsqd's names and defaults,
durations such as ``500ms`` or ``1h``, a TOML file, and clear errors naming the
option. (The daemon's flags are exercised end to end in ``test_daemon.py``.)"""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path

import pytest

from broker import Options
from broker.options import parse_duration_ms

SHIPPED_CONFIG = Path(__file__).parent.parent / "conf" / "pynsqd.toml"


@pytest.mark.parametrize("text, ms", [
    ("500ms", 500), ("60s", 60_000), ("15m", 900_000), ("1h", 3_600_000),
    ("1.5s", 1_500), ("250", 250), (750, 750),
])
def test_durations_accept_milliseconds_seconds_minutes_and_hours(text, ms):
    assert parse_duration_ms(text) == ms
    assert Options(max_req_timeout=text).max_req_timeout == ms


@pytest.mark.parametrize("text", ["soon", "5x", "-1s", "", "1 h 2", "ms"])
def test_a_malformed_duration_is_refused_naming_the_option(text):
    with pytest.raises(ValueError, match=f"msg-timeout: expected a duration .*got {text!r}"):
        Options(msg_timeout=text)


def test_defaults_are_nsqds_and_listeners_are_on_loopback():
    o = Options()
    assert (o.grpc_address, o.tcp_address, o.http_address) == (
        "127.0.0.1:4170", "127.0.0.1:4150", "127.0.0.1:4151")
    assert (o.mem_queue_size, o.max_msg_size, o.max_rdy_count) == (10_000, 1024 * 1024, 2500)
    assert (o.msg_timeout, o.max_msg_timeout, o.max_req_timeout) == (
        60_000, 15 * 60_000, 60 * 60_000)
    assert (o.max_bytes_per_file, o.sync_every, o.sync_timeout) == (104_857_600, 2500, 2000)
    assert (o.data_path, o.log_level) == ("", "info")


def test_the_shipped_config_file_lists_every_option_at_its_default():
    keys = set(tomllib.loads(SHIPPED_CONFIG.read_text()))
    assert keys == {f.name for f in dataclasses.fields(Options)}
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
    ("mem_queue_sise = 5\n", "unknown option 'mem_queue_sise'"),
    ('max_msg_size = "big"\n', "max_msg_size: expected a whole number, got 'big'"),
    ("grpc_address = 4170\n", "grpc_address: expected a string, got 4170"),
    ('msg_timeout = "soon"\n', "msg-timeout: expected a duration"),
    ("msg_timeout = true\n", "msg-timeout: expected a duration such as '60s', got True"),
    ("msg_timeout = \n", "pynsqd.toml"),
], ids=["unknown key", "text for a number", "number for text", "bad duration", "boolean duration",
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
    assert getattr(Options(**{name: 0}), name) == 0


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
