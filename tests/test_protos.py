"""The committed gRPC stubs are what `make protos` makes from protos/."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parent.parent
STUBS = ["broker_pb2.py", "broker_pb2.pyi", "broker_pb2_grpc.py"]


def test_committed_stubs_match_the_proto(tmp_path):
    shutil.copytree(ROOT / "protos", tmp_path / "protos")
    # The Makefile's `protos` command, run in a copy of the tree.
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", "-Ibroker/api=protos/pynsq/v1",
                    "--python_out=.", "--grpc_python_out=.", "--pyi_out=.",
                    "broker/api/broker.proto"], cwd=tmp_path, check=True)
    for name in STUBS:
        generated = (tmp_path / "broker" / "api" / name).read_text()
        committed = (ROOT / "broker" / "api" / name).read_text()
        assert generated == committed, f"broker/api/{name} is stale: run `make protos`"
