"""Every option of the broker and its default, in one place.

Names and defaults follow nsqd's where they apply. An option can come from its
default, from a TOML file (``--config``; keys use underscores, as nsqd's config
does), or from a command-line flag (dashes), each overriding the one before.
Durations are milliseconds in code; in flags and files they are written as Go's
(and so nsqd's) ``time.ParseDuration`` reads them: a number and a unit, such as
``"60s"``, ``"1m30s"``, ``"1.5h"``, ``"500ms"`` or ``"300us"`` (a TOML integer is
milliseconds, as nsqd's config loader reads it). A bare number in a flag is
refused, as nsqd refuses it: ``--msg-timeout 30`` is not 30 ms.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
import socket
import tomllib
import zlib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

DEFAULT_GRPC_ADDRESS = "127.0.0.1:4170"
DEFAULT_TCP_ADDRESS = "127.0.0.1:4150"
DEFAULT_HTTP_ADDRESS = "127.0.0.1:4151"
EVENT_LOOPS = ("asyncio", "uvloop", "auto")

_UNIT_MS = {"ns": 1e-6, "us": 1e-3, "\u00b5s": 1e-3, "\u03bcs": 1e-3, "ms": 1, "s": 1000,
            "m": 60_000, "h": 3_600_000}
_NUMBER = r"(?:\d+(?:\.\d*)?|\.\d+)"
_UNIT = "|".join(sorted(_UNIT_MS, key=len, reverse=True))
_GO_DURATION = re.compile(rf"(?:{_NUMBER}(?:{_UNIT}))+")
_GO_PART = re.compile(rf"({_NUMBER})({_UNIT})")


def parse_duration_ms(value: str | int | float, *, name: str = "duration",
                      bare_ms: bool = False) -> int:
    """``"60s"`` -> 60000, ``"1m30s"`` -> 90000, as Go's ``time.ParseDuration``
    reads it (``ns``, ``us``, ``ms``, ``s``, ``m``, ``h``; ``"0"`` alone needs no
    unit), rounded to the millisecond. A number (in code, or an integer in TOML) is
    milliseconds; a string without a unit is refused unless ``bare_ms``."""
    if isinstance(value, bool):
        raise ValueError(f"{name}: expected a duration such as '60s', got {value!r}")
    if isinstance(value, (int, float)):
        return int(value)
    text = value.strip()
    if text == "0" or (bare_ms and text.isdigit()):
        return int(text)
    if not _GO_DURATION.fullmatch(text):
        hint = (f" (a unit is required: '{text}s' or '{text}ms'?)"
                if re.fullmatch(_NUMBER, text) else "")
        raise ValueError(f"{name}: expected a duration such as '60s', '1m30s' or '500ms', "
                         f"got {value!r}{hint}")
    return round(sum(float(n) * _UNIT_MS[u] for n, u in _GO_PART.findall(text)))


def format_duration(ms: int) -> str:
    """60000 -> ``"60s"``, 900000 -> ``"15m"``, 3600000 -> ``"1h"``: the largest unit
    that keeps it whole (minutes from two on, as nsqd's documentation writes them)."""
    for unit, size in (("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if ms and ms % size == 0 and (unit != "m" or ms >= 120_000):
            return f"{ms // size}{unit}"
    return f"{ms}ms"


def suggest(name: str, known: list[str] | tuple[str, ...]) -> str:
    """`` (did you mean 'x'?)`` for the closest known name, or nothing."""
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _duration(default_ms: int, help: str) -> Any:
    return field(default=default_ms, metadata={"duration": True, "help": help})


def _opt(default: Any, help: str, **metadata: Any) -> Any:
    return field(default=default, metadata={"help": help, **metadata})


def _fixed(default: Any, help: str, why: str, **metadata: Any) -> Any:
    """An nsqd option pynsqd takes only at its default (so an nsqd config that sets
    it to that works), refusing any other value with ``why``."""
    return field(default=default, metadata={"help": f"{help}; {why}", "fixed": why,
                                            **metadata})


@dataclass
class Options:
    """The broker's configuration. Durations are in milliseconds."""

    grpc_address: str = _opt(DEFAULT_GRPC_ADDRESS, "host:port of the gRPC API")
    tcp_address: str = _opt(DEFAULT_TCP_ADDRESS,
                            "host:port of NSQ's TCP protocol (V2); empty: off")
    http_address: str = _opt(DEFAULT_HTTP_ADDRESS, "host:port of nsqd's HTTP API; empty: off")
    data_path: str = _opt("", "directory for the broker's data (empty: memory only)")
    mem_queue_size: int = _opt(10_000, "messages kept in memory per topic and channel")
    max_bytes_per_file: int = _opt(100 * 1024 * 1024, "size at which a data file rolls")
    max_disk_bytes: int = _opt(0, "with --data-path: bytes of data files past which publishes "
                                  "are refused (0: no limit)")
    max_memory_bytes: int = _opt(0, "without --data-path: bytes of queued message bodies past "
                                    "which publishes are refused (0: no limit)")
    sync_every: int = _opt(2500, "messages per fsync of the data files")
    sync_timeout: int = _duration(2_000, "longest time between fsyncs")
    msg_timeout: int = _duration(60_000, "default in-flight timeout of a message")
    max_msg_timeout: int = _duration(15 * 60_000, "largest timeout a consumer may ask for")
    max_msg_size: int = _opt(1024 * 1024, "largest message body, in bytes")
    max_body_size: int = _opt(5 * 1024 * 1024, "largest request body (MPUB, gRPC request), "
                              "in bytes")
    max_req_timeout: int = _duration(3_600_000, "largest REQ or DPUB delay")
    max_rdy_count: int = _opt(2500, "largest RDY count a consumer may give")
    max_attempts: int = _opt(0, "deliveries after which a message goes to the channel's "
                                "dead-letter topic (0: never; a channel may set its own)")
    dedupe_window: int = _duration(10 * 60_000, "how long the broker remembers each MPUB a "
                                   "writer named (producer id, sequence), so a replay within "
                                   "it publishes nothing twice")
    dedupe_capacity: int = _opt(1_000_000, "most de-duplication entries kept, oldest first "
                                           "out: about 450 bytes each (450 MB at the default)")
    max_connections: int = _opt(0, "most TCP and HTTP(S) connections open at once (0: the "
                                   "open-file limit less an eighth kept for serving)")
    max_connections_per_client: int = _opt(0, "most TCP and HTTP(S) connections open at once "
                                               "from one client address (0: half of "
                                               "--max-connections)")
    max_grpc_connections: int = _opt(0, "most gRPC connections open at once, counted apart "
                                        "from TCP and HTTP(S) (0: as --max-connections)")
    max_topics: int = _opt(10_000, "most topics at once; one more is refused at creation "
                                   "(0: no limit)")
    max_channels_per_topic: int = _opt(5_000, "most channels of one topic at once; one more "
                                              "is refused at creation (0: no limit)")
    max_channels: int = _opt(50_000, "most channels of the whole broker at once, over every "
                                     "topic; one more is refused at creation (0: no limit)")
    log_level: str = _opt("info", "debug, info, warning or error")
    event_loop: str = _opt("asyncio", "pynsqd's event loop: asyncio, uvloop (if installed), "
                           "or auto (uvloop when installed, else asyncio)")
    lookupd_tcp_address: tuple[str, ...] = _opt(
        (), "host:port of an nsqlookupd's TCP port to register with (repeatable)",
        alias="nsqlookupd_tcp_addresses")
    broadcast_address: str = _opt("", "address registered with nsqlookupd (empty: the "
                                      "hostname)")
    broadcast_tcp_port: int = _opt(0, "TCP port registered with nsqlookupd (0: the "
                                      "--tcp-address port)")
    broadcast_http_port: int = _opt(0, "HTTP port registered with nsqlookupd (0: the "
                                       "--http-address port)")
    node_id: int = _opt(-1, "this broker's part of every message id, 0 to 1023, unique in a "
                            "fleet (-1: from the hostname and the gRPC listen address)",
                        alias="id")
    statsd_address: str = _opt("", "UDP host:port of statsd to push stats to (empty: off)")
    statsd_prefix: str = _opt("nsq.%s", "prefix of statsd keys (%s: broadcast address and "
                              "HTTP port)")
    statsd_interval: int = _duration(60_000, "time between pushes to statsd")
    statsd_udp_packet_size: int = _opt(508, "largest statsd UDP datagram, in bytes")
    statsd_exclude_ephemeral: bool = _opt(False, "leave #ephemeral topics and channels out "
                                                 "of statsd")
    statsd_mem_stats: bool = _fixed(False, "push Go memory stats to statsd",
                                    "pynsqd has no Go runtime; /metrics has process_* and "
                                    "python_* instead")
    log_prefix: str = _opt("[pynsqd] ", "prefix of every log line")
    # -- nsqd options pynsqd takes at their value only (why in each) --
    max_channel_consumers: int = _fixed(0, "most consumers on one channel (0: no limit)",
                                        "pynsqd does not limit consumers per channel")
    max_heartbeat_interval: int = _fixed(60_000, "longest IDENTIFY heartbeat interval",
                                         "pynsqd's TCP server caps it at 60s", duration=True)
    max_output_buffer_size: int = _fixed(65536, "largest IDENTIFY output_buffer_size",
                                         "pynsqd's TCP server caps it at 64 KiB")
    max_output_buffer_timeout: int = _fixed(30_000, "longest IDENTIFY output_buffer_timeout",
                                            "pynsqd's TCP server caps it at 30s",
                                            duration=True)
    e2e_processing_latency_percentiles: tuple[str, ...] = _fixed(
        (), "end-to-end latency percentiles to report", "pynsqd reports p50, p95 and p99 "
        "(/metrics has the histogram)", flag="e2e-processing-latency-percentile")
    e2e_processing_latency_window_time: int = _fixed(
        600_000, "window of the latency percentiles", "pynsqd's are over the latest "
        "deliveries, not a time window", duration=True)
    min_output_buffer_timeout: int = _fixed(25, "shortest IDENTIFY output_buffer_timeout",
                                            "pynsqd's TCP server takes 25ms at least",
                                            duration=True)
    output_buffer_timeout: int = _fixed(250, "default output_buffer_timeout",
                                        "pynsqd's TCP server flushes once per event-loop "
                                        "pass", duration=True)
    deflate: bool = _fixed(False, "offer deflate compression", "pynsqd declines compression "
                           "and clients speak plain V2")
    snappy: bool = _fixed(False, "offer snappy compression", "pynsqd declines compression "
                          "and clients speak plain V2")
    max_deflate_level: int = _fixed(6, "highest deflate level", "pynsqd declines compression")
    queue_scan_selection_count: int = _fixed(
        20, "channels checked per scan", "pynsqd keeps each channel's deadlines in a "
        "queue woken by the event loop's timers, with nothing to scan")
    queue_scan_worker_pool_max: int = _fixed(
        4, "scan workers", "pynsqd keeps each channel's deadlines in a queue woken by the "
        "event loop's timers, with nothing to scan")
    # -- on a network: TLS and NSQ's auth (broker/security checks these) --
    http_allowed_hosts: tuple[str, ...] = field(default=(), metadata={
        "help": "a Host name HTTP requests may name (repeatable or comma-separated; '*': "
                "any); default: on loopback, loopback names only", "flag": "http-allowed-hosts"})
    https_address: str = _opt("", "host:port of nsqd's HTTP API over TLS; empty: off")
    tls_cert: str = _opt("", "path to the broker's certificate file (PEM)")
    tls_key: str = _opt("", "path to the broker's private key file (PEM)")
    tls_root_ca_file: str = _opt("", "path to the certificate authority file that signs "
                                 "client certificates")
    tls_client_auth_policy: str = _opt("", "client certificates: '' (not asked), 'require' "
                                       "or 'require-verify'")
    tls_required: str = field(default="false", metadata={
        "help": "require TLS of clients: true, false, or tcp-https (TCP and HTTPS only)",
        "loose": True})
    tls_min_version: str = _opt("tls1.2", "lowest TLS version accepted: tls1.0 ... tls1.3")
    auth_http_addresses: tuple[str, ...] = field(default=(), metadata={
        "help": "host:port or full URL of an auth server (repeatable)",
        "flag": "auth-http-address"})
    auth_http_request_method: str = _opt("get", "get or post, to query the auth server")
    http_client_connect_timeout: int = _duration(2_000, "connect timeout towards auth servers")
    http_client_request_timeout: int = _duration(5_000, "request timeout towards auth servers")
    # -- every core: one broker process per worker (broker/workers.py) --
    workers: int | str = field(default="1", metadata={
        "help": "broker processes on this host, each a node of its own behind the shared "
                "addresses (0 or auto: one per core)", "loose": True})

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            flag = f.name.replace("_", "-")
            if f.metadata.get("duration"):
                setattr(self, f.name, parse_duration_ms(value, name=flag))
            elif isinstance(f.default, bool):
                setattr(self, f.name, parse_bool(value, flag))
            elif isinstance(f.default, tuple):
                setattr(self, f.name, (value,) if isinstance(value, str) else tuple(value))
            if "fixed" in f.metadata and getattr(self, f.name) != f.default:
                shown = (format_duration(f.default) if f.metadata.get("duration")
                         else str(f.default).lower() if isinstance(f.default, bool)
                         else f.default)
                raise ValueError(f"{flag}: only {shown!r} is supported "
                                 f"({f.metadata['fixed']})")
        for name in ("mem_queue_size", "max_msg_size", "max_rdy_count", "sync_every",
                     "max_bytes_per_file", "max_body_size", "max_disk_bytes",
                     "max_memory_bytes", "max_attempts", "broadcast_tcp_port",
                     "broadcast_http_port", "max_connections", "max_connections_per_client",
                     "max_grpc_connections", "max_topics", "max_channels_per_topic",
                     "max_channels"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name.replace('_', '-')} must not be negative")
        # The gRPC API is the one listener that cannot be off: empty names no address.
        for name in ("grpc_address", "tcp_address", "http_address", "https_address"):
            if getattr(self, name) or name == "grpc_address":
                split_listen_address(getattr(self, name), name.replace("_", "-"))
        self.lookupd_tcp_address = _addresses(self.lookupd_tcp_address, "lookupd-tcp-address")
        if self.lookupd_tcp_address and not (self.tcp_address and self.http_address):
            raise ValueError("lookupd-tcp-address needs tcp-address and http-address: "
                             "nsqlookupd registers a broker by its TCP and HTTP ports")
        from .storage.segments import MIN_FILE
        if self.max_bytes_per_file < MIN_FILE:   # not rounded up in silence
            raise ValueError(f"max-bytes-per-file must be at least {MIN_FILE}, "
                             f"got {self.max_bytes_per_file}")
        for name in ("broadcast_tcp_port", "broadcast_http_port"):
            if getattr(self, name) > 65535:
                raise ValueError(f"{name.replace('_', '-')} must be a port, 0 to 65535")
        if self.statsd_address:
            split_host_port(self.statsd_address, "statsd-address")
        if self.statsd_interval <= 0 or self.statsd_udp_packet_size <= 0:
            raise ValueError("statsd-interval and statsd-udp-packet-size must be positive")
        if self.log_level.lower() not in ("debug", "info", "warning", "error"):
            raise ValueError(f"log-level: expected debug, info, warning or error, "
                             f"got {self.log_level!r}")
        if self.event_loop not in EVENT_LOOPS:
            raise ValueError(f"event-loop: expected {', '.join(EVENT_LOOPS)}, "
                             f"got {self.event_loop!r}")
        if not -1 <= self.node_id <= 1023:
            raise ValueError(f"node-id must be 0 to 1023 (or -1: from the hostname and the "
                             f"gRPC address), got {self.node_id}")
        self.workers = parse_workers(self.workers)
        if self.max_attempts > 65535:
            raise ValueError("max-attempts must be 0 (off) to 65535")
        if self.dedupe_window < 0:
            raise ValueError("dedupe-window must not be negative")
        if self.dedupe_capacity < 1:
            raise ValueError("dedupe-capacity must be at least 1")
        if self.msg_timeout <= 0:
            raise ValueError("msg-timeout must be positive")
        if self.msg_timeout > self.max_msg_timeout:
            raise ValueError("msg-timeout must not exceed max-msg-timeout")
        from .security.hosts import allowed_hosts
        from .security.tls import check_options
        self.http_allowed_hosts = allowed_hosts(self.http_allowed_hosts)
        check_options(self)
        if self.data_path:
            # What the log format holds, checked at start: the broker never accepts a
            # message or a file that a restart could not read back.
            from .storage.records import MAX_BODY
            from .storage.segments import MAX_FILE
            if self.max_msg_size > MAX_BODY:
                raise ValueError(f"max-msg-size {self.max_msg_size} is more than a durable "
                                 f"message can be ({MAX_BODY} bytes) with data-path")
            if self.max_bytes_per_file > MAX_FILE:
                raise ValueError(f"max-bytes-per-file {self.max_bytes_per_file} is more "
                                 f"than a log file can be ({MAX_FILE} bytes)")

    def node_id_for(self, grpc_address: str) -> int:
        """``--node-id``, or when it is -1, the default of a broker serving gRPC on
        ``grpc_address``: nsqd hashes the hostname alone, which gives every broker on
        one host the same id. The hash here takes the hostname and the listen host,
        and the port is added to it: brokers on one host listening on different ports
        differ (unless their ports are a multiple of 1024 apart)."""
        if self.node_id >= 0:
            return self.node_id
        host, _, port = grpc_address.rpartition(":")
        digest = zlib.crc32(f"{socket.gethostname()}|{host}".encode())
        return (digest + (int(port) if port.isdigit() else 0)) % 1024

    def replace(self, **changes: Any) -> "Options":
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_toml(cls, path: str | Path, **overrides: Any) -> "Options":
        """Read a TOML file; unknown keys are an error naming the key."""
        try:
            with open(path, "rb") as f:
                data = tomllib.load(f)
        except tomllib.TOMLDecodeError as err:
            raise ValueError(f"{path}: {err}") from None
        except OSError as err:
            raise ValueError(f"{path}: {err.strerror or err}") from None
        known = {f.name: f for f in fields(cls)}
        aliases = {f.metadata["alias"]: f.name for f in fields(cls) if "alias" in f.metadata}
        values: dict[str, Any] = {}
        for key, value in data.items():
            name = key.replace("-", "_")
            name = aliases.get(name, name)
            if name not in known:
                raise ValueError(f"{path}: unknown option {key!r}"
                                 f"{suggest(name, [*known, *aliases])}")
            if name in values:
                raise ValueError(f"{path}: {key!r} repeats an option given under another name")
            default = known[name].default
            if isinstance(default, tuple):  # repeatable: a list of strings (or one string)
                if isinstance(value, str):
                    value = [value]
                if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                    raise ValueError(f"{path}: {key}: expected a list of strings, got {value!r}")
                value = tuple(value)
            elif known[name].metadata.get("duration"):
                pass  # a string with a unit, or an integer of milliseconds: checked below
            elif not known[name].metadata.get("loose") and type(value) is not type(default):
                kind = ("true or false" if isinstance(default, bool) else
                        "a whole number" if isinstance(default, int) else "a string")
                raise ValueError(f"{path}: {key}: expected {kind}, got {value!r}")
            values[name] = value
        values.update(overrides)
        return cls(**values)


def parse_bool(value: Any, name: str) -> bool:
    """Go's flag booleans: true/false, 1/0, t/f (any case)."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "t", "true"):
        return True
    if text in ("0", "f", "false"):
        return False
    raise ValueError(f"{name}: expected true or false, got {value!r}")


MAX_WORKERS = 1024  # one node id each


def parse_workers(value: int | str) -> int:
    """``--workers``: a count of 1 to 1024, or 0 / ``auto`` for one per core."""
    text = str(value).strip().lower()
    if isinstance(value, bool) or not (text == "auto" or text.isdigit()):
        raise ValueError(f"workers: expected a number of workers or auto, got {value!r}")
    count = 0 if text == "auto" else int(text)
    if count == 0:
        count = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
            else os.cpu_count() or 1
    if count > MAX_WORKERS:
        raise ValueError(f"workers: at most {MAX_WORKERS} (one node id each), got {count}")
    return count


def split_host_port(address: str, name: str = "address") -> tuple[str, int]:
    """``"host:port"`` or ``"[ipv6]:port"`` -> (host, port) with the brackets taken
    off; an error naming ``name`` otherwise."""
    host, port = split_listen_address(address, name)
    if not host or port == 0:
        raise ValueError(f"{name}: expected host:port, got {address!r}")
    return host, port


def split_listen_address(address: str, name: str = "address") -> tuple[str, int]:
    """A listen address: ``host:port``, ``[ipv6]:port`` or ``:port`` (every
    interface; host ""), port 0 picking a free one -> (host without brackets, port)."""
    host, sep, port = address.rpartition(":")
    bracketed = host.startswith("[") and host.endswith("]")
    if bracketed:
        host = host[1:-1]
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536 \
            or ("[" in host or "]" in host) or (":" in host and not bracketed):
        raise ValueError(f"{name}: expected host:port with a port from 0 to 65535 (an IPv6 "
                         f"host in brackets: [::1]:4150), got {address!r}")
    return host, int(port)


def _addresses(value: Any, name: str) -> tuple[str, ...]:
    """A repeatable host:port option, checked."""
    values = (value,) if isinstance(value, str) else tuple(value)
    for address in values:
        split_host_port(address, name)
    return values


def option_help() -> dict[str, tuple[Any, str, bool]]:
    """name -> (default, help, is_duration), for building command-line flags."""
    return {f.name: (f.default, f.metadata.get("help", ""), bool(f.metadata.get("duration")))
            for f in fields(Options)}


def option_aliases() -> dict[str, str]:
    """nsqd's name of an option -> pynsqd's (both accepted in flags and files)."""
    return {f.metadata["alias"]: f.name for f in fields(Options) if "alias" in f.metadata}


def option_flag(name: str) -> str:
    """The command-line flag of an option (nsqd's name: one ``--auth-http-address`` per value)."""
    return "--" + Options.__dataclass_fields__[name].metadata.get("flag", name.replace("_", "-"))
