"""A running broker: the core, its clock ticking, and its servers.

``BrokerApp`` is what ``pynsqd`` runs and what ``EmbeddedBroker`` runs in a
thread. It must be started and stopped on the event loop that owns the core.
"""

from __future__ import annotations

import asyncio
import logging

from .core import TICK_INTERVAL, Broker
from .options import Options
from .server.grpc_server import start_grpc_server
from .storage import Storage

log = logging.getLogger("pynsqd")


class BrokerApp:
    def __init__(self, options: Options | None = None) -> None:
        self.options = options or Options()
        self.broker = Broker(self.options)
        self.grpc_address = ""
        self._grpc = None
        self._ticker: asyncio.Task | None = None

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
            self._grpc, self.grpc_address = await start_grpc_server(self.broker,
                                                                   self.options.grpc_address)
        except BaseException:
            self._close_storage()
            raise
        self._ticker = asyncio.create_task(self._tick_forever())
        log.info("gRPC: listening on %s", self.grpc_address)

    async def stop(self, grace: float = 1.0) -> None:
        if self._grpc is not None:
            await self._grpc.stop(grace)
            self._grpc = None
        if self._ticker is not None:
            self._ticker.cancel()
            self._ticker = None
        self._close_storage()
        log.info("stopped")

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
