"""pynsq's broker: NSQ's model (topics, channels, in-flight, deferred) served over gRPC.

The public surface:

- ``Options``: every setting and its default (nsqd's names).
- ``Broker``: the core, for embedding in an event loop you own.
- ``BrokerApp``: the core with its servers, as ``pynsqd`` runs it.
- ``EmbeddedBroker``: a broker on a free loopback port in a thread; a context manager.
- ``Client``: a synchronous gRPC client.
- the errors, ``BrokerError`` and its subclasses.
"""

__version__ = "0.1.0"

import os  # noqa: E402

# gRPC's fork handlers can kill a child forked while a channel or a server of this
# process is busy, before the child execs (grpc/grpc#43055): PySpark starting its JVM
# in a driver that already holds a client or an embedded broker, for one. pynsq never
# forks without exec, so they are off unless the environment says otherwise. gRPC reads
# this once, when it is first imported: it is set before anything here imports it.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

from .client import BrokerUnavailable, Client, ClientError  # noqa: E402
from .errors import (BrokerError, ChannelNotFound, InvalidChannel, InvalidMessage,  # noqa: E402
                     InvalidRequest, InvalidTopic, LeaseNotFound, MessageTooBig, NotInFlight,
                     TopicNotFound)
from .options import DEFAULT_GRPC_ADDRESS, Options  # noqa: E402

__all__ = ["Broker", "BrokerApp", "BrokerError", "BrokerUnavailable", "ChannelNotFound",
           "Client", "ClientError", "DEFAULT_GRPC_ADDRESS", "EmbeddedBroker", "InvalidChannel",
           "InvalidMessage", "InvalidRequest", "InvalidTopic", "LeaseNotFound", "MessageTooBig",
           "NotInFlight", "Options", "TopicNotFound", "__version__"]

# The core and the servers (aiohttp, the HTTP and TCP listeners) load on first use: a
# Spark Python worker that only needs ``Client`` (the source's driver worker starts
# with each query) does not pay for them.
_LAZY = {"Broker": ".core", "BrokerApp": ".app", "EmbeddedBroker": ".embedded"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib
        value = getattr(importlib.import_module(_LAZY[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
