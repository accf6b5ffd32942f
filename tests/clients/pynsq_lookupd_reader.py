"""NSQ's official Python client (pynsq) reading a topic through nsqlookupd, as a script
the tests run in its own process. Prints the bodies it read as a JSON list.

    python pynsq_lookupd_reader.py LOOKUPD_HTTP_ADDRESS TOPIC CHANNEL N [ids]

With ``ids``, prints [id, body] pairs instead.
"""

import json
import sys

import nsq
import tornado.ioloop


def main(lookupd_http: str, topic: str, channel: str, n: int, ids: bool = False) -> None:
    loop = tornado.ioloop.IOLoop.current()
    seen = []

    def handler(msg):
        seen.append([msg.id.decode(), msg.body.decode()] if ids else msg.body.decode())
        if len(seen) == n:
            print(json.dumps(seen))
            loop.call_later(0.3, loop.stop)  # let the last FIN go out
        return True

    nsq.Reader(topic=topic, channel=channel, message_handler=handler,
               lookupd_http_addresses=[f"http://{lookupd_http}"], max_in_flight=10,
               lookupd_poll_interval=1)
    loop.call_later(60, loop.stop)
    loop.start()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5:] == ["ids"])
