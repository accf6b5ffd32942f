"""The one authorisation rule: a request needs a right for every name it touches.

- a topic it publishes to, creates, sets, empties, pauses or deletes: ``publish`` on it;
- a channel it reads or acts on: ``subscribe`` on its topic and channel;
- a topic its channel settings send messages to (the ``dead_letter_topic`` named, or
  ``TOPIC.dead`` that ``max_attempts`` implies): ``publish`` on that topic;
- settings of a channel that exists, changed: an admin act, which needs both rights on
  it, ``publish`` on its topic and ``subscribe`` on the channel (creating a channel
  that exists, without changing it, is a subscriber's act, as SUB is);
- a lease or lease session named, live or no longer held (requeued, timed out): the
  principal that made it (``ClientAuth.principal``), and ``subscribe`` on the lease's
  topic and channel.

Every server turns its requests into ``Need`` lists here and checks them with
``ClientAuth.require``; the core knows nothing of it (it keeps each lease's owner as an
opaque string).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .. import deadletter
from .auth import Unauthorized

if TYPE_CHECKING:
    from ..core import Broker

PUBLISH, SUBSCRIBE = "publish", "subscribe"


@dataclass(frozen=True)
class Need:
    """A right a request needs: ``publish`` on ``topic``, or ``subscribe`` on ``topic``
    and ``channel``."""

    permission: str
    topic: str
    channel: str = ""


def publish(topic: str) -> list[Need]:
    return [Need(PUBLISH, topic)]


def subscribe(topic: str, channel: str) -> list[Need]:
    return [Need(SUBSCRIBE, topic, channel)]


def create_channel(broker: "Broker", topic: str, channel: str, max_attempts: int | None,
                   dead_letter_topic: str) -> list[Need]:
    """CreateChannel, ``/channel/create``: see the module's rules."""
    needs = subscribe(topic, channel)
    t = broker.topics.get(topic)
    existing = t.channels.get(channel) if t is not None else None
    changes_attempts = max_attempts is not None and (
        existing is None or existing.max_attempts != max_attempts)
    changes_target = bool(dead_letter_topic) and (
        existing is None or existing.dead_letter_topic != dead_letter_topic)
    if not (changes_attempts or changes_target):
        return needs
    if existing is not None:
        needs += publish(topic)
    target = dead_letter_topic or (existing.dead_letter_topic if existing is not None else "")
    attempts = max_attempts if max_attempts is not None else (
        existing.max_attempts if existing is not None else None)
    if attempts is None:
        attempts = broker.options.max_attempts
    if not target and attempts:
        target = deadletter.default_dead_letter_topic(topic)
    if target:
        needs += publish(target)
    return needs


def owned(owner: str | None, principal: str, what: str) -> None:
    """Refuse unless ``principal`` made ``what`` (``owner`` None: no such thing, left
    to the handler's own answer)."""
    if owner is not None and owner != principal:
        raise Unauthorized(f"AUTH failed for {what}: it belongs to another identity")


def lease(broker: "Broker", lease_id: str, principal: str) -> list[Need]:
    """A lease named, live or remembered: its owner's, and ``subscribe`` on its channel."""
    scope = broker.lease_scope(lease_id)
    if scope is None:
        return []                   # unknown: the handler answers as without auth
    owner, topic, channel = scope
    owned(owner, principal, f"lease {lease_id}")
    return subscribe(topic, channel)


def session(broker: "Broker", session_id: str, principal: str) -> None:
    """A lease session named (to resume, reserve into, adopt into): its owner's."""
    if session_id:
        owned(broker.session_owner(session_id), principal, f"lease session {session_id}")


def producer_id(principal: str, producer_id: str) -> str:
    """A producer id scoped to its principal: one tenant's (producer, sequence) never
    meets another's. Unchanged without auth (no principal) or without a producer id."""
    if not principal or not producer_id:
        return producer_id
    return hashlib.sha256(principal.encode()).hexdigest()[:16] + "/" + producer_id
