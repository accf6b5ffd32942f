"""NSQ's own binaries (nsqlookupd, nsqadmin, nsq_tail) for the tests, on loopback ports.

They are found in ``$NSQ_BIN``, by default the folder ``../shared/nsq/bin`` next to
the repository; a test that needs one skips, saying so, where it is absent.
"""

from __future__ import annotations

import json
import os
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from .helpers import free_port, wait_for

REPO = Path(__file__).resolve().parent.parent
NSQ_BIN = Path(os.environ.get("NSQ_BIN") or REPO.parent / "shared" / "nsq" / "bin")


def nsq_binary(name: str) -> str:
    """The path of one of NSQ's binaries, or skip the test with the reason."""
    path = NSQ_BIN / name
    if not os.access(path, os.X_OK):
        pytest.skip(f"NSQ's {name} not found in {NSQ_BIN} (set NSQ_BIN to the folder of "
                    f"NSQ 1.3's binaries)")
    return str(path)


def http_json(url: str, method: str = "GET", body: bytes | None = None,
              timeout: float = 10) -> dict:
    """GET (or ``method``) a URL and decode its JSON; HTTP errors raise."""
    request = urllib.request.Request(url, data=body, method=method)
    if body is not None:
        request.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(request, timeout=timeout) as response:
        data = response.read()
    return json.loads(data) if data else {}


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


class NsqProcess:
    """One of NSQ's daemons as a subprocess; ``stop`` ends it."""

    def __init__(self, args: list[str], ping_url: str) -> None:
        self.args = args
        self.ping_url = ping_url
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 30) -> "NsqProcess":
        self.proc = subprocess.Popen(self.args, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE)

        def up() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"{self.args[0]} exited: "
                                     f"{self.proc.stderr.read().decode(errors='replace')}")
            return http_ok(self.ping_url)

        wait_for(up, timeout, interval=0.05, message=f"{Path(self.args[0]).name} to answer")
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc is not None:
            self.proc.stderr.close()
        self.proc = None


class Lookupd(NsqProcess):
    """A real nsqlookupd on two free loopback ports (the same ports across restarts)."""

    def __init__(self, *flags: str) -> None:
        self.tcp_address = f"127.0.0.1:{free_port()}"
        self.http_address = f"127.0.0.1:{free_port()}"
        super().__init__([nsq_binary("nsqlookupd"), "--tcp-address", self.tcp_address,
                          "--http-address", self.http_address,
                          "--broadcast-address", "127.0.0.1", "--log-level", "warn", *flags],
                         f"http://{self.http_address}/ping")

    def lookup(self, topic: str) -> list[dict]:
        """The producers nsqlookupd lists for ``topic`` (none if it knows no such topic)."""
        try:
            return http_json(f"http://{self.http_address}/lookup?topic={topic}")["producers"]
        except urllib.error.HTTPError as err:
            if err.code == 404:
                return []
            raise

    def channels(self, topic: str) -> list[str]:
        return http_json(f"http://{self.http_address}/channels?topic={topic}")["channels"]
