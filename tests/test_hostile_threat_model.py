"""The threat model's table (docs/threat-model.md) is kept true by the suite: every
test a row names exists as a test function, every bound it names is a constant or
an option the broker has, and every boundary has rows."""

from __future__ import annotations

import ast
import re
from dataclasses import fields
from pathlib import Path

import pytest

from broker import lookupd
from broker.options import Options
from broker.security import auth, printable
from broker.server import admission, grpc_server, limits, wire

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "threat-model.md"
COLUMNS = ["boundary", "resource", "bound", "at the bound", "test"]
BOUNDARIES = ("TCP", "HTTP", "gRPC", "auth server", "nsqlookupd", "disk", "Spark driver",
              "Spark executors")
RESOURCES = ("descriptors", "connections", "memory", "pending AUTHs", "event-loop time",
             "disk", "log lines", "topics and channels")
_TEST_CELL = re.compile(r"`(tests/[\w/]+\.py)::(\w+)`")
_CONSTANT = re.compile(r"`([A-Z][A-Z0-9_]{2,})`")
_OPTION = re.compile(r"`--([a-z0-9-]+)`")


def rows() -> list[dict[str, str]]:
    lines = [line for line in DOC.read_text().splitlines() if line.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert header == COLUMNS
    out = []
    for line in lines[2:]:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        assert len(cells) == len(COLUMNS), line
        out.append(dict(zip(COLUMNS, cells)))
    return out


def _test_functions(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {node.name for node in tree.body
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.name.startswith("test_")}


def _row_id(row: dict[str, str]) -> str:
    return f"{row['boundary']}: {row['resource']}"[:60]


@pytest.mark.parametrize("row", rows(), ids=_row_id)
def test_each_row_names_a_test_that_exists_or_says_open(row):
    cell = row["test"]
    if cell == "open":
        return
    named = _TEST_CELL.findall(cell)
    assert named and _TEST_CELL.sub("", cell).strip(" ,") == "", \
        f"the test cell must be `tests/FILE.py::test_name` or open: {cell!r}"
    for file, name in named:
        path = ROOT / file
        assert path.is_file(), f"{file} does not exist"
        assert name in _test_functions(path), f"{file} has no test {name}"


@pytest.mark.parametrize("row", rows(), ids=_row_id)
def test_each_bound_a_row_names_is_a_constant_or_an_option_of_the_broker(row):
    text = row["bound"] + " " + row["at the bound"]
    modules = (limits, admission, auth, printable, wire, grpc_server, lookupd)
    for name in _CONSTANT.findall(row["bound"]):     # (the answers are nsqd's codes)
        assert any(hasattr(m, name) for m in modules), f"no constant {name}"
    flags = {f.name.replace("_", "-") for f in fields(Options)}
    for flag in _OPTION.findall(text):
        assert flag in flags, f"no option --{flag}"
    if row["test"] != "open":
        assert row["bound"] and row["at the bound"], "a proven bound says what it is and does"


def test_every_boundary_and_every_resource_has_rows():
    table = rows()
    for boundary in BOUNDARIES:
        assert any(boundary in r["boundary"] for r in table), boundary
    text = " ".join(r["resource"] + " " + r["bound"] for r in table)
    for resource in RESOURCES:
        assert resource in text, resource
