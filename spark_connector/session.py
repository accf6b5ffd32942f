"""The driver's side of the source: lease sessions with each broker, and the leases
of the micro-batches Spark has planned but not yet committed.

A ``LeaseKeeper`` lives in the process where Spark runs the stream reader's
driver methods. It keeps one lease session stream open per broker (the broker
requeues a session's leases the moment that stream ends) and a thread that
touches every open lease often enough that a batch running longer than
``msgTimeoutMs`` keeps its messages.
"""

from __future__ import annotations

import logging
import threading
from typing import Iterable

import grpc

from broker.api import broker_pb2 as pb
from broker.client import BrokerUnavailable, Client, ClientError

from .options import ReaderOptions

log = logging.getLogger("pynsq.spark")


class BrokerUnreachable(ConnectionError):
    """A broker named by the ``address`` option did not answer."""


class _BrokerSession:
    """A client of one broker and the lease session held open on it."""

    def __init__(self, address: str, options: ReaderOptions) -> None:
        self.address = address
        self.options = options
        self.client = Client(address, timeout=options.timeout_ms / 1000)
        try:
            self.client.ping(timeout=options.timeout_ms / 1000)
        except BrokerUnavailable as err:
            self.client.close()
            raise BrokerUnreachable(
                f"pynsq source: cannot reach the broker at {address} (option address): "
                f"{err}") from None
        self.session_id = ""
        self._stream = None
        self.open()

    def open(self) -> None:
        name = self.options.client_id or f"spark:{self.options.topic}/{self.options.channel}"
        self._stream = self.client.stub.OpenLeaseSession(pb.LeaseSessionRequest(client_id=name))
        self.session_id = next(self._stream).session_id
        threading.Thread(target=self._drain, args=(self._stream,), daemon=True,
                         name="pynsq-lease-session").start()

    def _drain(self, stream) -> None:
        try:
            for _ in stream:
                pass
        except grpc.RpcError:
            pass

    def reserve(self, max_messages: int) -> tuple[str, int]:
        request = pb.ReserveRequest(session_id=self.session_id, topic=self.options.topic,
                                    channel=self.options.channel, max_messages=max_messages,
                                    msg_timeout_ms=self.options.msg_timeout_ms)
        try:
            reply = self.client._call(self.client.stub.Reserve, request)
        except ClientError as err:
            if err.status != grpc.StatusCode.NOT_FOUND:
                raise
            # The session ended (the broker restarted): open a new one and retry.
            log.warning("lease session on %s ended; opening a new one", self.address)
            self.close_stream()
            self.open()
            request.session_id = self.session_id
            reply = self.client._call(self.client.stub.Reserve, request)
        return reply.lease_id, reply.count

    def leases(self, method: str, lease_ids: list[str]) -> None:
        if lease_ids:
            self.client._call(getattr(self.client.stub, method),
                              pb.LeaseRequest(lease_ids=lease_ids))

    def adopt(self, lease_ids: list[str]) -> int:
        reply = self.client._call(self.client.stub.AdoptLeases, pb.AdoptLeasesRequest(
            session_id=self.session_id, lease_ids=lease_ids))
        return reply.count

    def depth(self) -> int:
        stats = self.client.stats(self.options.topic, self.options.channel)
        return sum(c.depth for t in stats.topics for c in t.channels)

    def close_stream(self) -> None:
        if self._stream is not None:
            self._stream.cancel()
            self._stream = None

    def close(self) -> None:
        self.close_stream()
        self.client.close()


class LeaseKeeper:
    def __init__(self, options: ReaderOptions) -> None:
        self.options = options
        self._sessions = {address: _BrokerSession(address, options)
                          for address in options.addresses}
        self._open: dict[int, dict[str, dict]] = {}  # batch -> leases of its offset
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._touch_every = max(0.5, options.msg_timeout_ms / 1000 / 4)
        threading.Thread(target=self._keep_alive, daemon=True, name="pynsq-lease-touch").start()

    def ensure_channel(self) -> None:
        """Create the channel on every broker, so it gets what is published from now on."""
        for session in self._sessions.values():
            # maxAttempts: a poison message goes to the dead-letter topic after N batches.
            session.client.create_channel(self.options.topic, self.options.channel,
                                          max_attempts=self.options.max_attempts)

    def depths(self) -> dict[str, int]:
        self.ensure_channel()
        try:
            return {address: s.depth() for address, s in self._sessions.items()}
        except BrokerUnavailable as err:
            raise BrokerUnreachable(str(err)) from None

    def planned(self, batch: int) -> dict | None:
        """The offset of ``batch`` if it was reserved and not finished yet."""
        with self._lock:
            leases = self._open.get(batch)
        return {"batch": batch, "leases": leases} if leases else None

    def reserve(self, batch: int, wanted: int, target: dict[str, int] | None) -> dict[str, dict]:
        """Lease up to ``wanted`` messages across the brokers for ``batch``."""
        leases: dict[str, dict] = {}
        for address, session in self._sessions.items():
            budget = wanted if target is None else min(wanted, target.get(address, 0))
            if budget <= 0:
                continue
            lease_id, count = session.reserve(budget)
            if not lease_id:
                continue
            leases[str(len(leases))] = {"address": address, "lease": lease_id, "count": count}
            wanted -= count
            if target is not None:
                target[address] -= count
        if leases:
            with self._lock:
                self._open[batch] = leases
        return leases

    def adopt(self, batch: int, leases: dict[str, dict]) -> None:
        """Hold the leases of a batch planned by an earlier run (a replay)."""
        with self._lock:
            if batch in self._open:
                return
            self._open[batch] = leases
        by_address: dict[str, list[str]] = {}
        for lease in leases.values():
            by_address.setdefault(lease["address"], []).append(lease["lease"])
        for address, ids in by_address.items():
            session = self._sessions.get(address)
            if session is not None:
                count = session.adopt(ids)
                log.info("replaying batch %d: adopted %d message(s) of %d lease(s) on %s",
                         batch, count, len(ids), address)

    def finish_through(self, batch: int, offset_leases: dict[str, dict]) -> None:
        """FIN the leases of every batch up to ``batch``, and those the offset names."""
        with self._lock:
            done = [b for b in self._open if b <= batch]
            groups = [self._open.pop(b) for b in done]
        groups.append(offset_leases or {})
        self._each(groups, "FinishLeases")

    def _keep_alive(self) -> None:
        while not self._closed.wait(self._touch_every):
            with self._lock:
                groups = list(self._open.values())
            try:
                self._each(groups, "TouchLeases")
            except ClientError as err:
                log.warning("touching leases failed: %s", err)

    def _each(self, groups: Iterable[dict[str, dict]], method: str) -> None:
        by_address: dict[str, set[str]] = {}
        for leases in groups:
            for lease in leases.values():
                by_address.setdefault(lease["address"], set()).add(lease["lease"])
        for address, ids in by_address.items():
            session = self._sessions.get(address)
            if session is None:  # a lease of a broker no longer in the option
                log.warning("ignoring %d lease(s) of %s (not in option address)", len(ids),
                            address)
                continue
            session.leases(method, sorted(ids))

    def close(self) -> None:
        self._closed.set()
        for session in self._sessions.values():
            session.close()
