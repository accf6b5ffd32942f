"""README.md runs as written: each of its fenced code blocks is a test here
(tests/readmekit.py says how blocks run and how a block says what it needs),
and so do the examples a user is pointed to."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from broker import Client

from . import readmekit
from .helpers import Daemon
from .nsqkit import NSQ_BIN

README = readmekit.ROOT / "README.md"
BLOCKS = readmekit.blocks(README.read_text())
PYTHON_BLOCKS = [b for b in BLOCKS if b.lang == "python"]


def _param(block: readmekit.Block):
    marks = []
    if not block.runnable:
        marks.append(pytest.mark.skip(reason="an output listing, not code"))
    elif "skip" in block.marks:
        marks.append(pytest.mark.skip(reason=block.marks["skip"]))
    elif "nsq" in block.marks and not (NSQ_BIN / "nsqd").exists():
        marks.append(pytest.mark.skip(reason=f"needs NSQ's binaries (not in {NSQ_BIN}; "
                                             f"set NSQ_BIN)"))
    if "xfail" in block.marks:
        marks.append(pytest.mark.xfail(reason=block.marks["xfail"], strict=True))
    return pytest.param(block, id=block.id, marks=marks)


@pytest.fixture(scope="module")
def readme_broker():
    """The broker the README's Python blocks call 127.0.0.1:4170."""
    daemon = Daemon().wait_ready()
    with Client(daemon.address) as client:
        client.multi_publish("events", [b'{"user": "ann", "action": "view"}'] * 3)
    yield daemon
    assert daemon.stop() == 0


class Notebook:
    """The README's Python blocks in one namespace, run in order."""

    def __init__(self) -> None:
        self.namespace: dict = {"__name__": "__readme__"}
        self.done: set[int] = set()


@pytest.fixture(scope="module")
def notebook():
    return Notebook()


def run_python(block, request, notebook, broker, workdir: Path) -> None:
    for earlier in PYTHON_BLOCKS:
        if earlier.line >= block.line:
            break
        if earlier.line not in notebook.done and "skip" not in earlier.marks:
            try:  # a block read after an earlier one it may build on; its own test reports it
                run_python(earlier, request, notebook, broker, workdir)
            except Exception:
                notebook.done.add(earlier.line)
    notebook.done.add(block.line)
    spark = request.getfixturevalue("spark") if "spark" in block.marks else None
    if spark is not None:
        notebook.namespace["spark"] = spark
    code = (block.code.replace("127.0.0.1:4170", broker.address)
            .replace('"checkpoints/', f'"{workdir}/checkpoints/'))
    source = "\n" * block.line + code  # tracebacks name README.md's own lines
    try:
        exec(compile(source, str(README), "exec"), notebook.namespace)
        if spark is not None:
            for query in spark.streams.active:
                query.processAllAvailable()
                assert query.exception() is None
    finally:
        if spark is not None:
            for query in spark.streams.active:
                query.stop()


@pytest.mark.parametrize("block", [_param(b) for b in BLOCKS])
def test_readme_block_runs_as_written(block, request, notebook, tmp_path):
    if block.lang == "bash":
        readmekit.run_bash(block, tmp_path)
    else:
        broker = request.getfixturevalue("readme_broker")
        run_python(block, request, notebook, broker, tmp_path)


# -- the collector itself ---------------------------------------------------------------------

def test_every_runnable_readme_block_runs_or_says_why_not():
    """A block in a language the collector does not run is an output listing; a
    runnable one skipped or expected to fail names its reason (an empty mark is an
    error at collection)."""
    for block in BLOCKS:
        assert block.lang in ("python", "bash", "text"), \
            f"README.md:{block.line}: fence language {block.lang!r} (python, bash or text)"
        for mark in ("skip", "xfail"):
            assert block.marks.get(mark, "x").strip()


def test_an_unknown_mark_is_refused_naming_it():
    with pytest.raises(ValueError, match="unknown readme-test mark 'sprak'"):
        readmekit.blocks("<!-- readme-test: sprak -->\n```python\npass\n```\n")


def test_a_failing_bash_line_fails_its_block(tmp_path):
    block, = readmekit.blocks("```bash\npynsq pub events hello\npynsq topic frobnicate x\n```\n")
    with pytest.raises(AssertionError, match="bash exited 2"):
        readmekit.run_bash(block, tmp_path)


def test_a_bash_block_talks_to_its_own_broker_on_the_readme_ports(tmp_path):
    block, = readmekit.blocks(textwrap.dedent("""\
        ```bash
        pynsqd --msg-timeout 30s
        pynsq pub events 'hello'
        curl -sf 127.0.0.1:4151/stats?format=json | grep -q '"topic_name": "events"'
        ```
        """))
    readmekit.run_bash(block, tmp_path)


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
