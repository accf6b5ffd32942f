"""README.md and every docs/ page run as pasted: each page's fenced blocks, in order, its
``bash`` blocks in one shell and its ``python`` blocks in one namespace (tests/readmekit.py
says how, and how a block says what it needs); and so do the examples a user is pointed to."""

from __future__ import annotations

import re
import shutil
import sys
import textwrap
from pathlib import Path

import pytest

from . import readmekit
from .helpers import one_at_a_time
from .nsqkit import NSQ_BIN

PAGES = readmekit.pages()


def _skip_reason(block: readmekit.Block) -> str | None:
    if not block.runnable:
        return "an output listing, not code"
    if "skip" in block.marks:
        return block.marks["skip"]
    if "nsq" in block.marks and not (NSQ_BIN / "nsqd").exists():
        return f"needs NSQ's binaries (not in {NSQ_BIN}; set NSQ_BIN)"
    return None


def run_page(blocks: list[readmekit.Block], workdir: Path, request, monkeypatch,
             grace: float = 30) -> list[str]:
    """Run a page's blocks as a reader pastes them; the ids of the blocks skipped.
    Fails at the first block that fails (an xfail block must fail), and when the page
    leaves a process running."""
    monkeypatch.chdir(workdir)
    shell = readmekit.Shell(workdir, extra_path=str(NSQ_BIN))
    namespace: dict = {"__name__": "__main__"}
    skipped, stuck = [], []
    try:
        for block in blocks:
            reason = _skip_reason(block)
            if reason:
                skipped.append(f"{block.id} ({reason})")
                continue
            try:
                if block.lang == "bash":
                    shell.run(block)
                else:
                    run_python(block, namespace, request)
            except Exception as err:
                if "xfail" in block.marks:
                    continue
                raise readmekit.BlockFailed(f"{block.id} failed: {err}{_logs(workdir)}") from err
            if "xfail" in block.marks:
                raise readmekit.BlockFailed(f"{block.id} passed, but is marked xfail: "
                                            f"{block.marks['xfail']}")
    finally:
        stuck = shell.close(grace)
        if "spark" in namespace:
            for query in namespace["spark"].streams.active:
                query.stop()
            _forget_checkpoints(namespace)
    assert not stuck, f"the page left these running (say how to stop them): {stuck}"
    return skipped


def _logs(workdir: Path, lines: int = 40) -> str:
    """The end of each log the page's daemons wrote (``2> pynsqd.log``): why a broker a
    later block needed was gone."""
    parts = []
    for log in sorted(workdir.glob("*.log")):
        tail = log.read_text(errors="replace").splitlines()[-lines:]
        parts.append(f"\n--- the end of {log.name} ---\n" + "\n".join(tail))
    return "".join(parts)


def _forget_checkpoints(namespace: dict) -> None:
    """A relative checkpointLocation lands in the JVM's directory (the suite's, not the
    page's): what the page made there goes, so the next run starts afresh."""
    made = namespace.get("__readmekit_checkpoints__")
    if made is not None:
        shutil.rmtree(made, ignore_errors=True)


def run_python(block: readmekit.Block, namespace: dict, request) -> None:
    if "spark" in block.marks and "spark" not in namespace:
        namespace["spark"] = spark = request.getfixturevalue("spark")  # a pyspark shell's
        jvm_dir = Path(spark._jvm.java.lang.System.getProperty("user.dir"))
        if not (jvm_dir / "checkpoints").exists():
            namespace["__readmekit_checkpoints__"] = jvm_dir / "checkpoints"
    source = "\n" * (block.line) + block.code  # tracebacks name the page's own lines
    exec(compile(source, str(readmekit.ROOT / block.source), "exec"), namespace)
    spark = namespace.get("spark")
    if spark is not None:
        for query in spark.streams.active:
            query.processAllAvailable()
            assert query.exception() is None


@pytest.mark.xdist_group("spark")
@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(readmekit.ROOT)) for p in PAGES])
def test_the_page_runs_as_pasted(page, request, monkeypatch, tmp_path):
    with one_at_a_time("nsq-ports"):   # NSQ's own ports: 4150, 4151, 4160, 4161, 4170
        skipped = run_page(readmekit.page_blocks(page), tmp_path, request, monkeypatch)
    if skipped:
        print("skipped:", *skipped, sep="\n  ")


# -- the collector itself ---------------------------------------------------------------------

def test_every_runnable_block_runs_or_says_why_not():
    """A block in a language the collector does not run is an output listing; a
    runnable one skipped or expected to fail names its reason (an empty mark is an
    error at collection)."""
    for page in PAGES:
        for block in readmekit.page_blocks(page):
            assert block.lang in ("python", "bash", "text"), \
                f"{block.id}: fence language {block.lang!r} (python, bash or text)"


# Written beside these pages at the same time; drop a name once its page is in docs/.
PAGES_TO_COME: set[str] = set()


def test_every_page_links_to_pages_that_exist():
    for page in PAGES:
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", page.read_text()):
            assert (page.parent / target).exists() or target in PAGES_TO_COME, \
                f"{page.name} links to missing {target}"


def test_an_unknown_mark_is_refused_naming_it():
    with pytest.raises(ValueError, match="unknown readme-test mark 'sprak'"):
        readmekit.blocks("<!-- readme-test: sprak -->\n```python\npass\n```\n")


def test_a_block_that_starts_a_daemon_in_the_foreground_fails_before_it_runs(tmp_path):
    block, = readmekit.blocks(textwrap.dedent("""\
        ```bash
        nsqlookupd --tcp-address 127.0.0.1:4160 &
        pynsqd --lookupd-tcp-address 127.0.0.1:4160 \\
               --broadcast-address 127.0.0.1
        pynsq pub events hello
        ```
        """))
    shell = readmekit.Shell(tmp_path)
    try:
        with pytest.raises(readmekit.BlockFailed, match="(?s)foreground.*pynsqd --lookupd"):
            shell.run(block)
    finally:
        assert shell.close() == []


def test_a_daemon_in_the_background_and_one_shot_flags_are_not_foreground():
    assert readmekit.foreground_daemons(
        "pynsqd --data-path d 2> log &   # the broker\n"
        "pynsqd --print-config > pynsqd.toml\npynsqd --version && pynsq --version\n") == []


def test_a_failing_line_fails_its_block_and_the_page_stops_there(tmp_path, request, monkeypatch):
    page = readmekit.blocks("```bash\ntrue\n```\n\n```bash\nfalse\necho after\n```\n"
                            "\n```bash\ntouch never\n```\n", "page.md")
    with pytest.raises(readmekit.BlockFailed, match="page.md:5 failed"):
        run_page(page, tmp_path, request, monkeypatch, grace=1)
    assert not (tmp_path / "never").exists()


def test_blocks_share_one_shell_and_a_clash_between_them_fails(tmp_path, request, monkeypatch):
    """A later block sees what an earlier one left (a variable, a port taken): what
    a reader following the page meets."""
    page = readmekit.blocks(textwrap.dedent("""\
        ```bash
        python3 -m http.server --bind 127.0.0.1 4199 2>/dev/null &
        SERVER=$!
        ```

        ```bash
        python3 -c 'import socket,time; s=socket.socket(); time.sleep(1); s.bind(("127.0.0.1", 4199))'
        ```

        ```bash
        kill $SERVER
        ```
        """), "page.md")
    with pytest.raises(readmekit.BlockFailed, match="(?s)page.md:6 failed.*Address already in use"):
        run_page(page, tmp_path, request, monkeypatch, grace=1)


def test_a_page_that_leaves_a_daemon_running_fails(tmp_path, request, monkeypatch):
    page = readmekit.blocks("```bash\nsleep 600 &\n```\n", "page.md")
    with pytest.raises(AssertionError, match="(?s)left these running.*sleep 600"):
        run_page(page, tmp_path, request, monkeypatch, grace=1)


# -- the examples -------------------------------------------------------------------------------

def test_the_demo_runs_end_to_end_and_reads_every_event(spark, capsys):
    """``make demo``'s script, in the session's Spark (``make demo`` starts its own) and
    with a fifth of its events, to keep the suite's time."""
    sys.path.insert(0, str(readmekit.ROOT / "examples"))
    try:
        import demo
    finally:
        sys.path.pop(0)
    demo.main(spark, published=1000)
    out = capsys.readouterr().out
    assert "published 1000 events; Spark read 1000; broker FINed 1000, depth 0" in out
    assert "--- batch" in out and "purchase" in out
