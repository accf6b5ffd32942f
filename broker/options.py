"""Every option of the broker and its default, in one place.

Names and defaults follow nsqd's where they apply. An option can come from its
default, from a TOML file (``--config``; keys use underscores, as nsqd's config
does), or from a command-line flag (dashes), each overriding the one before.
Durations are milliseconds in code and accept ``"60s"``, ``"15m"``, ``"1h"``,
``"500ms"`` or a bare number of milliseconds in files and flags.
"""

from __future__ import annotations

import dataclasses
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

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, None: 1}


def parse_duration_ms(value: str | int | float, *, name: str = "duration") -> int:
    """``"60s"`` -> 60000. A bare number is milliseconds."""
    if isinstance(value, bool):
        raise ValueError(f"{name}: expected a duration such as '60s', got {value!r}")
    if isinstance(value, (int, float)):
        return int(value)
    match = _DURATION.match(value)
    if not match:
        raise ValueError(f"{name}: expected a duration such as '60s' or '500ms', got {value!r}")
    return int(float(match.group(1)) * _UNIT_MS[match.group(2)])


def _duration(default_ms: int, help: str) -> Any:
    return field(default=default_ms, metadata={"duration": True, "help": help})


def _opt(default: Any, help: str) -> Any:
    return field(default=default, metadata={"help": help})


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
    log_level: str = _opt("info", "debug, info, warning or error")
    event_loop: str = _opt("asyncio", "pynsqd's event loop: asyncio, uvloop (if installed), "
                           "or auto (uvloop when installed, else asyncio)")
    lookupd_tcp_address: tuple[str, ...] = _opt(
        (), "host:port of an nsqlookupd's TCP port to register with (repeatable)")
    broadcast_address: str = _opt("", "address registered with nsqlookupd (default: hostname)")
    node_id: int = _opt(-1, "this broker's part of every message id, 0 to 1023, unique in a "
                            "fleet (-1: from the hostname and the gRPC listen address)")
    statsd_address: str = _opt("", "UDP host:port of statsd to push stats to (empty: off)")
    statsd_prefix: str = _opt("nsq.%s", "prefix of statsd keys (%s: broadcast address and "
                              "HTTP port)")
    statsd_interval: int = _duration(60_000, "time between pushes to statsd")
    statsd_udp_packet_size: int = _opt(508, "largest statsd UDP datagram, in bytes")
    # -- on a network: TLS and NSQ's auth (broker/security checks these) --
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

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.metadata.get("duration"):
                setattr(self, f.name, parse_duration_ms(value, name=f.name.replace("_", "-")))
        for name in ("mem_queue_size", "max_msg_size", "max_rdy_count", "sync_every",
                     "max_bytes_per_file", "max_body_size", "max_disk_bytes",
                     "max_memory_bytes", "max_attempts"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name.replace('_', '-')} must not be negative")
        self.lookupd_tcp_address = _addresses(self.lookupd_tcp_address, "lookupd-tcp-address")
        if self.lookupd_tcp_address and not (self.tcp_address and self.http_address):
            raise ValueError("lookupd-tcp-address needs tcp-address and http-address: "
                             "nsqlookupd registers a broker by its TCP and HTTP ports")
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
        if self.max_attempts > 65535:
            raise ValueError("max-attempts must be 0 (off) to 65535")
        if self.msg_timeout <= 0:
            raise ValueError("msg-timeout must be positive")
        if self.msg_timeout > self.max_msg_timeout:
            raise ValueError("msg-timeout must not exceed max-msg-timeout")
        from .security.tls import check_options
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
        with open(path, "rb") as f:
            try:
                data = tomllib.load(f)
            except tomllib.TOMLDecodeError as err:
                raise ValueError(f"{path}: {err}") from None
        known = {f.name: f for f in fields(cls)}
        values: dict[str, Any] = {}
        for key, value in data.items():
            name = key.replace("-", "_")
            if name not in known:
                raise ValueError(f"{path}: unknown option {key!r}")
            default = known[name].default
            if isinstance(default, tuple):  # repeatable: a list of strings (or one string)
                if isinstance(value, str):
                    value = [value]
                if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                    raise ValueError(f"{path}: {key}: expected a list of strings, got {value!r}")
                value = tuple(value)
            elif not (known[name].metadata.get("duration") or known[name].metadata.get("loose")) \
                    and type(value) is not type(default):
                kind = "a whole number" if isinstance(default, int) else "a string"
                raise ValueError(f"{path}: {key}: expected {kind}, got {value!r}")
            values[name] = value
        values.update(overrides)
        return cls(**values)


def split_host_port(address: str, name: str = "address") -> tuple[str, int]:
    """``"host:port"`` -> (host, port); an error naming ``name`` otherwise."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{name}: expected host:port, got {address!r}")
    return host.strip("[]"), int(port)


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


def option_flag(name: str) -> str:
    """The command-line flag of an option (nsqd's name: one ``--auth-http-address`` per value)."""
    return "--" + Options.__dataclass_fields__[name].metadata.get("flag", name.replace("_", "-"))
