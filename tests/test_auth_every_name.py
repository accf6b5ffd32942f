"""Every gRPC method (from the service descriptor) and every HTTP endpoint (from the
router) has an authorisation case for each name it takes: the tables below. A method
or endpoint added without a row fails the first tests; each row is then run against a
broker with NSQ's auth: for every right a name needs, a secret holding every other
right the request needs (and not that one) is refused, and a secret holding them all
is served."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Callable

import grpc
import pytest

from broker import Client, ClientError, EmbeddedBroker
from broker.api import broker_pb2 as pb
from broker.core import Broker
from broker.server.http import HttpApi

from .authserver import AuthServer
from .helpers import wait_for
from .securitykit import http

IDENTITY, OTHER = "tenant", "someone-else"


@dataclass(frozen=True)
class Right:
    """``publish`` on a topic, ``subscribe`` on a topic and channel, ``owner`` (the
    principal that made the lease or session), ``accepted`` (any secret the auth
    server accepts). Topic and channel are the case's placeholders: T, C, D."""

    kind: str
    topic: str = ""
    channel: str = ""


PUB_T, PUB_D = Right("publish", "T"), Right("publish", "D")
SUB_TC = Right("subscribe", "T", "C")
SUB_TD = Right("subscribe", "T", "D")   # D as a channel of topic T
OWNER, ACCEPTED = Right("owner"), Right("accepted")


@dataclass
class Names:
    """One case's names, made unique per case so cases do not meet."""

    T: str
    C: str
    D: str
    state: dict = field(default_factory=dict)

    def right(self, r: Right) -> Right:
        return Right(r.kind, getattr(self, r.topic) if r.topic else "",
                     getattr(self, r.channel) if r.channel else "")


# -- the tables: name(s) a request takes -> the rights each needs ----------------------

IGNORED_SETTINGS = "(dead_letter_topic of its request: not read by this call)"
GRPC: dict[str, dict[str, list[Right]] | None] = {
    "Ping": None,                                         # open: health checks
    "Info": {"(no name)": [ACCEPTED]},
    "Stats": {"(no name; topic and channel only filter what it shows)": [ACCEPTED]},
    "Publish": {"topic": [PUB_T]},
    "MultiPublish": {"topic": [PUB_T]},
    "Subscribe": {"topic, channel": [SUB_TC]},
    "CreateTopic": {"topic": [PUB_T]},
    "DeleteTopic": {"topic": [PUB_T]},
    "EmptyTopic": {"topic": [PUB_T]},
    "PauseTopic": {"topic": [PUB_T]},
    "UnpauseTopic": {"topic": [PUB_T]},
    "CreateChannel": {"topic, channel": [SUB_TC], "dead_letter_topic": [PUB_D]},
    "DeleteChannel": {"topic, channel": [SUB_TC], IGNORED_SETTINGS: []},
    "EmptyChannel": {"topic, channel": [SUB_TC], IGNORED_SETTINGS: []},
    "PauseChannel": {"topic, channel": [SUB_TC], IGNORED_SETTINGS: []},
    "UnpauseChannel": {"topic, channel": [SUB_TC], IGNORED_SETTINGS: []},
    "OpenLeaseSession": {"session_id": [OWNER]},
    # The lease it FINs first is of another channel (D) than the one it reserves from.
    "Reserve": {"session_id": [OWNER], "topic, channel": [SUB_TC],
                "finish_lease_ids": [OWNER, SUB_TD]},
    "FetchLease": {"lease_id": [OWNER, SUB_TC]},
    "FinishLeases": {"lease_ids": [OWNER, SUB_TC]},
    "RequeueLeases": {"lease_ids": [OWNER, SUB_TC]},
    "TouchLeases": {"lease_ids": [OWNER, SUB_TC]},
    "AdoptLeases": {"session_id": [OWNER], "lease_ids": [OWNER, SUB_TC]},
}
# Beyond one row per method: the same method with other names or state.
GRPC_MORE: dict[str, dict[str, list[Right]]] = {
    "CreateChannel of an existing channel, settings changed": {
        "topic": [PUB_T], "channel": [SUB_TC], "dead_letter_topic": [PUB_D]},
    "FinishLeases of a lease that timed out": {"lease_ids": [OWNER, SUB_TC]},
    "AdoptLeases of a lease that timed out": {"session_id": [OWNER],
                                              "lease_ids": [OWNER, SUB_TC]},
}

HTTP: dict[str, dict[str, list[Right]] | None] = {
    "GET /ping": None,
    "GET /info": {"(no name)": [ACCEPTED]},
    "GET /stats": {"(no name; topic and channel only filter)": [ACCEPTED]},
    "GET /metrics": {"(no name)": [ACCEPTED]},
    **{f"{method} /{path}": {"topic": [PUB_T]} for method in ("POST", "PUT")
       for path in ("pub", "mpub")},
    **{f"POST /topic/{action}": {"topic": [PUB_T]}
       for action in ("create", "delete", "empty", "pause", "unpause")},
    "POST /channel/create": {"topic, channel": [SUB_TC], "dead_letter_topic": [PUB_D]},
    **{f"POST /channel/{action}": {"topic, channel": [SUB_TC]}
       for action in ("delete", "empty", "pause", "unpause")},
}
HTTP_MORE: dict[str, dict[str, list[Right]]] = {
    "POST /channel/create of an existing channel, settings changed": {
        "topic": [PUB_T], "channel": [SUB_TC], "dead_letter_topic": [PUB_D]},
}


def test_every_grpc_method_has_a_row():
    methods = set(pb.DESCRIPTOR.services_by_name["Broker"].methods_by_name)
    assert methods == set(GRPC), "a gRPC method without an authorisation row, or a stale row"


# Request fields that name something yet need no right of their own, and why.
NO_RIGHT_NEEDED = {
    "client_id": "a label the caller gives itself, shown in /stats",
    "broker_id": "the broker instance the caller expects; the handler compares it",
    "producer_id": "scoped to the caller's principal "
                   "(test_auth_tenants.py::test_one_tenant_cannot_claim_another_tenants_producer_id)",
}


def _names_of(message) -> set[str]:
    """The fields of a request that name something: a topic, a channel, an id."""
    return {f.name for f in message.fields
            if f.name.endswith(("topic", "channel", "_id", "_ids"))}


def test_every_name_a_grpc_request_takes_has_a_case_or_a_reason():
    service = pb.DESCRIPTOR.services_by_name["Broker"]
    for method, names in GRPC.items():
        request = service.methods_by_name[method].input_type
        if method == "Subscribe":
            request = request.fields_by_name["sub"].message_type     # its SUB frame
        covered = " ".join(names or {})
        for name in _names_of(request) - set(NO_RIGHT_NEEDED):
            assert name in covered, f"{method}: the name {name!r} has no case"


def test_every_http_endpoint_has_a_row():
    api = HttpApi(Broker(), {})
    routes = {f"{r.method} {r.resource.canonical}" for r in api.app.router.routes()
              if r.method != "HEAD"}                  # aiohttp's HEAD beside every GET
    assert routes == set(HTTP), "an HTTP endpoint without an authorisation row, or a stale row"


# -- what each request does, and the state it needs, made by the owner -------------------

def _lease(owner: Client, n: Names, timed_out: bool = False) -> None:
    owner.publish(n.T, b"m")
    session = owner.open_lease_session("planner", grace_ms=60_000)
    lease = owner.reserve(session.session_id, n.T, n.C, 10,
                          msg_timeout_ms=50 if timed_out else 0)
    assert lease.count == 1
    n.state.update(session=session, lease=lease.lease_id)
    if timed_out:
        wait_for(lambda: owner.stats(n.T, n.C).topics[0].channels[0].in_flight_count == 0,
                 10, message="the lease to time out")


def _lease_of_channel_d(owner: Client, n: Names) -> None:
    owner.create_channel(n.T, n.D)
    owner.publish(n.T, b"m")
    session = owner.open_lease_session("planner", grace_ms=60_000)
    lease = owner.reserve(session.session_id, n.T, n.D, 10)
    assert lease.count == 1
    n.state.update(session=session, lease=lease.lease_id)


def _session(owner: Client, n: Names) -> None:
    n.state["session"] = owner.open_lease_session("planner", grace_ms=60_000)


def _topic(owner: Client, n: Names) -> None:
    owner.create_topic(n.T)


def _channel(owner: Client, n: Names) -> None:
    owner.create_channel(n.T, n.C)


def _subscribe(c: Client, n: Names) -> None:
    c.subscribe(n.T, n.C).close()


def _adopt(c: Client, n: Names) -> None:
    c.adopt_leases(n.state["session"].session_id, [n.state["lease"]])


Setup = Callable[[Client, Names], None]
Act = Callable[[Client, Names], Any]

GRPC_ACTS: dict[str, tuple[Setup | None, Act]] = {
    "Info": (None, lambda c, n: c.info()),
    "Stats": (None, lambda c, n: c.stats()),
    "Publish": (None, lambda c, n: c.publish(n.T, b"x")),
    "MultiPublish": (None, lambda c, n: c.multi_publish(n.T, [b"x"])),
    "Subscribe": (None, _subscribe),
    "CreateTopic": (None, lambda c, n: c.create_topic(n.T)),
    **{f"{a}Topic": (_topic, (lambda a: lambda c, n: c.admin("topic", a, n.T))(a.lower()))
       for a in ("Delete", "Empty", "Pause", "Unpause")},
    "CreateChannel": (_topic, lambda c, n: c.create_channel(n.T, n.C, max_attempts=3,
                                                           dead_letter_topic=n.D)),
    "CreateChannel of an existing channel, settings changed": (
        _channel, lambda c, n: c.create_channel(n.T, n.C, max_attempts=3,
                                                dead_letter_topic=n.D)),
    **{f"{a}Channel": (_channel, (lambda a: lambda c, n: c.admin("channel", a, n.T, n.C))(
        a.lower())) for a in ("Delete", "Empty", "Pause", "Unpause")},
    "OpenLeaseSession": (_session, lambda c, n: c.open_lease_session(
        "resume", session_id=n.state["session"].session_id).close()),
    "Reserve": (_lease_of_channel_d, lambda c, n: c.reserve(
        n.state["session"].session_id, n.T, n.C, 1, finish=[n.state["lease"]])),
    "FetchLease": (_lease, lambda c, n: list(c.fetch_lease(n.state["lease"]))),
    "FinishLeases": (_lease, lambda c, n: c.finish_leases([n.state["lease"]])),
    "FinishLeases of a lease that timed out": (
        lambda c, n: _lease(c, n, timed_out=True),
        lambda c, n: c.finish_leases([n.state["lease"]])),
    "RequeueLeases": (_lease, lambda c, n: c.requeue_leases([n.state["lease"]])),
    "TouchLeases": (_lease, lambda c, n: c.touch_leases([n.state["lease"]])),
    "AdoptLeases": (_lease, _adopt),
    "AdoptLeases of a lease that timed out": (lambda c, n: _lease(c, n, timed_out=True),
                                              _adopt),
}


def _http_path(row: str, n: Names) -> tuple[str, bytes | None]:
    method, path = row.split(" ")[:2]
    query = f"topic={n.T}"
    if path.startswith("/channel/"):
        query += f"&channel={n.C}"
    if path == "/channel/create":
        query += f"&max_attempts=3&dead_letter_topic={n.D}"
    body = None if method == "GET" else b"x"
    return f"{path}?{query}", body


HTTP_SETUPS: dict[str, Setup | None] = {
    **{f"POST /topic/{a}": _topic for a in ("delete", "empty", "pause", "unpause")},
    "POST /channel/create": _topic,
    "POST /channel/create of an existing channel, settings changed": _channel,
    **{f"POST /channel/{a}": _channel for a in ("delete", "empty", "pause", "unpause")},
}


# -- running the rows -------------------------------------------------------------------

@pytest.fixture(scope="module")
def auth():
    with AuthServer({}) as server:
        yield server


@pytest.fixture(scope="module")
def broker(auth):
    with EmbeddedBroker(auth_http_addresses=[auth.address]) as b:
        yield b


_cases = iter(range(1_000_000))


def grant(auth: AuthServer, rights: list[Right], identity: str) -> str:
    """A secret for exactly ``rights`` (one unrelated grant besides, so that a secret with
    none of the request's rights is still accepted)."""
    auths = [{"topic": "^unrelated$", "channels": [".*"], "permissions": ["publish"]}]
    for r in rights:
        if r.kind == "publish":
            auths.append({"topic": f"^{r.topic}$", "channels": [".*"],
                          "permissions": ["publish"]})
        elif r.kind == "subscribe":
            auths.append({"topic": f"^{r.topic}$", "channels": [f"^{r.channel}$"],
                          "permissions": ["subscribe"]})
    secret = f"secret-{next(_cases)}"
    auth.secrets[secret] = {"ttl": 3600, "identity": identity, "authorizations": auths}
    return secret


def owner_of(broker, auth: AuthServer, n: Names) -> Client:
    """The case's owner: every right on its names, the identity the tested secrets share."""
    rights = [n.right(r) for r in (PUB_T, SUB_TC, PUB_D, SUB_TD)]
    return Client(broker.address, auth_secret=grant(auth, rights, IDENTITY), timeout=10)


def variants(names: dict[str, list[Right]]) -> list[tuple[str, Right]]:
    return [(name, right) for name, rights in names.items() for right in rights]


def all_rows(table: dict, more: dict) -> list[tuple[str, dict]]:
    return [(row, names) for row, names in {**table, **more}.items() if names is not None]


def _refusal(act: Callable[[], Any]) -> tuple[grpc.StatusCode | None, str]:
    try:
        act()
    except ClientError as err:
        return err.status, str(err)
    return None, ""


@pytest.mark.parametrize("row, names", all_rows(GRPC, GRPC_MORE), ids=lambda x: str(x)[:60])
def test_each_grpc_method_refuses_a_secret_lacking_any_right_a_name_needs(broker, auth, row,
                                                                         names):
    setup, act = GRPC_ACTS[row]
    needed = [r for rights in names.values() for r in rights]
    for name, missing in variants(names):
        i = next(_cases)
        n = Names(f"t{i}", f"c{i}", f"d{i}")
        rights = [n.right(r) for r in needed if r not in (missing, OWNER, ACCEPTED)]
        if setup is not None:
            with owner_of(broker, auth, n) as owner:
                setup(owner, n)
        if missing == ACCEPTED:
            secret = "unknown-secret"
        else:
            secret = grant(auth, rights, OTHER if missing == OWNER else IDENTITY)
        with Client(broker.address, auth_secret=secret, timeout=10) as c:
            status, message = _refusal(lambda: act(c, n))
        expected = (grpc.StatusCode.UNAUTHENTICATED if missing == ACCEPTED
                    else grpc.StatusCode.PERMISSION_DENIED)
        assert status == expected, (row, name, missing, status, message)
        if "session" in n.state:
            n.state["session"].close()
    n = Names(f"t{next(_cases)}", "c", "d")
    if setup is not None:
        with owner_of(broker, auth, n) as owner:
            setup(owner, n)
    with Client(broker.address, auth_secret=grant(auth, [n.right(r) for r in needed],
                                                  IDENTITY), timeout=10) as c:
        status, message = _refusal(lambda: act(c, n))
    assert status not in (grpc.StatusCode.PERMISSION_DENIED,
                          grpc.StatusCode.UNAUTHENTICATED), (row, message)
    if "session" in n.state:
        n.state["session"].close()


@pytest.mark.parametrize("row, names", all_rows(HTTP, HTTP_MORE), ids=lambda x: str(x)[:60])
def test_each_http_endpoint_refuses_a_secret_lacking_any_right_a_name_needs(broker, auth, row,
                                                                           names):
    setup = HTTP_SETUPS.get(row)
    needed = [r for rights in names.values() for r in rights]
    for name, missing in variants(names) + [("", None)]:
        i = next(_cases)
        n = Names(f"t{i}", f"c{i}", f"d{i}")
        if setup is not None:
            with owner_of(broker, auth, n) as owner:
                setup(owner, n)
        path, body = _http_path(row, n)
        if missing == ACCEPTED:
            secret = "unknown-secret"
        else:
            secret = grant(auth, [n.right(r) for r in needed if r not in (missing, ACCEPTED)],
                           IDENTITY)
        method = row.split(" ")[0]
        status, answer = (http(broker, path, secret, body) if method != "PUT"
                          else _put(broker, path, secret, body))
        if missing is None:
            assert status not in (401, 403), (row, answer)
        else:
            expected = (401, "E_AUTH_FAILED") if missing == ACCEPTED else (403, "E_UNAUTHORIZED")
            assert (status, json.loads(answer)["message"]) == expected, (row, name, missing)


def _put(broker, path: str, secret: str, body: bytes | None) -> tuple[int, bytes]:
    request = urllib.request.Request(f"http://{broker.http_address}{path}", data=body,
                                     method="PUT",
                                     headers={"Authorization": f"Bearer {secret}"})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()
