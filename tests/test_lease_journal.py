"""The lease journal (``leases.journal``): a write that fails (a full disk, EIO, a short
write) is cut back off the file and refuses the Reserve that wanted it with
``StorageFailed`` (gRPC ``RESOURCE_EXHAUSTED``), its messages given back; a damaged
record costs that record (one lease) and the load resumes past it; a journal written
before keys is read and rewritten in the keyed framing at the start; a clean stop
fsyncs it (the storage's last sync), so a power loss after it keeps every lease."""

from __future__ import annotations

import errno
import struct
import zlib

import grpc
import pytest

from broker import Client, EmbeddedBroker
from broker.client import ClientError
from broker.errors import StorageFailed
from broker.lease import LeaseJournal
from broker.storage import fileops, records

from .corekit import new_broker
from .test_storage_faults import crash
from .faultfs import FaultyFiles


def journaled_broker(path, files=None):
    broker, _ = new_broker()
    broker.create_channel("events", "spark")
    broker.multi_publish("events", [f"m{i}".encode() for i in range(40)])
    journal = LeaseJournal(path / "leases.journal", files)
    broker.restore_leases(journal)
    session = broker.open_lease_session("driver").session_id
    return broker, journal, session


def reserve(broker, session: str, n: int = 2):
    lease, _ = broker.reserve(session, "events", "spark", n, 60_000)
    return lease


def loaded(path) -> list[str]:
    return [r[0] for r in LeaseJournal(path / "leases.journal").load()]


@pytest.mark.parametrize("fault", ["enospc", "eio", "short"])
def test_a_failed_journal_write_refuses_the_reserve_and_later_leases_are_all_kept(tmp_path,
                                                                                  fault):
    files = FaultyFiles()
    broker, journal, session = journaled_broker(tmp_path, files)
    first = [reserve(broker, session).lease_id for _ in range(5)]
    size = (tmp_path / "leases.journal").stat().st_size
    if fault == "short":
        files.short_writes = True
    else:
        files.fail("write", errno.ENOSPC if fault == "enospc" else errno.EIO)
    depth = broker.channel("events", "spark").depth
    with pytest.raises(StorageFailed, match="leases.journal"):
        reserve(broker, session)
    # Nothing of it stays: not in the file, not held (its messages are back).
    assert (tmp_path / "leases.journal").stat().st_size == size
    assert broker.channel("events", "spark").depth == depth
    files.heal()
    later = [reserve(broker, session).lease_id for _ in range(5)]
    # What kill -9 leaves: the file as written.
    assert loaded(tmp_path) == first + later


def test_a_failed_end_of_a_lease_is_written_with_the_next_write(tmp_path):
    files = FaultyFiles()
    broker, journal, session = journaled_broker(tmp_path, files)
    kept, done = reserve(broker, session), reserve(broker, session)
    files.fail("write", errno.ENOSPC)
    broker.finish_leases([done.lease_id])          # answered: the FIN is the core's
    assert loaded(tmp_path) == [kept.lease_id, done.lease_id]
    files.heal()
    new = reserve(broker, session)
    assert loaded(tmp_path) == [kept.lease_id, new.lease_id]


def test_one_flipped_bit_costs_the_lease_it_hit_and_no_other(tmp_path):
    broker, journal, session = journaled_broker(tmp_path)
    leases = [reserve(broker, session).lease_id for _ in range(5)]
    journal.close()
    path = tmp_path / "leases.journal"
    data = path.read_bytes()
    for where, lost in ((40, []), (records.PROLOGUE_SIZE + 4, [leases[0]]),
                        (len(data) * 3 // 5, [leases[2]]), (len(data) - 1, [leases[4]])):
        flipped = bytearray(data)
        flipped[where] ^= 0x08
        path.write_bytes(bytes(flipped))
        assert loaded(tmp_path) == [i for i in leases if i not in lost], where


def test_a_journal_written_before_keys_is_read_and_rewritten_with_a_key(tmp_path):
    broker, _, session = journaled_broker(tmp_path)
    lease = reserve(broker, session, 3)
    ids = [m.id for m in lease.order]

    def old(kind: int, payload: bytes) -> bytes:   # u32 length, u8 kind, payload, u32 crc
        body = bytes((kind,)) + payload
        return struct.pack("<I", len(payload)) + body + struct.pack("<I", zlib.crc32(body))

    payload = (LeaseJournal._MADE.pack(lease.lease_id.encode(), 6, 5, 0, 60_000, 3)
               + b"events" + b"spark" + "".join(ids).encode() + struct.pack("<3H", 1, 1, 1))
    (tmp_path / "leases.journal").write_bytes(old(LeaseJournal.MADE, payload)
                                              + old(LeaseJournal.MADE, payload)[:-3])
    broker.requeue_leases([lease.lease_id])
    restarted = LeaseJournal(tmp_path / "leases.journal")
    assert [(r[0], r[4]) for r in restarted.load()] == [(lease.lease_id, ids)]
    assert broker.restore_leases(restarted) == 1
    assert records.file_key((tmp_path / "leases.journal").read_bytes())[0] != 0
    assert loaded(tmp_path) == [lease.lease_id]


@pytest.fixture
def files(monkeypatch) -> FaultyFiles:
    faulty = FaultyFiles()
    monkeypatch.setattr(fileops, "current", faulty)
    return faulty


@pytest.mark.parametrize("fault", [errno.ENOSPC, errno.EIO])
def test_a_reserve_on_a_full_disk_is_resource_exhausted_and_five_later_leases_survive_kill_9(
        files, tmp_path, fault):
    data = str(tmp_path / "data")
    with EmbeddedBroker(data_path=data) as broker:
        with Client(broker.address) as client:
            client.admin("channel", "create", "events", "spark")
            client.multi_publish("events", [f"m{i}".encode() for i in range(40)])
            session = client.open_lease_session("planner")
            first = [client.reserve(session.session_id, "events", "spark", 2).lease_id
                     for _ in range(5)]
            files.fail("write", fault)
            with pytest.raises(ClientError) as refused:
                client.reserve(session.session_id, "events", "spark", 2)
            assert refused.value.status == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "leases.journal" in str(refused.value)
            files.heal()
            later = [client.reserve(session.session_id, "events", "spark", 2).lease_id
                     for _ in range(5)]
            session.close()
        broker.call(crash, broker.broker)
    assert loaded(tmp_path / "data") == first + later


def test_a_start_that_cannot_rewrite_the_journal_says_so_and_leaves_it_as_it_was(tmp_path):
    broker, journal, session = journaled_broker(tmp_path)
    leases = [reserve(broker, session).lease_id for _ in range(3)]
    before = (tmp_path / "leases.journal").read_bytes()
    files = FaultyFiles()
    files.fail("write", errno.ENOSPC)
    restarted = LeaseJournal(tmp_path / "leases.journal", files)
    kept = restarted.load()
    with pytest.raises(OSError, match="cannot start: could not rewrite the lease journal"):
        restarted.open(kept)
    assert (tmp_path / "leases.journal").read_bytes() == before
    assert not (tmp_path / "leases.journal.tmp").exists()
    assert loaded(tmp_path) == leases


def test_a_clean_stop_fsyncs_the_journal_so_its_leases_outlive_a_power_loss_after_it(
        files, tmp_path):
    data = str(tmp_path / "data")
    # No sync on the clock's account meanwhile: only the stop's own fsyncs the journal.
    with EmbeddedBroker(data_path=data, sync_every=1 << 30, sync_timeout=1 << 30) as broker:
        with Client(broker.address) as client:
            client.admin("channel", "create", "events", "spark")
            client.multi_publish("events", [f"m{i}".encode() for i in range(10)])
            session = client.open_lease_session("planner")
            leases = [client.reserve(session.session_id, "events", "spark", 2).lease_id
                      for _ in range(3)]
    files.power_loss(data)
    assert loaded(tmp_path / "data") == leases
