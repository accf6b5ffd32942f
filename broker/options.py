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
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

DEFAULT_GRPC_ADDRESS = "127.0.0.1:4170"
DEFAULT_TCP_ADDRESS = "127.0.0.1:4150"
DEFAULT_HTTP_ADDRESS = "127.0.0.1:4151"

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
    sync_every: int = _opt(2500, "messages per fsync of the data files")
    sync_timeout: int = _duration(2_000, "longest time between fsyncs")
    msg_timeout: int = _duration(60_000, "default in-flight timeout of a message")
    max_msg_timeout: int = _duration(15 * 60_000, "largest timeout a consumer may ask for")
    max_msg_size: int = _opt(1024 * 1024, "largest message body, in bytes")
    max_req_timeout: int = _duration(3_600_000, "largest REQ or DPUB delay")
    max_rdy_count: int = _opt(2500, "largest RDY count a consumer may give")
    max_attempts: int = _opt(0, "deliveries after which a message goes to the channel's "
                                "dead-letter topic (0: never; a channel may set its own)")
    log_level: str = _opt("info", "debug, info, warning or error")

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.metadata.get("duration"):
                setattr(self, f.name, parse_duration_ms(value, name=f.name.replace("_", "-")))
        for name in ("mem_queue_size", "max_msg_size", "max_rdy_count", "sync_every",
                     "max_bytes_per_file", "max_attempts"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name.replace('_', '-')} must not be negative")
        if self.log_level.lower() not in ("debug", "info", "warning", "error"):
            raise ValueError(f"log-level: expected debug, info, warning or error, "
                             f"got {self.log_level!r}")
        if self.max_attempts > 65535:
            raise ValueError("max-attempts must be 0 (off) to 65535")
        if self.msg_timeout <= 0:
            raise ValueError("msg-timeout must be positive")
        if self.msg_timeout > self.max_msg_timeout:
            raise ValueError("msg-timeout must not exceed max-msg-timeout")

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
            if not known[name].metadata.get("duration") and type(value) is not type(default):
                kind = "a whole number" if isinstance(default, int) else "a string"
                raise ValueError(f"{path}: {key}: expected {kind}, got {value!r}")
            values[name] = value
        values.update(overrides)
        return cls(**values)


def option_help() -> dict[str, tuple[Any, str, bool]]:
    """name -> (default, help, is_duration), for building command-line flags."""
    return {f.name: (f.default, f.metadata.get("help", ""), bool(f.metadata.get("duration")))
            for f in fields(Options)}
