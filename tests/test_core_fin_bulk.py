"""FINs read together (a client's FIN lines in one read) do what the same FINs one by
one do: the same failures in the same order (an id not held, or FINed twice), the
same messages left in flight, the same counts and latency histogram, and the same
messages delivered next. Checked against FINs one by one over random id lists."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from broker import NotInFlight

from .corekit import new_broker, subscribe

N = 12


def fined(bulk: bool, picks: list[int]):
    """FIN ``picks`` (indexes of the ``N`` messages held; past them, ids no one holds)
    while ``N`` more wait to take the place of those FINed."""
    broker, clock = new_broker()
    c = subscribe(broker, "events", "work", rdy=N)
    ids = broker.multi_publish("events", [b"m%d" % i for i in range(2 * N)])
    clock.advance(0.5)
    msg_ids = [ids[i] if i < N else f"{i:016x}" for i in picks]
    if bulk:
        failures = [(e.msg_id, e.message) for e in c.channel.finish_many(c, msg_ids)]
    else:
        failures = []
        for msg_id in msg_ids:
            try:
                c.channel.finish(c, msg_id)
            except NotInFlight as err:
                failures.append((err.msg_id, err.message))
    ch = c.channel
    return (failures, list(c.in_flight), c.ids, ch.finish_count, c.finish_count,
            ch.latency.bucket_counts, ch.latency.sum_ms, ch.latency.percentiles())


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, N + 3), max_size=20))
def test_fins_read_together_do_what_the_same_fins_one_by_one_do(picks) -> None:
    assert fined(True, picks) == fined(False, picks)
