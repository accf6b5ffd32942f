"""Messages waiting on disk are read back ahead of their channel's cursor, never
waiting for the disk on the event loop: what the page cache holds is read there,
the rest by a reader thread. Delivery counts are written one record per channel
per pass.

The first test runs the real reader thread under a running event loop; the
others hold reads back by hand (as the model test does) to make them arrive
late: after the messages they read moved in the log, or after a lease took them.
"""

from __future__ import annotations

import asyncio
import errno
import threading

import pytest

from broker import Broker, Options
from broker.clock import ManualClock
from broker.storage import DiskStore, fileops, records
import broker.storage.store as store_module
from broker.storage.segments import READ_AHEAD as READ_AHEAD_BYTES, segment_of

from .corekit import Recorder
from .faultfs import FaultyFiles


class ReadsRecorded(FaultyFiles):
    """Remembers which thread each read of a log file ran in; ``cold``: the page cache
    holds nothing (every read would wait for the disk); ``partly``: it holds the first
    ``partly`` bytes of any range asked for."""

    def __init__(self, cold: bool = False, partly: int = 0) -> None:
        super().__init__()
        self.cold = cold
        self.partly = partly
        self.read_threads: list[str] = []

    def pread(self, fd: int, size: int, offset: int) -> bytes:
        self.read_threads.append(threading.current_thread().name)
        return super().pread(fd, size, offset)

    def pread_cached(self, fd: int, size: int, offset: int) -> bytes | None:
        if self.cold:
            return None
        self.read_threads.append(threading.current_thread().name)
        return super().pread_cached(fd, min(size, self.partly or size), offset)


def start(path, **options) -> Broker:
    opts = Options(data_path=str(path), **options)
    broker = Broker(opts, clock=ManualClock())
    broker.storage = DiskStore(broker, opts)
    broker.storage.recover()
    return broker


def held_reads(broker: Broker) -> list:
    """Make the store queue its reads ahead here instead of in its thread."""
    reads: list = []

    def read_ahead(topic, locs, done, cached_only=False) -> bool:
        if cached_only:  # nothing is in the page cache
            return False
        reads.append((broker.storage.logs[topic.name], locs, done))
        return True

    broker.storage.read_ahead = read_ahead
    return reads


def arrive(reads: list) -> None:
    for topic_log, locs, done in reads:
        done(topic_log.read_messages(locs))
    reads.clear()


def read_back(tmp_path, files: ReadsRecorded) -> tuple[list, list, list]:
    """3,000 messages spilled past --mem-queue-size (published one to seven at a time:
    PUB and BATCH records of a few messages), consumed under a running event loop:
    (ids published, messages received, threads that read the log meanwhile)."""
    bodies = [f"m{i}-".encode() * (1 + i % 40) for i in range(3000)]

    async def run() -> tuple[list, list]:
        broker = start(tmp_path, mem_queue_size=10, max_bytes_per_file=64 << 10)
        consumer = Recorder(broker)
        ch = broker.subscribe(consumer, "events", "work")
        ids, at, size = [], 0, 1
        while at < len(bodies):
            ids += broker.multi_publish("events", bodies[at:at + size])
            at, size = at + size, size % 7 + 1
        files.read_threads.clear()
        ch.set_rdy(consumer, 300)
        seen = 0
        for _ in range(10_000):
            if len(consumer.received) == len(bodies):
                break
            if len(consumer.received) > seen:
                seen = len(consumer.received)
                consumer.fin_all()
            await asyncio.sleep(0.001)
        broker.storage.close()
        return ids, consumer.received

    ids, received = asyncio.run(run())
    assert [m.id for m in received] == ids
    assert [m.body for m in received] == bodies
    assert all(m.attempts == 1 for m in received)
    assert files.read_threads, "the spilled messages were read back"
    return ids, received, files.read_threads


def test_spilled_messages_the_page_cache_holds_are_read_on_the_loop_in_order(tmp_path,
                                                                            monkeypatch):
    files = ReadsRecorded()
    monkeypatch.setattr(fileops, "current", files)
    _, _, threads = read_back(tmp_path, files)
    assert set(threads) == {threading.main_thread().name}, "no hand-off to the reader thread"


def test_spilled_messages_not_in_the_page_cache_are_read_off_the_event_loop_in_order(
        tmp_path, monkeypatch):
    files = ReadsRecorded(cold=True)
    monkeypatch.setattr(fileops, "current", files)
    _, _, threads = read_back(tmp_path, files)
    assert set(threads) == {"pynsq-read_0"}, "no read on the event loop"


@pytest.mark.parametrize("cached, readers", [
    (4000, {"MainThread"}),                    # whole records, then one cut: read on from it
    (20, {"MainThread", "pynsq-read_0"}),      # not even one whole record: the thread reads
])
def test_spilled_messages_the_page_cache_holds_in_part_are_read_whole_in_order(
        tmp_path, monkeypatch, cached, readers):
    # Each range asked of the page cache comes back cut after ``cached`` bytes, in the
    # middle of a record; nothing is lost or reordered (``read_back`` checks).
    files = ReadsRecorded(partly=cached)
    monkeypatch.setattr(fileops, "current", files)
    _, _, threads = read_back(tmp_path, files)
    assert set(threads) == readers


def test_a_read_ahead_that_fails_loses_nothing_and_delivery_goes_on(tmp_path, monkeypatch):
    files = FaultyFiles()
    monkeypatch.setattr(fileops, "current", files)

    async def run() -> tuple[list, list]:
        broker = start(tmp_path, mem_queue_size=10)
        consumer = Recorder(broker)
        ch = broker.subscribe(consumer, "events", "work")
        ids = broker.multi_publish("events", [f"m{i}".encode() for i in range(500)])
        files.fail("pread", errno.EIO, times=1)   # the first read back
        ch.set_rdy(consumer, 100)
        for _ in range(5000):
            consumer.fin_all()
            if len(consumer.received) == len(ids):
                break
            await asyncio.sleep(0.001)
        broker.storage.close()
        return ids, consumer.ids

    ids, got = asyncio.run(run())
    assert files.failures == 1
    assert got == ids


def test_a_channel_waits_for_its_next_messages_and_gets_them_when_they_arrive(tmp_path):
    broker = start(tmp_path, mem_queue_size=5)
    reads = held_reads(broker)
    consumer = Recorder(broker)
    ch = broker.subscribe(consumer, "events", "work")
    ids = broker.multi_publish("events", [f"m{i}".encode() for i in range(50)])
    ch.set_rdy(consumer, 100)
    assert consumer.ids == ids[:5]           # the rest is being read
    assert reads and ch.depth == 45
    arrive(reads)
    for _ in range(10):
        arrive(reads)
    assert consumer.ids == ids
    assert [m.body for m in consumer.received] == [f"m{i}".encode() for i in range(50)]


def test_a_read_that_arrives_after_its_messages_moved_in_the_log_is_read_again(tmp_path,
                                                                              monkeypatch):
    # Copied out however little that lets go of: this is about the read, not the choice.
    monkeypatch.setattr(store_module, "RELOCATE_GAIN", 0)
    broker = start(tmp_path, mem_queue_size=2, max_bytes_per_file=1024)
    store = broker.storage
    reads = held_reads(broker)
    consumer = Recorder(broker)
    ch = broker.subscribe(consumer, "events", "work")
    ids = broker.multi_publish("events", [f"old-{i}".encode() for i in range(10)])
    for i in range(40):  # newer files, so the first one is worth moving out
        broker.publish("events", f"new-{i}".encode() * 10)
    ch.set_rdy(consumer, 2)
    consumer.fin_all()
    ch.set_rdy(consumer, 2)                  # the next ones are being read
    assert reads
    topic_log = store.logs["events"]
    first = min(topic_log.refs)
    store._relocate(broker.topic("events"), topic_log, first)   # what tick does
    assert first not in topic_log.refs or topic_log.refs[first] == 0
    arrive(reads)                            # read from where they no longer are
    got = list(consumer.received)
    for _ in range(100):
        arrive(reads)
        ch.set_rdy(consumer, 100)
        consumer.fin_all()
        if len(consumer.received) == 50:
            break
    assert consumer.ids[:10] == ids
    assert all(segment_of(m.loc) != first for m in consumer.received[len(got):] if m.loc)
    assert not any(topic_log.refs.values()), "every FIN released what its message held"
    store.close()


def test_a_lease_takes_spilled_messages_even_while_a_read_is_under_way(tmp_path):
    broker = start(tmp_path, mem_queue_size=3)
    reads = held_reads(broker)
    consumer = Recorder(broker)
    ch = broker.subscribe(consumer, "events", "work")
    ids = broker.multi_publish("events", [f"m{i}".encode() for i in range(20)])
    ch.set_rdy(consumer, 10)
    assert consumer.ids == ids[:3] and reads
    session = broker.open_lease_session("spark")
    lease, depth = broker.reserve(session.session_id, "events", "work", 5)
    assert [m.id for m in lease.order] == ids[3:8]
    arrive(reads)                            # too late for those five: read again
    for _ in range(10):
        consumer.fin_all()
        arrive(reads)
    assert consumer.ids == ids[:3] + ids[8:]


def test_deliveries_of_one_pass_write_one_attempts_record_per_channel(tmp_path):
    broker = start(tmp_path)
    consumers = {}
    for name in ("x", "y"):
        consumers[name] = Recorder(broker)
        broker.subscribe(consumers[name], "events", name)
    broker.multi_publish("events", [b"a", b"b", b"c", b"d"])
    for _ in range(4):  # delivered and FINed one at a time, in one pass
        for name, consumer in consumers.items():
            broker.channel("events", name).set_rdy(consumer, 1)
            consumer.fin_all()
            broker.channel("events", name).set_rdy(consumer, 1)
    broker.storage.flush()
    kinds = [r.kind for p in sorted((tmp_path / "topics" / "t-events").glob("*.log"))
             for r in records.scan_file(p.read_bytes(), "log")]
    assert kinds.count(records.ATTEMPTS) <= 2
    assert kinds.count(records.FIN) == 2
    broker.storage.close()


def test_messages_read_back_delivered_and_fined_die_without_a_young_garbage_collection(
        tmp_path):
    # pynsqd's collector settings: a read-ahead's messages (all alive, queued) no longer
    # pass the young generation's threshold each time, so none is traced on its way
    # from the disk through a consumer to its FIN.
    import gc

    from broker.daemon import tune_garbage_collector

    broker = start(tmp_path, mem_queue_size=100)
    consumer = Recorder(broker)
    ch = broker.subscribe(consumer, "events", "work")
    for _ in range(200):
        broker.multi_publish("events", [b"x" * 100] * 100)
    broker.storage.flush()
    saved, young = gc.get_threshold(), []

    def counted(phase: str, info: dict) -> None:
        if phase == "start":
            young.append(info["generation"])

    gc.collect()
    tune_garbage_collector()
    gc.callbacks.append(counted)
    try:
        ch.set_rdy(consumer, 2500)
        while consumer.received:
            ch.finish_many(consumer, [m.id for m in consumer.received[:500]])
            del consumer.received[:500]
            broker.storage.flush()
    finally:
        gc.callbacks.remove(counted)
        gc.set_threshold(*saved)
    assert ch.depth == 0 and ch.in_flight_count == 0 and ch.finish_count == 20_000
    assert len(young) <= 2, f"{len(young)} collections while 20,000 messages were read back"
    broker.storage.close()


def test_read_aheads_of_consecutive_messages_read_each_byte_of_the_log_once(tmp_path):
    class BytesCounted(ReadsRecorded):
        read_bytes = 0

        def pread_cached(self, fd: int, size: int, offset: int) -> bytes | None:
            block = super().pread_cached(fd, size, offset)
            self.read_bytes += len(block or b"")
            return block

    files = BytesCounted()
    opts = Options(data_path=str(tmp_path), mem_queue_size=10)
    broker = Broker(opts, clock=ManualClock())
    broker.storage = DiskStore(broker, opts, files=files)
    broker.storage.recover()
    consumer = Recorder(broker)
    ch = broker.subscribe(consumer, "events", "work")
    ids = []
    for _ in range(100):  # 10,000 messages, 1.3 MB of log, past several read-aheads
        ids += broker.multi_publish("events", [b"x" * 100] * 100)
    broker.storage.flush()
    log_bytes = broker.storage.logs["events"].disk_bytes
    ch.set_rdy(consumer, 2500)
    received = []
    while consumer.received:
        taken = consumer.ids
        consumer.received.clear()
        received += taken
        ch.finish_many(consumer, taken)  # and the next ones are delivered
    assert received == ids
    assert files.read_bytes <= log_bytes + READ_AHEAD_BYTES
    broker.storage.close()
