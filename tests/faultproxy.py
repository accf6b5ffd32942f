"""A small TCP proxy for failure tests: forwards loopback connections to a target
and can cut them, delay them, or black-hole them (accept, forward nothing).

    with FaultProxy("127.0.0.1:4170") as proxy:
        client = Client(proxy.address)
        proxy.cut()              # close every open connection now
        proxy.blackhole(True)    # keep connections open but drop what flows
        proxy.delay(0.2)         # hold each chunk this many seconds
"""

from __future__ import annotations

import socket
import threading
import time


class FaultProxy:
    def __init__(self, target: str) -> None:
        host, _, port = target.rpartition(":")
        self.target = (host, int(port))
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._closed = False
        self._blackhole = False
        self._delay = 0.0
        self.accepted = 0
        threading.Thread(target=self._accept, daemon=True, name="faultproxy").start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                down, _ = self._listener.accept()
            except OSError:
                return
            try:
                up = socket.create_connection(self.target, timeout=5)
            except OSError:
                down.close()
                continue
            up.settimeout(None)
            with self._lock:
                self._conns.update((down, up))
                self.accepted += 1
            for src, dst in ((down, up), (up, down)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if self._delay:
                    time.sleep(self._delay)
                if not self._blackhole:
                    dst.sendall(data)
        except OSError:
            pass
        finally:
            self._drop(src, dst)

    def _drop(self, *socks: socket.socket) -> None:
        for s in socks:
            with self._lock:
                self._conns.discard(s)
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def cut(self) -> None:
        """Close every open connection (new ones are still accepted)."""
        with self._lock:
            conns = list(self._conns)
        self._drop(*conns)

    def blackhole(self, on: bool = True) -> None:
        self._blackhole = on

    def delay(self, seconds: float) -> None:
        self._delay = seconds

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        self.cut()

    def __enter__(self) -> "FaultProxy":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
