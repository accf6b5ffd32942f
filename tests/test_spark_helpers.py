"""The Spark tests' own start: a query that died at Spark's Python worker start (the
driver's fixed 10 s, passed on a busy host) is started again, nothing else is; a memory
sink's empty offsets folder left by that start goes first. Spark's calls are stood in
for by plain callables: what is under test is the helper's decision, not Spark."""

from __future__ import annotations

import pytest

from .spark_helpers import start_past_worker_start


class Died:
    """A query that ended at start with ``error``."""

    isActive = False
    status = {"message": "Stopped"}

    def __init__(self, error: str) -> None:
        self.error = error

    def exception(self):
        return RuntimeError(self.error)


class Running:
    isActive = True
    status = {"message": "Waiting for data to arrive"}


def test_a_memory_sink_started_again_after_the_worker_start_drops_its_empty_offsets(tmp_path):
    offsets = tmp_path / "ck" / "offsets"
    calls = []

    def start(writer):
        calls.append(offsets.exists())
        if len(calls) == 1:
            offsets.mkdir(parents=True)
            return Died("org.apache.spark.SparkException: Python worker failed to connect back.")
        if offsets.exists():
            raise RuntimeError("[STREAMING] This query does not support recovering from "
                               f"checkpoint location. Delete {offsets} to start over.")
        return Running()

    query = start_past_worker_start(start)(object())
    assert isinstance(query, Running)
    assert calls == [False, True, False]


def test_offsets_that_hold_a_batch_are_never_deleted(tmp_path):
    offsets = tmp_path / "ck" / "offsets"

    def start(writer):
        if not offsets.exists():
            offsets.mkdir(parents=True)
            (offsets / "0").write_text("v1")
            return Died("Python worker failed to connect back")
        raise RuntimeError("This query does not support recovering from checkpoint location. "
                           f"Delete {offsets} to start over.")

    with pytest.raises(RuntimeError, match="does not support recovering"):
        start_past_worker_start(start)(object())
    assert (offsets / "0").read_text() == "v1"


def test_a_query_that_died_of_anything_else_is_returned_as_it_died():
    starts = []

    def start(writer):
        starts.append(1)
        return Died("injected failure in batch 0")

    query = start_past_worker_start(start)(object())
    assert query.exception().args == ("injected failure in batch 0",) and len(starts) == 1
