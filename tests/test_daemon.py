"""`pynsqd` as users run it: flags, TOML, signals, and clear errors."""

from __future__ import annotations

import signal
import subprocess

import pytest

from broker import Client

from .helpers import Daemon, bin_path


@pytest.fixture
def daemons():
    started: list[Daemon] = []

    def start(*args: str, port: int | None = None) -> Daemon:
        d = Daemon(*args, port=port)
        started.append(d)
        return d

    yield start
    for d in started:
        d.kill()


def info(address: str):
    with Client(address) as client:
        return client.info()


def test_flags_set_options_with_nsqd_names_and_durations(daemons):
    d = daemons("--msg-timeout", "500ms", "--max-rdy-count", "100", "--max-req-timeout", "1h",
                "--max-msg-timeout", "2m").wait_ready()
    i = info(d.address)
    assert (i.msg_timeout_ms, i.max_rdy_count, i.max_req_timeout_ms) == (500, 100, 3_600_000)
    assert i.max_msg_timeout_ms == 120_000 and i.max_msg_size == 1024 * 1024


def test_toml_config_is_read_with_its_durations_and_flags_override_it(daemons, tmp_path):
    config = tmp_path / "pynsqd.toml"
    config.write_text('max_msg_size = 2048\nmsg_timeout = "500ms"\nmax_rdy_count = 10\n'
                      'max_msg_timeout = "1h"\nmax_req_timeout = "30s"\n')
    d = daemons("--config", str(config), "--max-rdy-count", "20", "--max-req-timeout",
                "15m").wait_ready()
    i = info(d.address)
    assert (i.max_msg_size, i.msg_timeout_ms, i.max_rdy_count) == (2048, 500, 20)
    assert (i.max_msg_timeout_ms, i.max_req_timeout_ms) == (3_600_000, 900_000)


def test_the_shipped_config_file_starts_the_daemon(daemons):
    d = daemons("--config", "conf/pynsqd.toml").wait_ready()
    assert info(d.address).max_rdy_count == 2500


def test_an_unknown_config_key_is_refused_naming_it(tmp_path):
    config = tmp_path / "bad.toml"
    config.write_text("mem_queue_sise = 5\n")
    result = subprocess.run([bin_path("pynsqd"), "--config", str(config)], capture_output=True,
                            text=True, timeout=30)
    assert result.returncode == 2 and "unknown option 'mem_queue_sise'" in result.stderr


def test_a_bad_duration_is_refused_naming_the_option():
    result = subprocess.run([bin_path("pynsqd"), "--msg-timeout", "soon"], capture_output=True,
                            text=True, timeout=30)
    assert result.returncode == 2 and "msg-timeout" in result.stderr


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_shuts_down_cleanly(daemons, sig):
    d = daemons().wait_ready()
    assert d.stop(sig) == 0
    assert "shutting down" in d.output()


def test_log_level_error_leaves_info_lines_out(daemons):
    d = daemons("--log-level", "error").wait_ready()
    assert d.stop(signal.SIGTERM) == 0
    assert "shutting down" not in d.output()


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_the_daemon_serves_on_the_event_loop_it_is_given(daemons, loop):
    if loop == "uvloop":
        pytest.importorskip("uvloop")
    d = daemons("--event-loop", loop).wait_ready()
    with Client(d.address) as client:
        client.publish("t", b"on " + loop.encode())
        with client.subscribe("t", "ch", rdy=1) as sub:
            msg = sub.get(30)
            assert msg is not None and msg.body == b"on " + loop.encode()
            sub.fin(msg.id)
    assert d.stop(signal.SIGTERM) == 0
    assert f"event loop: {loop}" in d.output()


def test_a_port_in_use_is_a_clear_error(daemons):
    first = daemons().wait_ready()
    second = daemons(port=first.port)
    assert second.proc.wait(30) == 1
    assert f"cannot listen on {first.address}" in second.output()


def test_help_lists_every_option():
    out = subprocess.run([bin_path("pynsqd"), "--help"], capture_output=True, text=True,
                         timeout=30).stdout
    for flag in ("--grpc-address", "--mem-queue-size", "--msg-timeout", "--max-msg-timeout",
                 "--max-msg-size", "--max-req-timeout", "--max-rdy-count", "--sync-every",
                 "--sync-timeout", "--data-path", "--config"):
        assert flag in out


def test_default_address_is_loopback_4170():
    out = subprocess.run([bin_path("pynsqd"), "--help"], capture_output=True, text=True,
                         timeout=30).stdout
    assert "127.0.0.1:4170" in out
