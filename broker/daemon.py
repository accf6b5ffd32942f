"""``pynsqd``: the broker daemon.

    pynsqd                                    # gRPC on 127.0.0.1:4170, memory only
    pynsqd --print-config > pynsqd.toml       # every option, commented, at its default
    pynsqd --config pynsqd.toml               # options from TOML
    pynsqd --msg-timeout 30s --max-rdy-count 5000

Flags override the file, which overrides the defaults; nsqd's single-dash form
(``-tcp-address=...``) is accepted too. SIGINT or SIGTERM stops it cleanly.
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import gc
import logging
import re
import resource
import signal
import socket
import sys
from importlib import resources

from . import __version__
from .app import BrokerApp, new_event_loop
from .backlog import READ_AHEAD
from .cli import OneLineParser
from .options import (Options, format_duration, option_flag, option_help,
                      split_listen_address)
from .security.tls import exposure_warnings
from .storage import DataPathLocked


# `pynsqd --help` in the order an operator looks for things; nsqd's options that pynsqd
# takes only at one value come last. An option named nowhere here is shown under "other".
HELP_GROUPS = {
    "listeners": ("grpc_address", "tcp_address", "http_address", "https_address"),
    "storage": ("data_path", "mem_queue_size", "max_bytes_per_file", "sync_every",
                "sync_timeout", "max_disk_bytes", "max_memory_bytes"),
    "limits": ("msg_timeout", "max_msg_timeout", "max_req_timeout", "max_msg_size",
               "max_body_size", "max_rdy_count", "max_attempts", "dedupe_window",
               "dedupe_capacity", "max_connections", "max_connections_per_client",
               "max_grpc_connections", "max_topics", "max_channels_per_topic", "max_channels"),
    "security (TLS and NSQ's auth)": (
        "tls_cert", "tls_key", "tls_root_ca_file", "tls_client_auth_policy", "tls_required",
        "tls_min_version", "auth_http_addresses", "auth_http_request_method",
        "http_client_connect_timeout", "http_client_request_timeout", "http_allowed_hosts"),
    "fleet (nsqlookupd, statsd, every core)": (
        "lookupd_tcp_address", "broadcast_address", "broadcast_tcp_port",
        "broadcast_http_port", "node_id", "workers", "statsd_address", "statsd_prefix",
        "statsd_interval", "statsd_udp_packet_size", "statsd_exclude_ephemeral"),
    "process": ("log_level", "log_prefix", "event_loop"),
}
IGNORED_GROUP = "nsqd options pynsqd accepts at one value only (any other is refused, saying why)"


def _help_group(name: str) -> str:
    if Options.__dataclass_fields__[name].metadata.get("fixed"):
        return IGNORED_GROUP
    return next((group for group, names in HELP_GROUPS.items() if name in names), "other")


class PrintConfig(argparse.Action):
    """``--print-config``: the commented config file shipped in the package (the
    repository's ``conf/pynsqd.toml``), to start one's own from."""

    def __init__(self, option_strings, dest, **kwargs) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        sys.stdout.write(resources.files("broker").joinpath("pynsqd.toml").read_text())
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="pynsqd", description="pynsq broker daemon (NSQ's model, served over gRPC). "
        "Flags override the --config file, which overrides the defaults; durations are "
        "written as nsqd's (500ms, 60s, 1m30s, 1.5h).")
    parser.add_argument("--config", metavar="FILE", help="TOML file of options")
    parser.add_argument("--print-config", action=PrintConfig,
                        help="print a config file listing every option at its default, "
                             "commented, and exit (pynsqd --print-config > pynsqd.toml)")
    parser.add_argument("--version", action="version", version=f"pynsqd {__version__}")
    groups = {name: parser.add_argument_group(name)
              for name in [*HELP_GROUPS, "other", IGNORED_GROUP]}
    for name, (default, help_text, is_duration) in option_help().items():
        group = groups[_help_group(name)]
        help_text = help_text.replace("%", "%%")
        if isinstance(default, tuple):  # repeatable, one value per flag (--auth-http-address)
            group.add_argument(option_flag(name), dest=name, default=None, action="append",
                               help=help_text)
            continue
        if isinstance(default, bool):  # Go's: --flag, --flag=true, --flag=false
            group.add_argument(option_flag(name), dest=name, default=None, nargs="?",
                               const="true", metavar="true|false",
                               help=f"{help_text} (default: {str(default).lower()})")
            continue
        shown = format_duration(default) if is_duration else default
        if shown not in ("", None) and f"({shown}:" not in help_text:
            help_text += f" (default: {shown})".replace("%", "%%")
        metavar = ("DURATION" if is_duration else "HOST:PORT" if name.endswith("_address")
                   else "N" if isinstance(default, int) else None)
        group.add_argument(option_flag(name), dest=name, default=None,
                           type=str if is_duration or isinstance(default, str) else int,
                           metavar=metavar, help=help_text)
    return parser


def go_flags(argv: list[str]) -> list[str]:
    """nsqd's flags as Go writes them, ``-tcp-address=x`` or ``-tcp-address x``, in
    the double-dash form argparse reads (``-h`` stays as it is)."""
    return [f"-{arg}" if re.match(r"^-[a-z][a-z0-9]*-?[a-z0-9-]+(=|$)", arg) else arg
            for arg in argv]


def options_from_args(args: argparse.Namespace) -> Options:
    flags = {name: value for name, value in vars(args).items()
             if name in option_help() and value is not None}
    if args.config:
        return Options.from_toml(args.config, **flags)
    return Options(**flags)


def raise_open_file_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit (as Go programs such as nsqd
    do), so each client's socket does not run into a default of 1024. Returns the
    soft limit in force. The connection caps (``server/admission.py``) keep clients
    below it with a reserve for serving; when ``accept`` still fails at the limit, the
    listener backs off and every connected client keeps being served."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if soft == resource.RLIM_INFINITY or soft >= target:
        return soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError) as err:
        logging.getLogger("pynsqd").warning("cannot raise the open-file limit from %d to %d: %s",
                                            soft, target, err)
        return soft
    return target


def tune_garbage_collector() -> None:
    """Queued messages are long-lived objects, by the million when kept in memory.
    With Python's default thresholds a full collection rescans all of them each time
    they grow by a quarter, and checks for that every 70,000 allocations: measured,
    half of a memory-only publish's CPU. Full collections are made a hundred times
    rarer.

    Messages read back from disk come READ_AHEAD (1,024) at a time, past the default
    young threshold (700): a young collection per read-ahead traced every message just
    read (they all live on, queued), a tenth of a durable consume's CPU, where a
    memory-only consume makes none. The young threshold holds a few read-aheads (and
    what a consumer has in flight meanwhile), so messages read, delivered and FINed die
    without being traced. A young collection traces up to 4,096 objects instead of 700
    (about a millisecond); the middle generation is collected every second young
    collection, so it holds about as many objects as with the defaults (its pauses and
    the pace of full collections stay as they were)."""
    gc.set_threshold(YOUNG_THRESHOLD, 1, 1000)


def freeze_start_up_objects() -> None:
    """What importing the broker made (modules, classes, functions, gRPC's and
    protobuf's tables: about 44,000 objects) lives as long as the process. A full
    collection traced all of it every time: 45-50 ms of CPU (measured on a busy
    2-core machine) with the event loop stopped and every message in flight waiting,
    most of a full collection's work while few messages are queued. Collected once
    now and moved out of the collector's generations (``gc.freeze``), it is never
    traced again. Called before the broker starts: nothing of its own (topics,
    channels, messages recovered from disk) is frozen; all of that is collected as
    before."""
    gc.collect()
    gc.freeze()


# Allocations (net) between young collections: four read-aheads of messages from disk.
YOUNG_THRESHOLD = 4 * READ_AHEAD


async def serve(options: Options) -> None:
    for warning in exposure_warnings(options):
        logging.getLogger("pynsqd").warning("%s", warning)
    # Handled from before the start: a SIGTERM or SIGINT while the data path is restored
    # (seconds, for millions of messages) stops the broker cleanly once it has started.
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    app = BrokerApp(options)
    await app.start()
    loop_kind = type(loop).__module__.partition(".")[0]
    logging.getLogger("pynsqd").info("event loop: %s", loop_kind)
    await stop.wait()
    logging.getLogger("pynsqd").info("signal received: shutting down")
    await app.stop()


def file_error(err: OSError, paths: dict[str, str]) -> str:
    """An error about a file one of ``paths`` (flag -> its value) names, said as
    ``--flag VALUE: what is wrong``; any other error as it is."""
    filename = str(err.filename) if getattr(err, "filename", None) else ""
    for flag, value in paths.items():
        if not value or not filename:
            continue
        if filename == value:
            if flag == "--data-path" and err.errno in (errno.EEXIST, errno.ENOTDIR):
                return f"{flag} {value}: is a file; it must be a directory (or not exist yet)"
            return f"{flag} {value}: {err.strerror or err}"
        if filename.startswith(value.rstrip("/") + "/"):
            return f"{flag} {value}: {filename}: {err.strerror or err}"
    return str(err)


def check_grpc_address_free(address: str) -> None:
    """Refuse a gRPC address something already listens on, in the broker's own words:
    gRPC's server would first print a line of its own (``E... add_port.cc``)."""
    host, port = split_listen_address(address, "grpc-address")
    if port == 0:
        return
    for family, kind, proto, _, where in socket.getaddrinfo(host or None, port,
                                                            type=socket.SOCK_STREAM,
                                                            flags=socket.AI_PASSIVE):
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC binds
            try:
                probe.bind(where)
            except OSError:
                raise OSError(f"cannot listen on {address} (gRPC, --grpc-address): address in "
                              f"use or not available") from None


def storage_mode(options: Options) -> str:
    if not options.data_path:
        return "memory only (nothing is kept across a restart; --data-path keeps it)"
    return (f"durable in {options.data_path} (fsync every {options.sync_every} messages or "
            f"{format_duration(options.sync_timeout)})")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(go_flags(sys.argv[1:] if argv is None else argv))
    try:
        options = options_from_args(args)
    except (ValueError, TypeError, OSError) as err:
        message = (file_error(err, {"--config": args.config or ""}) if isinstance(err, OSError)
                   else str(err))
        if args.config and message.startswith(f"{args.config}:"):  # the file's own errors
            message = f"--config {message}"
        parser.error(message)
    logging.basicConfig(level=options.log_level.upper(), stream=sys.stderr,
                        format=options.log_prefix.replace("%", "%%")
                        + "%(asctime)s %(levelname)s: %(message)s")
    log = logging.getLogger("pynsqd")
    log.info("pynsqd %s; config file: %s; storage: %s", __version__,
             args.config or "none (defaults and flags)", storage_mode(options))
    paths = {"--data-path": options.data_path, "--tls-cert": options.tls_cert,
             "--tls-key": options.tls_key, "--tls-root-ca-file": options.tls_root_ca_file,
             "--config": args.config or ""}
    from .workers import run_supervisor, uses_worker_layout
    try:   # a supervisor of one broker process per worker
        if options.workers > 1 or uses_worker_layout(options.data_path):
            return run_supervisor(options)
    except (OSError, DataPathLocked, ValueError) as err:
        log.error("%s", file_error(err, paths) if isinstance(err, OSError) else err)
        return 1
    try:
        check_grpc_address_free(options.grpc_address)
    except OSError as err:
        log.error("%s", err)
        return 1
    log.info("open-file limit: %d", raise_open_file_limit())
    tune_garbage_collector()
    freeze_start_up_objects()
    try:
        loop = new_event_loop(options.event_loop)
    except ValueError as err:
        parser.error(str(err))
    try:
        with asyncio.Runner(loop_factory=lambda: loop) as runner:
            runner.run(serve(options))
    except (OSError, DataPathLocked) as err:
        log.error("%s", file_error(err, paths) if isinstance(err, OSError) else err)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
