"""NSQ's own benchmark tools against pynsqd and nsqd, side by side in one run.

    python benchmarks/nsq_bench.py [--runfor 10s] [--rounds 1] [--nsq-bin DIR]
        [--event-loop asyncio uvloop]

``bench_writer`` (MPUB of 200 × 100-byte messages, one connection per core)
runs for ``--runfor`` against each broker, then ``bench_reader`` (RDY 2500, one
connection per core) reads what was written for half as long: a reader that ran
out of messages would report the writer's rate, not its own. Each broker is a
fresh subprocess with its data in a temporary directory (nsqd spills past
``--mem-queue-size`` to disk; pynsqd runs with ``--data-path`` so it does too).
nsqd runs once more with ``--mem-queue-size 1000000`` (everything in memory, nothing
durable): what a user who compares durable pynsqd with nsqd's fastest setting sees.
pynsqd runs once per event loop asked for (by default asyncio, and uvloop too
when it is installed), and once more memory only (no ``--data-path``), which
tells storage's share of its cost from the rest. Reported: msgs/s, and the
broker's CPU time per message (from ``/proc``; steadier than msgs/s on a shared
machine). The ratios are pynsqd ÷ nsqd from the same round; with ``--rounds`` each
figure and ratio is the median over the rounds, but for the ratios of CPU per message
(``cpu_ratios_worst``): the highest round's, since the goal is to be at or under
nsqd's in every round.

NSQ's binaries are looked for in ``$NSQ_BIN``, else ``../shared/nsq/bin``
beside the repository; when they are absent the benchmark says so and skips.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import socket
import statistics
import struct
import subprocess
import tempfile
from pathlib import Path
from typing import Callable

try:
    from .common import cpu_seconds, free_port, start, start_pynsqd, stop, wait_listening
except ImportError:  # run as a script
    from common import cpu_seconds, free_port, start, start_pynsqd, stop, wait_listening

REPO = Path(__file__).resolve().parents[1]
SIZE, BATCH = 100, 200
OPS = re.compile(r"([\d.]+)ops/s")
GO_DURATION = re.compile(r"([\d.]+)(ns|us|µs|ms|s|m|h)")
DURATION = re.compile(r"duration: ((?:[\d.]+(?:ns|us|µs|ms|s|m|h))+)")  # "1.2s", "503.5ms"
SECONDS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def seconds(duration: str) -> float:
    """Seconds of a Go duration (``"10s"``, ``"503.5ms"``, ``"1m30s"``)."""
    parts = GO_DURATION.findall(duration)
    if not parts or "".join(n + u for n, u in parts) != duration:
        raise ValueError(f"--runfor {duration!r} is not a Go duration such as 10s or 1m30s")
    return sum(float(n) * SECONDS[u] for n, u in parts)


def halved(runfor: str) -> str:
    """Half of a Go duration (``"10s"`` -> ``"5s"``; ``"1m30s"`` -> ``"45s"``)."""
    return f"{seconds(runfor) / 2:g}s"


def nsq_bin(explicit: str | None = None) -> Path | None:
    """The folder holding NSQ's binaries, or None when it is not there."""
    folder = Path(explicit or os.environ.get("NSQ_BIN") or REPO.parent / "shared" / "nsq" / "bin")
    needed = ("nsqd", "bench_writer", "bench_reader")
    return folder if all((folder / name).is_file() for name in needed) else None


def event_loops() -> list[str]:
    """The event loops pynsqd can run here: asyncio, and uvloop when installed."""
    return ["asyncio", *(["uvloop"] if importlib.util.find_spec("uvloop") else [])]


def bench(tool: Path, tcp_port: int, runfor: str, topic: str, pid: int) -> tuple[float, float]:
    """Run one of NSQ's bench tools; (its ops/s, broker CPU µs per message)."""
    cpu0 = cpu_seconds(pid)
    out = subprocess.run([str(tool), "--nsqd-tcp-address", f"127.0.0.1:{tcp_port}",
                          "--runfor", runfor, "--size", str(SIZE), "--topic", topic,
                          *(["--batch-size", str(BATCH)] if tool.name == "bench_writer" else [])],
                         capture_output=True, text=True, timeout=600, check=True)
    cpu = cpu_seconds(pid) - cpu0
    text = out.stdout + out.stderr
    found, took = OPS.findall(text), DURATION.findall(text)
    if not found or not took:
        raise RuntimeError(f"{tool.name} printed no rate: {text}")
    rate = float(found[-1])
    return rate, cpu / (rate * seconds(took[-1])) * 1e6 if rate else 0.0


# The shapes each broker setup is run in (a fresh broker for each):
#   no channel: NSQ's bench.sh (the topic has no channel while bench_writer writes, then
#       bench_reader reads);
#   channel first: the topic and bench_reader's channel created before the write (as when
#       consumers exist), then bench_writer, then bench_reader;
#   together: the channel created, then bench_writer and bench_reader run at once for
#       ``--runfor`` (a live pipeline), each rate reported.
SHAPES = ("no_channel", "channel_first", "together")
CHANNEL = "ch"   # bench_reader's default channel


def create_channel(tcp_port: int, topic: str, channel: str = CHANNEL) -> None:
    """Create ``topic`` and its ``channel`` as a consumer would: SUB, then leave (both stay,
    in nsqd and pynsqd alike)."""
    with socket.create_connection(("127.0.0.1", tcp_port), timeout=30) as s:
        s.sendall(b"  V2" + b"SUB %s %s\n" % (topic.encode(), channel.encode()))
        reply = b""
        while len(reply) < 4 or len(reply) < 4 + struct.unpack(">i", reply[:4])[0]:
            chunk = s.recv(4096)
            if not chunk:
                break
            reply += chunk
        if b"OK" not in reply:
            raise RuntimeError(f"SUB {topic} {channel} was refused: {reply!r}")


def write_and_read_together(folder: Path, tcp_port: int, runfor: str, pid: int) -> dict:
    """bench_writer and bench_reader at once for ``runfor`` on a topic whose channel exists;
    each tool's rate, and the broker's CPU per message written (each is read about once)."""
    topic = f"sub_bench_{tcp_port}"
    create_channel(tcp_port, topic)
    return tools_together(folder, [f"127.0.0.1:{tcp_port}"], runfor, topic,
                          lambda: cpu_seconds(pid))


def tools_together(folder: Path, targets: list[str], runfor: str, topic: str,
                   cpu: "Callable[[], float]", env: dict | None = None) -> dict:
    """On each of ``targets`` a ``bench_writer`` and a ``bench_reader`` at once for
    ``runfor`` (``env``: theirs); each tool's rate summed over the targets, and the CPU
    ``cpu()`` counts (the brokers') per message moved."""
    cpu0 = cpu()
    procs = [(tool, subprocess.Popen(
        [str(folder / tool), "--nsqd-tcp-address", target, "--runfor", runfor,
         "--size", str(SIZE), "--topic", topic,
         *(["--batch-size", str(BATCH)] if tool == "bench_writer" else [])],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env))
        for target in targets for tool in ("bench_writer", "bench_reader")]
    out = [(tool, p, p.communicate(timeout=600)[0]) for tool, p in procs]
    used = cpu() - cpu0
    rates = {"bench_writer": 0.0, "bench_reader": 0.0}
    counts = {"bench_writer": 0.0, "bench_reader": 0.0}
    for tool, proc, text in out:
        found, took = OPS.findall(text), DURATION.findall(text)
        if proc.returncode or not found or not took:
            raise RuntimeError(f"{tool} printed no rate: {text}")
        rates[tool] += float(found[-1])
        counts[tool] += float(found[-1]) * seconds(took[-1])
    moved = max(counts.values())
    cpu_us = round(used / moved * 1e6, 2) if moved else 0.0
    return {"write_msgs_per_s": round(rates["bench_writer"]),
            "read_msgs_per_s": round(rates["bench_reader"]),
            "write_cpu_us_per_msg": cpu_us, "read_cpu_us_per_msg": cpu_us}


def exercise(folder: Path, tcp_port: int, runfor: str, pid: int, shape: str) -> dict:
    """One of ``SHAPES`` against the broker listening on ``tcp_port`` (process ``pid``)."""
    if shape == "together":
        return write_and_read_together(folder, tcp_port, runfor, pid)
    return write_then_read(folder, tcp_port, runfor, pid, channel_first=shape == "channel_first")


def write_then_read(folder: Path, tcp_port: int, runfor: str, pid: int,
                    channel_first: bool = False) -> dict:
    topic = f"sub_bench_{tcp_port}"
    if channel_first:
        create_channel(tcp_port, topic)
    write, write_cpu = bench(folder / "bench_writer", tcp_port, runfor, topic, pid)
    read, read_cpu = bench(folder / "bench_reader", tcp_port, halved(runfor), topic, pid)
    return {"write_msgs_per_s": round(write), "read_msgs_per_s": round(read),
            "write_cpu_us_per_msg": round(write_cpu, 2), "read_cpu_us_per_msg": round(read_cpu, 2)}


def run_nsqd(folder: Path, runfor: str, mem_queue_size: int | None = None,
             shape: str = "no_channel") -> dict:
    """nsqd spilling past its default --mem-queue-size, or with ``mem_queue_size``
    (1,000,000: everything the run writes held in memory, nothing durable), in ``shape``."""
    tcp, http = free_port(), free_port()
    size = ["--mem-queue-size", str(mem_queue_size)] if mem_queue_size else []
    with tempfile.TemporaryDirectory(prefix="nsqd-bench-") as data:
        proc = start([str(folder / "nsqd"), "--tcp-address", f"127.0.0.1:{tcp}",
                      "--http-address", f"127.0.0.1:{http}", "--data-path", data,
                      "--log-level", "warn", *size], tcp)
        try:
            return exercise(folder, tcp, runfor, proc.pid, shape)
        finally:
            stop(proc)


def run_pynsqd(folder: Path, runfor: str, event_loop: str = "asyncio",
               durable: bool = True, shape: str = "no_channel") -> dict:
    """pynsqd under ``event_loop``; with ``durable`` False, without a data path (memory
    only), which tells storage's share of the cost from the rest; in ``shape``."""
    tcp = free_port()
    with tempfile.TemporaryDirectory(prefix="pynsqd-bench-") as data:
        loop = ["--event-loop", event_loop] if event_loop != "asyncio" else []
        path = ["--data-path", data] if durable else []
        proc, _ = start_pynsqd("--tcp-address", f"127.0.0.1:{tcp}", "--http-address", "",
                               *path, *loop)
        try:
            wait_listening(tcp)
            return exercise(folder, tcp, runfor, proc.pid, shape)
        finally:
            stop(proc)


def production_shapes(folder: Path, runfor: str, loop: str) -> dict:
    """The shapes beyond NSQ's own (channel first; writer and reader together), each with
    nsqd spilling, nsqd in memory, pynsqd durable and pynsqd memory-only under ``loop``;
    every ratio and CPU ratio of ``CPU_COMPARISONS``, and pynsqd durable ÷ nsqd spilling."""
    out = {}
    for shape in SHAPES[1:]:
        setups = {"nsqd": run_nsqd(folder, runfor, shape=shape),
                  "nsqd_memory": run_nsqd(folder, runfor, 1_000_000, shape=shape),
                  "pynsqd": run_pynsqd(folder, runfor, loop, shape=shape),
                  "pynsqd_memory_only": run_pynsqd(folder, runfor, loop, durable=False,
                                                   shape=shape)}
        out[shape] = {**setups, "cpu_ratios": cpu_ratios(setups), "ratios": {
            name: {kind: round(setups[ours][f"{kind}_msgs_per_s"]
                               / setups[theirs][f"{kind}_msgs_per_s"], 3)
                   if setups[theirs][f"{kind}_msgs_per_s"] else None
                   for kind in ("write", "read")}
            for name, (ours, theirs, _) in CPU_COMPARISONS.items()}}
    return out


def one_round(folder: Path, runfor: str, loops: list[str], production: bool = True) -> dict:
    """nsqd (spilling, then holding everything in memory), then pynsqd under each of
    ``loops``, then pynsqd memory only under the first; with ``production``, then the
    shapes beyond NSQ's own (``production_shapes``) under the first loop."""
    nsqd = run_nsqd(folder, runfor)
    nsqd_memory = run_nsqd(folder, runfor, mem_queue_size=1_000_000)
    by_loop = {}
    for loop in loops:
        r = run_pynsqd(folder, runfor, loop)
        by_loop[loop] = {**r, "write_ratio": round(r["write_msgs_per_s"]
                                                   / nsqd["write_msgs_per_s"], 3),
                         "read_ratio": round(r["read_msgs_per_s"] / nsqd["read_msgs_per_s"], 3)}
    memory = run_pynsqd(folder, runfor, loops[0], durable=False)
    durable = by_loop[loops[0]]
    shapes = production_shapes(folder, runfor, loops[0]) if production else {}
    return {"shapes": shapes, "nsqd": nsqd, "nsqd_memory": nsqd_memory, "by_event_loop": by_loop,
            "cpu_ratios": cpu_ratios({"pynsqd": durable, "pynsqd_memory_only": memory,
                                      "nsqd": nsqd, "nsqd_memory": nsqd_memory}),
            "durable_vs_nsqd_memory": {
                f"{kind}_ratio": round(durable[f"{kind}_msgs_per_s"]
                                       / nsqd_memory[f"{kind}_msgs_per_s"], 3)
                for kind in ("write", "read")},
            "pynsqd_memory_only": {**memory, **{
                f"{kind}_ratio": round(memory[f"{kind}_msgs_per_s"]
                                       / nsqd_memory[f"{kind}_msgs_per_s"], 3)
                for kind in ("write", "read")}}}


# pynsqd's CPU per message ÷ nsqd's, in one round: each pynsqd setup against the nsqd
# setup a user would compare it with (keys of ``run``'s result; how a row names them).
CPU_COMPARISONS = {
    "durable_vs_nsqd": ("pynsqd", "nsqd", "pynsqd durable ÷ nsqd spilling"),
    "durable_vs_nsqd_memory": ("pynsqd", "nsqd_memory", "pynsqd durable ÷ nsqd in memory"),
    "memory_only_vs_nsqd_memory": ("pynsqd_memory_only", "nsqd_memory",
                                   "pynsqd memory-only ÷ nsqd in memory"),
}


def cpu_ratios(setups: dict[str, dict]) -> dict:
    """Each of ``CPU_COMPARISONS``: pynsqd's CPU µs per message ÷ nsqd's, write and read,
    from ``setups`` (figures by the keys ``CPU_COMPARISONS`` names)."""
    out = {}
    for name, (ours, theirs, _) in CPU_COMPARISONS.items():
        out[name] = {}
        for kind in ("write", "read"):
            mine, other = (setups[ours][f"{kind}_cpu_us_per_msg"],
                           setups[theirs][f"{kind}_cpu_us_per_msg"])
            out[name][kind] = round(mine / other, 3) if other else None
    return out


def worst_cpu_ratios(rounds: list[dict]) -> dict:
    """Each CPU ratio's highest over the rounds: "at or under nsqd's in every round"
    holds when the worst round's is at most 1."""
    return {name: {kind: max((r["cpu_ratios"][name][kind] for r in rounds
                              if r["cpu_ratios"][name][kind] is not None), default=None)
                   for kind in ("write", "read")}
            for name in CPU_COMPARISONS}


def worst_shape_ratios(rounds: list[dict]) -> dict:
    """For each production shape, each rate ratio's lowest round and each CPU ratio's
    highest: the goals say "in every round"."""
    out = {}
    for shape in rounds[0]["shapes"]:
        each = [r["shapes"][shape] for r in rounds]
        out[shape] = {
            "ratios": {name: {kind: min((e["ratios"][name][kind] for e in each
                                         if e["ratios"][name][kind] is not None), default=None)
                              for kind in ("write", "read")} for name in CPU_COMPARISONS},
            "cpu_ratios": worst_cpu_ratios(each)}
    return out


def medians(results: list[dict]) -> dict:
    """The median of each figure over rounds (nested dicts alike). A ratio's median is
    the median of each round's ratio: nsqd and pynsqd measured minutes apart on a shared
    machine compare worse than within one round."""
    first = results[0]
    if isinstance(first, dict):
        return {k: medians([r[k] for r in results]) for k in first}
    value = statistics.median(results)
    return round(value, 3 if isinstance(first, float) else None) \
        if isinstance(first, (int, float)) else value


def run(runfor: str = "10s", explicit_bin: str | None = None,
        loops: list[str] | None = None, rounds: int = 1, production: bool = True) -> dict:
    """``rounds`` rounds of: nsqd, then pynsqd under each event loop of ``loops``
    (default: ``event_loops()``), then pynsqd memory only under the first; each figure
    is the median over the rounds. {"skipped": reason} when NSQ's binaries are absent.
    ``pynsqd`` and the ratios are the first loop's; ``by_event_loop`` has every loop's
    figures and ratios; ``pynsqd_memory_only`` its figures and ratios (÷ nsqd in memory:
    neither keeps anything on disk);
    ``cpu_ratios_worst`` each ``CPU_COMPARISONS`` ratio's highest round; ``shapes`` the
    production shapes' medians, ``shapes_worst`` their worst rounds, ``shapes_by_round``
    every round's ratios (``production`` False leaves them out)."""
    folder = nsq_bin(explicit_bin)
    if folder is None:
        return {"skipped": "NSQ's binaries (nsqd, bench_writer, bench_reader) were not found: "
                           "set NSQ_BIN to their folder"}
    halved(runfor)  # a bad duration fails here, before any broker starts
    loops = loops or event_loops()
    each = [one_round(folder, runfor, loops, production) for _ in range(max(1, rounds))]
    r = medians([{k: v for k, v in e.items() if k != "shapes"} for e in each])
    shapes = ({"shapes": medians([e["shapes"] for e in each]),
               "shapes_worst": worst_shape_ratios(each),
               "shapes_by_round": [{shape: {"ratios": e["shapes"][shape]["ratios"],
                                            "cpu_ratios": e["shapes"][shape]["cpu_ratios"]}
                                    for shape in e["shapes"]} for e in each]}
              if production else {})
    first = r["by_event_loop"][loops[0]]
    return {"runfor": runfor, "rounds": max(1, rounds), "nsqd": r["nsqd"],
            "pynsqd": {k: v for k, v in first.items() if not k.endswith("_ratio")},
            "write_ratio": first["write_ratio"], "read_ratio": first["read_ratio"],
            "by_event_loop": r["by_event_loop"],
            "pynsqd_memory_only": r["pynsqd_memory_only"],
            "nsqd_memory": r["nsqd_memory"], "durable_vs_nsqd_memory": r["durable_vs_nsqd_memory"],
            "cpu_ratios_worst": worst_cpu_ratios(each), **shapes}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runfor", default="10s", help="how long each tool runs (Go duration)")
    parser.add_argument("--nsq-bin", help="folder of NSQ's binaries (default: $NSQ_BIN, "
                                          "then ../shared/nsq/bin)")
    parser.add_argument("--event-loop", nargs="+", choices=("asyncio", "uvloop"),
                        help="pynsqd's event loops to run (default: asyncio, and uvloop when "
                             "installed)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="rounds of every run; each figure is the median (default 1)")
    args = parser.parse_args()
    print(json.dumps(run(args.runfor, args.nsq_bin, args.event_loop, args.rounds), indent=2))


if __name__ == "__main__":
    main()
