"""gnsq (on gevent) with ``tls_v1`` and ``auth_secret``, in its own process. Prints JSON.

    python gnsq_secure.py produce TCP_ADDRESS CA SECRET TOPIC N
    python gnsq_secure.py consume TCP_ADDRESS CA SECRET TOPIC CHANNEL N
"""

import json
import ssl
import sys

import gevent
import gnsq


def tls_options(ca: str) -> dict:
    return {"ca_certs": ca, "cert_reqs": ssl.CERT_REQUIRED}


def produce(tcp, ca, secret, topic, n):
    # gnsq's Producer cannot take the OK that follows a TLS upgrade (its response
    # queue does not exist yet), against nsqd as here; its connection class can.
    host, port = tcp.rsplit(":", 1)
    conn = gnsq.NsqdTCPClient(host, int(port), tls_v1=True, tls_options=tls_options(ca),
                              auth_secret=secret.encode())
    conn.connect()
    conn.identify()
    conn.publish(topic, b"g-0")
    conn.check_ok()
    conn.multipublish(topic, [f"g-{i}".encode() for i in range(1, n)])
    conn.check_ok()
    conn.close_stream()
    print(json.dumps("ok"))


def consume(tcp, ca, secret, topic, channel, n):
    consumer = gnsq.Consumer(topic, channel, nsqd_tcp_addresses=[tcp], max_in_flight=5,
                             tls_v1=True, tls_options=tls_options(ca),
                             auth_secret=secret.encode())
    seen = {}

    @consumer.on_message.connect
    def handler(consumer, message):
        seen[message.id.decode()] = message.body.decode()
        message.finish()
        if len(seen) >= n:
            gevent.spawn_later(0.3, consumer.close)

    runner = gevent.spawn(consumer.start)
    runner.join(timeout=60)
    print(json.dumps(seen))


if __name__ == "__main__":
    cmd, tcp, ca, secret = sys.argv[1:5]
    if cmd == "produce":
        produce(tcp, ca, secret, sys.argv[5], int(sys.argv[6]))
    else:
        consume(tcp, ca, secret, sys.argv[5], sys.argv[6], int(sys.argv[7]))
