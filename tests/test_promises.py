"""tests/PROMISES.md is checked, not trusted: every test a row names exists and is collected,
every row names a test or says why none can hold it, and the counts are the table's own."""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

TESTS = Path(__file__).parent
PROMISES = TESTS / "PROMISES.md"

ROW = re.compile(r"^\| (\d+[a-z]?) \|(.*)\|(.*)\|(.*)\|\s*$")
NAMED = re.compile(r"(test_\w+\.py)(?:::(\w+)(?:\[[^\]]*\])?)?")
# A row that names no test must say which of these it is.
NO_TEST = ("not a test's job", "a tool's run", "see ")


def rows() -> list[tuple[str, str, str]]:
    """(number, tests cell, status cell) of every table row, top to bottom."""
    found = []
    for line in PROMISES.read_text().splitlines():
        match = ROW.match(line)
        if match:
            number, _promise, tests, status = match.groups()
            found.append((number, tests.strip(), status.strip()))
    return found


@cache
def collected(path: Path) -> frozenset[str]:
    """The names pytest collects as tests from one file: module-level `test_*` functions,
    `test_*` methods of `Test*` classes, and `test_*` or `Test*` names bound to a hypothesis
    state machine's `TestCase`."""
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test_"):
            names.add(node.name)
        elif isinstance(node, ast.Assign) and any(
                isinstance(part, ast.Attribute) and part.attr == "TestCase"
                for part in ast.walk(node.value)):
            names.update(target.id for target in node.targets
                         if isinstance(target, ast.Name)
                         and target.id.startswith(("test_", "Test")))
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            names.update(item.name for item in node.body
                         if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
                         and item.name.startswith("test_"))
    return frozenset(names)


def test_every_named_test_exists_and_is_collected():
    missing = []
    for number, tests, _status in rows():
        for file, name in NAMED.findall(tests):
            path = TESTS / file
            if not path.exists():
                missing.append(f"row {number}: {file} does not exist")
            elif name and name not in collected(path):
                missing.append(f"row {number}: {file}::{name} is not a collected test")
    assert not missing, "\n".join(missing)


def test_every_row_names_a_test_or_says_why_none_holds_it():
    silent = [number for number, tests, status in rows()
              if not NAMED.search(tests) and not any(reason in tests + " " + status
                                                     for reason in NO_TEST)]
    assert not silent, f"rows naming no test and giving no reason: {silent}"


def test_row_numbers_are_unique():
    numbers = [number for number, _tests, _status in rows()]
    assert len(numbers) == len(set(numbers)), sorted({n for n in numbers if numbers.count(n) > 1})


def test_the_stated_count_of_rows_is_the_tables_own():
    stated = re.search(r"^Of (\d+) rows", PROMISES.read_text(), re.MULTILINE)
    assert stated, "PROMISES.md's Counts section must open with 'Of N rows'"
    assert int(stated.group(1)) == len(rows()), f"the table holds {len(rows())} rows"
    covered = re.search(r"^Of \d+ rows [^:]*: (\d+) covered", PROMISES.read_text(), re.MULTILINE)
    count = sum(status.startswith("covered") for _number, _tests, status in rows())
    assert covered and int(covered.group(1)) == count, f"{count} rows say covered"


def test_make_mutants_config_names_modules_and_test_files_that_exist():
    """`make mutants` from a fresh clone: mutmut is in the `dev` extra the target installs,
    and every module pattern and test file of `[tool.mutmut]` names something real."""
    import tomllib

    root = TESTS.parent
    project = tomllib.loads((root / "pyproject.toml").read_text())
    assert any(dep.startswith("mutmut") for dep in project["project"]["optional-dependencies"]["dev"])
    config = project["tool"]["mutmut"]
    unmatched = [p for p in config["only_mutate"] if not list(root.glob(p))]
    missing = [t for t in config["pytest_add_cli_args_test_selection"] if not (root / t).exists()]
    assert not unmatched and not missing, (unmatched, missing)
    makefile = (root / "Makefile").read_text()
    assert "mutants: $(VENV)/.installed-dev" in makefile and ".[dev]" in makefile
