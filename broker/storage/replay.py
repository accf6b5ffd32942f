"""What a topic's log says is pending where: the records read in order, kept compact.

One slot per message (its id, log location and deliver-at time in arrays, and a
bit mask of the copies still pending: bit 0 for the topic's hold, one bit per
durable channel), so recovering a million messages for three channels costs
tens of megabytes, not hundreds. Ids grow along the log, so a slot is found by
bisection; the few that do not (a MOVE of a message whose PUB is gone) are
looked up in a dict. Per-copy delivery counts and deferrals, which
few messages have, live in small dicts. Pure: it reads records, touches no file.

Deleting or emptying a channel touches no slot, so a start takes time linear in
the log however many times channels come and go: each slot keeps the epoch its
mask was written at, each channel the epoch it began at (made, or last
emptied), and a slot's bit counts for a channel only when the slot's epoch is
no older than the channel's.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from collections import Counter
from typing import Iterator

from . import records
from .segments import location, segment_of

HELD = 1          # the bit of the topic's hold


class Replay:
    def __init__(self, name: str) -> None:
        self.name = name
        self.topic_paused = False
        self.channels: dict[str, int] = {}      # live durable channel -> its bit
        self.paused: dict[str, bool] = {}
        self.dedupe: list[tuple[int, bytes]] = []
        # segment -> (offsets, counts) of its BATCH records: the log's index of them
        self.batches: dict[int, tuple[array, array]] = {}
        self.config: dict[str, bytes] = {}      # "" (the topic) or channel -> settings
        self.max_id = 0
        self._keys = array("Q")                  # ids that came in ascending order...
        self._key_slots = array("q")             # ... and their slots
        self._out_of_order: dict[int, int] = {}  # id -> slot, for the others
        self._locs = array("q")
        self._due = array("q")
        # Past 63 channels a list of Python ints (see ``_new_bit``).
        self._masks: array | list[int] = array("Q")
        self._stamps = array("I")                # the epoch each slot's mask was set in
        self._held: list[int] = []               # slots that may have the HELD bit
        self._attempts: dict[tuple[int, int], int] = {}
        self._deferred: dict[tuple[int, int], int] = {}
        self.damage: Counter[str] = Counter()    # what damaged records cost, counted
        self._free_bits: list[int] = []          # bits of deleted channels, to reuse
        self._next_bit = 1
        self._epoch = 0                          # one more at each channel made, deleted, emptied
        self._born: dict[int, int] = {HELD: 0}   # a live channel's bit -> the epoch it began at
        self._valid: dict[int, int] = {}         # slot epoch -> the bits that count in it
        self._live_mask = 0
        # The log's record of its files: segment -> (oldest kept, next id) of its ROLL;
        # segment -> (next segment, next id) of its FORWARD; the newest file deleted.
        self.rolls: dict[int, tuple[int, int]] = {}
        self.forwards: dict[int, tuple[int, int]] = {}
        self.deleted_upto = 0
        self._overridden: set[int] | None = None  # bits with counts or times (at the end)
        self._any_due = False
        self._common: "array | bool | None" = None

    # -- channels -------------------------------------------------------------
    def _live(self) -> int:
        return self._live_mask

    def _begin(self, bit: int) -> None:
        """``bit`` means a channel with nothing pending from now on (made, or emptied)."""
        self._epoch += 1
        self._born[bit] = self._epoch
        self._valid.clear()

    def _valid_bits(self, stamp: int) -> int:
        """The bits that count in a slot whose mask was set in epoch ``stamp``."""
        bits = self._valid.get(stamp)
        if bits is None:
            bits = 0
            for bit, born in self._born.items():
                if born <= stamp:
                    bits |= bit
            self._valid[stamp] = bits
        return bits

    def _counts(self, slot: int, bit: int) -> bool:
        return bool(self._masks[slot] & bit) and self._stamps[slot] >= self._born.get(bit, 1 << 32)

    def _create(self, name: str, paused: bool = False) -> None:
        if name not in self.channels:
            bit = self.channels[name] = self._new_bit()
            self._live_mask |= bit
            self._begin(bit)
        self.paused.setdefault(name, paused)

    def _new_bit(self) -> int:
        """A channel's bit: no limit on their number (past 63 channels the masks
        become Python ints, which grow as needed: a list, not an array)."""
        if self._free_bits:
            return self._free_bits.pop()
        bit = 1 << self._next_bit
        self._next_bit += 1
        if bit >> 64 and type(self._masks) is array:
            self._masks = list(self._masks)
        return bit

    def _delete(self, name: str) -> None:
        bit = self.channels.pop(name, None)
        self.paused.pop(name, None)
        if bit is not None:
            self._live_mask &= ~bit
            del self._born[bit]
            self._epoch += 1
            self._valid.clear()
            self._free_bits.append(bit)

    def _clear_held(self) -> None:
        masks, keep = self._masks, ~HELD
        for slot in self._held:
            masks[slot] &= keep
            self._attempts.pop((slot, HELD), None)
            self._deferred.pop((slot, HELD), None)
        self._held = []

    # -- records --------------------------------------------------------------
    def _find(self, msg_id: int) -> int | None:
        keys = self._keys
        i = bisect_left(keys, msg_id)
        if i < len(keys) and keys[i] == msg_id:
            return self._key_slots[i]
        return self._out_of_order.get(msg_id)

    def _new_slot(self, msg_id: int, loc: int, due: int, mask: int) -> int:
        slot = self._find(msg_id)
        if slot is None:
            slot = len(self._locs)
            if not self._keys or self._keys[-1] < msg_id:
                self._keys.append(msg_id)
                self._key_slots.append(slot)
            else:
                self._out_of_order[msg_id] = slot
            self._locs.append(loc)
            self._due.append(due)
            self._masks.append(mask)
            self._stamps.append(self._epoch)
        else:
            self._locs[slot], self._due[slot], self._masks[slot] = loc, due, mask
            self._stamps[slot] = self._epoch
        if mask & HELD:
            self._held.append(slot)
        return slot

    def read(self, seg: int, record: records.Record) -> None:
        """Apply one record of segment ``seg``."""
        kind = record.kind
        if kind == records.PUB:
            msg_id, _, deliver_at, flags = record.pub()
            self.max_id = max(self.max_id, msg_id)
            mask = HELD if flags & records.HELD else self._live()
            self._new_slot(msg_id, location(seg, record.offset), deliver_at, mask)
        elif kind == records.BATCH:
            self._batch(seg, record)
        elif kind == records.FIN:
            channel, ids = record.fins()
            bit = self.channels.get(channel)
            if bit is not None:
                keep, find, masks = ~bit, self._find, self._masks
                for msg_id in ids:
                    slot = find(msg_id)
                    if slot is not None:
                        masks[slot] &= keep
        elif kind == records.ATTEMPTS:
            channel, entries = record.attempts()
            bit = self.channels.get(channel)
            if bit is not None:
                for msg_id, attempts in entries:
                    slot = self._find(msg_id)
                    if slot is not None and self._counts(slot, bit):
                        self._attempts[(slot, bit)] = attempts
        elif kind == records.DEFER:
            channel, msg_id, deliver_at, attempts = record.defer()
            bit = self.channels.get(channel)
            slot = self._find(msg_id)
            if bit is not None and slot is not None and self._counts(slot, bit):
                self._attempts[(slot, bit)] = attempts
                self._deferred[(slot, bit)] = deliver_at
        elif kind == records.FLUSH:
            self._flush()
        elif kind == records.EMPTY:
            channel = record.channel()
            if not channel:
                self._clear_held()
            elif channel in self.channels:
                self._begin(self.channels[channel])
        elif kind == records.CHANNEL:
            op, channel = record.channel_op()
            if op == records.CREATE:
                self._create(channel)
                if not self.topic_paused:
                    self._flush()  # as the broker did (its FLUSH record says it again)
            elif op == records.DELETE:
                self._delete(channel)
                self.config.pop(channel, None)
            elif channel in self.paused:
                self.paused[channel] = op == records.PAUSE
        elif kind == records.TOPIC:
            self.topic_paused = record.payload[0] == records.PAUSE
            if not self.topic_paused and self.channels:
                self._flush()  # as the broker did (its FLUSH record says it again)
        elif kind == records.STATE:
            self.topic_paused, named = record.state()
            for channel in [c for c in self.channels if c not in named]:
                self._delete(channel)
            for channel, channel_paused in named.items():
                self._create(channel)
                self.paused[channel] = channel_paused
        elif kind == records.MOVE:
            msg_id, _, copies, _, _ = record.move()
            self.max_id = max(self.max_id, msg_id)
            mask = 0
            bits = []
            for channel, attempts, deliver_at in copies:
                bit = HELD if not channel else self.channels.get(channel)
                if bit is not None:
                    mask |= bit
                    bits.append((bit, attempts, deliver_at))
            slot = self._new_slot(msg_id, location(seg, record.offset), 0, mask)
            for bit, attempts, deliver_at in bits:
                self._attempts[(slot, bit)] = attempts
                self._deferred[(slot, bit)] = deliver_at
        elif kind == records.DEDUPE:
            self.dedupe.append((seg, bytes(record.payload)))
        elif kind == records.CONFIG:
            channel, data = record.config()
            self.config[channel] = data
        elif kind == records.ROLL:
            oldest, _, next_id = records.ROLL_BODY.unpack(record.payload)
            self.rolls[seg] = (oldest, next_id)
        elif kind == records.FORWARD:
            self.forwards[seg] = records.FORWARD_BODY.unpack(record.payload)
        elif kind == records.FILE_GONE:
            gone, = records.FILE_GONE_BODY.unpack(record.payload)
            self.deleted_upto = max(self.deleted_upto, gone)

    def _batch(self, seg: int, record: records.Record) -> None:
        """Each message of a BATCH, as its PUB would: message ``i`` is at the batch's
        location plus ``i``."""
        try:
            batch = record.batch()
        except records.DamagedRecord:  # its check passed: written so by a broker at fault
            self.damage["batch record(s) whose columns do not add up (their messages "
                        "are lost)"] += 1
            return
        ids = batch.raw_ids()
        n = len(ids)
        if not n:
            return
        index = self.batches.get(seg)
        if index is None:
            index = self.batches[seg] = (array("q"), array("I"))
        index[0].append(record.offset)
        index[1].append(n)
        self.max_id = max(self.max_id, max(ids))
        mask = HELD if batch.held else self._live()
        loc = location(seg, record.offset)
        due = batch.deliver_ats
        keys = self._keys
        if ((not keys or keys[-1] < ids[0]) and not self._out_of_order
                and ids.tolist() == sorted(ids)):
            # The usual case: ids after every one so far, in order: all slots at once.
            first = len(self._locs)
            keys.extend(ids)
            self._key_slots.extend(range(first, first + n))
            self._locs.extend(range(loc, loc + n))
            self._due.extend(due if due is not None else array("q", bytes(8 * n)))
            self._masks.extend([mask] * n)
            self._stamps.extend([self._epoch] * n)
            if mask & HELD:
                self._held.extend(range(first, first + n))
            return
        new_slot = self._new_slot
        for i, msg_id in enumerate(ids):
            new_slot(msg_id, loc + i, due[i] if due is not None else 0, mask)

    def _flush(self) -> None:
        """What the topic held goes to its durable channels."""
        if not self._held:
            return
        live, masks, stamps, epoch = self._live(), self._masks, self._stamps, self._epoch
        bits = list(self.channels.values())
        for slot in self._held:
            if masks[slot] & HELD:
                kept = masks[slot] & self._valid_bits(stamps[slot]) & ~HELD
                masks[slot], stamps[slot] = kept | live, epoch
                # A held copy's own time (from a MOVE) goes with it to each channel; a
                # channel's time from before it began (an old bit) goes.
                for overrides in (self._attempts, self._deferred):
                    value = overrides.pop((slot, HELD), None)
                    for bit in bits:
                        if value is not None:
                            overrides[(slot, bit)] = value
                        elif not kept & bit:
                            overrides.pop((slot, bit), None)
        self._held = []

    def damaged(self, span: bytes) -> None:
        """A damaged span of the log, met where the records read so far left off: count
        what it cost, by what the record was (its header usually survives)."""
        found = records.damaged_kind(span)
        owners = ("the topic's hold" if self.topic_paused or not self.channels
                  else "channel(s) " + ", ".join(sorted(self.channels)))
        if found is None:
            self.damage[f"unreadable span(s) (a message there is lost to {owners})"] += 1
            return
        kind, channel = found
        if not records.PUB <= kind <= records.BATCH:  # its type is what was damaged
            self.damage[f"unreadable span(s) (a message there is lost to {owners})"] += 1
        elif kind in (records.PUB, records.MOVE):
            self.damage[f"message(s) lost to {owners}"] += 1
        elif kind == records.BATCH:
            self.damage[f"message(s) lost to {owners}"] += records.batch_count(span)
        elif kind == records.FIN:
            self.damage[f"FIN record(s) of {channel or 'the hold'} (those messages may be "
                        f"delivered again)"] += 1
        elif kind in (records.ATTEMPTS, records.DEFER):
            self.damage[f"delivery count or deferral record(s) of {channel} (counts lower, "
                        f"delays shorter)"] += 1
        elif kind == records.DEDUPE:
            self.damage["de-duplication entry(ies) (a repeated MPUB may be accepted)"] += 1
        else:
            self.damage["copy(ies) of a record written twice (nothing lost)"] += 1

    # -- results --------------------------------------------------------------
    def pending(self, channel: str | None) -> Iterator[tuple[int, int, int]]:
        """(location, attempts, deliver-at) of each message pending in ``channel``
        (None: held by the topic), in log order."""
        bit = HELD if channel is None else self.channels[channel]
        born = self._born[bit]
        attempts, deferred = self._attempts, self._deferred
        locs, due, stamps = self._locs, self._due, self._stamps
        for slot, mask in enumerate(self._masks):
            if mask & bit and stamps[slot] >= born:
                yield (locs[slot], attempts.get((slot, bit), 0),
                       deferred.get((slot, bit), due[slot]))

    def ready_locations(self, channel: str) -> array | None:
        """The locations of the messages pending in ``channel``, in log order, when every
        one of them is ready with no delivery counted (the usual case after a publish:
        one pass, no tuple per message); None otherwise (then ``pending``)."""
        bit = self.channels[channel]
        if self._overridden is None:
            self._overridden = {b for _, b in self._attempts} | {b for _, b in self._deferred}
            self._any_due = any(self._due)
        if bit in self._overridden or self._any_due:
            return None
        if self._common is None:
            self._common = self._pending_in_all()
        if self._common is not False:
            return self._common
        born = self._born[bit]
        return array("q", [loc for loc, mask, stamp in zip(self._locs, self._masks, self._stamps)
                           if mask & bit and stamp >= born])

    def _pending_in_all(self) -> "array | bool":
        """The locations of the messages pending, when each is pending in every live
        channel (a topic whose channels all read the same backlog: one pass for them
        all, not one per channel); False when not."""
        live = self._live_mask
        bits = [bit for bit in self._born if bit != HELD]
        latest = max((self._born[bit] for bit in bits), default=0)
        common = array("q")
        for loc, mask, stamp in zip(self._locs, self._masks, self._stamps):
            part = mask & live
            if not part:
                continue
            if part != live or stamp < latest:
                return False
            common.append(loc)
        return common

    def locations(self, ids: "set[int]") -> set[int]:
        """The log locations of the messages with these ids (those the log has)."""
        slots = (self._find(msg_id) for msg_id in ids)
        return {self._locs[slot] for slot in slots if slot is not None}

    def copies_per_segment(self) -> dict[int, int]:
        """Segment -> pending copies in it (the topic's hold counting one)."""
        counts: dict[int, int] = {}
        valid = self._valid_bits
        for loc, mask, stamp in zip(self._locs, self._masks, self._stamps):
            mask &= valid(stamp)
            if mask:
                seg = segment_of(loc)
                counts[seg] = counts.get(seg, 0) + mask.bit_count()
        return counts

    def count(self) -> int:
        valid = self._valid_bits
        return sum((m & valid(s)).bit_count() for m, s in zip(self._masks, self._stamps))
