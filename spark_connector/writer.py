"""Writers: publish a DataFrame's rows to a pynsq topic, from the executors.

    from spark_connector import pub_to_topic

    (df.selectExpr("CAST(body AS STRING) AS body")
       .writeStream.foreachBatch(pub_to_topic("127.0.0.1:4170", "lines"))
       .option("checkpointLocation", "checkpoints/lines").start())

    df.writeStream.format("pynsq").option("address", "127.0.0.1:4170")
      .option("topic", "lines").option("checkpointLocation", "...").start()
    df.write.format("pynsq").option("address", "127.0.0.1:4170").option("topic", "lines") \
      .mode("append").save()     # append: the one save mode a topic has

Input columns: ``body`` (BINARY or STRING, required, never null), ``topic``
(STRING, optional: routes each row when no topic option is given; the option,
when given, wins over the column, as in Kafka's sink),
``defer_ms`` (integer, optional: DPUB per row), ``ttl_ms`` (integer, optional:
the row's time to live; 0 or null: the topic's). Each partition publishes its
rows in MPUB batches of ``batchSize``; nothing is collected to the driver.

No duplicates on replay: every MPUB names a producer id and its sequence
within the partition. The producer id names the writer: for streams (query id,
writer name, batch id, partition), where the writer name is ``producer`` if
given, else ``to-<topic>`` for ``pub_to_topic`` and the ``producer`` option
(default ``sink``) for the sink; for batch writes (write id, partition). The
broker keeps one entry per accepted MPUB (first id, count, and a digest of
topic, bodies, defers and ttls) for its de-duplication window (10 minutes). A replay
of the same rows in the same order publishes nothing and gets the first ids; a
replay whose rows differ (another ``batchSize``, ``numPartitions`` or row order,
two writers sharing one name, a copied checkpoint) fails the batch with
``ProducerConflict`` naming the producer and saying what to change: never a
silent drop. With ``delivery`` ``at-least-once`` such a replay is published
again instead (Kafka's sink's promise). Two ``pub_to_topic`` calls to one topic
in one ``foreachBatch`` need distinct ``producer`` names. Under Spark Connect,
whose ``foreachBatch`` is told its batch but not its query, ``pub_to_topic``
needs ``producer``, which stands for the query.

Against ``pynsqd --workers`` each worker keeps its own window, so a partition
publishes on the worker a CRC-32 of its producer id picks among those the
broker's Info lists, not on the one the shared port gave its connection.
"""

from __future__ import annotations

import logging
import sys
import time
import uuid
from bisect import bisect_right
from dataclasses import dataclass
from itertools import accumulate
from typing import Iterable, Iterator, Mapping

from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage
from pyspark.sql.types import BinaryType, IntegralType, StringType, StructType

from broker.client import BrokerUnavailable, Client
from broker.dedupe import content_digest
from broker.errors import ProducerConflict
from broker.names import is_valid_name
from broker.workers import worker_addresses, worker_for
from broker.security.client import SPARK_OPTIONS, ClientSecurity

from .compat import DataSourceStreamArrowWriter
from .options import (DEFAULT_RECONNECT_TIMEOUT_MS, OptionError, _check_unknown, _int, _lower,
                      parse_addresses, require_name, security_options)

BODY, TOPIC, DEFER, TTL = "body", "topic", "defer_ms", "ttl_ms"
# Rows per MPUB. A gRPC call costs the broker and the writer hundreds of microseconds
# whatever it holds (more than 500 rows of 100 bytes cost them): in requests of 5,000 that
# cost is a tenth of a microsecond a row.
DEFAULT_BATCH_SIZE = 5000
# An MPUB is also cut before its bodies pass this many bytes, under the broker's
# --max-body-size (nsqd's default: 5 MiB), so large rows never make a request the
# broker refuses. The cut depends only on the rows, so a replay names the same requests.
MAX_REQUEST_BYTES = 4 << 20

# What a writer promises when Spark replays a batch whose rows differ from its first run's.
EXACTLY_ONCE, AT_LEAST_ONCE = "exactly-once", "at-least-once"
DELIVERIES = (EXACTLY_ONCE, AT_LEAST_ONCE)
# Said with every refused replay: what makes a replay differ, and what to change.
REPLAY_DIFFERS = (
    "the writer's input is not the same when Spark replays the batch: a value computed "
    "inside foreachBatch that changes between runs (current_timestamp(), now(), rand(), "
    "uuid(), an external lookup), rows in another order (after a shuffle: a join, "
    "groupBy, repartition), another batchSize or numPartitions, or another writer using "
    "the same producer name. Compute such values in the streaming query before "
    "foreachBatch (Spark fixes current_timestamp() there per batch), sort rows within "
    "partitions after a shuffle, give each writer its own producer name; or accept "
    "duplicates on replay with delivery='at-least-once' (pub_to_topic) or "
    ".option('delivery', 'at-least-once') (the sink)")

log = logging.getLogger(__name__)


class PublishError(ValueError):
    """A row that cannot be published: a null or oversize body, a bad column."""


@dataclass(frozen=True)
class WriterOptions:
    address: str
    topic: str | None
    batch_size: int
    security: ClientSecurity = ClientSecurity()  # TLS files, auth secret (never shown)

    producer: str = "sink"
    delivery: str = EXACTLY_ONCE
    reconnect_timeout_ms: int = DEFAULT_RECONNECT_TIMEOUT_MS

    NAMES = ("address", "topic", "batchSize", "producer", "delivery", "reconnectTimeoutMs",
             *SPARK_OPTIONS)

    @classmethod
    def parse(cls, options: Mapping[str, str], schema: StructType) -> "WriterOptions":
        given = _lower(options)
        _check_unknown(given, {n.lower() for n in cls.NAMES}, "sink")
        addresses = parse_addresses(given.get("address"))
        if len(addresses) != 1:
            raise OptionError("option address: the pynsq sink publishes to one broker")
        # As Kafka's sink: the topic option, when given, wins over a topic column (a
        # source's rows carry their own topic, which must not route them back to it);
        # without the option, the column routes each row.
        routed = TOPIC in schema.names and not given.get("topic")
        topic = None if routed else require_name(given, "topic", "topic")
        check_columns(schema, BODY, DEFER if DEFER in schema.names else None,
                      TOPIC if routed else None, TTL if TTL in schema.names else None)
        producer = given.get("producer", "sink")
        check_producer(producer, "option producer")
        delivery = check_delivery(given.get("delivery", EXACTLY_ONCE), "option delivery")
        return cls(addresses[0], topic, _int(given, "batchSize", DEFAULT_BATCH_SIZE),
                   security_options(given), producer, delivery,
                   _int(given, "reconnectTimeoutMs", DEFAULT_RECONNECT_TIMEOUT_MS, minimum=0))


def check_producer(name: str, what: str) -> None:
    if not name or ":" in name:
        raise OptionError(f"{what}: a writer name must be non-empty and have no ':', "
                          f"got {name!r}")


def check_delivery(value: str, what: str) -> str:
    delivery = str(value).strip().lower()
    if delivery not in DELIVERIES:
        raise OptionError(f"{what}: {EXACTLY_ONCE!r} (the default) or {AT_LEAST_ONCE!r}, "
                          f"got {value!r}")
    return delivery


def check_columns(schema: StructType, body: str, defer: str | None, topic: str | None,
                  ttl: str | None = None) -> None:
    """Fail on the driver, naming the column, before any task runs."""
    fields = {f.name: f.dataType for f in schema.fields}
    if body not in fields:
        raise PublishError(f"column {body!r} is required (BINARY or STRING); the DataFrame "
                           f"has {', '.join(fields) or 'no columns'}")
    if not isinstance(fields[body], (BinaryType, StringType)):
        raise PublishError(f"column {body!r} must be BINARY or STRING, not "
                           f"{fields[body].simpleString()}")
    if defer is not None and not isinstance(fields.get(defer), IntegralType):
        raise PublishError(f"defer column {defer!r} must exist and be an integer column")
    if topic is not None and not isinstance(fields.get(topic), StringType):
        raise PublishError(f"topic column {topic!r} must exist and be a STRING column")
    if ttl is not None and not isinstance(fields.get(ttl), IntegralType):
        raise PublishError(f"ttl column {ttl!r} must exist and be an integer column")


class PartitionPublisher:
    """Publishes one partition's rows in MPUB batches; runs in an executor."""

    def __init__(self, address: str, default_topic: str | None, producer_id: str,
                 batch_size: int, where: str, security: ClientSecurity | None = None,
                 topic_column: bool = True, delivery: str = EXACTLY_ONCE,
                 reconnect_timeout_ms: int = DEFAULT_RECONNECT_TIMEOUT_MS) -> None:
        kwargs = security.client_kwargs() if security else {}
        self.where = where
        self.reconnect_timeout_ms = reconnect_timeout_ms
        self.client = Client(address, **kwargs)
        info = self._waiting(self.client.info)
        if info.workers:
            # pynsqd --workers: each worker keeps its own de-duplication window, so every
            # attempt of this producer id goes to the worker its id hashes to, not to the
            # one the kernel gave this connection.
            self.client.close()
            self.client = Client(worker_for(producer_id, worker_addresses(address, info.workers)),
                                 **kwargs)
        self.max_size = info.max_msg_size
        self.default_topic = default_topic
        self.topic_column = topic_column  # whether a ``topic`` column routes rows
        self.producer_id = producer_id
        self.batch_size = batch_size
        self.delivery = delivery
        self.sequence = 0
        self.published = 0
        self.row = 0
        self._pending: dict[str, tuple[list[bytes], list[int], list[int]]] = {}
        self._pending_bytes: dict[str, int] = {}

    def add(self, body: bytes | str | None, topic: str | None = None,
            defer_ms: int | None = None, ttl_ms: int | None = None) -> None:
        row = self.row
        self.row += 1
        if body is None:
            raise PublishError(f"{self.where}, row {row}: column 'body' is null")
        if isinstance(body, str):
            body = body.encode()
        if not body:
            raise PublishError(f"{self.where}, row {row}: column 'body' is empty")
        if len(body) > self.max_size:
            raise PublishError(f"{self.where}, row {row}: column 'body' has {len(body)} bytes, "
                               f"over the broker's max-msg-size of {self.max_size}")
        topic = topic or self.default_topic
        if not topic:
            raise PublishError(f"{self.where}, row {row}: column 'topic' is null and no "
                               f"topic option was given")
        if ttl_ms is not None and ttl_ms < 0:
            raise PublishError(f"{self.where}, row {row}: column 'ttl_ms' is negative")
        pending = self._pending.get(topic)
        if pending and self._pending_bytes[topic] + len(body) > MAX_REQUEST_BYTES:
            self._flush(topic)
        bodies, defers, ttls = self._pending.setdefault(topic, ([], [], []))
        bodies.append(body)
        defers.append(int(defer_ms or 0))
        ttls.append(int(ttl_ms or 0))
        self._pending_bytes[topic] = self._pending_bytes.get(topic, 0) + len(body)
        if len(bodies) >= self.batch_size:
            self._flush(topic)

    def _flush(self, topic: str) -> None:
        bodies, defers, ttls = self._pending.pop(topic)
        self._pending_bytes.pop(topic, None)
        # Each request's sequence is its position in this partition's output, so a
        # replay of the same rows names the same requests.
        try:
            self._publish(topic, bodies, defers, ttls, self.producer_id)
        except ProducerConflict as conflict:
            if self.delivery != AT_LEAST_ONCE:
                raise ProducerConflict(f"{self.where}: {conflict}. Here {REPLAY_DIFFERS}") \
                    from None
            # At least once: the rows as they are now are published too, keyed by their
            # content, so a further replay of these same rows publishes nothing again.
            log.warning("%s: a replay whose rows differ from its first run's is published "
                        "again (delivery at-least-once)", self.where)
            digest = content_digest(topic, bodies, defers, ttls).hex()
            self._publish(topic, bodies, defers, ttls, f"{self.producer_id}~{digest}")
        self.sequence += 1
        self.published += len(bodies)

    def _publish(self, topic: str, bodies: list[bytes], defers: list[int], ttls: list[int],
                 producer_id: str) -> None:
        self._waiting(self.client.multi_publish, topic, bodies,
                      defer_ms=defers if any(defers) else (), producer_id=producer_id,
                      sequence=self.sequence, ttl_ms=ttls if any(ttls) else ())

    def _waiting(self, call, *args, **kwargs):
        """``call``, tried again while the broker does not answer, until it has been
        silent for ``reconnectTimeoutMs`` (the client reconnects within a second of its
        return), as the driver waits. Safe for an MPUB: it names its producer and
        sequence, so one that got through before its answer was lost is answered with
        its first ids, never published twice."""
        deadline, pause = None, 0.05
        while True:
            try:
                return call(*args, **kwargs)
            except BrokerUnavailable as err:
                now = time.monotonic()
                if deadline is None:
                    deadline = now + self.reconnect_timeout_ms / 1000
                    log.warning("%s: %s; waiting up to reconnectTimeoutMs (%d ms)", self.where,
                                err, self.reconnect_timeout_ms)
                if now >= deadline:
                    raise BrokerUnavailable(err.status, f"{self.where}: {err}; silent for "
                                            f"longer than reconnectTimeoutMs "
                                            f"({self.reconnect_timeout_ms} ms)") from None
                time.sleep(min(pause, deadline - now))
                pause = min(pause * 2, 1.0)

    def finish(self) -> int:
        """Publish what is pending; returns how many rows were published in all."""
        for topic in list(self._pending):
            self._flush(topic)
        return self.published

    def close(self) -> None:
        self.client.close()

    def add_arrow(self, batches: Iterable) -> None:
        for batch in batches:
            names = batch.schema.names
            if self._add_plain(batch, names):
                continue
            bodies = batch.column(names.index(BODY)).to_pylist()
            topics = (batch.column(names.index(TOPIC)).to_pylist()
                      if TOPIC in names and self.topic_column else [None] * len(bodies))
            defers = (batch.column(names.index(DEFER)).to_pylist() if DEFER in names
                      else [None] * len(bodies))
            ttls = (batch.column(names.index(TTL)).to_pylist() if TTL in names
                    else [None] * len(bodies))
            for body, topic, defer, ttl in zip(bodies, topics, defers, ttls):
                self.add(body, topic, defer, ttl)

    def _add_plain(self, batch, names: list[str]) -> bool:
        """``add`` each row of ``batch`` at once, when it has bodies only (no routing,
        defer or ttl column) and every body is valid; False (nothing added) otherwise,
        and the rows go one by one, which names the first bad one. The same MPUBs as
        row by row: the checks run over the column, the cuts are found on the running
        sum of the bodies' sizes (a row at a time had been most of a writer's cost)."""
        if (not self.default_topic or DEFER in names or TTL in names
                or (TOPIC in names and self.topic_column)):
            return False
        import pyarrow as pa
        import pyarrow.compute as pc

        column = batch.column(names.index(BODY))
        if not len(column):
            return True
        if column.null_count:
            return False
        if pa.types.is_string(column.type):
            column = column.cast(pa.binary())
        elif pa.types.is_large_string(column.type):
            column = column.cast(pa.large_binary())
        sizes = pc.binary_length(column)
        smallest, largest = pc.min_max(sizes).values()
        if smallest.as_py() < 1 or largest.as_py() > self.max_size:
            return False
        self._add_bodies(column.to_pylist(), sizes.to_pylist())
        return True

    def _add_bodies(self, bodies: list[bytes], sizes: list[int]) -> None:
        """Valid bodies for the default topic, cut into MPUBs exactly as ``add`` cuts
        them one at a time."""
        topic, n, start = self.default_topic, len(bodies), 0
        ends = list(accumulate(sizes, initial=0))   # ends[i]: the bytes of bodies[:i]
        self.row += n
        while start < n:
            pending = self._pending.get(topic)
            have = len(pending[0]) if pending else 0
            used = self._pending_bytes.get(topic, 0) if pending else 0
            # How many more fit under MAX_REQUEST_BYTES with what is pending.
            fit = bisect_right(ends, ends[start] + MAX_REQUEST_BYTES - used, start) - 1 - start
            if fit <= 0:
                if have:
                    self._flush(topic)
                    continue
                fit = 1     # alone in its request, as ``add`` lets an empty one take it
            take = min(fit, self.batch_size - have, n - start)
            pending_bodies, defers, ttls = self._pending.setdefault(topic, ([], [], []))
            pending_bodies += bodies[start:start + take]
            defers += [0] * take
            ttls += [0] * take
            self._pending_bytes[topic] = used + ends[start + take] - ends[start]
            start += take
            if len(pending_bodies) >= self.batch_size:
                self._flush(topic)


def publish_partition(address: str, topic: str | None, producer: str, batch_size: int,
                      kind: str, batches: Iterable,
                      security: ClientSecurity | None = None, topic_column: bool = True,
                      delivery: str = EXACTLY_ONCE,
                      reconnect_timeout_ms: int = DEFAULT_RECONNECT_TIMEOUT_MS) -> int:
    """Publish this task's Arrow batches as producer ``producer:PARTITION``; a ``topic``
    column routes rows only if ``topic_column``."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    partition = ctx.partitionId() if ctx else 0
    publisher = PartitionPublisher(address, topic, f"{producer}:{partition}", batch_size,
                                   f"{kind} partition {partition}", security, topic_column,
                                   delivery, reconnect_timeout_ms)
    try:
        publisher.add_arrow(batches)
        return publisher.finish()
    finally:
        publisher.close()


def pub_to_topic(address: str, topic: str, *, batch_size: int = DEFAULT_BATCH_SIZE,
                 body_column: str = BODY, defer_column: str | None = None,
                 topic_column: str | None = None, producer: str | None = None,
                 tls_ca: str | None = None, tls_cert: str | None = None,
                 tls_key: str | None = None, auth_secret: str | None = None,
                 ttl_column: str | None = None, delivery: str = EXACTLY_ONCE,
                 reconnect_timeout_ms: int = DEFAULT_RECONNECT_TIMEOUT_MS):
    """A ``foreachBatch`` function publishing each micro-batch to ``topic``.

    ``body_column`` (BINARY or STRING) is required; ``defer_column`` gives a
    per-row defer in milliseconds; ``topic_column`` routes each row by its value
    (a null goes to ``topic``); ``ttl_column`` gives a per-row time to live in
    milliseconds. Each partition publishes from its executor in MPUB batches of
    ``batch_size``. A broker error fails the batch, so Spark retries it; the
    retry publishes nothing already published. ``producer`` names this writer
    for de-duplication (default ``to-<topic>``): give two calls to the same
    topic in one ``foreachBatch`` different names. Under Spark Connect, which
    does not tell a ``foreachBatch`` function its query, ``producer`` stands for
    the query and is required. ``delivery``: ``"exactly-once"`` (default) fails a
    replay whose rows differ from its first run's with ``ProducerConflict`` saying
    what to change; ``"at-least-once"`` publishes such a replay again (identical
    replays still publish nothing twice). A broker that does not answer is waited
    for up to ``reconnect_timeout_ms`` (as the source's ``reconnectTimeoutMs``),
    then the batch fails naming it. ``tls_ca``, ``tls_cert``, ``tls_key`` and
    ``auth_secret`` are ``broker.Client``'s. Bad arguments raise here, before any
    batch runs.
    """
    parse_addresses(address)
    check_topic(topic, "topic")
    security = ClientSecurity(tls_ca, tls_cert, tls_key, auth_secret)
    if batch_size < 1:
        raise OptionError(f"batch_size must be at least 1, got {batch_size}")
    writer = producer if producer is not None else f"to-{topic}"
    check_producer(writer, "producer")
    delivery = check_delivery(delivery, "delivery")
    if reconnect_timeout_ms < 0:
        raise OptionError(f"reconnect_timeout_ms must be at least 0, got {reconnect_timeout_ms}")

    def publish_batch(df, batch_id: int) -> None:
        check_columns(df.schema, body_column, defer_column, topic_column, ttl_column)
        name = _producer_name(df, writer, producer is not None, batch_id)
        columns = [df[body_column].alias(BODY)]
        if topic_column:
            columns.append(df[topic_column].alias(TOPIC))
        if defer_column:
            columns.append(df[defer_column].alias(DEFER))
        if ttl_column:
            columns.append(df[ttl_column].alias(TTL))

        def publish(batches: Iterator) -> Iterator:
            import pyarrow as pa

            published = publish_partition(address, topic, name, batch_size,
                                          f"batch {batch_id}", batches, security,
                                          delivery=delivery,
                                          reconnect_timeout_ms=reconnect_timeout_ms)
            yield pa.RecordBatch.from_pydict({"published": [published]})

        # One row per partition comes back; summing them on the executors would cost a
        # second stage (a shuffle) per batch, more than the whole write of a small batch.
        df.select(*columns).mapInArrow(publish, "published LONG").collect()

    return publish_batch


def check_topic(topic: str, what: str) -> None:
    if not isinstance(topic, str) or not is_valid_name(topic):
        raise OptionError(f"{what}: invalid topic name {topic!r} (1-64 characters of "
                          f"[.a-zA-Z0-9_-], optionally ending in #ephemeral)")


# Spark Connect runs a ``foreachBatch`` function in a Python process of its own, started
# as this module, on the server's side; the ``batch_id`` it passes is Spark's batch id.
CONNECT_FOREACH_BATCH_WORKER = "pyspark.sql.connect.streaming.worker.foreach_batch_worker"


def _in_connect_foreach_batch() -> bool:
    """Whether this call runs in Spark Connect's ``foreachBatch`` worker, whatever the
    DataFrame handed to the writer (the batch itself, or any plan built on it)."""
    main = sys.modules.get("__main__")
    return getattr(getattr(main, "__spec__", None), "name", None) == CONNECT_FOREACH_BATCH_WORKER


def _producer_name(df, writer: str, named: bool, batch_id: int) -> str:
    """The producer id of one ``foreachBatch`` call, before its partition number.

    The batch's identity is Spark's: (query, batch). Classic Spark tells the thread
    running ``foreachBatch`` its query id; Spark Connect does not, so there a
    ``producer`` given stands for the query (``named:``) and is required, since a
    replay named anew would publish its batch twice. Outside any stream each call is a
    new producer (only its task retries are de-duplicated). Which of these holds never
    depends on the DataFrame's plan: a ``select``, a join or a cache changes nothing.
    """
    if _in_connect_foreach_batch():
        if not named:
            raise OptionError(
                "pub_to_topic under Spark Connect needs producer=: Connect does not tell "
                "foreachBatch which query runs it, so give this writer a name that stands "
                "for the query (unique to it, e.g. its checkpoint's name) and its replays "
                "publish nothing twice")
        return f"named:{writer}:{batch_id}"
    if not type(df).__module__.startswith("pyspark.sql.connect"):
        query_id = df.sparkSession.sparkContext.getLocalProperty("sql.streaming.queryId")
        if query_id:
            return f"{query_id}:{writer}:{batch_id}"
    return f"call-{uuid.uuid4().hex}:{writer}:{batch_id}"


class _Count(WriterCommitMessage):
    def __init__(self, published: int) -> None:
        self.published = published


class PynsqStreamWriter(DataSourceStreamArrowWriter):
    """``df.writeStream.format("pynsq")``: one producer id per (query, writer name, batch,
    partition)."""

    def __init__(self, options: Mapping[str, str], schema: StructType) -> None:
        self.options = WriterOptions.parse(options, schema)

    def write(self, iterator: Iterator) -> WriterCommitMessage:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        query_id = ctx.getLocalProperty("sql.streaming.queryId")
        batch_id = ctx.getLocalProperty("streaming.sql.batchId")
        if not query_id or batch_id is None:
            # Without them every batch would share one producer id: refuse, never guess.
            raise PublishError("the pynsq sink's task names no streaming query and batch "
                               "(sql.streaming.queryId, streaming.sql.batchId), so its "
                               "replays could not be told apart")
        o = self.options
        return _Count(publish_partition(o.address, o.topic,
                                        f"{query_id}:{o.producer}:{batch_id}",
                                        o.batch_size, f"batch {batch_id}", iterator,
                                        o.security, o.topic is None, o.delivery,
                                        o.reconnect_timeout_ms))

    def commit(self, messages, batchId: int) -> None:
        pass

    def abort(self, messages, batchId: int) -> None:
        pass


class PynsqBatchWriter(DataSourceArrowWriter):
    """``df.write.format("pynsq")``: one producer id per (write, partition)."""

    def __init__(self, options: Mapping[str, str], schema: StructType) -> None:
        self.options = WriterOptions.parse(options, schema)
        self.write_id = uuid.uuid4().hex  # made on the driver, shipped to every task

    def write(self, iterator: Iterator) -> WriterCommitMessage:
        o = self.options
        return _Count(publish_partition(o.address, o.topic, f"write-{self.write_id}",
                                        o.batch_size, "write", iterator, o.security,
                                        o.topic is None, o.delivery, o.reconnect_timeout_ms))
