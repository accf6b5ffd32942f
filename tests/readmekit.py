"""Running README.md's fenced code blocks as tests.

Every fenced block is one test. A block runs as written, but for its ports and
the paths the README names as a user's own; an HTML comment on the line before
its fence says what it needs::

    <!-- readme-test: spark -->                 the session's Spark, as ``spark``
    <!-- readme-test: nsq -->                   NSQ's own binaries (skipped without them)
    <!-- readme-test: tmp /var/lib/pynsq -->    that path becomes a fresh directory
    <!-- readme-test: skip: why it cannot run here -->
    <!-- readme-test: xfail: the behaviour that is broken -->

Several go on one comment, separated by ``;``; a reason runs to the comment's end.

``python`` blocks run in one namespace, top to bottom, as a notebook would, with
``127.0.0.1:4170`` meaning a ``pynsqd`` the suite runs and ``checkpoints/`` a
fresh directory. ``bash`` blocks run under ``bash -e`` with this environment's
``bin`` first on ``PATH``, then NSQ's (``$NSQ_BIN``); NSQ's well-known ports (4150, 4151, 4152, 4160, 4161,
4170, 4171) become free ones. ``pynsq`` talks to the block's broker, and
``.venv/`` is the environment the suite runs in (``make test``'s own), and
``pynsqd`` starts one in the background and returns once it answers; a block
that starts none gets one of its own. When the block ends, each ``pynsqd`` it
started must stop cleanly on SIGTERM (exit code 0). Blocks in another language
(``text``, or none) are output listings and are not run.
"""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).parent.parent
MARKER = re.compile(r"^<!--\s*readme-test:\s*(.*?)\s*-->\s*$")
FENCE = re.compile(r"^```(\S*)\s*$")
WELL_KNOWN_PORTS = (4150, 4151, 4152, 4160, 4161, 4170, 4171)
RUNNABLE = ("python", "bash")
KNOWN_MARKS = ("spark", "nsq", "tmp", "skip", "xfail")


@dataclasses.dataclass
class Block:
    line: int           # line of the opening fence, 1-based
    lang: str
    code: str
    marks: dict[str, str]

    @property
    def id(self) -> str:
        return f"L{self.line}-{self.lang or 'text'}"

    @property
    def runnable(self) -> bool:
        return self.lang in RUNNABLE


def parse_marks(text: str, where: str) -> dict[str, str]:
    """``spark; tmp /x; skip: reason`` -> marks; a reason runs to the comment's end."""
    marks: dict[str, str] = {}
    rest = text.strip()
    while rest:
        reasoned = re.match(r"(skip|xfail)\s*:\s*(.*)$", rest, re.S)
        if reasoned:
            name, value, rest = reasoned.group(1), reasoned.group(2), ""
        else:
            part, _, rest = rest.partition(";")
            name, _, value = part.strip().partition(" ")
            rest = rest.strip()
        if name not in KNOWN_MARKS:
            raise ValueError(f"{where}: unknown readme-test mark {name!r} "
                             f"(known: {', '.join(KNOWN_MARKS)})")
        if name in ("skip", "xfail", "tmp") and not value.strip():
            raise ValueError(f"{where}: readme-test mark {name!r} needs a reason or path")
        marks[name] = value.strip()
    return marks


def blocks(text: str, source: str = "README.md") -> list[Block]:
    """The fenced blocks of a markdown text, each with the marks of the comment
    right before its fence."""
    found: list[Block] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        start = i
        marker = MARKER.match(lines[i - 1]) if i else None
        marks = parse_marks(marker.group(1), f"{source}:{i}") if marker else {}
        i += 1
        body: list[str] = []
        while i < len(lines) and not lines[i].startswith("```"):
            body.append(lines[i])
            i += 1
        found.append(Block(start + 1, fence.group(1), "\n".join(body) + "\n", marks))
        i += 1
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def with_ports(code: str, ports: dict[int, int]) -> str:
    """The code with each well-known port (``:4170``, ``4160`` as a bare word)
    replaced by its free counterpart."""
    for known, port in ports.items():
        code = re.sub(rf"(?<![\d.]){known}(?!\d)", str(port), code)
    return code


BASH_PRELUDE = r"""
set -eo pipefail
export PATH="{bin}:{nsq_bin}:$PATH"
pynsqd() {{ "{python}" -m tests.readmekit start-pynsqd "$@"; }}
pynsq() {{ command pynsq --address 127.0.0.1:{grpc} "$@"; }}
"""


def run_bash(block: Block, workdir: Path, timeout: float = 120) -> None:
    """Run a bash block; raise AssertionError with its output when it fails or a
    ``pynsqd`` it started does not stop cleanly."""
    ports = {p: free_port() for p in WELL_KNOWN_PORTS}
    code = with_ports(block.code, ports)
    if "tmp" in block.marks:
        code = code.replace(block.marks["tmp"], str(workdir / "tmp-path"))
    code = code.replace(".venv/", f"{sys.prefix}/")  # the environment the suite runs in
    pids = workdir / "pynsqd.pids"
    pids.write_text("")
    env = dict(os.environ, READMEKIT_PIDS=str(pids), READMEKIT_LOG=str(workdir / "pynsqd.log"),
               READMEKIT_PORTS=" ".join(str(ports[p]) for p in (4170, 4150, 4151)),
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT),
                                                        os.environ.get("PYTHONPATH")])))
    from .nsqkit import NSQ_BIN
    script = BASH_PRELUDE.format(bin=Path(sys.executable).parent, nsq_bin=NSQ_BIN,
                                 python=sys.executable, grpc=ports[4170])
    if not re.search(r"^\s*pynsqd\b", code, re.M):
        script += "pynsqd\n"   # a block that starts no broker talks to one of its own
    script += code
    output = workdir / "bash.out"  # a file, not a pipe: what a block leaves running holds it
    with output.open("wb") as out_file:
        proc = subprocess.Popen(["bash", "-c", script], cwd=ROOT, env=env,
                                start_new_session=True, stdout=out_file,
                                stderr=subprocess.STDOUT)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise AssertionError(f"README.md:{block.line}: still running after {timeout}s\n"
                             f"{output.read_text(errors='replace')}")
    finally:
        stopped = stop_daemons(pids)
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # what the block left in the background
        except ProcessLookupError:
            pass
    out = output.read_text(errors="replace")
    if proc.returncode != 0:
        raise AssertionError(f"README.md:{block.line}: bash exited {proc.returncode}\n{out}")
    bad = {pid: rc for pid, rc in stopped.items() if rc != 0}
    if bad:
        log = (workdir / "pynsqd.log").read_text(errors="replace")
        raise AssertionError(f"README.md:{block.line}: pynsqd did not stop cleanly {bad}\n{log}")


def stop_daemons(pids: Path) -> dict[int, int]:
    """SIGTERM every pynsqd listed, wait for each; pid -> exit code."""
    codes: dict[int, int] = {}
    for pid in map(int, pids.read_text().split()):
        codes[pid] = _terminate(pid)
    pids.write_text("")
    return codes


def _terminate(pid: int, timeout: float = 30) -> int:
    """SIGTERM a supervised pynsqd and return its exit code (-9: it had to be killed)."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    deadline = time.monotonic() + timeout
    status = Path(_status_file(pid))
    while time.monotonic() < deadline:
        if status.exists() and status.read_text().strip():
            rc = int(status.read_text())
            status.unlink()
            return rc
        time.sleep(0.05)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return -9


def _status_file(pid: int) -> str:
    return f"{os.environ.get('TMPDIR', '/tmp')}/readmekit-{pid}.rc"


# -- the ``pynsqd`` a bash block runs ---------------------------------------------------------

def start_pynsqd(args: list[str]) -> int:
    """Start ``pynsqd ARGS`` in the background on the block's ports (flags the block
    gives win), wait until it answers, and return. A pynsqd this block started
    before is stopped first: the README's ``pynsqd`` lines are alternatives."""
    pids = Path(os.environ["READMEKIT_PIDS"])
    for pid in map(int, pids.read_text().split()):
        if _terminate(pid) != 0:
            print(f"pynsqd (pid {pid}) did not stop cleanly", file=sys.stderr)
            return 1
    pids.write_text("")
    grpc, tcp, http = os.environ["READMEKIT_PORTS"].split()
    ours = ["--grpc-address", f"127.0.0.1:{grpc}", "--tcp-address", f"127.0.0.1:{tcp}",
            "--http-address", f"127.0.0.1:{http}"]
    # A supervisor keeps pynsqd's exit code in a file: this shim exits before pynsqd does.
    log = open(os.environ["READMEKIT_LOG"], "ab")
    said_from = log.tell()
    proc = subprocess.Popen([sys.executable, "-m", "tests.readmekit", "supervise",
                             str(Path(sys.executable).parent / "pynsqd"), *ours, *args],
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    with pids.open("a") as f:
        f.write(f"{proc.pid}\n")
    from broker import Client, ClientError
    address = next((a for flag, a in zip(args, args[1:]) if flag == "--grpc-address"),
                   f"127.0.0.1:{grpc}")
    client = Client(address, timeout=1)
    deadline = time.monotonic() + 30
    try:
        while time.monotonic() < deadline:
            if proc.poll() is not None:  # --version, --help, or an error: what it said
                with open(os.environ["READMEKIT_LOG"], "rb") as f:
                    f.seek(said_from)
                    sys.stdout.write(f.read().decode(errors="replace"))
                return proc.returncode
            try:
                if client.ping(timeout=1) == "OK":
                    return 0
            except ClientError:
                time.sleep(0.05)
    finally:
        client.close()
    print(f"pynsqd did not answer on {address} within 30 s", file=sys.stderr)
    return 1


def supervise(argv: list[str]) -> int:
    """Run ``argv``, pass SIGTERM on, and record its exit code where
    ``_terminate`` finds it (this process's pid is the one the block knows)."""
    Path(_status_file(os.getpid())).unlink(missing_ok=True)  # a stale one, of a reused pid
    child = subprocess.Popen(argv)
    signal.signal(signal.SIGTERM, lambda *_: child.send_signal(signal.SIGTERM))
    signal.signal(signal.SIGINT, lambda *_: child.send_signal(signal.SIGINT))
    rc = child.wait()
    Path(_status_file(os.getpid())).write_text(str(rc))
    return rc


if __name__ == "__main__":
    command, *rest = sys.argv[1:]
    if command == "start-pynsqd":
        sys.exit(start_pynsqd(rest))
    if command == "supervise":
        sys.exit(supervise(rest))
    sys.exit(f"readmekit: unknown command {command!r}")
