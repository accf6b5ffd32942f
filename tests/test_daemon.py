"""`pynsqd` as users run it: flags, TOML, signals, and clear errors."""

from __future__ import annotations

import signal
import subprocess

import pytest

from broker import Client

from .helpers import Daemon, bin_path, free_port, wait_for


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


def test_a_sigterm_while_the_data_path_is_restored_stops_the_broker_cleanly_once_started(
        tmp_path):
    """A stop asked for while the broker starts (restoring a data path can take seconds)
    is a clean stop (exit 0, what it holds written), never the signal's default action;
    and nothing is lost by it."""
    import threading

    data = str(tmp_path / "data")
    first = Daemon("--data-path", data).wait_ready()
    with Client(first.address) as client:
        client.create_channel("kept", "c")
        for i in range(20):
            client.multi_publish("kept", [b"%d" % (i * 1000 + j) for j in range(1000)])
    assert first.stop() == 0

    for _ in range(3):
        d = Daemon("--data-path", data)
        lines: list[str] = []

        def read(proc=d.proc, lines=lines) -> None:
            for line in proc.stdout:
                lines.append(line.decode(errors="replace"))
                if "restored" in lines[-1]:   # still starting: its servers come next
                    proc.send_signal(signal.SIGTERM)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        assert d.proc.wait(60) == 0, "".join(lines)
        reader.join(10)
        assert any("restored 1 topic(s) and 20000 pending" in line for line in lines), lines
        assert any("signal received: shutting down" in line for line in lines), lines

    again = Daemon("--data-path", data).wait_ready()
    try:
        with Client(again.address) as client:
            assert client.stats().topics[0].channels[0].depth == 20_000
    finally:
        assert again.stop() == 0


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


def pynsqd(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([bin_path("pynsqd"), *args], capture_output=True, text=True,
                          timeout=30)


@pytest.mark.parametrize("args, text", [
    (("--tcp-address", "127.0.0.1:99999"), "tcp-address: expected host:port with a port from "
                                           "0 to 65535 (an IPv6 host in brackets: [::1]:4150), "
                                           "got '127.0.0.1:99999'"),
    (("--msg-timeout", "30"), "msg-timeout: expected a duration such as '60s', '1m30s' or "
                              "'500ms', got '30' (a unit is required: '30s' or '30ms'?)"),
    (("--max-rdy-count", "many"), "argument --max-rdy-count: invalid int value: 'many'"),
    (("--tcp-adress", "x"), "unrecognized arguments: --tcp-adress x (did you mean "
                            "'--tcp-address'?)"),
    (("--max-channel-consumers", "10"), "max-channel-consumers: only 0 is supported (pynsqd "
                                        "does not limit consumers per channel)"),
    (("--config", "no/such/file.toml"), "no/such/file.toml: No such file or directory"),
    (("--statsd-mem-stats",), "statsd-mem-stats: only 'false' is supported"),
])
def test_usage_and_value_errors_are_one_line_with_exit_code_2(args, text):
    result = pynsqd(*args)
    assert result.returncode == 2, result.stderr
    assert text in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "usage:" not in result.stderr and "Traceback" not in result.stderr


def test_durations_take_gos_forms(daemons):
    d = daemons("--msg-timeout", "1m30s", "--max-msg-timeout", "1.5h",
                "--max-req-timeout", "2h45m").wait_ready()
    i = info(d.address)
    assert (i.msg_timeout_ms, i.max_msg_timeout_ms, i.max_req_timeout_ms) == (
        90_000, 5_400_000, 9_900_000)


def test_nsqds_single_dash_flags_are_accepted(daemons):
    d = daemons("-msg-timeout=1m30s", "-max-rdy-count", "77").wait_ready()
    i = info(d.address)
    assert (i.msg_timeout_ms, i.max_rdy_count) == (90_000, 77)


def test_an_nsqd_config_file_starts_the_daemon(daemons, tmp_path):
    """nsqd's own key names, and nsqd-only options at nsqd's values."""
    config = tmp_path / "nsqd.cfg"
    config.write_text('nsqlookupd_tcp_addresses = []\nmsg_timeout = "1m30s"\n'
                      'max_heartbeat_interval = "60s"\nmax_channel_consumers = 0\n'
                      'e2e_processing_latency_percentiles = []\nlog_prefix = "[nsqd] "\n')
    d = daemons("--config", str(config)).wait_ready()
    assert info(d.address).msg_timeout_ms == 90_000
    d.stop()
    assert "[nsqd] " in d.output()


def test_help_shows_defaults_in_the_units_users_write():
    out = " ".join(pynsqd("--help").stdout.split())
    assert "in-flight timeout of a message (default: 60s)" in out
    assert "(default: 15m)" in out and "(default: 1h)" in out and "(default: 2s)" in out
    assert "ms'" not in out and "(default: '')" not in out and "(default: hostname)" not in out


def test_version_is_printed():
    result = pynsqd("--version")
    assert result.returncode == 0 and result.stdout.startswith("pynsqd ")


def test_operators_see_clients_topics_channels_and_admin_actions_in_the_info_log(caplog):
    """nsqd's INFO lines: a line per client, per topic/channel change and per admin
    action, whatever the protocol, and none per message."""
    import logging
    import socket

    from broker import EmbeddedBroker

    caplog.set_level(logging.INFO, logger="pynsqd")
    with EmbeddedBroker() as broker, Client(broker.address) as client:
        client.create_channel("events", "archive")
        with client.subscribe("events", "spark", rdy=100) as sub:
            client.multi_publish("events", [b"x"] * 200)
            for _ in range(200):
                sub.fin(sub.get(10).id)
        host, port = broker.tcp_address.rsplit(":", 1)
        with socket.create_connection((host, int(port))) as tcp:
            tcp.sendall(b"  V2SUB events nsq\n")
            tcp.recv(64)
        client.admin("channel", "pause", "events", "archive")
        client.admin("channel", "empty", "events", "archive")
        client.admin("topic", "pause", "events")
        client.admin("channel", "delete", "events", "archive")
        client.admin("topic", "delete", "events")
        wait_for(lambda: "TCP: client(" in caplog.text, message="the TCP client's exit")
    lines = [r.getMessage() for r in caplog.records if r.name == "pynsqd"]
    text = "\n".join(lines)
    for expected in ("TOPIC(events): created", "CHANNEL(events/archive): created",
                     "CHANNEL(events/spark): created", "CHANNEL(events/nsq): created",
                     "subscribed to events/spark", "left events/spark (0 in flight requeued)",
                     "TCP: new client(127.0.0.1:", "subscribed to events/nsq",
                     "CHANNEL(events/archive): pausing", "CHANNEL(events/archive): emptying",
                     "TOPIC(events): pausing", "CHANNEL(events/archive): deleted",
                     "TOPIC(events): deleted"):
        assert expected in text, expected
    assert "CLIENT(grpc " in text and "CLIENT(V2 " in text
    assert len(lines) < 40, text  # 200 messages published and FINed: no line of their own


# -- pynsqd's entry point in this process (broker.daemon:main), so that a mutation run
# sees which tests reach it; the tests above run the console script.
def run_pynsqd(*args: str, while_serving=None) -> tuple[int, object]:
    """``pynsqd ARGS`` in-process: once it is serving (it logged its event loop, after its
    start), ``while_serving()`` runs in a thread and SIGTERM follows. The exit code, and
    what ``while_serving`` returned. The process's signal handlers, garbage-collector
    thresholds, frozen objects and open-file limit are put back after."""
    import gc
    import logging
    import os
    import resource
    import threading

    from broker.daemon import main

    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    thresholds, nofile = gc.get_threshold(), resource.getrlimit(resource.RLIMIT_NOFILE)
    seen: dict = {}
    finished, started = threading.Event(), threading.Event()

    class Started(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.getMessage().startswith("event loop: "):
                started.set()

    watcher, logger = Started(), logging.getLogger("pynsqd")
    level = logger.level
    logger.addHandler(watcher)
    logger.setLevel(min(logger.getEffectiveLevel(), logging.INFO))  # the line it waits for

    def serving() -> None:
        try:
            wait_for(lambda: finished.is_set() or started.is_set(), 30,
                     message="pynsqd to serve")
            if finished.is_set():
                return
            seen["result"] = while_serving()
        except BaseException as err:  # noqa: BLE001 - reported by the test
            seen["error"] = err
        os.kill(os.getpid(), signal.SIGTERM)

    helper = threading.Thread(target=serving, daemon=True)
    if while_serving is not None:
        helper.start()
    try:
        code = main(list(args))
    finally:
        finished.set()
        logger.removeHandler(watcher)
        logger.setLevel(level)
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        gc.set_threshold(*thresholds)
        gc.unfreeze()
        resource.setrlimit(resource.RLIMIT_NOFILE, nofile)
    if while_serving is not None:
        helper.join(30)
    if "error" in seen:
        raise seen["error"]
    return code, seen.get("result")


def test_pynsqd_in_process_serves_with_nsqds_flags_until_sigterm_and_exits_0(caplog):
    import logging
    import resource

    caplog.set_level(logging.INFO, logger="pynsqd")
    address = f"127.0.0.1:{free_port()}"

    def use() -> tuple:
        with Client(address) as client:
            msg_id = client.publish("events", b"hello")
            return client.info().msg_timeout_ms, client.info().max_rdy_count, msg_id

    code, (msg_timeout_ms, max_rdy_count, msg_id) = run_pynsqd(
        "-grpc-address", address, "--tcp-address", "127.0.0.1:0", "--http-address",
        "127.0.0.1:0", "-msg-timeout=1m30s", "-max-rdy-count", "77", "--event-loop", "asyncio",
        while_serving=use)
    assert code == 0
    assert (msg_timeout_ms, max_rdy_count) == (90_000, 77) and msg_id
    lines = [r.getMessage() for r in caplog.records if r.name == "pynsqd"]
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY:
        assert f"open-file limit: {hard}" in lines
    assert "event loop: asyncio" in lines
    assert "signal received: shutting down" in lines


def test_pynsqd_in_process_names_an_address_in_use_and_exits_1(caplog):
    import logging
    import socket

    caplog.set_level(logging.INFO, logger="pynsqd")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        address = f"127.0.0.1:{busy.getsockname()[1]}"
        code, _ = run_pynsqd("--grpc-address", address, "--tcp-address", "127.0.0.1:0",
                             "--http-address", "127.0.0.1:0")
    assert code == 1
    errors = [r.getMessage() for r in caplog.records
              if r.levelname == "ERROR" and r.name == "pynsqd"]
    assert errors and errors[-1].startswith(f"cannot listen on {address}"), errors


def test_pynsqd_in_process_with_two_workers_runs_the_supervisor_which_names_a_port_in_use(
        caplog):
    """--workers 2 starts the supervisor (one broker per worker), whose shared port in use
    is named with its kind; a single broker would name it without."""
    import logging
    import socket

    caplog.set_level(logging.INFO, logger="pynsqd")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        address = f"127.0.0.1:{busy.getsockname()[1]}"
        code, _ = run_pynsqd("--workers", "2", "--grpc-address", f"127.0.0.1:{free_port()}",
                             "--tcp-address", address, "--http-address",
                             f"127.0.0.1:{free_port()}")
    assert code == 1
    errors = [r.getMessage() for r in caplog.records
              if r.levelname == "ERROR" and r.name == "pynsqd"]
    assert any(f"cannot listen on {address} (tcp)" in e for e in errors), errors


def test_the_open_file_limit_is_raised_to_the_hard_limit():
    import resource

    from broker.daemon import raise_open_file_limit

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, 256), hard))
    try:
        expected = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        assert raise_open_file_limit() == expected
        assert resource.getrlimit(resource.RLIMIT_NOFILE) == (expected, hard)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_with_no_hard_open_file_limit_a_million_is_asked_for(monkeypatch):
    """A stand-in for the kernel's limits: this machine's hard limit may not be infinite."""
    import resource

    from broker.daemon import raise_open_file_limit

    asked = []
    monkeypatch.setattr(resource, "getrlimit", lambda _: (1024, resource.RLIM_INFINITY))
    monkeypatch.setattr(resource, "setrlimit", lambda which, limits: asked.append(limits))
    assert raise_open_file_limit() == 1 << 20
    assert asked == [(1 << 20, resource.RLIM_INFINITY)]


def test_an_open_file_limit_that_cannot_be_raised_is_logged_and_the_start_goes_on(
        monkeypatch, caplog):
    """A stand-in for a kernel that refuses (a container's limit)."""
    import errno
    import logging
    import os
    import resource

    from broker.daemon import raise_open_file_limit

    def refuse(which, limits):
        raise OSError(errno.EPERM, os.strerror(errno.EPERM))

    monkeypatch.setattr(resource, "getrlimit", lambda _: (1024, 4096))
    monkeypatch.setattr(resource, "setrlimit", refuse)
    caplog.set_level(logging.WARNING, logger="pynsqd")
    assert raise_open_file_limit() == 1024
    assert [r.getMessage() for r in caplog.records] == [
        "cannot raise the open-file limit from 1024 to 4096: [Errno 1] Operation not permitted"]


def test_a_serving_pynsqds_full_collections_do_not_trace_what_start_up_made():
    """Start-up's objects (modules, gRPC's and protobuf's tables: tens of thousands,
    tens of ms per full collection) are out of the collector's generations while
    pynsqd serves; what the broker itself makes, its messages, is still collected."""
    import gc

    address = f"127.0.0.1:{free_port()}"

    def tracked() -> tuple[int, int, int]:
        with Client(address) as client:
            client.multi_publish("events", [b"x"] * 100)
        gc.collect()
        # This process is pytest's too: what start-up froze includes the test run's own.
        return len(gc.get_objects()), gc.get_freeze_count(), len(gc.get_objects(2))

    gc.collect()
    before = len(gc.get_objects())
    code, (tracked_while_serving, frozen, _) = run_pynsqd(
        "--grpc-address", address, "--tcp-address", "", "--http-address", "",
        while_serving=tracked)
    assert code == 0
    assert frozen >= before > 20_000
    assert tracked_while_serving < 10_000 < before


def test_full_garbage_collections_are_made_rarer_and_young_ones_wait_for_read_aheads():
    import gc

    from broker.backlog import READ_AHEAD
    from broker.daemon import tune_garbage_collector

    saved = gc.get_threshold()
    try:
        tune_garbage_collector()
        young, middle, old = gc.get_threshold()
        assert old == 1000
        # A few read-aheads of messages fit between young collections; the middle
        # generation still holds about what the defaults let it (700 times 10).
        assert young >= 2 * READ_AHEAD and 5_000 <= young * (middle + 1) <= 10_000
    finally:
        gc.set_threshold(*saved)
