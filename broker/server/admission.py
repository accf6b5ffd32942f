"""Accepting connections: how many a broker holds, and what happens when it is out of
descriptors.

Every socket is a file descriptor, and the process has ``RLIMIT_NOFILE`` of them for
its clients, its data files and its auth-server connections alike. A client that
opens connections and keeps them (slow bodies, half-sent headers, idle keep-alives)
must not take the descriptors the broker needs to serve anyone else, so the TCP and
HTTP(S) listeners of a broker share one ``ConnectionGate``:

- at most ``max_connections`` connections open at once, by default the open-file
  limit less a reserve (``RESERVE_FRACTION`` of it, at least ``MIN_RESERVE``) kept
  for data files, gRPC and the auth servers;
- at most ``max_per_address`` from one client address (by default half the global
  cap), so one host cannot take them all.

A connection over either cap is accepted and closed at once (its descriptor is free
again before the next accept): the client sees its connection closed, and the broker
logs one line per ``REFUSAL_LOG_SECONDS`` with how many it refused. The accept loop
(``accept_forever``) backs off when ``accept`` itself fails for want of descriptors or
memory (EMFILE, ENFILE, ENOBUFS, ENOMEM), from ``BACKOFF_FIRST`` doubling to
``BACKOFF_MOST`` seconds, logs when it starts and when it accepts again (at most once per
``REFUSAL_LOG_SECONDS``, however often the descriptors run out and come back), and never
stops serving the connections it has.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import resource
import socket
import time
import weakref
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

log = logging.getLogger("pynsqd")

#: Part of the open-file limit no client connection may take (data files, gRPC
#: connections, auth-server connections, the broker's own).
RESERVE_FRACTION = 8           # one eighth
MIN_RESERVE = 64
#: The accept loop's pause after a failed accept: doubles up to the most.
BACKOFF_FIRST, BACKOFF_MOST = 0.05, 2.0
#: Refusals are counted and said in one log line at most this often.
REFUSAL_LOG_SECONDS = 10.0
_OUT_OF_RESOURCES = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


def open_file_limit() -> int:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


def default_max_connections(nofile: int | None = None) -> int:
    """The open-file limit less its reserve."""
    nofile = open_file_limit() if nofile is None else nofile
    return max(1, nofile - max(MIN_RESERVE, nofile // RESERVE_FRACTION))


def max_grpc_connections(options: Any) -> int:
    """The most gRPC connections at once: grpc-core keeps their count (one over it is
    closed before its handshake), apart from the TCP and HTTP(S) gate's."""
    return (getattr(options, "max_grpc_connections", 0)
            or getattr(options, "max_connections", 0) or default_max_connections())


@dataclass
class Ticket:
    """One admitted connection; ``release`` (idempotent) gives its place back."""

    gate: "ConnectionGate"
    address: str
    released: bool = False

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.gate._release(self.address)


@dataclass
class ConnectionGate:
    max_connections: int
    max_per_address: int
    open: int = 0
    by_address: Counter = field(default_factory=Counter)
    refused: int = 0
    _refused_since_log: int = 0
    _last_refusal_log: float = float("-inf")

    @classmethod
    def for_options(cls, options: Any) -> "ConnectionGate":
        total = getattr(options, "max_connections", 0) or default_max_connections()
        per = getattr(options, "max_connections_per_client", 0) or max(1, total // 2)
        return cls(total, min(per, total))

    def admit(self, address: str) -> Ticket | None:
        """A ticket for a new connection from ``address``, or None (and the refusal
        counted and, at most every ``REFUSAL_LOG_SECONDS``, logged) over a cap."""
        if self.open >= self.max_connections or \
                self.by_address[address] >= self.max_per_address:
            self._refuse(address)
            return None
        self.open += 1
        self.by_address[address] += 1
        return Ticket(self, address)

    def _release(self, address: str) -> None:
        self.open -= 1
        self.by_address[address] -= 1
        if self.by_address[address] <= 0:
            del self.by_address[address]

    def _refuse(self, address: str) -> None:
        self.refused += 1
        self._refused_since_log += 1
        now = time.monotonic()
        if now - self._last_refusal_log >= REFUSAL_LOG_SECONDS:
            log.warning("refused %d connection(s) over the connection caps (%d open of %d; "
                        "%d from %s, at most %d per address)", self._refused_since_log,
                        self.open, self.max_connections, self.by_address[address],
                        address, self.max_per_address)
            self._refused_since_log = 0
            self._last_refusal_log = now


_gates: "weakref.WeakKeyDictionary[Any, ConnectionGate]" = weakref.WeakKeyDictionary()


def gate_for(broker: Any) -> ConnectionGate:
    """The one gate of ``broker``'s listeners (made on first use, from its options)."""
    gate = _gates.get(broker)
    if gate is None:
        gate = _gates[broker] = ConnectionGate.for_options(broker.options)
    return gate


async def listening_sockets(host: str | None, port: int, *,
                            reuse_port: bool = False) -> list[socket.socket]:
    """Bound, listening, non-blocking sockets for ``host`` (None: every interface) and
    ``port``, as ``loop.create_server`` makes them."""
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, family=socket.AF_UNSPEC,
                                   type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    sockets: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in dict.fromkeys(infos):
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if reuse_port:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
            sock.listen(4096)
            sock.setblocking(False)
    except OSError:
        for sock in sockets:
            sock.close()
        raise
    return sockets


async def accept_forever(sock: socket.socket, gate: ConnectionGate, name: str,
                         serve: Callable[[socket.socket, Ticket], Any]) -> None:
    """Accept connections on ``sock`` until cancelled: each one the gate admits is
    handed to ``serve`` with its ticket (which ``serve`` must release when the
    connection ends); the others are closed at once."""
    loop = asyncio.get_running_loop()
    backoff = 0.0
    said_out_at: float | None = None     # the last "cannot accept" line, said once a while
    said_out = False
    while True:
        try:
            conn, peer = await loop.sock_accept(sock)
        except OSError as err:
            if err.errno not in _OUT_OF_RESOURCES:
                raise
            now = time.monotonic()
            if not backoff and (said_out_at is None or now - said_out_at >= REFUSAL_LOG_SECONDS):
                log.warning("%s: cannot accept connections (%s): %d open; backing off, "
                            "serving the connections it has", name, err.strerror, gate.open)
                said_out_at, said_out = now, True
            backoff = min(BACKOFF_MOST, backoff * 2 or BACKOFF_FIRST)
            await asyncio.sleep(backoff)
            continue
        if backoff:
            if said_out:
                log.warning("%s: accepting connections again", name)
                said_out = False
            backoff = 0.0
        address = peer[0] if isinstance(peer, tuple) else str(peer)
        ticket = gate.admit(address)
        if ticket is None:
            conn.close()
            continue
        conn.setblocking(False)
        try:
            serve(conn, ticket)
        except Exception:
            ticket.release()
            conn.close()
            log.exception("%s: could not serve a connection", name)


_tasks: set[asyncio.Task] = set()


def spawn(coro: Any) -> asyncio.Task:
    """A task for an accepted connection's start, kept until it is done (the loop keeps
    only a weak reference to a task)."""
    task = asyncio.get_running_loop().create_task(coro)
    _tasks.add(task)
    task.add_done_callback(_tasks.discard)
    return task


async def serve_accepted(sock: socket.socket, ticket: Ticket, protocol_factory,
                         **kwargs: Any) -> None:
    """``loop.connect_accepted_socket`` (TLS handshake included, with ``ssl``); the
    ticket is released here when that fails, by the protocol when the connection ends."""
    try:
        await asyncio.get_running_loop().connect_accepted_socket(protocol_factory, sock,
                                                                 **kwargs)
    except (OSError, asyncio.TimeoutError) as err:   # a handshake that failed or stalled
        ticket.release()
        sock.close()
        log.debug("connection from %s ended before it was served: %r", ticket.address, err)


class Listener:
    """A listener's accept loops, one per bound socket; ``close`` stops them."""

    def __init__(self, sockets: list[socket.socket], tasks: list[asyncio.Task]) -> None:
        self.sockets = sockets
        self.tasks = tasks

    @classmethod
    async def start(cls, host: str | None, port: int, gate: ConnectionGate, name: str,
                    serve: Callable[[socket.socket, Ticket], Any], *,
                    reuse_port: bool = False) -> "Listener":
        sockets = await listening_sockets(host, port, reuse_port=reuse_port)
        tasks = [asyncio.get_running_loop().create_task(accept_forever(s, gate, name, serve))
                 for s in sockets]
        return cls(sockets, tasks)

    def address(self) -> tuple:
        return self.sockets[0].getsockname()

    async def close(self) -> None:
        for task in self.tasks:
            task.cancel()
        for task in self.tasks:
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass
        for sock in self.sockets:
            sock.close()
        self.tasks = []
