"""A running broker: the core, its clock ticking, and its servers.

``BrokerApp`` is what ``pynsqd`` runs and what ``EmbeddedBroker`` runs in a
thread. It must be started and stopped on the event loop that owns the core.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

from .core import TICK_INTERVAL, Broker
from .identity import data_path_identity
from .lease import LeaseJournal
from .lookupd import LookupdRegistration
from .options import Options
from .security.guard import Security
from .server.grpc_server import start_grpc_server
from .server.http import HttpApi
from .server.tcp import TcpServer
from .statsd import StatsdPusher
from .storage import DiskStore, MemoryStore

log = logging.getLogger("pynsqd")
_last_accept_failure = 0.0


def _log_accept_failures(loop: asyncio.AbstractEventLoop, context: dict) -> None:
    """At the open-file limit asyncio reports every failed ``accept`` (many per
    second, each with a traceback) and retries a second later; the broker keeps
    serving its connected clients meanwhile. Say it once a second, in one line."""
    global _last_accept_failure
    if not str(context.get("message", "")).startswith("socket.accept() out of system resource"):
        loop.default_exception_handler(context)
        return
    now = time.monotonic()
    if now - _last_accept_failure >= 1.0:
        _last_accept_failure = now
        log.error("cannot accept connections: %s (connected clients are still served; "
                  "retrying)", context.get("exception"))


def new_event_loop(choice: str = "asyncio") -> asyncio.AbstractEventLoop:
    """A new event loop of the kind ``--event-loop`` names: ``asyncio``, ``uvloop``
    (an error naming the option when it is not installed), or ``auto`` (uvloop
    when installed, else asyncio)."""
    if choice in ("uvloop", "auto"):
        try:
            import uvloop
        except ImportError:
            if choice == "uvloop":
                raise ValueError("event-loop uvloop: the uvloop package is not installed "
                                 "(install pynsq-broker[uvloop], or use asyncio)") from None
        else:
            return uvloop.new_event_loop()
    return asyncio.new_event_loop()


class BrokerApp:
    def __init__(self, options: Options | None = None) -> None:
        self.options = options or Options()
        self.broker = Broker(self.options)
        self.grpc_address = self.tcp_address = self.http_address = self.https_address = ""
        self.addresses: dict[str, str] = {}
        self._grpc = None
        self._tcp: TcpServer | None = None
        self._http: HttpApi | None = None
        self._https: HttpApi | None = None
        self._ticker: asyncio.Task | None = None
        self._lookupd: LookupdRegistration | None = None
        self._statsd: StatsdPusher | None = None
        self.security: Security | None = None

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        if loop.get_exception_handler() is None:   # leave an embedding program's own alone
            loop.set_exception_handler(_log_accept_failures)
        if self.options.data_path:
            storage = DiskStore(self.broker, self.options)
            self.broker.storage = storage
            try:
                self.broker.recover(
                    storage, LeaseJournal(Path(self.options.data_path) / "leases.journal"))
            except BaseException:
                self.broker.storage = MemoryStore(self.options.max_memory_bytes)
                storage.abandon()
                raise
        try:
            self.security = Security.from_options(self.options)
            self._grpc, self.grpc_address = await start_grpc_server(
                self.broker, self.options.grpc_address, self.security)
            self.addresses["grpc"] = self.grpc_address
            # The default node id depends on the gRPC port: one the OS picked (port 0)
            # is known only now. Ids keep increasing across the change.
            node_id = self.options.node_id_for(self.grpc_address)
            if node_id != self.broker.new_id.node_id:
                self.broker.new_id.node_id = node_id
            if self.options.data_path:
                # Named by its data path, not its address: a reader finds its leases after
                # a restart on other ports.
                self.broker.identity = data_path_identity(self.options.data_path, node_id)
            else:
                self.broker.identity = f"n{node_id}-{self.broker.instance_id}"
            if self.options.tcp_address:
                self._tcp = TcpServer(self.broker, self.security)
                self.tcp_address = await self._tcp.start(self.options.tcp_address)
                self.addresses["tcp"] = self.tcp_address
                log.info("TCP (NSQ protocol V2): listening on %s", self.tcp_address)
            if self.options.http_address:
                self._http = HttpApi(self.broker, self.addresses, self.security)
                self.http_address = await self._http.start(self.options.http_address)
                self.addresses["http"] = self.http_address
                log.info("HTTP (nsqd API): listening on %s", self.http_address)
            if self.options.https_address:
                self._https = HttpApi(self.broker, self.addresses, self.security, tls=True)
                self.https_address = await self._https.start(self.options.https_address)
                self.addresses["https"] = self.https_address
                log.info("HTTPS (nsqd API over TLS): listening on %s", self.https_address)
        except BaseException:
            await self._stop_servers(0)
            self._close_storage()
            raise
        self._ticker = asyncio.create_task(self._tick_forever())
        log.info("gRPC: listening on %s (node id %d, identity %s)", self.grpc_address,
                 self.broker.new_id.node_id, self.broker.identity)
        if self.options.lookupd_tcp_address:
            self._lookupd = LookupdRegistration(self.broker, self.addresses)
            self._lookupd.start()
        if self.options.statsd_address:
            self._statsd = StatsdPusher(self.broker, self.addresses)
            self._statsd.start()

    async def stop(self, grace: float = 1.0) -> None:
        if self._lookupd is not None:
            await self._lookupd.close()
            self._lookupd = None
        if self._statsd is not None:
            await self._statsd.close()
            self._statsd = None
        await self._stop_servers(grace)
        if self._ticker is not None:
            self._ticker.cancel()
            self._ticker = None
        self._close_storage()
        log.info("stopped")

    async def _stop_servers(self, grace: float) -> None:
        if self._https is not None:
            await self._https.close()
            self._https = None
        if self._http is not None:
            await self._http.close()
            self._http = None
        if self._tcp is not None:
            await self._tcp.close()
            self._tcp = None
        if self._grpc is not None:
            await self._grpc.stop(grace)
            self._grpc = None
        if self.security is not None:
            await self.security.close()

    def _close_storage(self) -> None:
        # The storage first: its last sync fsyncs the lease journal too.
        storage, self.broker.storage = self.broker.storage, MemoryStore(
            self.options.max_memory_bytes)
        storage.close()
        journal, self.broker.lease_journal = self.broker.lease_journal, None
        if journal is not None:
            journal.close()

    async def _tick_forever(self) -> None:
        while True:
            await asyncio.sleep(TICK_INTERVAL)
            try:
                self.broker.tick()
                self.broker.storage.tick()
            except Exception:  # a bug must not stop time for everyone
                log.exception("tick failed")
