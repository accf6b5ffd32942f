"""The broker's exceptions: one class per thing that can go wrong.

Every error carries nsqd's error code (``E_BAD_TOPIC``, ``E_FIN_FAILED``, ...)
so that each server can speak its own wire format without guessing, and a
message that names what was wrong.
"""

from __future__ import annotations


class BrokerError(Exception):
    """Base class of every error the broker reports to a client."""

    code = "E_INVALID"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class InvalidRequest(BrokerError):
    """A request that is malformed or out of range (RDY count, delay, timeout)."""

    code = "E_INVALID"


class InvalidTopic(BrokerError):
    """A topic name that breaks the naming rule."""

    code = "E_BAD_TOPIC"


class InvalidChannel(BrokerError):
    """A channel name that breaks the naming rule."""

    code = "E_BAD_CHANNEL"


class InvalidMessage(BrokerError):
    """An empty body, or one over ``--max-msg-size``."""

    code = "E_BAD_MESSAGE"


class MessageTooBig(InvalidMessage):
    """A body over ``--max-msg-size``."""


class TopicNotFound(BrokerError):
    code = "E_TOPIC_NOT_FOUND"


class ChannelNotFound(BrokerError):
    code = "E_CHANNEL_NOT_FOUND"


class LeaseNotFound(BrokerError):
    code = "E_LEASE_NOT_FOUND"


class NotInFlight(BrokerError):
    """FIN/REQ/TOUCH of a message this consumer does not hold in flight."""

    def __init__(self, command: str, msg_id: str, message: str) -> None:
        super().__init__(message)
        self.command = command
        self.msg_id = msg_id
        self.code = f"E_{command}_FAILED"


class Exiting(BrokerError):
    """The broker is shutting down."""

    code = "E_EXITING"


class StorageFailed(BrokerError):
    """The data path could not take a publish (a failed write or fsync, a full
    disk): nothing of it was accepted, and the client may retry."""

    code = "E_PUB_FAILED"


class QueueFull(StorageFailed):
    """Without ``--data-path``: the queued messages would pass ``--max-memory-bytes``."""
