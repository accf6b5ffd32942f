"""Options of the ``pynsq`` source, read and checked once, on the driver.

Names are case-insensitive, as Spark's are. An unknown or missing option, or a
bad value, raises ``OptionError`` naming it, so the query fails at start.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from dataclasses import dataclass
from typing import Iterable, Mapping

from broker.names import is_valid_name
from broker.security.client import SPARK_OPTIONS, ClientSecurity


class OptionError(ValueError):
    """A missing, unknown or malformed option of the pynsq source or sink."""


# Options Spark itself passes to sources and sinks.
SPARK_OWN = {"path", "checkpointlocation"}


def _lower(options: Mapping[str, str]) -> dict[str, str]:
    # Spark hands a case-insensitive dict; a plain dict may come from tests.
    return {k.lower(): v for k, v in options.items() if k.lower() not in SPARK_OWN}


# Kafka's names for options whose meaning is the same here, as Spark's Kafka source
# spells them: a Kafka user's options work unchanged.
KAFKA_ALIASES = {"maxOffsetsPerTrigger": "maxMessagesPerTrigger",
                 "minOffsetsPerTrigger": "minMessagesPerTrigger",
                 "subscribe": "topic"}
# Names as documented, to show them so whatever case they were given in.
_SPELLED = {n.lower(): n for n in (*KAFKA_ALIASES, *KAFKA_ALIASES.values(), "batchSize",
                                   "producer")}


def _spelled(name: str) -> str:
    return _SPELLED.get(name.lower(), name)


def _check_unknown(given: dict[str, str], known: Iterable[str], what: str) -> None:
    """One short message for every unknown option, each with the known name it is
    closest to ("did you mean"), or the known names when none is close."""
    known_lower = {n.lower() for n in known}
    unknown = sorted(set(given) - known_lower)
    if not unknown:
        return
    parts, guessed = [], False
    for name in unknown:
        close = difflib.get_close_matches(name, sorted(known_lower), n=1, cutoff=0.75)
        guessed |= bool(close)
        parts.append(f"{name} (did you mean {_spelled(close[0])}?)" if close else name)
    tail = "" if guessed else f" (known: {', '.join(sorted(_spelled(n) for n in known_lower))})"
    raise OptionError(f"unknown option(s) for the pynsq {what}: {', '.join(parts)}{tail}")


def _as_given(given: dict[str, str], ours: str) -> str:
    """``ours``, or the Kafka name of it the user gave (so an error names what they typed).
    A value given under a Kafka name is read under that name."""
    for kafka, name in KAFKA_ALIASES.items():
        if name == ours and kafka.lower() in given:
            if ours.lower() in given and given[ours.lower()].strip() != \
                    given[kafka.lower()].strip():
                raise OptionError(f"options {kafka} and {ours} are the same option, given two "
                                  f"values ({given[kafka.lower()]!r}, {given[ours.lower()]!r}): "
                                  f"give one")
            return kafka
    return ours


_DURATION = re.compile(r"^\s*(\d+)\s*(ms|s|m|min|h|d)?\s*$", re.IGNORECASE)
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000, "d": 86_400_000}


def _duration_ms(given: dict[str, str], name: str, default: int) -> int:
    """A duration as Spark writes them (``15m``, ``30s``, ``500ms``; a bare number is ms)."""
    raw = given.get(name.lower())
    if raw is None:
        return default
    match = _DURATION.match(raw)
    if not match:
        raise OptionError(f"option {name}: expected a duration such as 15m, 30s or 500ms, "
                          f"got {raw!r}")
    return int(match.group(1)) * _UNIT_MS[(match.group(2) or "ms").lower()]


def _int(given: dict[str, str], name: str, default: int, minimum: int = 1) -> int:
    raw = given.get(name.lower())
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise OptionError(f"option {name}: expected an integer, got {raw!r}") from None
    if value < minimum:
        raise OptionError(f"option {name}: must be at least {minimum}, got {value}")
    return value


def parse_addresses(raw: str | None, option: str = "address") -> list[str]:
    """``"h1:4170,h2:4170"`` -> ["h1:4170", "h2:4170"]."""
    if not raw or not raw.strip():
        raise OptionError(f"option {option} is required: one or more host:port, comma-separated")
    addresses = [a.strip() for a in raw.split(",") if a.strip()]
    for address in addresses:
        host, sep, port = address.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise OptionError(f"option {option}: {address!r} is not host:port")
    return addresses


def require_name(given: dict[str, str], name: str, kind: str) -> str:
    value = given.get(name.lower())
    if not value:
        raise OptionError(f"option {name} is required")
    if not is_valid_name(value):
        raise OptionError(_invalid_name(name, kind, value))
    return value


def _invalid_name(option: str, kind: str, value: str) -> str:
    return (f"option {option}: invalid {kind} name {value!r} (1-64 characters of "
            f"[.a-zA-Z0-9_-], optionally ending in #ephemeral)")


def require_names(given: dict[str, str], name: str, kind: str) -> tuple[str, ...]:
    """A comma-separated list of names (one at least), each checked, in order, once."""
    raw = given.get(name.lower()) or ""
    names = [n.strip() for n in raw.split(",") if n.strip()]
    if not names:
        raise OptionError(f"option {name} is required")
    bad = next((value for value in names if not is_valid_name(value)), None)
    if bad is not None:
        raise OptionError(_invalid_name(name, kind, bad))
    return tuple(dict.fromkeys(names))


def _bool(given: dict[str, str], name: str, default: bool) -> bool:
    raw = given.get(name.lower())
    if raw is None:
        return default
    if raw.strip().lower() not in ("true", "false"):
        raise OptionError(f"option {name}: expected true or false, got {raw!r}")
    return raw.strip().lower() == "true"


# Defaults that bound a micro-batch, so a first batch over a large backlog
# neither loads it all into memory nor outlives its timeouts. Spark pays a few
# hundred ms per micro-batch whatever its size, so a batch is made large enough
# that this is small next to reading it (1M messages of 100 B fit in one); what
# bounds it is the broker's memory: a batch read back from disk is held in memory
# while it runs, about 128 MiB of bodies plus ~300 B a message at most.
DEFAULT_MAX_MESSAGES_PER_TRIGGER = 1_000_000
DEFAULT_MAX_BYTES_PER_TRIGGER = 128 << 20
# How long a broker that answered before may stay silent (a restart, a blip) before it
# counts as unreachable: calls meanwhile wait for it to come back.
DEFAULT_RECONNECT_TIMEOUT_MS = 30_000
# How long minMessagesPerTrigger may hold back a batch with fewer messages (Kafka's default).
DEFAULT_MAX_TRIGGER_DELAY_MS = 15 * 60_000


@dataclass(frozen=True)
class ReaderOptions:
    addresses: list[str]
    topics: tuple[str, ...]   # one or more: option topic (or subscribe) is a list
    channel: str
    max_messages_per_trigger: int
    max_bytes_per_trigger: int
    msg_timeout_ms: int
    num_partitions: int
    timeout_ms: int
    client_id: str
    fail_on_data_loss: bool = True
    security: ClientSecurity = ClientSecurity()  # TLS files, auth secret (never shown)
    max_attempts: int | None = None     # the channel's; None: leave it as the broker has it
    lookupd_addresses: tuple[str, ...] = ()  # nsqlookupd HTTP host:port; then addresses is []
    lookupd_poll_interval_ms: int = 5000     # how often the fleet is asked again, at most
    reconnect_timeout_ms: int = DEFAULT_RECONNECT_TIMEOUT_MS  # a broker silent longer: unreachable
    fail_on_broker_down: bool = False   # a durable broker unreachable stops the query
    min_messages_per_trigger: int = 0   # fewer ready: wait, up to max_trigger_delay_ms
    max_trigger_delay_ms: int = DEFAULT_MAX_TRIGGER_DELAY_MS

    NAMES = ("address", "lookupdHttpAddress", "lookupdPollIntervalMs", "topic", "channel",
             "maxMessagesPerTrigger", "maxBytesPerTrigger", "msgTimeoutMs", "numPartitions",
             "timeoutMs", "clientId", "failOnDataLoss", "maxAttempts", "reconnectTimeoutMs", "failOnBrokerDown", "minMessagesPerTrigger",
             "maxTriggerDelay", *KAFKA_ALIASES, *SPARK_OPTIONS)

    @property
    def topic(self) -> str:
        """The topic of a one-topic source (each topic of a list has its own ``for_topic``)."""
        return self.topics[0]

    def for_topic(self, topic: str) -> "ReaderOptions":
        return dataclasses.replace(self, topics=(topic,))

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> "ReaderOptions":
        given = _lower(options)
        _check_unknown(given, cls.NAMES, "source")
        addresses, lookupd = broker_addresses(given)
        return cls(
            addresses=addresses,
            lookupd_addresses=tuple(lookupd),
            lookupd_poll_interval_ms=_int(given, "lookupdPollIntervalMs", 5000, minimum=100),
            topics=require_names(given, _as_given(given, "topic"), "topic"),
            channel=require_name(given, "channel", "channel"),
            max_messages_per_trigger=_int(given, _as_given(given, "maxMessagesPerTrigger"),
                                          DEFAULT_MAX_MESSAGES_PER_TRIGGER),
            max_bytes_per_trigger=_int(given, "maxBytesPerTrigger",
                                       DEFAULT_MAX_BYTES_PER_TRIGGER),
            msg_timeout_ms=_int(given, "msgTimeoutMs", 60_000, minimum=1000),
            num_partitions=_int(given, "numPartitions", 2),
            timeout_ms=_int(given, "timeoutMs", 10_000, minimum=100),
            client_id=given.get("clientid", ""),
            fail_on_data_loss=_bool(given, "failOnDataLoss", True),
            fail_on_broker_down=_bool(given, "failOnBrokerDown", False),
            min_messages_per_trigger=_int(given, _as_given(given, "minMessagesPerTrigger"), 0,
                                          minimum=0),
            max_trigger_delay_ms=_duration_ms(given, "maxTriggerDelay",
                                              DEFAULT_MAX_TRIGGER_DELAY_MS),
            reconnect_timeout_ms=_int(given, "reconnectTimeoutMs", DEFAULT_RECONNECT_TIMEOUT_MS,
                                      minimum=0),
            security=security_options(given),
            max_attempts=(_int(given, "maxAttempts", 0, minimum=0)
                          if given.get("maxattempts") is not None else None),
        )


_SPELLED.update({n.lower(): n for n in ReaderOptions.NAMES})


def broker_addresses(given: dict[str, str]) -> tuple[list[str], list[str]]:
    """(``address`` list, ``lookupdHttpAddress`` list): exactly one of the two is given."""
    has_address = bool((given.get("address") or "").strip())
    has_lookupd = bool((given.get("lookupdhttpaddress") or "").strip())
    if has_address and has_lookupd:
        raise OptionError("options address and lookupdHttpAddress exclude each other: give "
                          "the brokers, or the nsqlookupd that lists them")
    if has_lookupd:
        return [], parse_addresses(given["lookupdhttpaddress"], "lookupdHttpAddress")
    if not has_address:
        raise OptionError("option address or lookupdHttpAddress is required: the brokers' "
                          "gRPC host:port, or nsqlookupd's HTTP host:port (comma-separated)")
    return parse_addresses(given["address"]), []


def security_options(given: dict[str, str]) -> ClientSecurity:
    """tlsCaFile, tlsCertFile, tlsKeyFile, authSecret (``broker/security/client.py``)."""
    try:
        return ClientSecurity.from_options(given)
    except ValueError as err:
        raise OptionError(str(err)) from None
