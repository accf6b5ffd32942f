"""What the benchmarks share: free ports and servers started as subprocesses."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(cmd: list[str], port: int, timeout: float = 30.0) -> subprocess.Popen:
    """Run ``cmd`` and wait until something listens on ``port`` (a RuntimeError, at once,
    if it exits first)."""
    proc = subprocess.Popen(cmd)
    try:
        wait_listening(port, timeout, proc)
    except RuntimeError:
        proc.kill()
        proc.wait()
        raise
    return proc


def wait_listening(port: int, timeout: float = 30.0,
                   proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"exited with {proc.returncode} before listening on {port}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on port {port}")


def start_pynsqd(*args: str, grpc_port: int | None = None, timeout: float = 30.0
                 ) -> tuple[subprocess.Popen, str]:
    """A `pynsqd` with gRPC on a free port (TCP and HTTP too, unless ``args`` say otherwise)."""
    port = grpc_port or free_port()
    cmd = [str(Path(sys.executable).parent / "pynsqd"), "--grpc-address", f"127.0.0.1:{port}",
           "--tcp-address", "127.0.0.1:0", "--http-address", "127.0.0.1:0",
           "--log-level", "warning", *args]
    return start(cmd, port, timeout), f"127.0.0.1:{port}"


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (all its threads), from /proc."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    proc.wait(60)


def ratios(result: dict, baseline: dict) -> dict:
    """publish_ratio and consume_ratio of two {publish,consume}_msgs_per_s results."""
    return {f"{kind}_ratio": round(result[f"{kind}_msgs_per_s"] / baseline[f"{kind}_msgs_per_s"], 3)
            for kind in ("publish", "consume")}


def main_with_baseline(doc: str, default_messages: int, run, serve_baseline) -> None:
    """The command line of a throughput benchmark whose baseline server is itself."""
    import argparse
    import asyncio
    import json

    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--messages", type=int, default=default_messages)
    parser.add_argument("--baseline-server", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.baseline_server:
        asyncio.run(serve_baseline(args.baseline_server))
        return
    print(json.dumps(run(args.messages), indent=2))
