"""The writers' requests stay under the broker's --max-body-size, whatever the rows' size."""

from __future__ import annotations

from broker import Client, EmbeddedBroker
from spark_connector.writer import PartitionPublisher


def test_rows_larger_than_the_body_limit_in_total_are_published_in_several_requests():
    body = b"x" * (300 << 10)            # 30 rows of 300 KiB: 9 MiB, over the 5 MiB limit
    with EmbeddedBroker() as broker, Client(broker.address) as client:
        client.admin("channel", "create", "big", "all")
        publisher = PartitionPublisher(broker.address, "big", "test:big:0", 500, "partition 0")
        try:
            for i in range(30):
                publisher.add(body[:-4] + b"%04d" % i)
            assert publisher.finish() == 30
            assert publisher.sequence > 1      # cut into several MPUBs
        finally:
            publisher.close()
        [topic] = client.stats("big").topics
        assert topic.channels[0].depth == 30
