"""A model of a pynsq -> Spark -> pynsq pipeline at Spark's interface, under faults.

The machine drives the source's reader and the writer's partition publisher as
Spark's micro-batch engine does (``initialOffset``, ``latestOffset``, an offset
log written before the batch runs, ``partitions``, ``read`` of each slice,
publishing each task's rows under the producer id (query, writer, batch,
partition), a commit log, ``commit``, ``stop``, and a restart from the last
offsets that replays an uncommitted batch), against a real durable broker
(embedded, on a fixed loopback port, with ``--data-path``). Between and inside
batches it injects the faults a pipeline meets: a batch that fails after some
tasks published, a driver that dies (its lease session cut, nothing requeued),
a query stopped, a broker restarted cleanly or killed (what ``kill -9`` leaves),
leases timing out under a hung driver, a source commit that never comes (the
``once`` trigger), and other readers churning thousands of leases.

The oracle: once the channel is drained, the output topic holds every input
message exactly once (no documented exception applies to a durable broker whose
readers are all this query), and no replay ever published other rows than its
first attempt (that would raise ``ProducerConflict``). Each output row carries
the input's id, body and attempts, so a replay whose rows differ in any column
is caught.

Deterministic at the suite's budget; ``PYNSQ_SPARK_MODEL_EXAMPLES`` runs more.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections import Counter

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, rule

from broker import Client, EmbeddedBroker
from broker.client import BrokerUnavailable
from broker.storage.store import MemoryStore
from pyspark.sql.streaming.datasource import ReadMaxRows
from spark_connector.fetch import LeaseLost
from spark_connector.reader import PynsqStreamReader
from spark_connector.writer import PartitionPublisher

from .helpers import free_port, wait_for

QUERY_ID = "7d3c1a52-model-query"
OPTIONS = {"topic": "in", "channel": "spark", "msgTimeoutMs": "3000", "timeoutMs": "5000",
           "numPartitions": "2", "reconnectTimeoutMs": "20000"}


class BatchFailed(RuntimeError):
    """An injected failure of a micro-batch after some of its tasks published."""


def crash(embedded: EmbeddedBroker) -> None:
    """Stop the broker as ``kill -9`` would: nothing more is written, nothing is closed
    cleanly (what the kernel already has stays)."""
    def let_go() -> None:
        core = embedded.broker
        core.storage.abandon()
        core.storage = MemoryStore()
        if core.lease_journal is not None:
            core.lease_journal.close()
            core.lease_journal = None

    embedded.call(let_go)
    embedded.stop()


def _answers(client: Client) -> bool:
    try:
        client.ping(timeout=2)
        return True
    except BrokerUnavailable:
        return False


class Query:
    """One run of the streaming query: a reader made from the options, started from
    the checkpoint as Spark starts it (an uncommitted last batch is run again)."""

    def __init__(self, model: "PipelineModel", available_now: bool = False) -> None:
        self.model = model
        self.reader = PynsqStreamReader({**OPTIONS, **model.options, "address": model.address})
        try:
            offsets, commits = model.offsets, model.commits
            if not offsets:
                self.start = self.reader.initialOffset()
            else:
                last = max(offsets)
                start, end = offsets[last]
                self.start = end
                if last not in commits:
                    self.execute(last, start, end)
            if available_now:
                self.reader.prepareForTriggerAvailableNow()
        except BaseException:
            self.reader.stop()  # Spark stops the source of a query that failed
            raise

    def next_batch(self, limit: int, fail: str = "", commit_now: bool = True) -> bool:
        end = self.reader.latestOffset(self.start, ReadMaxRows(limit))
        if end == self.start:
            return False
        batch = max(self.model.offsets, default=-1) + 1
        self.model.offsets[batch] = (self.start, end)   # the offset log, before the batch runs
        if fail == "driver dies":
            raise BatchFailed("the driver died with the batch planned")
        self.execute(batch, self.start, end, fail)
        self.start = end
        if commit_now:
            self.reader.commit(end)
        return True

    def execute(self, batch: int, start: dict, end: dict, fail: str = "") -> None:
        parts = self.reader.partitions(start, end)
        for task, part in enumerate(parts):
            rows = [row for arrow in self.reader.read(part)
                    for row in zip(*(arrow.column(i).to_pylist() for i in (0, 1, 3)))]
            publisher = PartitionPublisher(self.model.address, "out",
                                           f"{QUERY_ID}:to-out:{batch}:{task}", 7,
                                           f"batch {batch} task {task}")
            try:
                for msg_id, body, attempts in rows:
                    publisher.add(json.dumps([msg_id, body.decode(), attempts]))
                publisher.finish()
            finally:
                publisher.close()
            if fail == "batch fails" and task == 0:
                raise BatchFailed(f"batch {batch} failed after task 0 published")
        self.model.commits.add(batch)                  # the commit log

    def stop(self) -> None:
        self.reader.stop()

    def die(self) -> None:
        """The driver is gone: its lease sessions drop, nothing is given back."""
        for keeper in (self.reader._keepers or {}).values():
            keeper.close()
        self.reader._keepers = None


class PipelineModel(RuleBasedStateMachine):
    def __init__(self, durable: bool = True, **options: str) -> None:
        super().__init__()
        self.durable = durable
        self.options = options
        self.data = tempfile.mkdtemp(prefix="pynsq-model-")
        self.port = free_port()
        self.embedded = self._start()
        self.address = self.embedded.address
        with Client(self.address) as client:
            client.create_channel("in", "spark")
            client.create_channel("out", "check")
        self.offsets: dict[int, tuple[dict, dict]] = {}
        self.commits: set[int] = set()
        self.published: list[str] = []
        self.query: Query | None = None

    def _start(self) -> EmbeddedBroker:
        embedded = EmbeddedBroker(grpc_address=f"127.0.0.1:{self.port}", tcp_address="",
                                  http_address="", data_path=self.data if self.durable else "",
                                  msg_timeout=3000).start()
        with Client(embedded.address, timeout=5) as client:
            wait_for(lambda: _answers(client), 30, message="the broker to answer")
        return embedded

    def _query(self, available_now: bool = False) -> Query:
        if self.query is None:
            self.query = Query(self, available_now)
        return self.query

    def _run(self, step) -> None:
        """``step(query)``; a task that failed for good (its lease timed out under a slow
        machine: ``LeaseLost``) fails the query, which Spark then restarts."""
        try:
            step(self._query())
        except LeaseLost:
            self._restart_query("stop")

    def _restart_query(self, how: str) -> None:
        if self.query is not None:
            self.query.stop() if how == "stop" else self.query.die()
        self.query = None

    # -- the input ------------------------------------------------------------
    @rule(n=st.integers(1, 40))
    def publish(self, n: int) -> None:
        with Client(self.address) as client:
            base = len(self.published)
            self.published += client.multi_publish(
                "in", [f"m-{base + i}".encode() for i in range(n)])

    # -- batches --------------------------------------------------------------
    @rule(limit=st.integers(1, 30), commit_now=st.booleans())
    def batch(self, limit: int, commit_now: bool) -> None:
        self._run(lambda query: query.next_batch(limit, commit_now=commit_now))

    @rule(limit=st.integers(1, 30), fail=st.sampled_from(["batch fails", "driver dies"]))
    def failing_batch(self, limit: int, fail: str) -> None:
        try:
            self._run(lambda query: query.next_batch(limit, fail))
        except BatchFailed:
            self._restart_query("stop" if fail == "batch fails" else "die")

    @rule(how=st.sampled_from(["stop", "die"]))
    def query_ends(self, how: str) -> None:
        self._restart_query(how)

    # -- the broker -----------------------------------------------------------
    @rule(kill=st.booleans())
    def broker_restarts(self, kill: bool) -> None:
        if kill:
            crash(self.embedded)
        else:
            self.embedded.stop()
        self.embedded = self._start()

    @rule()
    def leases_time_out(self) -> None:
        """A hung driver: every message in flight on the channel passes its deadline."""
        def time_out() -> None:
            ch = self.embedded.broker.topics["in"].channels["spark"]
            ch.tick(time.monotonic() + 3600)

        self.embedded.call(time_out)

    @rule(n=st.sampled_from([50, 1100]))
    def other_leases_churn(self, n: int) -> None:
        """Another query reserves ``n`` leases of one message each, then requeues them
        all (its driver went away): ``n`` requeued leases the broker remembers."""
        def churn() -> None:
            core = self.embedded.broker
            core.multi_publish("other", [b"x"] * n)
            session = core.open_lease_session("other-query")
            for _ in range(n):
                core.reserve(session.session_id, "other", "elsewhere", 1)
            core.close_lease_session(session.session_id)

        self.embedded.call(churn)

    # -- the oracle -----------------------------------------------------------
    def teardown(self) -> None:
        try:
            if self.published:
                self._drain_and_check()
        finally:
            if self.query is not None:
                self.query.stop()
            self.embedded.stop()
            shutil.rmtree(self.data, ignore_errors=True)

    def _drain_and_check(self) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            more: list[bool] = []
            self._run(lambda query: more.append(query.next_batch(100)))
            if more != [False]:
                continue
            stats = self._channel("in", "spark")
            if stats == (0, 0):
                break
            time.sleep(0.05)  # leases of a dead driver wait out their grace period
        self._restart_query("stop")
        out = self._read_output()
        counts = Counter(row[0] for row in out)
        published = set(self.published)
        lost = published - set(counts)
        duplicates = {i: n for i, n in counts.items() if n > 1}
        assert not lost and not duplicates, (
            f"published {len(published)}, distinct out {len(counts)}, "
            f"duplicates {sum(duplicates.values()) - len(duplicates)}, lost {len(lost)}")
        assert set(counts) <= published

    def _channel(self, topic: str, channel: str) -> tuple[int, int]:
        def stats() -> tuple[int, int]:
            ch = self.embedded.broker.topics[topic].channels[channel]
            return ch.depth, ch.in_flight_count + ch.deferred_count

        return self.embedded.call(stats)

    def _read_output(self) -> list[list]:
        def take() -> list[bytes]:
            core = self.embedded.broker
            session = core.open_lease_session("oracle")
            bodies = []
            while True:
                lease, _ = core.reserve(session.session_id, "out", "check", 10_000)
                if lease is None:
                    break
                bodies += [m.body for m in lease.order]
                core.finish_leases([lease.lease_id])
            core.close_lease_session(session.session_id)
            return bodies

        return [json.loads(body) for body in self.embedded.call(take)]


PipelineModel.TestCase.settings = settings(
    max_examples=int(os.environ.get("PYNSQ_SPARK_MODEL_EXAMPLES", "12")),
    stateful_step_count=int(os.environ.get("PYNSQ_SPARK_MODEL_STEPS", "16")),
    deadline=None, derandomize=True, print_blob=True,
    suppress_health_check=list(HealthCheck))
# A longer run (the environment variables above) is given the time it needs.
TestPipelineModel = pytest.mark.timeout(
    0 if "PYNSQ_SPARK_MODEL_EXAMPLES" in os.environ else 300)(PipelineModel.TestCase)


# -- the scenarios found, each run through the same driver and oracle -----------------
from spark_connector.session import DataLoss  # noqa: E402


def run(model: PipelineModel, *steps) -> None:
    """Run ``steps`` (a rule and its arguments), then the oracle."""
    try:
        for step, *args in steps:
            step(model, *args)
        model._drain_and_check()
    finally:
        model.teardown_quietly()


def _teardown_quietly(self: PipelineModel) -> None:
    if self.query is not None:
        self.query.stop()
        self.query = None
    self.embedded.stop()
    shutil.rmtree(self.data, ignore_errors=True)


PipelineModel.teardown_quietly = _teardown_quietly


def test_a_batch_that_fails_after_publishing_is_replayed_with_the_same_rows_every_column():
    """The lease is requeued when the query stops; the replay takes it back, and each
    message's attempts read as the failed run read them: no ProducerConflict."""
    run(PipelineModel(), (PipelineModel.publish, 40),
        (PipelineModel.failing_batch, 40, "batch fails"))


def test_a_replay_after_the_dead_drivers_lease_timed_out_reads_the_same_rows():
    run(PipelineModel(), (PipelineModel.publish, 40),
        (PipelineModel.failing_batch, 40, "driver dies"), (PipelineModel.leases_time_out,))


@pytest.mark.parametrize("kill", [False, True], ids=["clean restart", "kill -9"])
def test_a_committed_batch_is_not_read_again_after_the_broker_restarts_between_runs(kill):
    """``once``: Spark committed the batch but never told the source; the query stopped,
    its lease was requeued; the broker restarts before the next run FINs it."""
    run(PipelineModel(), (PipelineModel.publish, 40), (PipelineModel.batch, 30, False),
        (PipelineModel.query_ends, "stop"), (PipelineModel.broker_restarts, kill))


def test_a_committed_batch_is_not_read_again_after_thousands_of_other_leases_churn():
    run(PipelineModel(), (PipelineModel.publish, 40), (PipelineModel.batch, 30, False),
        (PipelineModel.query_ends, "stop"), (PipelineModel.other_leases_churn, 1100))


@pytest.mark.parametrize("kill", [False, True], ids=["clean restart", "kill -9"])
def test_a_batch_that_failed_before_a_broker_restart_is_replayed_with_the_same_rows(kill):
    run(PipelineModel(), (PipelineModel.publish, 40),
        (PipelineModel.failing_batch, 40, "batch fails"),
        (PipelineModel.broker_restarts, kill))


def test_available_now_reads_the_whole_backlog_of_its_start_across_a_broker_restart():
    model = PipelineModel()
    try:
        model.publish(40)
        query = model._query(available_now=True)
        query.next_batch(10, commit_now=False)   # committed, not yet FINed
        model.broker_restarts(False)
        while query.next_batch(10):
            pass
        assert model._channel("in", "spark") == (0, 0)
        model._drain_and_check()
    finally:
        model.teardown_quietly()


def test_a_memory_only_broker_that_lost_a_planned_batch_fails_the_query_naming_it():
    model = PipelineModel(durable=False)
    try:
        model.publish(40)
        model.failing_batch(30, "driver dies")    # planned (in the offset log), not run
        model.broker_restarts(False)              # a memory-only broker keeps nothing
        with pytest.raises(DataLoss, match=r"batch 1 planned to read 30 message\(s\) of lease "
                                           r"\w+ on 127.0.0.1:\d+, but that broker keeps "
                                           r"messages in memory only"):
            model._query()
    finally:
        model.teardown_quietly()


def test_without_fail_on_data_loss_a_lost_batch_is_skipped_and_the_query_goes_on(caplog):
    model = PipelineModel(durable=False, failOnDataLoss="false")
    try:
        model.publish(40)
        model.failing_batch(30, "driver dies")
        model.broker_restarts(False)
        model.publish(5)
        query = model._query()
        assert "those 30 message(s) are lost" in caplog.text
        assert query.next_batch(100)
    finally:
        model.teardown_quietly()
