"""The broker's exceptions, grouped by meaning so callers catch what they mean.

Families (catch these): ``Invalid`` (a request that is malformed or out of
range), ``NotFound`` (a topic, channel or lease that does not exist),
``NotInFlight`` (FIN/REQ/TOUCH of a message the consumer does not hold),
``Unavailable`` (the broker is shutting down). Each concrete class carries
nsqd's error code (``E_BAD_TOPIC``, ``E_FIN_FAILED``, ...) and whether nsqd
treats it as fatal (the TCP connection is closed after it), so that each
server maps an error to its wire in one place without guessing.

``error_for_code(code, message)`` turns a code back into the matching
exception, for clients that receive the code over a wire (gRPC sends it in the
trailing metadata ``pynsq-error-code``).
"""

from __future__ import annotations

#: gRPC trailing-metadata key that carries ``BrokerError.code`` on every error status.
ERROR_CODE_METADATA = "pynsq-error-code"


class BrokerError(Exception):
    """Base class of every error the broker reports to a client."""

    code = "E_INVALID"
    #: nsqd closes a TCP connection after a fatal error.
    fatal = True

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


# -- families ------------------------------------------------------------------

class Invalid(BrokerError):
    """A request that is malformed or out of range."""

    code = "E_INVALID"


class NotFound(BrokerError):
    """A topic, channel or lease that does not exist."""


class Unavailable(BrokerError):
    """The broker cannot take the request now (it is shutting down)."""


class Conflict(BrokerError):
    """A request that contradicts what the broker already holds."""


# -- Invalid ---------------------------------------------------------------------

class InvalidRequest(Invalid):
    """A request that is malformed or out of range (RDY count, delay, timeout)."""

    code = "E_INVALID"


class InvalidTopic(Invalid):
    """A topic name that breaks the naming rule."""

    code = "E_BAD_TOPIC"


class InvalidChannel(Invalid):
    """A channel name that breaks the naming rule."""

    code = "E_BAD_CHANNEL"


class InvalidMessage(Invalid):
    """An empty message body, one over ``--max-msg-size``, or one that cannot be read."""

    code = "E_BAD_MESSAGE"


class MessageTooBig(InvalidMessage):
    """A message body over ``--max-msg-size``."""


class InvalidBody(Invalid):
    """A request body (MPUB, IDENTIFY, AUTH) that is malformed or of a bad size."""

    code = "E_BAD_BODY"


class BodyTooBig(InvalidBody):
    """A request body over ``--max-body-size``."""


class AuthDisabled(Invalid):
    """AUTH sent to a broker that has no auth server."""

    code = "E_AUTH_DISABLED"


# -- NotFound --------------------------------------------------------------------

class TopicNotFound(NotFound):
    code = "E_TOPIC_NOT_FOUND"


class ChannelNotFound(NotFound):
    code = "E_CHANNEL_NOT_FOUND"


class LeaseNotFound(NotFound):
    code = "E_LEASE_NOT_FOUND"


class WrongBroker(LeaseNotFound):
    """A lease named for another broker instance than the one that answered."""

    code = "E_WRONG_BROKER"


# -- Conflict --------------------------------------------------------------------

class ProducerConflict(Conflict):
    """A replayed (producer id, sequence) whose content differs from what it first published."""

    code = "E_PRODUCER_CONFLICT"


# -- the rest --------------------------------------------------------------------

class NotInFlight(BrokerError):
    """FIN/REQ/TOUCH of a message this consumer does not hold in flight.

    Not fatal: nsqd reports it and keeps the connection.
    """

    fatal = False

    def __init__(self, command: str, msg_id: str, message: str) -> None:
        super().__init__(message)
        self.command = command
        self.msg_id = msg_id
        self.code = f"E_{command}_FAILED"


class Exiting(Unavailable):
    """The broker is shutting down."""

    code = "E_EXITING"


class StorageFailed(BrokerError):
    """The data path could not take a publish (a failed write or fsync, a full
    disk): nothing of it was accepted, and the client may retry."""

    code = "E_PUB_FAILED"


class AdminFailed(StorageFailed):
    """The data path could not take the record of an admin call (create, delete,
    pause, empty, settings): nothing was changed, and the client may retry."""

    code = "E_STORAGE_FAILED"


class LimitReached(BrokerError):
    """A topic or channel past ``--max-topics`` or ``--max-channels-per-topic``: not
    made, nothing else changed; it can be made once others are deleted."""

    code = "E_LIMIT_REACHED"


class TooManyTopics(LimitReached):
    code = "E_TOO_MANY_TOPICS"


class TooManyChannels(LimitReached):
    code = "E_TOO_MANY_CHANNELS"


class QueueFull(StorageFailed):
    """Without ``--data-path``: the queued messages would pass ``--max-memory-bytes``."""


def _by_code() -> dict[str, type[BrokerError]]:
    """Every error class by its code, classes defined in other modules included."""
    found: dict[str, type[BrokerError]] = {}
    pending = list(BrokerError.__subclasses__())
    while pending:
        cls = pending.pop(0)
        pending.extend(cls.__subclasses__())
        code = cls.__dict__.get("code")
        if isinstance(code, str):
            found[code] = cls  # breadth first: the most specific class wins
    return found


def error_for_code(code: str, message: str) -> BrokerError:
    """The exception a broker raised, rebuilt from its ``code`` and message.

    ``E_FIN_FAILED`` / ``E_REQ_FAILED`` / ``E_TOUCH_FAILED`` give ``NotInFlight``;
    an unknown code gives a plain ``BrokerError`` that keeps the code.
    """
    if code.startswith("E_") and code.endswith("_FAILED") and \
            code[2:-7] in ("FIN", "REQ", "TOUCH"):
        return NotInFlight(code[2:-7], "", message)
    cls = _by_code().get(code)
    if cls is not None and cls.__init__ is BrokerError.__init__:
        return cls(message)
    err = BrokerError(message)
    err.code = code
    return err
