"""The executors' side of the source: fetch one slice of a lease as Arrow batches."""

from __future__ import annotations

import logging
import time
from typing import Iterator

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.pandas.types import to_arrow_schema

from broker.api import broker_pb2 as pb
from broker.client import BrokerUnavailable, Client
from broker.errors import LeaseNotFound, WrongBroker

from .datasource import SCHEMA

log = logging.getLogger("pynsq.spark")

ARROW_SCHEMA = to_arrow_schema(SCHEMA, timezone="UTC")
# Ids are 16 characters each: their Arrow offsets are 0, 16, 32, ... (int32, little-endian).
MAX_ID_ROWS = 1 << 16  # a lease frame holds fewer
ID_OFFSETS = pa.array(range(0, 16 * (MAX_ID_ROWS + 1), 16), pa.int32()).buffers()[1].to_pybytes()


def to_record_batch(frame: pb.MessageColumns, topic: str, channel: str) -> pa.RecordBatch:
    """Arrow arrays straight from the frame's packed columns (no per-row Python)."""
    n = frame.count
    id_offsets = (ID_OFFSETS[:4 * (n + 1)] if n < MAX_ID_ROWS else
                  pa.array(range(0, 16 * (n + 1), 16), pa.int32()).buffers()[1])
    ids = pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(id_offsets),
                                                 pa.py_buffer(frame.ids)])
    bodies = pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(frame.body_offsets),
                                                    pa.py_buffer(frame.bodies)])
    nanos = pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(frame.timestamps)])
    attempts = pa.Array.from_buffers(pa.int32(), n, [None, pa.py_buffer(frame.attempts)])
    return pa.RecordBatch.from_arrays([
        ids, bodies,
        pc.divide(nanos, 1000).cast(pa.timestamp("us", tz="UTC")),
        attempts, pa.repeat(topic, n), pa.repeat(channel, n),
    ], schema=ARROW_SCHEMA)


class LeaseLost(RuntimeError):
    """A task's lease is gone: it cannot read what the batch planned to read."""


# Clients kept by an executor's Python worker between tasks (Spark reuses the worker,
# ``spark.python.worker.reuse``): a task of the next batch fetches over the connection
# the last one opened, instead of paying a connect and HTTP/2 handshake per task.
# Keyed by broker address and security; one that failed is dropped, never reused.
MAX_KEPT_CLIENTS = 64
_clients: dict[tuple, Client] = {}


def _client(part) -> tuple[tuple, Client]:
    security = part.security.client_kwargs() if part.security else {}
    key = (part.address, tuple(sorted(security.items())))
    client = _clients.pop(key, None)
    if client is None:
        client = Client(part.address, timeout=part.timeout_s, **security)
    _clients[key] = client  # the most recently used last
    while len(_clients) > MAX_KEPT_CLIENTS:
        _clients.pop(next(iter(_clients))).close()
    return key, client


def _drop(key: tuple) -> None:
    client = _clients.pop(key, None)
    if client is not None:
        client.close()


def fetch_slice(part) -> Iterator[pa.RecordBatch]:
    """Yield the messages of ``part`` (a ``LeaseSlice``) still held by its lease.

    A broker that does not answer (it restarts, the network blips) is waited for as
    the driver waits: the fetch is tried again, backing off, until
    ``reconnectTimeoutMs`` has passed since it first failed; rows a broken stream
    already yielded are not yielded again. So a broker back within that time fails
    no task. Right after a restart the lease may not be held yet (the driver adopts
    it again within a touch interval): ``WrongBroker`` is waited for the same way.

    A lease that is gone (finished, requeued, timed out) fails the task, so that
    Spark retries it or fails the query instead of committing a batch that read
    nothing; with ``failOnDataLoss=false`` a lease that ended reads nothing and
    logs why (one asked of the wrong broker instance still fails).
    """
    window = part.reconnect_timeout_s
    yielded: list[pa.Array] = []   # ids yielded so far, should the stream break
    first_failure: float | None = None
    delay = 0.1
    while True:
        try:
            yield from _fetch_once(part, yielded)
            return
        except (BrokerUnavailable, WrongBroker) as err:
            now = time.monotonic()
            first_failure = now if first_failure is None else first_failure
            if now - first_failure >= window:
                if isinstance(err, WrongBroker):
                    raise _lost(part, err) from None
                raise ConnectionError(
                    f"pynsq source: fetching lease {part.lease_id} from {part.address} "
                    f"failed: {err} (waited {now - first_failure:.1f} s, reconnectTimeoutMs "
                    f"{window * 1000:.0f})") from None
            log.warning("pynsq: fetching lease %s from %s failed (%s); trying again in "
                        "%.1f s, for up to reconnectTimeoutMs", part.lease_id, part.address,
                        err, delay)
            time.sleep(min(delay, max(0.0, first_failure + window - now)))
            delay = min(delay * 2, 2.0)


def _lost(part, err: Exception) -> LeaseLost:
    return LeaseLost(f"pynsq source: lease {part.lease_id} on {part.address} is gone: {err}. "
                     f"Its messages were requeued and will be read again; this task fails "
                     f"so that the batch does not commit without them")


def _fetch_once(part, yielded: list[pa.Array]) -> Iterator[pa.RecordBatch]:
    """One try of ``fetch_slice``: rows whose ids are in ``yielded`` are skipped (a try
    before this one yielded them), and the ids of what is yielded are added."""
    key, client = _client(part)
    seen = pa.concat_arrays(yielded) if yielded else None
    done = False
    try:
        frames = client.fetch_lease(part.lease_id, part.partition, part.num_partitions,
                                    broker_id=part.broker_id,
                                    timeout=max(part.timeout_s, 60.0))
        for frame in frames:
            if frame.count:
                batch = to_record_batch(frame, part.topic, part.channel)
                if seen is not None:
                    batch = batch.filter(pc.invert(pc.is_in(batch.column(0), value_set=seen)))
                    if not batch.num_rows:
                        continue
                yielded.append(batch.column(0))
                yield batch
        done = True
    except WrongBroker:
        raise
    except LeaseNotFound as err:
        if not part.fail_on_data_loss:
            log.warning("pynsq: lease %s on %s is gone (%s); reading nothing "
                        "(failOnDataLoss=false)", part.lease_id, part.address, err)
            return
        raise _lost(part, err) from None
    finally:
        if not done:
            # Failed, or stopped half-way (Spark cancelled the task, a LIMIT was reached):
            # a stream left open must not stay on a connection the next task reuses.
            _drop(key)
