"""A process holding a busy client or an embedded broker can start other programs.

PySpark starts its JVM with ``subprocess.Popen(..., preexec_fn=...)`` (a fork, then an
exec). gRPC's fork handlers, on by default, could kill such a child before its exec
while a channel or a server of the parent was busy: Spark then failed to start with
"Java gateway process exited before sending its port number". Importing ``broker`` or
``spark_connector`` turns them off (unless the environment sets them)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# In a fresh interpreter: an embedded broker, two threads publishing to it without a
# pause, and 300 children forked (with a preexec_fn, as PySpark does) and exec'd.
FORKS = """
import subprocess, sys, threading
import {module}
from broker import Client, EmbeddedBroker

with EmbeddedBroker() as broker, Client(broker.address) as client:
    done = threading.Event()

    def publish():
        while not done.is_set():
            client.publish("forks", b"x")

    threads = [threading.Thread(target=publish) for _ in range(2)]
    for t in threads:
        t.start()
    codes = [subprocess.Popen(["/bin/true"], preexec_fn=lambda: None,
                              stdin=subprocess.PIPE).wait() for _ in range(300)]
    done.set()
    for t in threads:
        t.join()
print(sum(code != 0 for code in codes))
"""


def _failed_children(module: str, env: dict[str, str]) -> int:
    out = subprocess.run([sys.executable, "-c", FORKS.format(module=module)], cwd=REPO,
                         env=env, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    return int(out.stdout.split()[-1])


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "GRPC_ENABLE_FORK_SUPPORT"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    return env


def test_children_forked_beside_a_busy_broker_and_client_all_start():
    assert _failed_children("broker", _env()) == 0


def test_the_spark_connector_alone_turns_grpcs_fork_handlers_off_before_grpc_loads():
    out = subprocess.run(
        [sys.executable, "-c",
         "import sys, spark_connector, os; "
         "print(os.environ.get('GRPC_ENABLE_FORK_SUPPORT'), 'grpc' in sys.modules)"],
        cwd=REPO, env=_env(), capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["false", "True"], out.stderr[-2000:]


def test_a_setting_in_the_environment_is_left_as_it_is():
    out = subprocess.run(
        [sys.executable, "-c", "import broker, os; print(os.environ['GRPC_ENABLE_FORK_SUPPORT'])"],
        cwd=REPO, env={**_env(), "GRPC_ENABLE_FORK_SUPPORT": "true"}, capture_output=True,
        text=True, timeout=60)
    assert out.stdout.strip() == "true", out.stderr[-2000:]
