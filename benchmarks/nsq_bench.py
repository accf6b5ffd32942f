"""NSQ's own benchmark tools against pynsqd and nsqd, side by side in one run.

    python benchmarks/nsq_bench.py [--runfor 10s] [--nsq-bin DIR]

``bench_writer`` (MPUB of 200 × 100-byte messages, one connection per core)
runs for ``--runfor`` against each broker, then ``bench_reader`` (RDY 2500, one
connection per core) drains what was written for as long. Each broker is a
fresh subprocess with its data in a temporary directory (nsqd spills past
``--mem-queue-size`` to disk; pynsqd runs with ``--data-path`` so it does too).
The ratios are pynsqd ÷ nsqd from the same run.

NSQ's binaries are looked for in ``$NSQ_BIN``, else ``../shared/nsq/bin``
beside the repository; when they are absent the benchmark says so and skips.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import tempfile
from pathlib import Path

try:
    from .common import free_port, start, start_pynsqd, stop, wait_listening
except ImportError:  # run as a script
    from common import free_port, start, start_pynsqd, stop, wait_listening

REPO = Path(__file__).resolve().parents[1]
SIZE, BATCH = 100, 200
OPS = re.compile(r"([\d.]+)ops/s")


def nsq_bin(explicit: str | None = None) -> Path | None:
    """The folder holding NSQ's binaries, or None when it is not there."""
    folder = Path(explicit or os.environ.get("NSQ_BIN") or REPO.parent / "shared" / "nsq" / "bin")
    needed = ("nsqd", "bench_writer", "bench_reader")
    return folder if all((folder / name).is_file() for name in needed) else None


def bench(tool: Path, tcp_port: int, runfor: str, topic: str) -> float:
    """Run one of NSQ's bench tools; its ops/s."""
    out = subprocess.run([str(tool), "--nsqd-tcp-address", f"127.0.0.1:{tcp_port}",
                          "--runfor", runfor, "--size", str(SIZE), "--topic", topic,
                          *(["--batch-size", str(BATCH)] if tool.name == "bench_writer" else [])],
                         capture_output=True, text=True, timeout=600, check=True)
    found = OPS.findall(out.stdout + out.stderr)
    if not found:
        raise RuntimeError(f"{tool.name} printed no rate: {out.stdout}{out.stderr}")
    return float(found[-1])


def write_then_read(folder: Path, tcp_port: int, runfor: str) -> dict:
    topic = f"sub_bench_{tcp_port}"
    write = bench(folder / "bench_writer", tcp_port, runfor, topic)
    read = bench(folder / "bench_reader", tcp_port, runfor, topic)
    return {"write_msgs_per_s": round(write), "read_msgs_per_s": round(read)}


def run_nsqd(folder: Path, runfor: str) -> dict:
    tcp, http = free_port(), free_port()
    with tempfile.TemporaryDirectory(prefix="nsqd-bench-") as data:
        proc = start([str(folder / "nsqd"), "--tcp-address", f"127.0.0.1:{tcp}",
                      "--http-address", f"127.0.0.1:{http}", "--data-path", data,
                      "--log-level", "warn"], tcp)
        try:
            return write_then_read(folder, tcp, runfor)
        finally:
            stop(proc)


def run_pynsqd(folder: Path, runfor: str) -> dict:
    tcp = free_port()
    with tempfile.TemporaryDirectory(prefix="pynsqd-bench-") as data:
        proc, _ = start_pynsqd("--tcp-address", f"127.0.0.1:{tcp}", "--http-address", "",
                               "--data-path", data)
        try:
            wait_listening(tcp)
            return write_then_read(folder, tcp, runfor)
        finally:
            stop(proc)


def run(runfor: str = "10s", explicit_bin: str | None = None) -> dict:
    """Both brokers, nsqd first; {} with a reason when NSQ's binaries are absent."""
    folder = nsq_bin(explicit_bin)
    if folder is None:
        return {"skipped": "NSQ's binaries (nsqd, bench_writer, bench_reader) were not found: "
                           "set NSQ_BIN to their folder"}
    nsqd = run_nsqd(folder, runfor)
    pynsqd = run_pynsqd(folder, runfor)
    return {"runfor": runfor, "nsqd": nsqd, "pynsqd": pynsqd,
            "write_ratio": round(pynsqd["write_msgs_per_s"] / nsqd["write_msgs_per_s"], 3),
            "read_ratio": round(pynsqd["read_msgs_per_s"] / nsqd["read_msgs_per_s"], 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runfor", default="10s", help="how long each tool runs (Go duration)")
    parser.add_argument("--nsq-bin", help="folder of NSQ's binaries (default: $NSQ_BIN, "
                                          "then ../shared/nsq/bin)")
    args = parser.parse_args()
    print(json.dumps(run(args.runfor, args.nsq_bin), indent=2))


if __name__ == "__main__":
    main()
