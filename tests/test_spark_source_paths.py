"""The source under Spark on the paths a broker takes: moved to new ports, restarted
while a task fetches. Each counts distinct ids against what was published."""

from __future__ import annotations

from broker import Client, EmbeddedBroker

from .spark_helpers import Recorder, channel_stats, publish, reader


def run(spark, address, checkpoint, recorder, **trigger):
    (reader(spark, address, "events", maxMessagesPerTrigger=1000).writeStream
     .foreachBatch(recorder).option("checkpointLocation", str(checkpoint))
     .trigger(**trigger).start().awaitTermination(180))


def test_a_checkpoint_reused_after_the_broker_moved_reads_nothing_twice(spark, tmp_path):
    data, checkpoint = str(tmp_path / "data"), tmp_path / "ck"
    first, second, third = Recorder(), Recorder(), Recorder()
    with EmbeddedBroker(data_path=data) as old:
        old_address = old.address
        with Client(old_address) as c:
            c.create_channel("events", "spark")
            published = publish(c, "events", 3000)
        run(spark, old_address, checkpoint, first, once=True)
        run(spark, old_address, checkpoint, second, once=True)
    assert len(set(first.ids) | set(second.ids)) == 2000
    # The same data path on new ports: the checkpoint's offsets name the old address.
    with EmbeddedBroker(data_path=data) as moved, Client(moved.address) as c:
        assert moved.address != old_address
        run(spark, moved.address, checkpoint, third, availableNow=True)
        every = first.ids + second.ids + third.ids
        assert len(every) == len(set(every))      # 0 duplicates
        assert set(every) == published             # 0 lost
        stats = channel_stats(c, "events")
        assert (stats.depth, stats.in_flight_count) == (0, 0)
