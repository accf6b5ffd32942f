"""The Makefile's promise: with no ``java`` on the PATH, ``make demo``,
``make test`` and ``make bench`` stop with a clear message before doing any
work. Run in a copy of the Makefile whose environment counts as installed, so
that nothing is installed or run."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
MAKE = shutil.which("make")
JAVA_MISSING = "Java 17 or newer is required by Spark 4 and was not found on PATH"

pytestmark = pytest.mark.skipif(MAKE is None, reason="make is not installed")


@pytest.fixture
def project(tmp_path):
    """The Makefile and pyproject.toml, with an environment marked as installed
    (its Python is this one) and an empty bin directory for the PATH."""
    for name in ("Makefile", "pyproject.toml"):
        shutil.copy(ROOT / name, tmp_path / name)
    os.utime(tmp_path / "pyproject.toml", (0, 0))  # older than the "installed" mark
    venv_bin = tmp_path / ".venv" / "bin"
    venv_bin.mkdir(parents=True)
    (venv_bin / "python").symlink_to(sys.executable)
    (tmp_path / ".venv" / ".installed").touch()
    (tmp_path / "path").mkdir()
    return tmp_path


def make(project: Path, target: str) -> subprocess.CompletedProcess:
    env = {"PATH": str(project / "path"), "HOME": os.environ.get("HOME", str(project))}
    return subprocess.run([MAKE, "--no-print-directory", target, f"PYTHON={sys.executable}"],
                          cwd=project, env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("target", ["check-java", "demo", "test", "bench"])
def test_make_stops_with_a_clear_message_when_java_is_missing(project, target):
    result = make(project, target)
    assert result.returncode != 0
    assert JAVA_MISSING in result.stdout + result.stderr
    assert "pytest" not in result.stdout and "Traceback" not in result.stderr


def test_make_check_java_passes_when_java_is_on_the_path(project):
    java = project / "path" / "java"
    java.write_text("#!/bin/sh\nexit 0\n")
    java.chmod(java.stat().st_mode | stat.S_IXUSR)
    result = make(project, "check-java")
    assert result.returncode == 0, result.stdout + result.stderr
    assert JAVA_MISSING not in result.stdout + result.stderr


def fake_tools(folder: Path, *, chromium: bool) -> Path:
    """A PATH of stand-ins: apt-get and make record their arguments, id says root."""
    folder.mkdir()
    log = folder / "calls.log"
    tools = {"apt-get": f'echo "apt-get $*" >> {log}', "make": f'echo "make $*" >> {log}',
             "id": "echo 0"}
    if chromium:
        tools["chromium"] = "exit 0"
    for name, body in tools.items():
        path = folder / name
        path.write_text(f"#!/bin/sh\n{body}\n")
        path.chmod(0o755)
    return log


@pytest.mark.parametrize("chromium", [False, True])
def test_ci_installs_chromium_only_when_it_is_missing_then_runs_make_test(tmp_path, chromium):
    log = fake_tools(tmp_path / "bin", chromium=chromium)
    env = {"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin"}
    if shutil.which("chromium", path=env["PATH"]) and not chromium:
        pytest.skip("a real chromium is on /usr/bin")
    result = subprocess.run(["bash", str(ROOT / ".ci" / "run")], env=env, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    calls = log.read_text().splitlines()
    installs = [c for c in calls if c.startswith("apt-get") and "install" in c]
    if chromium:
        assert installs == []
    else:
        assert len(installs) == 1 and "chromium chromium-driver" in installs[0]
    assert calls[-1] == "make test"


def test_make_test_runs_the_shared_spark_sessions_tests_in_one_process(request, spark):
    """`make test` runs the suite in TEST_WORKERS processes with xdist's loadgroup; every
    test on the shared session is in one group, so one process holds the one session."""
    makefile = (ROOT / "Makefile").read_text()
    assert "-n $(TEST_WORKERS) --dist loadgroup" in makefile
    assert request.node.get_closest_marker("xdist_group").args == ("spark",)


def test_every_test_on_the_spark_session_runs_in_one_worker_of_make_tests_run(tmp_path):
    """The grouping itself, under the xdist and pytest this suite installs: twelve tests
    on a ``spark`` fixture and twelve without, in two workers with loadgroup, as `make
    test` runs them. The ``spark`` tests all run in one worker, so one process holds
    the one session (without the hook's step after ``yield`` they are spread over both)."""
    (tmp_path / "conftest.py").write_text(
        "import os, pytest\n"
        "from tests.conftest import pytest_collection_modifyitems  # the hook under test\n"
        "@pytest.fixture\n"
        "def spark():\n"
        "    return os.environ['PYTEST_XDIST_WORKER']\n")
    (tmp_path / "test_shapes.py").write_text(
        "import os, pathlib, pytest\n"
        "@pytest.mark.parametrize('n', range(12))\n"
        "def test_on_the_session(spark, n):\n"
        "    (pathlib.Path(os.environ['OUT']) / f'spark-{n}').write_text(spark)\n"
        "@pytest.mark.parametrize('n', range(12))\n"
        "def test_alone(n):\n"
        "    worker = os.environ['PYTEST_XDIST_WORKER']\n"
        "    (pathlib.Path(os.environ['OUT']) / f'alone-{n}').write_text(worker)\n")
    out = tmp_path / "out"
    out.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OUT": str(out)}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "2", "--dist", "loadgroup",
         "-p", "no:cacheprovider", "test_shapes.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    on_session = {(out / f"spark-{n}").read_text() for n in range(12)}
    assert len(on_session) == 1, f"the spark tests ran in {sorted(on_session)}"


def test_a_test_without_the_spark_session_is_in_no_group(request):
    assert request.node.get_closest_marker("xdist_group") is None


def test_make_demo_installs_the_spark_extra_only_with_pips_output_in_a_log(project):
    """A first ``make demo`` (no environment yet) installs ``.[spark]``, not the test
    tools, and sends pip's output to .venv/pip.log (shown only if pip fails)."""
    (project / ".venv" / ".installed").unlink()
    java = project / "path" / "java"
    java.write_text("#!/bin/sh\nexit 0\n")
    java.chmod(0o755)
    env = {"PATH": f"{project / 'path'}:/usr/bin:/bin", "HOME": str(project)}
    result = subprocess.run([MAKE, "--no-print-directory", "-n", "demo",
                             f"PYTHON={sys.executable}"], cwd=project, env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    recipe = result.stdout
    assert "-e '.[spark]'" in recipe and "[test]" not in recipe
    assert "> .venv/pip.log 2>&1" in recipe
    assert "examples/demo.py" in recipe
