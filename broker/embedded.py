"""A broker inside the current process, for tests, notebooks and demos.

    with EmbeddedBroker() as broker:           # free loopback ports
                                                # (tls_cert=, tls_key=, auth_http_addresses=
                                                # [...]: TLS and auth, as pynsqd's flags)
        print(broker.address)                   # gRPC: "127.0.0.1:NNNNN"
        print(broker.tcp_address, broker.http_address)  # NSQ's TCP and HTTP
        ...

It runs its own event loop in a daemon thread; ``call`` runs a function on that
loop (where the core lives) and returns its result.
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import Future
from typing import Any, Callable, TypeVar

from .app import BrokerApp, new_event_loop
from .core import Broker
from .options import Options

T = TypeVar("T")


class EmbeddedBroker:
    def __init__(self, options: Options | None = None, **option_values: Any) -> None:
        if options is None:
            for name in ("grpc_address", "tcp_address", "http_address"):
                option_values.setdefault(name, "127.0.0.1:0")
            options = Options(**option_values)
        elif option_values:
            options = options.replace(**option_values)
        self.options = options
        self._app: BrokerApp | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> str:
        """host:port of the gRPC API."""
        if self._app is None:
            raise RuntimeError("the embedded broker is not running")
        return self._app.grpc_address

    @property
    def tcp_address(self) -> str:
        """host:port of NSQ's TCP protocol."""
        return self.app.tcp_address

    @property
    def http_address(self) -> str:
        """host:port of nsqd's HTTP API."""
        return self.app.http_address

    @property
    def https_address(self) -> str:
        """host:port of nsqd's HTTP API over TLS (with ``https_address`` and a certificate)."""
        return self.app.https_address

    @property
    def broker(self) -> Broker:
        """The core. Touch it only through ``call``."""
        if self._app is None:
            raise RuntimeError("the embedded broker is not running")
        return self._app.broker

    @property
    def app(self) -> BrokerApp:
        if self._app is None:
            raise RuntimeError("the embedded broker is not running")
        return self._app

    def start(self) -> "EmbeddedBroker":
        if self._app is not None:
            return self
        started: Future = Future()
        self._loop = new_event_loop(self.options.event_loop)   # (as pynsqd's --event-loop)

        def run() -> None:
            asyncio.set_event_loop(self._loop)
            app = BrokerApp(self.options)
            try:
                self._loop.run_until_complete(app.start())
            except BaseException as err:
                started.set_exception(err)
                return
            self._app = app
            started.set_result(None)
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, name="pynsq-embedded", daemon=True)
        self._thread.start()
        try:
            started.result(timeout=30)
        except BaseException:
            self._thread.join(timeout=5)
            self._loop.close()
            self._loop = None
            raise
        return self

    def stop(self) -> None:
        if self._app is None or self._loop is None:
            return
        asyncio.run_coroutine_threadsafe(self._app.stop(), self._loop).result(timeout=30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        assert self._thread is not None
        self._thread.join(timeout=30)
        self._loop.close()
        self._app = None
        self._loop = None

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` on the broker's loop and return its result."""
        if self._loop is None:
            raise RuntimeError("the embedded broker is not running")

        async def run() -> T:
            return fn(*args)

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(timeout=30)

    def __enter__(self) -> "EmbeddedBroker":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
