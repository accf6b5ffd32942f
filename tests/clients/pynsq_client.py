"""NSQ's official Python client (pynsq, on tornado) against a broker, as a script
the tests run in its own process. Prints what happened as JSON.

    python pynsq_client.py publish TCP_ADDRESS TOPIC
    python pynsq_client.py consume TCP_ADDRESS TOPIC CHANNEL N
"""

import json
import sys

import nsq
import tornado.ioloop


def publish(tcp: str, topic: str) -> None:
    loop = tornado.ioloop.IOLoop.current()
    writer = nsq.Writer([tcp])
    results = []

    def done(conn, data):
        results.append(data.decode() if isinstance(data, bytes) else repr(data))
        if len(results) == 3:
            print(json.dumps(results))
            loop.stop()

    def go():
        writer.pub(topic, b"one", done)
        writer.mpub(topic, [b"two", b"three"], done)
        writer.dpub(topic, 300, b"four", done)

    loop.call_later(1.0, go)
    loop.call_later(30, loop.stop)
    loop.start()


def consume(tcp: str, topic: str, channel: str, n: int) -> None:
    loop = tornado.ioloop.IOLoop.current()
    seen = []

    def handler(msg):
        body = msg.body.decode()
        if body.startswith("requeue") and msg.attempts == 1:
            msg.enable_async()
            msg.requeue(time_ms=200, backoff=False)
            return None
        if body.startswith("touch"):
            msg.touch()
        seen.append({"id": msg.id.decode(), "body": body, "attempts": msg.attempts})
        if len(seen) >= n:
            print(json.dumps(seen))
            loop.call_later(0.3, loop.stop)  # let the last FIN go out
        return True

    nsq.Reader(topic=topic, channel=channel, message_handler=handler,
               nsqd_tcp_addresses=[tcp], max_in_flight=10, lookupd_poll_interval=1)
    loop.call_later(60, loop.stop)
    loop.start()


if __name__ == "__main__":
    if sys.argv[1] == "publish":
        publish(sys.argv[2], sys.argv[3])
    else:
        consume(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]))
