"""NSQ's official Python client (pynsq) with ``tls_v1`` and ``auth_secret``, in its
own process. Prints JSON.

    python pynsq_secure.py publish TCP_ADDRESS CA SECRET TOPIC N
    python pynsq_secure.py consume TCP_ADDRESS CA SECRET TOPIC CHANNEL N
    python pynsq_secure.py refused TCP_ADDRESS CA SECRET TOPIC   # the error a PUB gets
"""

import json
import ssl
import sys

import nsq
import tornado.ioloop


def tls_options(ca: str) -> dict:
    return {"ca_certs": ca, "cert_reqs": ssl.CERT_REQUIRED}


def publish(tcp, ca, secret, topic, n):
    loop = tornado.ioloop.IOLoop.current()
    writer = nsq.Writer([tcp], tls_v1=True, tls_options=tls_options(ca), auth_secret=secret)
    results = []

    def done(conn, data):
        results.append(data.decode() if isinstance(data, bytes) else str(data))
        if len(results) == 2:
            print(json.dumps(results))
            loop.stop()

    def go():
        if not writer.conns:
            loop.call_later(0.2, go)
            return
        writer.pub(topic, b"p-0", done)
        writer.mpub(topic, [f"p-{i}".encode() for i in range(1, n)], done)

    loop.call_later(0.5, go)
    loop.call_later(60, loop.stop)
    loop.start()


def refused(tcp, ca, secret, topic):
    loop = tornado.ioloop.IOLoop.current()
    writer = nsq.Writer([tcp], tls_v1=True, tls_options=tls_options(ca), auth_secret=secret)
    seen = []

    def done(conn, data):
        seen.append(str(data))
        print(json.dumps(seen))
        loop.stop()

    def go():
        if not writer.conns:
            loop.call_later(0.2, go)
            return
        writer.pub(topic, b"nope", done)

    loop.call_later(0.5, go)
    loop.call_later(60, loop.stop)
    loop.start()


def consume(tcp, ca, secret, topic, channel, n):
    loop = tornado.ioloop.IOLoop.current()
    seen = {}

    def handler(msg):
        seen[msg.id.decode()] = msg.body.decode()
        if len(seen) >= n:
            print(json.dumps(seen))
            loop.call_later(0.3, loop.stop)  # let the last FIN go out
        return True

    nsq.Reader(topic=topic, channel=channel, message_handler=handler,
               nsqd_tcp_addresses=[tcp], max_in_flight=10, tls_v1=True,
               tls_options=tls_options(ca), auth_secret=secret)
    loop.call_later(60, loop.stop)
    loop.start()


if __name__ == "__main__":
    cmd, tcp, ca, secret = sys.argv[1:5]
    if cmd == "publish":
        publish(tcp, ca, secret, sys.argv[5], int(sys.argv[6]))
    elif cmd == "refused":
        refused(tcp, ca, secret, sys.argv[5])
    else:
        consume(tcp, ca, secret, sys.argv[5], sys.argv[6], int(sys.argv[7]))
