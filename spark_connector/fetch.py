"""The executors' side of the source: fetch one slice of a lease as Arrow batches."""

from __future__ import annotations

import logging
from typing import Iterator

import grpc
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.pandas.types import to_arrow_schema

from broker.api import broker_pb2 as pb
from broker.client import Client

from .datasource import SCHEMA

log = logging.getLogger("pynsq.spark")

ARROW_SCHEMA = to_arrow_schema(SCHEMA, timezone="UTC")


def to_record_batch(frame: pb.MessageColumns, topic: str, channel: str) -> pa.RecordBatch:
    n = len(frame.ids)
    timestamps = pa.array(frame.timestamps, pa.int64())
    return pa.RecordBatch.from_arrays([
        pa.array(frame.ids, pa.string()),
        pa.array(frame.bodies, pa.binary()),
        pc.divide(timestamps, 1000).cast(pa.timestamp("us", tz="UTC")),
        pa.array(frame.attempts, pa.int32()),
        pa.repeat(topic, n),
        pa.repeat(channel, n),
    ], schema=ARROW_SCHEMA)


def fetch_slice(part) -> Iterator[pa.RecordBatch]:
    """Yield the messages of ``part`` (a ``LeaseSlice``) still held by its lease.

    A lease that no longer exists yields nothing: its messages went back to the
    channel (the planning driver went away, or the lease timed out) and a later
    batch reads them.
    """
    client = Client(part.address, timeout=part.timeout_s)
    request = pb.FetchLeaseRequest(lease_id=part.lease_id, partition=part.partition,
                                   num_partitions=part.num_partitions)
    try:
        for frame in client.stub.FetchLease(request, timeout=max(part.timeout_s, 60.0)):
            if frame.ids:
                yield to_record_batch(frame, part.topic, part.channel)
    except grpc.RpcError as err:
        if err.code() == grpc.StatusCode.NOT_FOUND:
            log.warning("pynsq: lease %s on %s is gone; its messages were requeued",
                        part.lease_id, part.address)
            return
        raise ConnectionError(f"pynsq source: fetching lease {part.lease_id} from "
                              f"{part.address} failed: {err.code().name}: {err.details()}") from None
    finally:
        client.close()
