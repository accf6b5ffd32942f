"""Running the README's and every ``docs/`` page's fenced code blocks as a reader would.

A page runs **as pasted**: its ``bash`` blocks, in order, in one shell (started in a fresh
directory, this environment's ``bin`` first on ``PATH``, then NSQ's ``$NSQ_BIN``), and its
``python`` blocks, in order, in one namespace (in the same directory), the two interleaved as
the page orders them. Nothing in a block is rewritten: ports are NSQ's and pynsq's own (4150,
4151, 4170 ...), paths are relative to that directory. So a daemon a block starts in the
foreground hangs the page (and is refused before it runs: `foreground_daemons`), a daemon
a page leaves running fails it, and a block that clashes with one before it fails as it would
for a reader. An HTML comment on the line before a fence says what a block needs::

    <!-- readme-test: spark -->                 run where ``spark`` is a session (a pyspark shell)
    <!-- readme-test: nsq -->                   NSQ's own binaries (skipped without them)
    <!-- readme-test: skip: why it cannot run here -->
    <!-- readme-test: xfail: the behaviour that is broken -->

Several go on one comment, separated by ``;``; a reason runs to the comment's end. Blocks in
another language (``text``, or none) are output listings and are not run.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).parent.parent
MARKER = re.compile(r"^<!--\s*readme-test:\s*(.*?)\s*-->\s*$")
FENCE = re.compile(r"^```(\S*)\s*$")
RUNNABLE = ("python", "bash")
KNOWN_MARKS = ("spark", "nsq", "skip", "xfail")
# What runs until it is stopped: started without `&`, it holds the reader's shell.
DAEMONS = ("pynsqd", "nsqd", "nsqlookupd", "nsqadmin")
# Those flags make a daemon print and exit instead of serving.
ONE_SHOT_FLAGS = ("--help", "-h", "--version", "--print-config")


def pages() -> list[Path]:
    """Every page a reader is pointed to: README.md, then docs/, alphabetically."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


@dataclasses.dataclass
class Block:
    source: str         # the page, relative to the repository
    line: int           # line of the opening fence, 1-based
    lang: str
    code: str
    marks: dict[str, str]

    @property
    def id(self) -> str:
        return f"{self.source}:{self.line}"

    @property
    def runnable(self) -> bool:
        return self.lang in RUNNABLE


def parse_marks(text: str, where: str) -> dict[str, str]:
    """``spark; nsq; skip: reason`` -> marks; a reason runs to the comment's end."""
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
        if name in ("skip", "xfail") and not value.strip():
            raise ValueError(f"{where}: readme-test mark {name!r} needs a reason")
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
        found.append(Block(source, start + 1, fence.group(1), "\n".join(body) + "\n", marks))
        i += 1
    return found


def page_blocks(page: Path) -> list[Block]:
    return blocks(page.read_text(), str(page.relative_to(ROOT)))


SEPARATOR = re.compile(r"(&&|\|\||;|(?<![<>&])&(?![>&]))")  # a pipe is one command


def foreground_daemons(code: str) -> list[str]:
    """The commands of a bash block that start a daemon without ``&``: pasted, each
    holds the shell and nothing after it runs."""
    found = []
    for line in re.sub(r"\\\n", " ", code).splitlines():
        parts = SEPARATOR.split(line.split(" #", 1)[0])
        for command, separator in zip(parts[::2], parts[1::2] + [""]):
            try:
                words = shlex.split(command)
            except ValueError:
                words = command.split()
            if (words and Path(words[0]).name in DAEMONS and separator != "&"
                    and not any(flag in words for flag in ONE_SHOT_FLAGS)):
                found.append(command.strip())
    return found


class BlockFailed(AssertionError):
    pass


class Shell:
    """One bash a reader pastes into: blocks run in it one after another, so variables,
    ``$!`` and background jobs carry over. Under ``set -e``: a failing line ends it."""

    def __init__(self, workdir: Path, extra_path: str = "") -> None:
        self.workdir = workdir
        self.output = workdir / ".shell.out"  # a file: what a block leaves running holds it
        self.count = 0
        env = dict(os.environ)
        env["PATH"] = os.pathsep.join(filter(None, [str(Path(sys.executable).parent),
                                                    extra_path, env["PATH"]]))
        self._out = self.output.open("wb")
        self.proc = subprocess.Popen(["bash", "--norc", "--noprofile"], cwd=workdir, env=env,
                                     stdin=subprocess.PIPE, stdout=self._out,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        self._send("set -eo pipefail\n")

    def _send(self, text: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(text.encode())
        self.proc.stdin.flush()

    def said(self, since: int = 0) -> str:
        with self.output.open("rb") as f:
            f.seek(since)
            return f.read().decode(errors="replace")

    def run(self, block: Block, timeout: float = 120) -> str:
        """Run one block; its output. BlockFailed when a line fails or it is still
        running after ``timeout`` (a daemon in the foreground, say)."""
        foreground = foreground_daemons(block.code)
        if foreground:
            raise BlockFailed(f"{block.id}: starts a daemon in the foreground, so a reader's "
                              f"paste stops there: {foreground[0]!r} (end it with ' &' and "
                              f"say how to stop it)")
        self.count += 1
        script = self.workdir / f".block-{self.count}.sh"
        script.write_text(block.code)
        done = f"__readmekit_block_{self.count}_done__"
        start = self.output.stat().st_size
        # stdin from /dev/null: a command that reads it must not eat the next block
        self._send(f"source {shlex.quote(str(script))} < /dev/null\necho {done}\n")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            said = self.said(start)
            if done in said:
                return said.replace(done + "\n", "")
            if self.proc.poll() is not None:
                raise BlockFailed(f"{block.id}: exited {self.proc.returncode}\n"
                                  f"{self.said(start)}")
            time.sleep(0.05)
        raise BlockFailed(f"{block.id}: still running after {timeout:.0f} s (a daemon in the "
                          f"foreground?)\n{self.said(start)}")

    def close(self, grace: float = 30) -> list[str]:
        """End the shell; the command lines of what the page left running (each is
        killed), after ``grace`` seconds for what it stopped to finish stopping."""
        if self.proc.poll() is None:
            self._send("exit 0\n")
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        deadline = time.monotonic() + grace
        while (left := session_processes(self.proc.pid)) and time.monotonic() < deadline:
            time.sleep(0.1)
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self._out.close()
        return list(left.values())


def session_processes(sid: int) -> dict[int, str]:
    """pid -> command line of every live process in session ``sid``."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            fields = stat[stat.rindex(")") + 2:].split()
            if fields[0] == "Z" or int(fields[3]) != sid:
                continue
            found[int(entry.name)] = (entry / "cmdline").read_bytes().replace(
                b"\0", b" ").decode(errors="replace").strip()
        except (OSError, ValueError, IndexError):
            continue
    return found
