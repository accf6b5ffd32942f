"""Dead letters and message TTL: what happens to a message that must not be delivered.

A channel's ``max_attempts`` (0: off; unset: the broker's ``--max-attempts``)
bounds deliveries: a message whose next delivery would exceed it is moved to the
channel's dead-letter topic (``TOPIC.dead`` unless the channel names one). A
message past its expiry (``ttl`` at publish, or the topic's ``ttl``) is never
delivered: it goes to the dead-letter topic when the channel has one, and is
dropped otherwise. Both are decided where a channel picks its next message to
deliver, so REQs and timeouts count alike.

The dead-letter copy keeps the message's id, body and publish time; its
``attempts`` start again from 0. Durable order: the copy's PUB is written to the
dead-letter topic's log before the FIN on the source channel is queued, so a
crash between the two can duplicate a dead letter but never lose it.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from .errors import BrokerError, InvalidRequest
from .message import MAX_ATTEMPTS, Message, Published
from .names import EPHEMERAL_SUFFIX, check_topic_name

if TYPE_CHECKING:
    from .channel import Channel
    from .topic import Topic

log = logging.getLogger("pynsqd")

DEAD_SUFFIX = ".dead"
# A dead letter that cannot be written (disk full) is retried this much later.
RETRY_DELAY = 1.0
ATTEMPTS, EXPIRED = "attempts", "expired"


def default_dead_letter_topic(topic: str) -> str:
    return topic.removesuffix(EPHEMERAL_SUFFIX) + DEAD_SUFFIX


def max_attempts(channel: "Channel") -> int:
    """The channel's limit, or the broker's default; 0: no limit."""
    if channel.max_attempts is not None:
        return channel.max_attempts
    return channel.topic.broker.options.max_attempts


def dead_letter_topic(channel: "Channel") -> str:
    """Where the channel's dead letters go; "" when it keeps none."""
    if channel.dead_letter_topic:
        return channel.dead_letter_topic
    if max_attempts(channel):
        return default_dead_letter_topic(channel.topic.name)
    return ""


def check_max_attempts(value: int) -> int:
    if not 0 <= value <= MAX_ATTEMPTS:
        raise InvalidRequest(f"max_attempts {value} out of range: must be 0 (off) to "
                             f"{MAX_ATTEMPTS}")
    return value


def check_ttl_ms(value: int) -> int:
    if value < 0:
        raise InvalidRequest(f"ttl {value} ms must not be negative (0: never expires)")
    return value


def check_channel_settings(topic: str, max_attempts: int | None,
                           dead_letter_topic: str) -> None:
    if max_attempts is not None:
        check_max_attempts(max_attempts)
    if dead_letter_topic:
        check_topic_name(dead_letter_topic)
        if dead_letter_topic == topic:
            raise InvalidRequest(f"dead_letter_topic {dead_letter_topic}: a channel's dead "
                                 f"letters cannot go back to its own topic")


def configure_channel(channel: "Channel", max_attempts: int | None = None,
                      dead_letter_topic: str = "") -> None:
    """Set what was given (None / "": leave as is), check it, and persist it."""
    if max_attempts is None and not dead_letter_topic:
        return
    check_channel_settings(channel.topic.name, max_attempts, dead_letter_topic)
    was = channel.max_attempts, channel.dead_letter_topic
    if max_attempts is not None:
        channel.max_attempts = max_attempts
    if dead_letter_topic:
        channel.dead_letter_topic = dead_letter_topic
    try:
        channel.topic.broker.storage.config_changed(channel.topic, channel)
    except BaseException:  # not written: nothing changes
        channel.max_attempts, channel.dead_letter_topic = was
        raise


def configure_topic(topic: "Topic", ttl_ms: int | None = None) -> None:
    if ttl_ms is None:
        return
    was, topic.ttl_ms = topic.ttl_ms, check_ttl_ms(ttl_ms)
    try:
        topic.broker.storage.config_changed(topic, None)
    except BaseException:  # not written: nothing changes
        topic.ttl_ms = was
        raise


def settings_of(topic: "Topic", channel: "Channel | None") -> dict[str, Any]:
    """What storage keeps of the topic's (``channel`` None) or a channel's settings;
    defaults are left out."""
    if channel is None:
        return {"ttl_ms": topic.ttl_ms} if topic.ttl_ms else {}
    out: dict[str, Any] = {}
    if channel.max_attempts is not None:
        out["max_attempts"] = channel.max_attempts
    if channel.dead_letter_topic:
        out["dead_letter_topic"] = channel.dead_letter_topic
    return out


def restore_settings(topic: "Topic", channel: "Channel | None",
                     settings: dict[str, Any]) -> None:
    """Put back settings that storage read (what ``settings_of`` gave)."""
    if channel is None:
        topic.ttl_ms = int(settings.get("ttl_ms", 0))
    else:
        channel.max_attempts = settings.get("max_attempts")
        channel.dead_letter_topic = settings.get("dead_letter_topic", "")


# -- at delivery ---------------------------------------------------------------
def verdict(channel: "Channel", msg: Message, now_ns: int) -> str:
    """Why ``msg`` must not be delivered now ("" if it may)."""
    if msg.expires and msg.expires <= now_ns:
        return EXPIRED
    limit = max_attempts(channel)
    if limit and msg.attempts >= limit:
        return ATTEMPTS
    return ""


def all_deliverable(channel: "Channel", msgs: list[Message], now_ns: int) -> bool:
    """Whether ``verdict`` lets every one of ``msgs`` be delivered now: checked in bulk,
    without a call per message (a lease takes thousands at once)."""
    limit = max_attempts(channel)
    if limit and max([msg.attempts for msg in msgs], default=0) >= limit:
        return False
    return min(filter(None, [msg.expires for msg in msgs]), default=now_ns + 1) > now_ns


def expires_at(now_ns: int, ttl_ms: int) -> int:
    """The expiry (wall ns) of a message published at ``now_ns`` (0: never)."""
    return now_ns + ttl_ms * 1_000_000 if ttl_ms else 0


def remove(channel: "Channel", msg: Message, reason: str) -> bool:
    """Take ``msg`` (out of the channel's queues) out of the channel: dead-letter
    it, or drop it if expired and the channel keeps no dead letters. Returns False
    when the dead letter could not be written; the caller then keeps ``msg``."""
    target = dead_letter_topic(channel)
    if target:
        broker = channel.topic.broker
        copy = Message(msg.id, msg.body, msg.timestamp)
        try:
            # Not bounded by --max-topics: a message failing is no client making topics,
            # and one refused here would stay in its channel, retried forever.
            topic = broker.get_or_create_topic(target, bounded=False)
            run = Published.of(copy)
            broker.storage.published(topic, run, [])
        except BrokerError as err:
            log.error("%s/%s: message %s could not be dead-lettered to %s: %s (kept; "
                      "retried)", channel.topic.name, channel.name, msg.id, target, err)
            return False
        topic.publish(run)
    if reason == EXPIRED:
        channel.expired_count += 1
    if target:
        channel.dead_letter_count += 1
    channel.topic.broker.storage.finished(channel, [msg])
    return True
