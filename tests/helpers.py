"""Small helpers shared by the tests."""

from __future__ import annotations

import fcntl
import json
import tempfile
import threading
import time
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Callable, Iterator, TypeVar

T = TypeVar("T")


def wait_for(condition: Callable[[], T], timeout: float = 10.0, interval: float = 0.01,
             message: str = "condition") -> T:
    """Poll ``condition`` until it returns something truthy; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message}")
        time.sleep(interval)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bin_path(name: str) -> str:
    """A console script of this environment (pynsqd, pynsq)."""
    import sys
    from pathlib import Path

    return str(Path(sys.executable).parent / name)


class Daemon:
    """``pynsqd`` as a subprocess on a free loopback port; stopped by ``stop`` or ``kill``."""

    def __init__(self, *args: str, port: int | None = None) -> None:
        import subprocess

        self.port = port or free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.proc = subprocess.Popen([bin_path("pynsqd"), "--grpc-address", self.address,
                                      "--tcp-address", "127.0.0.1:0",
                                      "--http-address", "127.0.0.1:0", *args],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout: float = 30.0) -> "Daemon":
        from broker import Client, ClientError

        client = Client(self.address, timeout=1)

        def answers() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"pynsqd exited with {self.proc.returncode}: "
                                     f"{self.output()}")
            try:
                return client.ping(timeout=1) == "OK"
            except ClientError:
                return False

        try:
            wait_for(answers, timeout, interval=0.05, message=f"pynsqd on {self.address}")
        finally:
            client.close()
        return self

    def output(self) -> str:
        if self.proc.poll() is None:
            return ""
        return self.proc.stdout.read().decode(errors="replace")

    def stop(self, sig: int | None = None, timeout: float = 30.0) -> int:
        import signal

        if self.proc.poll() is None:
            self.proc.send_signal(sig or signal.SIGTERM)
        return self.proc.wait(timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)


def rss(pid: int) -> int:
    """The resident memory of process ``pid`` in bytes (Linux: /proc)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for process {pid}")


@contextmanager
def one_at_a_time(what: str):
    """Hold ``what`` (a fixed port or the like) alone among the suite's worker processes,
    through a lock file. Not an xdist group: under pytest 9, pytest-xdist's ``--dist
    loadgroup`` no longer keeps a group on one worker (it renames ``_nodeid``, which pytest
    no longer reads), so two workers can run two such tests at once."""
    with open(Path(tempfile.gettempdir()) / f"pynsq-tests-{what}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@contextmanager
def json_http_server(answer: Callable[[str, int], object]) -> Iterator[str]:
    """An HTTP server on loopback answering every GET with ``answer(path, its own port)``
    as JSON (an nsqlookupd, or a broker's ``/info``, that the test writes); yields its
    ``host:port`` and stops it after."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            body = json.dumps(answer(self.path, self.server.server_address[1])).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
