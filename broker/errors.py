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


class WrongBroker(LeaseNotFound):
    """A lease named for another broker instance than the one that answered."""

    code = "E_WRONG_BROKER"


class ProducerConflict(BrokerError):
    """A replayed (producer id, sequence) whose content differs from what it first published."""

    code = "E_PRODUCER_CONFLICT"


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


def _codes() -> dict[str, type[BrokerError]]:
    found: dict[str, type[BrokerError]] = {}
    pending = list(BrokerError.__subclasses__())
    while pending:
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        code = cls.__dict__.get("code")
        if isinstance(code, str) and code not in found:
            found[code] = cls
    return found


def error_for_code(code: str, message: str) -> BrokerError:
    """The ``BrokerError`` subclass instance matching an error code read off the wire."""
    if code.endswith("_FAILED") and code.startswith("E_"):
        return NotInFlight(code[2:-len("_FAILED")], "", message)
    cls = _codes().get(code, BrokerError)
    err = cls(message)
    if cls is BrokerError and code:
        err.code = code
    return err
