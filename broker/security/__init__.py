"""On a network: TLS on every listener and NSQ's auth protocol.

- ``tls``: checks the TLS options and builds the broker's ``ssl.SSLContext`` and
  gRPC server credentials from them (nsqd's flag names).
- ``auth``: asks the auth servers ``/auth?remote_ip=&tls=&secret=&common_name=``,
  validates and caches the answer for its ``ttl``, and says whether a client may
  publish to a topic or subscribe to a channel, as nsqd does.
- ``grpc_auth``: the same authorisations on every gRPC call (secret in call metadata).
- ``client``: the client side, gRPC channel credentials and the secret's metadata.

The core knows nothing of this: the servers call in here at their edges.
"""
