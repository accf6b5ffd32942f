"""A running broker: the core, its clock ticking, and its servers.

``BrokerApp`` is what ``pynsqd`` runs and what ``EmbeddedBroker`` runs in a
thread. It must be started and stopped on the event loop that owns the core.
"""

from __future__ import annotations

import asyncio
import logging

from .core import TICK_INTERVAL, Broker
from .options import Options
from .security.guard import Security
from .server.grpc_server import start_grpc_server
from .server.http import HttpApi
from .server.tcp import TcpServer
from .storage import Storage

log = logging.getLogger("pynsqd")


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
        self.security: Security | None = None

    async def start(self) -> None:
        if self.options.data_path:
            storage = Storage(self.broker, self.options)
            try:
                storage.recover()
            except BaseException:
                storage.close()
                raise
            self.broker.storage = storage
        try:
            self.security = Security.from_options(self.options)
            self._grpc, self.grpc_address = await start_grpc_server(
                self.broker, self.options.grpc_address, self.security)
            self.addresses["grpc"] = self.grpc_address
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
        log.info("gRPC: listening on %s", self.grpc_address)

    async def stop(self, grace: float = 1.0) -> None:
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
        storage, self.broker.storage = self.broker.storage, None
        if storage is not None:
            storage.close()

    async def _tick_forever(self) -> None:
        while True:
            await asyncio.sleep(TICK_INTERVAL)
            try:
                self.broker.tick()
                if self.broker.storage is not None:
                    self.broker.storage.tick()
            except Exception:  # a bug must not stop time for everyone
                log.exception("tick failed")
