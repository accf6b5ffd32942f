"""gnsq (on gevent) against a broker, as a script the tests run in its own
process so gevent's monkey-patching stays there. Prints JSON.

    python gnsq_client.py produce TCP_ADDRESS TOPIC
    python gnsq_client.py http HTTP_ADDRESS TOPIC
    python gnsq_client.py consume TCP_ADDRESS TOPIC CHANNEL N
"""

import json
import sys

import gevent
import gnsq


def produce(tcp: str, topic: str) -> None:
    producer = gnsq.Producer([tcp])
    producer.start()
    producer.publish(topic, b"g-one")
    producer.multipublish(topic, [b"g-two", b"g-three"])
    producer.publish(topic, b"g-deferred", defer=300)
    producer.close()
    producer.join()
    print(json.dumps("ok"))


def http(address: str, topic: str) -> None:
    host, port = address.rsplit(":", 1)
    client = gnsq.NsqdHTTPClient(host, int(port))
    client.create_topic(topic)
    client.create_channel(topic, "gnsq")
    client.publish(topic, b"h-one")
    client.multipublish(topic, [b"h-two", b"h-three"])
    client.multipublish(topic, [b"h-four", b"h-five"], binary=True)
    client.publish(topic, b"h-deferred", defer=300)
    stats = client.stats(topic=topic)
    depth = stats["topics"][0]["channels"][0]["depth"]
    print(json.dumps({"ping": client.ping().decode() if isinstance(client.ping(), bytes)
                      else client.ping(), "depth": depth,
                      "version": client.info()["version"]}))


def consume(tcp: str, topic: str, channel: str, n: int) -> None:
    consumer = gnsq.Consumer(topic, channel, nsqd_tcp_addresses=[tcp], max_in_flight=5,
                             max_backoff_duration=1)
    seen = []

    @consumer.on_message.connect
    def handler(consumer, message):
        seen.append({"id": message.id.decode(), "body": message.body.decode(),
                     "attempts": message.attempts})
        message.finish()
        if len(seen) >= n:
            gevent.spawn_later(0.3, consumer.close)

    gevent.spawn_later(60, consumer.close)
    consumer.start(block=True)
    print(json.dumps(seen))


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "produce":
        produce(sys.argv[2], sys.argv[3])
    elif mode == "http":
        http(sys.argv[2], sys.argv[3])
    else:
        consume(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]))
