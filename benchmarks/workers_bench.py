"""Every core: one pynsqd against ``pynsqd --workers N`` (N = cores), with NSQ's own tools.

    python benchmarks/workers_bench.py [--runfor 5s] [--workers N] [--nsq-bin DIR]

Both runs are durable (``--data-path``) and get the same clients: N ``bench_writer``
processes at once (MPUB of 200 × 100 B, one connection per core each), one against each
worker's own TCP port (as a fleet's producers spread) or all N against the one pynsqd;
then N ``bench_reader`` (RDY 2500) the same way for half as long. Reported: msgs/s (the
tools' rates summed) and the brokers' CPU time per message (every worker's and the
supervisor's, from ``/proc``).

What the figures say for a bigger host: each worker is a whole broker with its own
event loop, so its CPU per message does not grow with N, and a host whose clients run
elsewhere serves about ``cores ÷ CPU per message``. On a 2-core machine the bench tools
share the two cores with the workers, so N = 2 shows less than that ceiling.
The live shape (``together``): the channel created on each worker, then on each worker
one ``bench_writer`` and one ``bench_reader`` at once, each with ``GOMAXPROCS=1`` (one
connection each: one writer and one reader per worker, the connections ``nsq_bench``'s
``together`` shape makes to nsqd: a writer and a reader of two each), against nsqd holding
everything in memory under those two tools, in rounds, the setups in turn; judged by the
worst round, as the one-process rows of that shape are.

NSQ's binaries are looked for as ``nsq_bench.py`` does; without them this skips.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

try:
    from .common import cpu_seconds, free_port, start_pynsqd, stop, wait_listening
    from .nsq_bench import (BATCH, DURATION, OPS, SIZE, create_channel, halved, nsq_bin,
                            run_nsqd, seconds, tools_together)
except ImportError:  # run as a script
    from common import cpu_seconds, free_port, start_pynsqd, stop, wait_listening
    from nsq_bench import (BATCH, DURATION, OPS, SIZE, create_channel, halved, nsq_bin,
                           run_nsqd, seconds, tools_together)

MODEL_CORES = 16


def cores() -> int:
    return len(os.sched_getaffinity(0))


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (a supervisor's workers)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(stat[1]) == pid:
                found.append(int(entry.name))
    return found


def broker_cpu(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            total += cpu_seconds(pid)
        except OSError:
            pass
    return total


def run_tools(tool: Path, targets: list[str], runfor: str, topic: str,
              pids: list[int]) -> tuple[float, float]:
    """One ``tool`` per target at once; (summed msgs/s, broker CPU µs per message)."""
    env = dict(os.environ)
    extra = ["--batch-size", str(BATCH)] if tool.name == "bench_writer" else []
    cpu0 = broker_cpu(pids)
    procs = [subprocess.Popen([str(tool), "--nsqd-tcp-address", target, "--runfor", runfor,
                               "--size", str(SIZE), "--topic", topic, *extra],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env=env) for target in targets]
    outputs = [p.communicate(timeout=600)[0] for p in procs]
    cpu = broker_cpu(pids) - cpu0
    rate = messages = 0.0
    for text in outputs:
        found, took = OPS.findall(text), DURATION.findall(text)
        if not found or not took:
            raise RuntimeError(f"{tool.name} printed no rate: {text}")
        rate += float(found[-1])
        messages += float(found[-1]) * seconds(took[-1])
    return rate, (cpu / messages * 1e6 if messages else 0.0)


def measure(folder: Path, runfor: str, workers: int, tools: int, durable: bool = True) -> dict:
    """Write then read against pynsqd with ``workers`` workers (1: a single pynsqd), with
    ``tools`` bench tools at once, spread over the workers' own ports."""
    with tempfile.TemporaryDirectory(prefix="pynsqd-workers-bench-") as data:
        proc, tcp, http = start_broker(workers, data if durable else "")
        try:
            own = wait_for_workers(http, workers) if workers > 1 else [f"127.0.0.1:{tcp}"]
            targets = [own[i % len(own)] for i in range(tools)]
            wait_listening(tcp)
            pids = [proc.pid, *children(proc.pid)]
            topic = f"workers_bench_{tcp}"
            write, write_cpu = run_tools(folder / "bench_writer", targets, runfor, topic, pids)
            read, read_cpu = run_tools(folder / "bench_reader", targets, halved(runfor), topic,
                                       pids)
        finally:
            stop(proc)
    return {"write_msgs_per_s": round(write), "read_msgs_per_s": round(read),
            "write_cpu_us_per_msg": round(write_cpu, 2),
            "read_cpu_us_per_msg": round(read_cpu, 2)}


def start_broker(workers: int, data: str, tries: int = 3) -> tuple:
    """pynsqd (``--workers N`` past 1) on free loopback ports, durable in ``data`` if
    given: (process, TCP port, HTTP port). Ports picked free here are let go until the
    broker binds them, so another process (a test beside this run) may take one first:
    the broker then exits, and is started again on others."""
    for attempt in range(tries):
        tcp, http = free_port(), free_port()
        try:
            proc, _ = start_pynsqd("--tcp-address", f"127.0.0.1:{tcp}",
                                   "--http-address", f"127.0.0.1:{http}",
                                   *(["--data-path", data] if data else []),
                                   *(["--workers", str(workers)] if workers > 1 else []))
        except RuntimeError:
            if attempt + 1 < tries:
                continue
            raise
        return proc, tcp, http


def together(folder: Path, runfor: str, workers: int, durable: bool) -> dict:
    """``pynsqd --workers N`` in the live shape (the module's doc)."""
    with tempfile.TemporaryDirectory(prefix="pynsqd-workers-bench-") as data:
        proc, tcp, http = start_broker(workers, data if durable else "")
        try:
            own = wait_for_workers(http, workers)
            topic = f"workers_together_{tcp}"
            for address in own:
                create_channel(int(address.rpartition(":")[2]), topic)
            pids = [proc.pid, *children(proc.pid)]
            return tools_together(folder, own, runfor, topic, lambda: broker_cpu(pids),
                                  {**os.environ, "GOMAXPROCS": "1"})
        finally:
            stop(proc)


# The live shape's setups: (key, pynsqd --workers durable?) each against nsqd in memory.
TOGETHER = {"durable": True, "memory_only": False}


def run_together(folder: Path, runfor: str, workers: int, rounds: int) -> dict:
    """Rounds of nsqd in memory, then each of ``TOGETHER``, in the live shape; each
    round's ratios (write and read), their worst, and the median figures."""
    by_round = []
    for _ in range(rounds):
        one = {"nsqd_memory": run_nsqd(folder, runfor, 1_000_000, shape="together")}
        for key, durable in TOGETHER.items():
            one[key] = together(folder, runfor, workers, durable)
        one["ratios"] = {key: {kind: round(one[key][f"{kind}_msgs_per_s"]
                                           / one["nsqd_memory"][f"{kind}_msgs_per_s"], 3)
                               for kind in ("write", "read")} for key in TOGETHER}
        by_round.append(one)

    def median(key: str, field: str) -> float:
        values = sorted(r[key][field] for r in by_round)
        return values[len(values) // 2]

    fields = ("write_msgs_per_s", "read_msgs_per_s", "write_cpu_us_per_msg",
              "read_cpu_us_per_msg")
    return {"rounds": by_round,
            "median": {key: {f: median(key, f) for f in fields}
                       for key in ("nsqd_memory", *TOGETHER)},
            "worst": {key: {kind: min(r["ratios"][key][kind] for r in by_round)
                            for kind in ("write", "read")} for key in TOGETHER}}


def wait_for_workers(http: int, workers: int, timeout: float = 60.0) -> list[str]:
    """Each worker's own TCP address, once the shared HTTP port lists them all and each
    answers."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{http}/info", timeout=2) as r:
                listed = json.loads(r.read()).get("workers", [])
            if len(listed) == workers:
                for w in listed:
                    wait_listening(int(w["tcp"].rpartition(":")[2]))
                return [w["tcp"] for w in listed]
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"pynsqd --workers {workers} did not list its workers")


def run(runfor: str = "5s", workers: int | None = None,
        explicit_bin: str | None = None, rounds: int = 1) -> dict:
    folder = nsq_bin(explicit_bin)
    if folder is None:
        return {"skipped": "NSQ's binaries (bench_writer, bench_reader) were not found: "
                           "set NSQ_BIN to their folder"}
    halved(runfor)
    n = workers or cores()
    one, many = measure(folder, runfor, 1, tools=n), measure(folder, runfor, n, tools=n)
    model = {kind: round(MODEL_CORES * 1e6 / many[f"{kind}_cpu_us_per_msg"])
             if many[f"{kind}_cpu_us_per_msg"] else None for kind in ("write", "read")}
    live = run_together(folder, runfor, n, rounds) if n > 1 else None
    return {"runfor": runfor, "cores": cores(), "workers": n, "one": one, "many": many,
            "together": live,
            "write_ratio": round(many["write_msgs_per_s"] / one["write_msgs_per_s"], 3),
            "read_ratio": round(many["read_msgs_per_s"] / one["read_msgs_per_s"], 3),
            f"model_{MODEL_CORES}_cores_msgs_per_s": model}


def rows(row, runfor: str, rounds: int = 1) -> list[dict]:
    """``make bench`` rows: N workers ÷ one pynsqd, write and read, CPU per message, and
    what the measured CPU per message predicts for a 16-core host; then N workers in the
    live shape ÷ nsqd in memory, durable and memory only, judged by the worst round."""
    r = run(runfor, rounds=rounds)
    if "skipped" in r:
        print(f"workers: skipped ({r['skipped']})")
        return []
    n, one, many = r["workers"], r["one"], r["many"]
    model = r[f"model_{MODEL_CORES}_cores_msgs_per_s"]
    if n < 2:
        print("workers: skipped (one core: nothing to spread over)")
        return []
    tools = {"write": "bench_writer", "read": "bench_reader"}
    out = [row(f"workers: {tools[kind]} x{n} (÷ 1 pynsqd)", many[f"{kind}_msgs_per_s"],
               "msgs/s", one[f"{kind}_msgs_per_s"],
               f"ratio -> {n} on {r['cores']} cores (clients share them); CPU us/msg "
               f"{many[f'{kind}_cpu_us_per_msg']:.2f} vs {one[f'{kind}_cpu_us_per_msg']:.2f}; "
               f"{MODEL_CORES} cores: ~{model[kind] or 0:,} msgs/s")
           for kind in ("write", "read")]
    live = r["together"]
    setups = {"durable": "durable", "memory_only": "memory-only"}
    for key, label in setups.items():
        for kind in ("write", "read"):
            rounds_ = ", ".join(f"{x['ratios'][key][kind]:.2f}" for x in live["rounds"])
            ours, theirs = live["median"][key], live["median"]["nsqd_memory"]
            out.append(row(
                f"workers x{n}, write+read together: {tools[kind]} pynsqd {label} "
                f"÷ nsqd in memory", ours[f"{kind}_msgs_per_s"], "msgs/s",
                theirs[f"{kind}_msgs_per_s"],
                f"ratio >= 1.0 in every round (worst of {len(live['rounds'])}; rounds "
                f"{rounds_}); a writer and a reader on each worker; CPU us/msg "
                f"{ours[f'{kind}_cpu_us_per_msg']:.2f} (all workers) vs "
                f"{theirs[f'{kind}_cpu_us_per_msg']:.2f}",
                ratio=live["worst"][key][kind]))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runfor", default="5s", help="how long each writer runs (Go duration)")
    parser.add_argument("--workers", type=int, help="workers of the second run (default: cores)")
    parser.add_argument("--nsq-bin", help="folder of NSQ's binaries")
    args = parser.parse_args()
    print(json.dumps(run(args.runfor, args.workers, args.nsq_bin), indent=2))


if __name__ == "__main__":
    main()
