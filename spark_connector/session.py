"""The driver's side of the source: lease sessions with each broker, and the leases
of the micro-batches Spark has planned but not yet committed.

A ``LeaseKeeper`` lives in the process where Spark runs the stream reader's
driver methods. It keeps one lease session open per broker and a thread that
touches every open lease often enough that a batch running longer than
``msgTimeoutMs`` keeps its messages. When a session's stream drops (a network
blip, a proxy's idle timeout), the broker keeps its leases for a grace period
of ``msgTimeoutMs``; the keeper reconnects and resumes it, or, if the grace
period passed, opens a new session and adopts its batches' leases again.

Brokers fail apart: one that does not answer stops neither the reads nor the
TOUCHes of the others. A broker that answered before and stops answering (it
restarts, the network blips) is waited for: a call to it is retried, as the
client reconnects, until ``reconnectTimeoutMs`` has passed since its first
unanswered call. Only then is it down. A durable broker keeps its messages, so
the query goes on with the others (its messages late, not lost; the log and the
progress say so) and tries it again, without waiting, on each trigger, unless
``failOnBrokerDown`` asks to stop; one that keeps messages in memory only fails
the query with ``failOnDataLoss`` (the default), naming its address.

A broker is known by its identity (Info's ``identity``, kept in its data path),
not its address: offsets name each lease's broker by it, and a lease is FINed
or adopted wherever that broker answers now. A FIN whose broker is not among
those connected is kept, and sent once it is found.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Iterable

from broker.client import BrokerUnavailable, Client, ClientError, LeaseSession
from broker.errors import LeaseNotFound
from broker.workers import worker_addresses

from .discovery import DiscoveryError, Fleet
from .options import ReaderOptions

log = logging.getLogger("pynsq.spark")


# How many FINed lease ids a keeper remembers, to not FIN them again (a few batches'
# worth: Spark names a batch again only in the trigger right after its commit).
REMEMBERED_FINS = 1024


class BrokerUnreachable(ConnectionError):
    """A broker named by option ``address`` (or listed by nsqlookupd) did not answer."""


class DataLoss(RuntimeError):
    """Messages a batch planned to read are gone for good (``failOnDataLoss``)."""


@dataclass
class _Fins:
    """FINs to send: lease ids by broker address, and their offsets' entries by id."""

    by_address: dict[str, set[str]]
    made_by: dict[str, dict]


class _BrokerSession:
    """A client of one broker and the lease session held open on it."""

    def __init__(self, address: str, options: ReaderOptions,
                 closed: threading.Event | None = None) -> None:
        self.address = address
        self.options = options
        self.client = Client(address, timeout=options.timeout_ms / 1000,
                             **options.security.client_kwargs())
        self.session: LeaseSession | None = None
        # The driver's thread and the touch thread may both (re)open the session.
        self._lock = threading.RLock()
        self._closed = closed or threading.Event()
        # Monotonic time of the first unanswered call since the broker last answered.
        self.silent_since: float | None = None
        # Whether the broker keeps messages across a restart (--data-path): a lease made by
        # an earlier instance of a memory-only broker took its messages with it.
        self.durable = True
        # Whether its Reserve FINs the leases named with it first (one round trip a trigger).
        self.reserve_finishes = False
        # What names the broker wherever it answers (Info's ``identity``; "" from a broker
        # too old to say): offsets name leases by it, so a broker that moved is found.
        self.identity = ""
        try:
            self.client.ping(timeout=options.timeout_ms / 1000)
            self.learn()
            self.open()
        except BrokerUnavailable as err:
            self.client.close()
            raise unreachable(address, err, options) from None

    def learn(self) -> None:
        """Ask the broker what it is (durable, its identity, what it can do)."""
        info = self.client.info()
        self.durable, self.reserve_finishes = info.durable, info.reserve_finishes
        self.identity = info.identity

    @property
    def broker_id(self) -> str:
        return self.session.broker_id if self.session else ""

    def open(self) -> bool:
        """Open the session, resuming the previous one if the broker still keeps it.
        Returns whether the leases held before are still held by this session."""
        with self._lock:
            previous = self.session.session_id if self.session is not None else ""
            name = self.options.client_id or f"spark:{self.options.topic}/{self.options.channel}"
            session = self.client.open_lease_session(
                name, session_id=previous, grace_ms=self.options.msg_timeout_ms)
            if self.session is not None:
                self.session.close()  # a stream replaced (or already ended) is let go
            self.session = session
            if previous and not session.resumed:
                self.learn()  # a restart, or another broker now on this address
                log.warning("pynsq: lease session on %s had ended (the broker restarted, or "
                            "its grace period passed); opened a new one", self.address)
            return session.resumed

    def reconnect(self, held: list[str]) -> None:
        """If the session's stream dropped: resume it, or open anew and adopt ``held``."""
        with self._lock:
            if self.session is not None and self.session.alive:
                return
            log.warning("pynsq: lease session stream to %s dropped; reconnecting", self.address)
            if not self.open() and held:
                self.adopt(held)

    # -- a broker that stops answering ------------------------------------------
    def answered(self) -> None:
        self.silent_since = None

    def unanswered(self) -> float:
        """Count a call the broker did not answer; returns seconds silent so far."""
        now = time.monotonic()
        if self.silent_since is None:
            self.silent_since = now
        return now - self.silent_since

    def call(self, action: Callable[["_BrokerSession"], object], wait: bool = True) -> object:
        """``action(self)``, waited for while the broker is silent for less than
        ``reconnectTimeoutMs``: each time it does not answer, wait until it answers a
        ping again (the client reconnects on its own, within a second) and retry.
        Raises ``BrokerUnavailable`` once the broker has been silent that long (a call
        is always tried twice, so a single cut connection is not counted as silence).
        ``wait=False``: tried twice, never waited for."""
        window = self.options.reconnect_timeout_ms / 1000 if wait else 0.0
        tries = 0
        while True:
            tries += 1
            try:
                result = action(self)
            except BrokerUnavailable as err:
                silent = self.unanswered()
                if tries >= 2 and (silent >= window or self._closed.is_set()):
                    raise
                if window > 0:
                    log.warning("pynsq: %s did not answer (%s); silent for %.1f s, waiting up "
                                "to reconnectTimeoutMs (%d ms)", self.address, err, silent,
                                self.options.reconnect_timeout_ms)
                if tries >= 2:  # it answers pings, not this call: do not hammer it
                    self._closed.wait(0.2)
                self._wait_until_it_answers(self.silent_since + window)
                if self._closed.is_set():  # stopped meanwhile: its client is closed
                    raise
                continue
            self.answered()
            return result

    def _wait_until_it_answers(self, deadline: float) -> bool:
        timeout = self.options.timeout_ms / 1000
        while not self._closed.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            try:
                self.client.ping(timeout=min(left, timeout))
                return True
            except BrokerUnavailable:
                # A channel backing off fails calls at once: look again shortly.
                self._closed.wait(min(0.2, max(0.0, deadline - time.monotonic())))
        return False

    def reserve(self, max_messages: int, max_bytes: int,
                finish: list[str] = ()) -> tuple[str, int, int, int, object]:
        """(lease id, count, bytes, depth left, the FIN's reply or None). ``finish``: leases
        the broker FINs before it reserves (only if it says ``reserve_finishes``)."""
        def call():
            return self.client.reserve(self.session.session_id, self.options.topic,
                                       self.options.channel, max_messages, max_bytes=max_bytes,
                                       msg_timeout_ms=self.options.msg_timeout_ms,
                                       finish=finish)
        try:
            reply = call()
        except LeaseNotFound:
            # The session ended (the broker restarted): open a new one and retry. The
            # broker checks the session before it FINs: the first try FINed nothing.
            self.open()
            reply = call()
        return (reply.lease_id, reply.count, reply.bytes, reply.depth,
                reply if finish else None)

    def adopt(self, lease_ids: list[str]) -> tuple[int, list[str]]:
        reply = self.client.adopt_leases(self.session.session_id, lease_ids)
        return reply.count, list(reply.missing)

    def depth(self) -> int:
        stats = self.client.stats(self.options.topic, self.options.channel)
        return sum(c.depth for t in stats.topics for c in t.channels)

    def close(self) -> None:
        if self.session is not None:
            self.session.close()
        self.client.close()


def unreachable(address: str, err: Exception, options: ReaderOptions | None = None,
                silent: bool = False, durable: bool = False) -> BrokerUnreachable:
    where = ("listed by nsqlookupd, option lookupdHttpAddress"
             if options is not None and options.lookupd_addresses else "option address")
    how_long = (f", silent for longer than reconnectTimeoutMs ({options.reconnect_timeout_ms}"
                f" ms)" if silent and options is not None else "")
    why = (" (failOnBrokerDown=true; with false the other brokers are read meanwhile and "
           "its messages once it is back)" if durable else "")
    return BrokerUnreachable(f"pynsq source: cannot reach the broker at {address} "
                             f"({where}){how_long}: {err}{why}")


def expand_workers(options: ReaderOptions) -> list[str]:
    """Option ``address``, with each ``pynsqd --workers`` address replaced by its workers'
    own addresses (Info's ``workers``): a lease is held by one worker, and executors must
    fetch it there, not wherever the shared port sends them. An address that does not
    answer is kept as given (connecting to it then says so)."""
    found: dict[str, None] = {}
    for address in options.addresses:
        workers = ()
        try:
            with Client(address, timeout=options.timeout_ms / 1000,
                        **options.security.client_kwargs()) as client:
                workers = client.info().workers
        except ClientError:
            pass
        found.update(dict.fromkeys(worker_addresses(address, workers) or [address]))
    return list(found)


class LeaseKeeper:
    def __init__(self, options: ReaderOptions) -> None:
        self.options = options
        self._sessions: dict[str, _BrokerSession] = {}
        self._open: dict[int, dict[str, dict]] = {}  # batch -> leases of its offset
        self._unfinished: dict[str, set[str]] = {}  # address -> leases whose FIN failed
        self._unfinished_leases: dict[str, dict] = {}  # their offsets' entries, by id
        # Leases to FIN whose broker is not among those connected (it moved and is not
        # listed yet, or is down): kept, by id, and sent once it is found.
        self._homeless: dict[str, dict] = {}
        # Durable brokers silent past reconnectTimeoutMs (address -> since, epoch seconds):
        # read again once they answer; their messages are late, not lost.
        self.down: dict[str, float] = {}
        self._told_homeless: set[str] = set()  # brokers whose absence was logged
        # Leases this keeper FINed (the last few): Spark's ``commit(end)`` and the next
        # ``latestOffset(start=end)`` name the same batch; its FIN is sent once.
        self._finished: OrderedDict[str, None] = OrderedDict()
        self._lock = threading.RLock()
        self._closed = threading.Event()
        self._turn = 0  # which broker reserve asks first
        # availableNow: messages per broker still to read of those there at start (None:
        # another trigger). Messages of a lease lost to a broker restart come back in its
        # channel and are added back, so the backlog of the start is read in full.
        self.target: dict[str, int] | None = None
        # address -> the channel's depth the last reserve's answer gave (None: no reserve
        # since the last plan, so no fresh figure): spares a Stats call per trigger.
        self._reserved_depths: dict[str, int] | None = None
        self._option = "lookupdHttpAddress" if options.lookupd_addresses else "address"
        self._static: list[str] | None = None  # option address, workers expanded
        self._fleet = (Fleet(options.lookupd_addresses, options.topic,
                             poll_interval=options.lookupd_poll_interval_ms / 1000,
                             timeout=options.timeout_ms / 1000)
                       if options.lookupd_addresses else None)
        self._connect(initial=True)
        self._touch_every = max(0.5, options.msg_timeout_ms / 1000 / 4)
        threading.Thread(target=self._keep_alive, daemon=True, name="pynsq-lease-touch").start()

    # -- brokers -------------------------------------------------------------
    def brokers(self) -> list[str]:
        """The brokers to reserve from now: those of option ``address``, or those
        nsqlookupd lists for the topic (asked again at most every poll interval)."""
        if self._fleet is None:
            if self._static is None:
                self._static = expand_workers(self.options)
            return list(self._static)
        try:
            return self._fleet.brokers()
        except DiscoveryError as err:
            raise BrokerUnreachable(f"pynsq source: {err} (option lookupdHttpAddress)") from None

    def _connect(self, initial: bool = False) -> None:
        """Open a session with every broker not connected yet; with nsqlookupd, a broker
        seen for the first time gets the channel too."""
        listed = self.brokers()
        for address in listed:
            if address in self._sessions:
                continue
            try:
                session = _BrokerSession(address, self.options, self._closed)
            except BrokerUnreachable as err:
                if self.options.fail_on_data_loss:
                    raise
                if initial:
                    log.warning("%s; going on with the other brokers (failOnDataLoss=false)",
                                err)
                continue
            self._sessions[address] = session
            if self._fleet is not None and not initial:
                log.info("pynsq: broker %s joined the fleet of topic %s", address,
                         self.options.topic)
                self.ensure_channel([address])
        if listed and not self._sessions:
            raise BrokerUnreachable(f"pynsq source: no broker of option {self._option} "
                                    f"answered: {', '.join(listed)}")

    def _each_broker(self, addresses: Iterable[str], action: Callable[[_BrokerSession], object],
                     what: str, may_fail_query: bool = True,
                     wait: bool = True, late: bool = True) -> dict[str, object]:
        """Run ``action`` on each broker; one that fails does not stop the others. A broker
        that stays unreachable fails the query unless the call cannot lose data
        (``may_fail_query=False``: a FIN is kept and sent again), and then only as the
        options say: a durable broker's messages wait for it (late, not lost), so it
        fails the query only with ``failOnBrokerDown``, unless ``late=False`` (a replay,
        which must read what it read before); one that keeps them in memory only fails
        it with ``failOnDataLoss``.
        ``wait=False``: a silent broker is not waited for (see ``_BrokerSession.call``)."""
        results: dict[str, object] = {}
        for address in addresses:
            session = self._sessions.get(address)
            if session is None:
                continue
            try:
                # A blip (a cut connection, a GOAWAY, a restart) fails the call in flight: it
                # is retried as the client reconnects, for up to reconnectTimeoutMs. A retried
                # Reserve whose first reply was lost leaves an untouched lease that times out
                # back into the channel.
                results[address] = session.call(action, wait)
            except BrokerUnavailable as err:
                waits_for_it = late and session.durable
                if may_fail_query and (self.options.fail_on_broker_down if waits_for_it
                                       else self.options.fail_on_data_loss):
                    raise unreachable(address, err, self.options, silent=wait,
                                      durable=waits_for_it) from None
                if may_fail_query and waits_for_it and wait:
                    self._went_down(session, err)
                else:
                    log.warning("pynsq: %s on %s failed: %s", what, address, err)
                continue
            if self.down.pop(address, None) is not None:
                log.warning("pynsq source: broker %s is back; reading its messages again",
                            address)
        return results

    def _went_down(self, session: _BrokerSession, err: Exception) -> None:
        if session.address in self.down:
            return
        self.down[session.address] = time.time()
        log.warning("pynsq source: broker %s (%s) of topic %s did not answer for longer than "
                    "reconnectTimeoutMs (%d ms): %s. It keeps its messages (durable): they are "
                    "read once it is back, late but not lost; reading the other brokers "
                    "meanwhile (set failOnBrokerDown=true to stop the query instead)",
                    session.address, session.identity, self.options.topic,
                    self.options.reconnect_timeout_ms, err)

    def held_on(self, address: str) -> list[str]:
        with self._lock:
            return sorted({lease["lease"] for leases in self._open.values()
                           for lease in leases.values() if lease["address"] == address})

    def broker_id(self, address: str) -> str | None:
        session = self._sessions.get(address)
        return session.broker_id if session is not None else None

    def where(self, lease: dict) -> str | None:
        """The address the broker holding ``lease`` answers at now, or None if it is not
        among the brokers connected. A lease names its broker by identity (the address it
        had may now be another broker's, or nobody's); one written before identities were
        named is looked for at its address."""
        identity = lease.get("identity")
        if not identity:
            return lease["address"] if lease["address"] in self._sessions else None
        if self._sessions.get(lease["address"]) is not None \
                and self._sessions[lease["address"]].identity == identity:
            return lease["address"]
        for address, session in self._sessions.items():
            if session.identity == identity:
                return address
        # A broker that keeps messages in memory only takes a new identity on each start:
        # the one at the lease's address now is that broker restarted (its leases gone).
        here = self._sessions.get(lease["address"])
        return lease["address"] if here is not None and not here.durable else None

    def _absent(self, lease: dict, doing: str) -> str:
        who = (f"broker {lease['identity']} (last at {lease['address']})"
               if lease.get("identity") else f"the broker at {lease['address']}")
        return (f"pynsq source: {doing} lease {lease['lease']}: {who} is not among the brokers "
                f"of option {self._option} now")

    # -- driver calls --------------------------------------------------------
    def ensure_channel(self, addresses: Iterable[str] | None = None) -> None:
        """Create the channel on every broker (or those of ``addresses``), so it gets
        what is published from now on."""
        o = self.options
        # maxAttempts: a poison message goes to the dead-letter topic after N batches.
        self._each_broker(list(self._sessions) if addresses is None else list(addresses),
                          lambda s: s.client.create_channel(o.topic, o.channel,
                                                            max_attempts=o.max_attempts),
                          "creating the channel")

    def depths(self) -> dict[str, int]:
        self.ensure_channel()
        return self._each_broker(list(self._sessions), lambda s: s.depth(), "stats")

    def latest_depths(self) -> dict[str, int]:
        """Each broker's depth now: what the last ``reserve``'s answer from it said (a
        reserve's answer carries the depth it left behind), else asked with Stats."""
        fresh = self._reserved_depths or {}
        asked = [a for a in self._sessions if a not in fresh and a not in self.down]
        if asked:
            self.ensure_channel(asked)
        depths = self._each_broker(asked, lambda s: s.depth(), "stats")
        return {a: fresh[a] if a in fresh else depths[a]
                for a in self._sessions if a in fresh or a in depths}

    def progress(self) -> dict:
        """What a user watches, per broker: the channel's depth, the messages this query
        holds in batches not committed yet (in flight), and their sum (its lag); brokers
        down, whose messages are late."""
        depths = self.latest_depths()
        with self._lock:
            held: dict[str, int] = {}
            for leases in self._open.values():
                for lease in leases.values():
                    held[lease["address"]] = held.get(lease["address"], 0) + int(lease["count"])
        brokers: dict[str, dict] = {}
        for address, session in self._sessions.items():
            entry: dict = {"identity": session.identity, "inFlight": held.get(address, 0)}
            if address in depths:
                entry["depth"] = depths[address]
                entry["lag"] = depths[address] + entry["inFlight"]
            if address in self.down:
                entry["down"] = (f"not answering since "
                                 f"{time.strftime('%H:%M:%S', time.gmtime(self.down[address]))}"
                                 f" UTC: its messages are late, not lost")
            brokers[address] = entry
        return {"source": f"pynsq topic {self.options.topic} channel {self.options.channel}",
                "depth": sum(depths.values()),
                "lag": sum(e.get("lag", e["inFlight"]) for e in brokers.values()),
                "brokersDown": len(self.down), "brokers": brokers}

    def planned(self, batch: int) -> dict | None:
        """The offset of ``batch`` if it was reserved and not finished yet."""
        self._reserved_depths = None  # a new plan: depths from an earlier reserve are stale
        with self._lock:
            leases = self._open.get(batch)
        return {"batch": batch, "leases": leases} if leases else None

    def reserve(self, batch: int, wanted: int, max_bytes: int,
                finish_through: tuple[int, dict[str, dict]] | None = None) -> dict[str, dict]:
        """Lease up to ``wanted`` messages (``max_bytes`` of bodies) for ``batch``, spread
        over the brokers: each is offered an equal share first, then what is left goes to
        those that filled their share. One that gave less had nothing more ready: it is
        not asked again (the messages published meanwhile are the next batch's), so a
        batch holds one lease per broker unless another broker fell short.

        ``finish_through``: (batch, offset leases) to FIN first, as ``finish_through``
        does. Each broker gets its FINs in its reserve's call, which it answers only after
        FINing them (a committed lease requeued since gives its messages back before the
        reserve could lease them again): one round trip a trigger, not two. A broker not
        reserved from, or one that cannot (an older broker), gets them on their own first.
        With availableNow they go first, on their own: what a FIN finds lost to a broker
        restart is added back to what this reserve is to read."""
        if self._fleet is not None or not self.options.fail_on_data_loss:
            # First: a broker found again (it moved, it is back) gets its kept FINs now,
            # before a reserve could lease their messages to this batch.
            self._connect()
        fins = None
        if finish_through is not None:
            if self.target is not None:
                self.finish_through(*finish_through)
            else:
                fins = self._take_fins(*finish_through)
        finished: dict[str, object] = {}
        tried: set[str] = set()  # brokers sent their FINs (answered or not)
        try:
            if fins is not None:
                # Those that cannot take them with their reserve (older brokers) first.
                tried.update(a for a in fins.by_address
                             if a not in self._sessions or not self._sessions[a].reserve_finishes)
                finished.update(self._send_fins(fins, tried))
            leases = self._reserve(batch, wanted, max_bytes, fins, finished, tried)
            if fins is not None:
                # Those not reserved from (no share left for them, not listed any more).
                finished.update(self._send_fins(
                    fins, [a for a in fins.by_address if a not in tried]))
            return leases
        finally:
            if fins is not None:
                self._settle_fins(fins, finished)

    def _reserve(self, batch: int, wanted: int, max_bytes: int, fins: "_Fins | None",
                 finished: dict[str, object], tried: set[str]) -> dict[str, dict]:
        target = self.target
        # A broker that left the fleet is not reserved from; its leases are still FINed.
        listed = set(self.brokers())
        addresses = [a for a in self._sessions if a in listed]
        self._turn = (self._turn + 1) % max(1, len(addresses))
        addresses = addresses[self._turn:] + addresses[:self._turn]
        leases: dict[str, dict] = {}
        depths: dict[str, int] = {}
        left, bytes_left = wanted, max_bytes
        share = -(-wanted // max(1, len(addresses)))
        byte_share = -(-max_bytes // max(1, len(addresses)))
        short: set[str] = set()  # brokers that gave less than they were asked
        for first_pass in (True, False):
            for address in addresses:
                if left <= 0 or bytes_left <= 0:
                    break
                if address in short:
                    continue
                budget = min(left, share) if first_pass else left
                if target is not None:
                    budget = min(budget, target.get(address, 0))
                if budget <= 0:
                    continue
                byte_budget = min(bytes_left, byte_share) if first_pass else bytes_left
                fin = (sorted(fins.by_address.get(address, ()))
                       if fins is not None and address not in tried else [])
                if fin:
                    tried.add(address)
                got = self._each_broker([address],
                                        lambda s: s.reserve(budget, byte_budget, fin), "reserve")
                if address not in got:
                    short.add(address)
                    continue
                lease_id, count, size, depths[address], fin_reply = got[address]
                if fin:
                    finished[address] = fin_reply
                if count < budget and size < byte_budget:
                    short.add(address)
                if not lease_id:
                    continue
                leases[str(len(leases))] = {"address": address, "lease": lease_id,
                                            "count": count, "broker": self.broker_id(address),
                                            "identity": self._sessions[address].identity}
                left -= count
                bytes_left -= size
                if target is not None:
                    target[address] -= count
        self._reserved_depths = depths
        if leases:
            with self._lock:
                self._open[batch] = leases
        return leases

    def adopt(self, batch: int, leases: dict[str, dict]) -> set[str]:
        """Hold the leases of a batch planned by an earlier run (a replay).

        Returns the ids of leases that are gone for good: adopted with nothing
        left, or made by a broker instance that since restarted. A durable broker
        has their messages back in the channel for a later batch; a memory-only one
        lost them: with ``failOnDataLoss`` that raises ``DataLoss`` naming them,
        without, the replay goes on and the log says how many were lost.
        """
        with self._lock:
            if batch in self._open:
                return set()
            self._open[batch] = leases
        gone: set[str] = set()
        by_address: dict[str, list[str]] = {}
        restarted: dict[str, tuple[dict, str]] = {}  # made by an earlier instance
        for lease in leases.values():
            address = self.where(lease)
            if address is None:
                what = self._absent(lease, f"replaying batch {batch}, cannot adopt")
                if self.options.fail_on_data_loss:
                    raise BrokerUnreachable(
                        f"{what}: give its address now in option {self._option} (its "
                        f"messages are kept there), or set failOnDataLoss=false to replay "
                        f"without them (they are read later, once it is found)")
                log.warning("%s; replaying without its %s message(s) (failOnDataLoss=false)",
                            what, lease.get("count", "?"))
                gone.add(lease["lease"])
                continue
            lease = {**lease, "address": address}
            current = self.broker_id(address)
            if lease.get("broker") and current is not None and lease["broker"] != current:
                session = self._sessions.get(address)
                if session is None or not session.durable:
                    self._lost_to_restart(batch, lease, current)
                    gone.add(lease["lease"])
                    continue
                # A durable broker keeps its leases across a restart: adopt it there.
                restarted[lease["lease"]] = (lease, current)
            by_address.setdefault(address, []).append(lease["lease"])
        adopted = self._each_broker(by_address, lambda s: s.adopt(by_address[s.address]),
                                    "adopting leases", late=False)
        for address, (count, missing) in adopted.items():
            log.info("replaying batch %d: adopted %d message(s) of %d lease(s) on %s",
                     batch, count, len(by_address[address]), address)
            for lease_id in missing:
                if lease_id in restarted:
                    self._lost_to_restart(batch, *restarted[lease_id])
            gone.update(missing)
        return gone

    def _lost_to_restart(self, batch: int, lease: dict, current: str) -> None:
        """``lease`` of ``batch`` was made by an instance of its broker that has since
        restarted: its messages are back in the channel (durable), or lost."""
        address, count = lease["address"], int(lease.get("count", 0))
        session = self._sessions.get(address)
        if session is not None and not session.durable:
            what = (f"pynsq source: batch {batch} planned to read {count} message(s) of lease "
                    f"{lease['lease']} on {address}, but that broker keeps messages in memory "
                    f"only and has restarted since (instance {lease['broker']}, now {current}): "
                    f"those {count} message(s) are lost")
            if self.options.fail_on_data_loss:
                raise DataLoss(what + ". Set failOnDataLoss=false to go on without them")
            log.warning("%s; going on without them (failOnDataLoss=false)", what)
            return
        log.warning("replaying batch %d: lease %s was made by broker instance %s, now %s "
                    "answers at %s (restarted): its %d message(s) are back in the channel "
                    "and a later batch reads them", batch, lease["lease"], lease["broker"],
                    current, address, count)
        self._back_in_channel(address, count)

    def _back_in_channel(self, address: str, count: int) -> None:
        with self._lock:
            if self.target is not None and count:
                self.target[address] = self.target.get(address, 0) + count

    def finish_through(self, batch: int, offset_leases: dict[str, dict]) -> None:
        """FIN the leases of every batch up to ``batch``, and those the offset names
        (held, or requeued since: the broker FINs what of them still waits)."""
        fins = self._take_fins(batch, offset_leases)
        self._settle_fins(fins, self._send_fins(fins, fins.by_address))

    def _take_fins(self, batch: int, offset_leases: dict[str, dict]) -> "_Fins":
        """The FINs to send now: ``finish_through``'s leases, and those whose FIN failed."""
        with self._lock:
            done = [b for b in self._open if b <= batch]
            groups = [self._open.pop(b) for b in done]
            groups.append({k: lease for k, lease in (offset_leases or {}).items()
                           if lease["lease"] not in self._finished})
            by_address = self._unfinished
            self._unfinished = {}
            groups.append(self._homeless)
            self._homeless = {}
            made_by = {**self._unfinished_leases,
                       **{lease["lease"]: lease for leases in groups for lease in leases.values()}}
            self._unfinished_leases = {}
            for leases in groups:
                for lease in leases.values():
                    address = self.where(lease)
                    if address is None:
                        # Never dropped: its messages would be read again.
                        self._keep_homeless(lease)
                        continue
                    by_address.setdefault(address, set()).add(lease["lease"])
        return _Fins(by_address, made_by)

    def _keep_homeless(self, lease: dict) -> None:
        self._homeless[lease["lease"]] = lease
        who = lease.get("identity") or lease["address"]
        if who not in self._told_homeless:
            self._told_homeless.add(who)
            log.warning("%s; its FIN is kept and sent once that broker is found (until then "
                        "it holds its messages, or they wait in its channel)",
                        self._absent(lease, "cannot FIN"))

    def _send_fins(self, fins: "_Fins", addresses: Iterable[str]) -> dict[str, object]:
        # A FIN that does not get through loses nothing: it is kept and sent with the next
        # commit (its messages may be read again meanwhile), so it never fails the query.
        return self._each_broker(
            [a for a in addresses if fins.by_address.get(a)],
            lambda s: s.client.finish_leases(sorted(fins.by_address[s.address])), "FIN",
            may_fail_query=False)

    def _settle_fins(self, fins: "_Fins", finished: dict[str, object]) -> None:
        """Record the answers (``finished``: address -> reply with ``missing``) to ``fins``;
        the FINs of a broker that did not answer are kept for the next commit."""
        by_address, made_by = fins.by_address, fins.made_by
        for address, reply in finished.items():
            # A lease the broker does not know, made by an instance of it since restarted:
            # a durable broker has its messages back in the channel (read again).
            if not reply.missing:
                continue
            try:  # a restart ended the session's stream: the new one names the instance
                self._sessions[address].reconnect(self.held_on(address))
            except (BrokerUnavailable, ClientError) as err:
                log.warning("pynsq: reconnecting to %s failed: %s", address, err)
            current = self.broker_id(address)
            for lease_id in reply.missing:
                lease = made_by.get(lease_id)
                if lease and lease.get("broker") and lease["broker"] != current \
                        and self._sessions[address].durable:
                    self._back_in_channel(address, int(lease.get("count", 0)))
        with self._lock:
            for address, ids in by_address.items():
                if address in finished:
                    # FINed, or unknown to the broker (a FIN sent again would not change it).
                    self._finished.update(dict.fromkeys(sorted(ids)))
                elif address in self._sessions:
                    self._unfinished.setdefault(address, set()).update(ids)
                    self._unfinished_leases.update((i, made_by[i]) for i in ids if i in made_by)
            while len(self._finished) > REMEMBERED_FINS:
                self._finished.popitem(last=False)

    def requeue_open(self) -> None:
        """Give back the leases of batches not known committed (the query stops)."""
        with self._lock:
            groups = list(self._open.values())
            self._open.clear()
        by_address: dict[str, list[str]] = {}
        for leases in groups:
            for lease in leases.values():
                by_address.setdefault(lease["address"], []).append(lease["lease"])
        try:
            # Not waited for: a broker that does not answer requeues them after the grace period.
            self._each_broker(by_address, lambda s: s.client.requeue_leases(
                by_address[s.address]), "REQ", wait=False)
        except BrokerUnreachable as err:
            log.warning("%s: its leases are requeued when its grace period ends", err)

    def _keep_alive(self) -> None:
        while not self._closed.wait(self._touch_every):
            for address, session in list(self._sessions.items()):
                held = self.held_on(address)
                try:
                    session.reconnect(held)
                    if held:
                        session.client.touch_leases(held)
                    session.answered()
                except BrokerUnavailable as err:  # this broker only; the others go on
                    session.unanswered()
                    log.warning("pynsq: touching leases on %s failed: %s", address, err)
                except ClientError as err:
                    log.warning("pynsq: touching leases on %s failed: %s", address, err)

    def close(self) -> None:
        self._closed.set()
        for session in self._sessions.values():
            session.close()
