"""Finding the brokers of a fleet through nsqlookupd (driver side).

    discover(["127.0.0.1:4161"], "events")   # -> ["10.0.0.5:4170", "10.0.0.6:4170"]

    fleet = Fleet(["127.0.0.1:4161"], "events", poll_interval=5.0)
    fleet.brokers()                            # between batches: re-asked at most every 5 s

Each pynsqd started with ``--lookupd-tcp-address`` registers its topics with
nsqlookupd under its broadcast address and its TCP and HTTP ports, as nsqd
does. nsqlookupd's ``/lookup?topic=NAME`` lists those producers; each one's
``/info`` on its HTTP port names its gRPC address, which is what the source
reads from. A bound wildcard host (``0.0.0.0``) is replaced by the broadcast
address.

A broker that does not answer ``/info`` is left out (it may be restarting; the
next poll finds it again); lookupd addresses that all fail raise
``DiscoveryError`` naming them, except in ``Fleet`` once it has found brokers:
then it keeps the last list it had, so that an nsqlookupd restart does not
stop a streaming query. Standard library only.
"""

from __future__ import annotations

import json
import logging
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Callable, Iterable

log = logging.getLogger("pynsq.discovery")

WILDCARD_HOSTS = {"", "0.0.0.0", "::", "[::]"}


class DiscoveryError(ConnectionError):
    """No nsqlookupd answered."""


def discover(lookupd_http_addresses: Iterable[str], topic: str,
             timeout: float = 5.0) -> list[str]:
    """The gRPC ``host:port`` of every broker nsqlookupd lists for ``topic``, sorted.

    An empty list when the topic is known to no broker yet.
    """
    addresses = list(lookupd_http_addresses)
    if not addresses:
        raise ValueError("no nsqlookupd HTTP address given")
    producers: dict[tuple[str, int], None] = {}
    failures = []
    for address in addresses:
        try:
            data = _get_json(f"{_base_url(address)}/lookup?"
                             f"{urllib.parse.urlencode({'topic': topic})}", timeout)
        except urllib.error.HTTPError as err:
            if err.code == 404:  # TOPIC_NOT_FOUND: this lookupd knows no such topic
                continue
            failures.append(f"{address} (HTTP {err.code})")
            continue
        except (OSError, ValueError) as err:
            failures.append(f"{address} ({err})")
            continue
        for host_port in producer_http_addresses(data):
            producers[host_port] = None
    if failures and len(failures) == len(addresses):
        raise DiscoveryError(f"no nsqlookupd answered /lookup?topic={topic}: "
                             f"{'; '.join(failures)}")
    found = set()
    for host, http_port in producers:
        try:
            info = _get_json(f"http://{_join(host, http_port)}/info", timeout)
        except (OSError, ValueError) as err:
            log.warning("broker %s listed by nsqlookupd did not answer /info: %s",
                        _join(host, http_port), err)
            continue
        grpc = grpc_address(info, host)
        if grpc:
            found.add(grpc)
    return sorted(found)


class Fleet:
    """The brokers that have ``topic``, asked of nsqlookupd at most every
    ``poll_interval`` seconds (the driver calls ``brokers`` before each batch)."""

    def __init__(self, lookupd_http_addresses: Iterable[str], topic: str, *,
                 poll_interval: float = 5.0, timeout: float = 5.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.lookupd_http_addresses = list(lookupd_http_addresses)
        self.topic = topic
        self.poll_interval = poll_interval
        self.timeout = timeout
        self._clock = clock
        self._brokers: list[str] | None = None
        self._asked_at = 0.0

    def brokers(self) -> list[str]:
        now = self._clock()
        if self._brokers is not None and now - self._asked_at < self.poll_interval:
            return self._brokers
        try:
            found = discover(self.lookupd_http_addresses, self.topic, self.timeout)
        except DiscoveryError as err:
            if self._brokers is None:
                raise
            log.warning("%s; keeping the %d broker(s) found before", err, len(self._brokers))
            found = self._brokers
        self._brokers, self._asked_at = found, now
        return found


def producer_http_addresses(lookup: dict) -> list[tuple[str, int]]:
    """(broadcast address, HTTP port) of each producer in a ``/lookup`` answer.

    nsqlookupd before 1.0 wrapped its answer in ``{"data": ...}``; both are read.
    """
    body = lookup.get("data", lookup) if isinstance(lookup, dict) else {}
    return [(p["broadcast_address"], int(p["http_port"]))
            for p in body.get("producers") or []
            if p.get("broadcast_address") and p.get("http_port")]


def grpc_address(info: dict, broadcast_address: str) -> str | None:
    """The gRPC ``host:port`` from a broker's ``/info``; None if it has none.

    A wildcard host is replaced by ``broadcast_address``.
    """
    address = info.get("grpc_address") or ""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        return None
    if host in WILDCARD_HOSTS:
        host = broadcast_address
    return _join(host.strip("[]"), int(port))


def _join(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _base_url(address: str) -> str:
    address = address.strip().rstrip("/")
    return address if address.startswith(("http://", "https://")) else f"http://{address}"


def _get_json(url: str, timeout: float) -> dict:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.loads(response.read())
