"""The wheel a user installs: built once from a copy of the sources, then read as an
installer reads it. It carries the licence, the type marker, the config file that
``pynsqd --print-config`` prints, and the metadata a package index shows."""

from __future__ import annotations

import email
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
SOURCES = ("pyproject.toml", "README.md", "LICENSE", "pyspark_pynsq.py", "broker",
           "spark_connector", "conf")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> zipfile.ZipFile:
    """The wheel, built from a copy (the checkout gets no build/ or egg-info)."""
    src = tmp_path_factory.mktemp("src")
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, symlinks=True,
                            ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(ROOT / name, src / name)
    out = tmp_path_factory.mktemp("dist")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "--quiet", "--wheel-dir", str(out), str(src)],
                   check=True, capture_output=True, timeout=300)
    built, = out.glob("pynsq_broker-*.whl")
    with zipfile.ZipFile(built) as zf:
        yield zf


def metadata(wheel: zipfile.ZipFile) -> email.message.Message:
    name, = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
    return email.message_from_bytes(wheel.read(name))


def test_the_wheel_carries_the_mit_licence_text(wheel):
    licences = [n for n in wheel.namelist() if "/licenses/" in n]
    assert [n.rsplit("/", 1)[1] for n in licences] == ["LICENSE"]
    text = wheel.read(licences[0]).decode()
    assert text == (ROOT / "LICENSE").read_text()
    assert text.startswith("MIT License") and "WITHOUT WARRANTY OF ANY KIND" in text
    assert metadata(wheel)["License-Expression"] == "MIT"


def test_both_packages_are_marked_typed(wheel):
    assert {"broker/py.typed", "spark_connector/py.typed"} <= set(wheel.namelist())


def test_the_config_file_is_in_the_wheel_as_the_repository_has_it(wheel):
    shipped = wheel.read("broker/pynsqd.toml").decode()
    assert shipped == (ROOT / "conf" / "pynsqd.toml").read_text()
    tomllib.loads(shipped)


def test_the_metadata_names_authors_urls_classifiers_and_the_spark_extra(wheel):
    meta = metadata(wheel)
    assert meta["Name"] == "pynsq-broker" and meta["Author"] or meta["Author-email"]
    urls = dict(u.split(", ", 1) for u in meta.get_all("Project-URL"))
    assert {"Homepage", "Documentation", "Source", "Issues"} <= set(urls)
    classifiers = meta.get_all("Classifier")
    assert "Typing :: Typed" in classifiers
    assert "Programming Language :: Python :: 3.11" in classifiers
    assert "spark" in meta.get_all("Provides-Extra")
    assert meta["Requires-Python"] == ">=3.11"


def test_the_wheel_holds_the_packages_and_the_auto_registration_module_only(wheel):
    tops = {n.split("/", 1)[0] for n in wheel.namelist()}
    assert {t for t in tops if not t.endswith(".dist-info")} == \
        {"broker", "spark_connector", "pyspark_pynsq.py"}


def test_print_config_prints_the_shipped_file_which_pynsqd_reads(tmp_path):
    pynsqd = Path(sys.executable).parent / "pynsqd"
    printed = subprocess.run([str(pynsqd), "--print-config"], capture_output=True, text=True,
                             check=True, timeout=60).stdout
    assert printed == (ROOT / "conf" / "pynsqd.toml").read_text()
    from broker.options import Options
    (tmp_path / "pynsqd.toml").write_text(printed)
    assert Options.from_toml(tmp_path / "pynsqd.toml") == Options()
