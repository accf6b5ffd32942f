"""Which ``Host`` a request to the HTTP API may name: the guard against DNS rebinding.

A page on another site can make its own name resolve to 127.0.0.1; the browser then
sends the broker same-origin requests (the cross-origin guard sees nothing wrong) whose
``Host`` is that site's name. So a request's ``Host`` must be one the broker answers to:

- ``--http-allowed-hosts`` given (repeatable, or comma-separated): one of those names
  (any port); ``*`` accepts any;
- not given, listening on loopback: a loopback name or address (``localhost``,
  ``*.localhost``, ``127.x.x.x``, ``::1``), the listen host, this machine's host name
  and ``--broadcast-address`` (what nsqlookupd hands nsqadmin): names a rebinding
  site cannot take;
- not given, listening beyond loopback: any (put the names on the list to narrow it).

A request without ``Host`` (not a browser: HTTP/1.0 tools) is served.
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .tls import is_loopback

if TYPE_CHECKING:
    from ..options import Options


def host_of(value: str) -> str:
    """``Host`` without its port, brackets or final dot, lowercased."""
    value = value.strip().lower()
    if value.startswith("["):
        value = value[1:].partition("]")[0]
    elif value.count(":") == 1:
        value = value.partition(":")[0]
    return value.rstrip(".")


def is_loopback_name(host: str) -> bool:
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class HostPolicy:
    allowed: frozenset[str] | None = None    # None: any name
    loopback: bool = False                   # loopback names and addresses too

    def allows(self, header: str | None) -> bool:
        if header is None or self.allowed is None:
            return True
        host = host_of(header)
        return host in self.allowed or (self.loopback and is_loopback_name(host))


def allowed_hosts(values: "tuple[str, ...] | str") -> tuple[str, ...]:
    """``--http-allowed-hosts``: names, one per value or comma-separated, checked."""
    values = (values,) if isinstance(values, str) else tuple(values)
    given = [h.strip() for value in values for h in value.split(",") if h.strip()]
    for host in given:
        if not host_of(host) or any(c.isspace() or c in "/@?#" for c in host):
            raise ValueError(f"http-allowed-hosts: {host!r} is not a host name")
    return tuple(host_of(h) for h in given)


def policy(options: "Options", listen_address: str) -> HostPolicy:
    """The ``Host`` names a listener on ``listen_address`` answers to."""
    if options.http_allowed_hosts:
        if "*" in options.http_allowed_hosts:
            return HostPolicy()
        return HostPolicy(frozenset(options.http_allowed_hosts))
    if not is_loopback(listen_address):
        return HostPolicy()
    own = {host_of(listen_address.rpartition(":")[0]), socket.gethostname().lower()}
    if options.broadcast_address:
        own.add(host_of(options.broadcast_address))
    return HostPolicy(frozenset(own), loopback=True)
