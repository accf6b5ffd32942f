"""tests/SPARK_PATHS.md is checked, not trusted: every test a cell names exists and is
collected, every cell gives a verdict and a test or says why none drives it yet, and the
DataFrame shapes it claims are the ones the shapes driver runs."""

from __future__ import annotations

import re
from pathlib import Path

from .drivers.writer_shapes import SHAPES
from .test_promises import NAMED, collected

TESTS = Path(__file__).parent
PATHS = TESTS / "SPARK_PATHS.md"

CELL = re.compile(r"^\| ([WS]\d+[a-z]?) \|" + r"(.*)\|" * 6 + r"\s*$")
VERDICTS = ("exactly once", "loud:", "limit:")
NO_TEST = ("not driven: ",)


def cells() -> list[tuple[str, str, str]]:
    """(cell, verdict, tests) of every table row, top to bottom."""
    found = []
    for line in PATHS.read_text().splitlines():
        match = CELL.match(line)
        if match:
            cell, *_path, verdict, tests = match.groups()
            found.append((cell, verdict.strip(), tests.strip()))
    return found


def test_every_test_a_cell_names_exists_and_is_collected():
    missing = []
    for cell, _verdict, tests in cells():
        for file, name in NAMED.findall(tests):
            path = TESTS / file
            if not path.exists():
                missing.append(f"{cell}: {file} does not exist")
            elif not name or name not in collected(path):
                missing.append(f"{cell}: {file}::{name} is not a collected test")
    assert not missing, "\n".join(missing)


def test_every_cell_has_a_verdict_and_a_test_or_says_why_not():
    found = cells()
    assert len(found) >= 20, "the table was not read"
    assert len({cell for cell, _, _ in found}) == len(found), "cell names repeat"
    bad = [cell for cell, verdict, tests in found
           if not any(v in verdict for v in VERDICTS)
           or not (NAMED.search(tests) or tests.startswith(NO_TEST))]
    assert not bad, f"cells without a verdict, or naming no test and no reason: {bad}"


def test_every_cell_is_filled_none_pending():
    assert [cell for cell, verdict, tests in cells() if "pending" in verdict + tests] == []


def test_the_shapes_the_table_claims_are_the_ones_driven():
    assert set(SHAPES) == {"given", "select", "selectExpr", "withColumn", "filter", "union",
                           "join", "cached"}
    for shape in ("`select`", "`selectExpr`", "`withColumn`", "`filter`", "`union`", "a join",
                  "`persist()`"):
        assert shape in PATHS.read_text(), shape
