"""Hostile tenants on one broker with NSQ's auth: what one secret can do to names it has
no rights on. Each test replays an attack that once got in: a dead-letter topic as a way
to publish anywhere, a lease finished by someone else after it timed out, a lease
session resumed by whoever knew its id, a revoked secret still accepted, a producer id
claimed by another tenant, a grant regex that backtracks, a page on another site
reaching the HTTP API through DNS rebinding."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request

import grpc
import pytest

from broker import Client, ClientError, EmbeddedBroker
from broker.api import broker_pb2_grpc as pb_grpc
from broker.security.auth import InvalidAuthReply, parse_reply
from broker.security.client import client_channel

from .authserver import AuthServer, reply
from .helpers import wait_for
from .securitykit import Raw, http


def grant(topic: str, *permissions: str, identity: str, channels=(".*",)) -> dict:
    return {"ttl": 3600, "identity": identity, "authorizations": [
        {"topic": topic, "channels": list(channels), "permissions": list(permissions)}]}


SECRETS = {
    "admin": grant(".*", "publish", "subscribe", identity="admin"),
    "foo-only": grant("^foo$", "publish", "subscribe", identity="mallory"),
    "alice": grant("^a-", "publish", "subscribe", identity="alice"),
    "alice-reader": grant("^a-", "subscribe", identity="alice-reader"),
    "bob": grant("^b-", "publish", "subscribe", identity="bob"),
    "bob-on-a": grant("^a-", "subscribe", identity="bob"),   # rights on a-, another owner
}


@pytest.fixture(scope="module")
def auth():
    with AuthServer(dict(SECRETS)) as server:
        yield server


@pytest.fixture(scope="module")
def broker(auth):
    with EmbeddedBroker(auth_http_addresses=[auth.address]) as b:
        yield b


def client(broker, secret: str) -> Client:
    return Client(broker.address, auth_secret=secret, timeout=10)


def on_a_new_connection(broker, secret: str) -> Client:
    """A client whose channel opens its own connection (gRPC shares one between the
    channels of a process to the same address)."""
    c = client(broker, secret)
    c._channel.close()
    c._channel = client_channel(broker.address, [("grpc.use_local_subchannel_pool", 1)],
                                auth_secret=secret)
    c.stub = pb_grpc.BrokerStub(c._channel)
    return c


def denied(action) -> ClientError:
    with pytest.raises(ClientError) as err:
        action()
    assert err.value.status == grpc.StatusCode.PERMISSION_DENIED, err.value
    assert str(err.value).startswith("E_UNAUTHORIZED"), err.value
    return err.value


def topics(broker) -> set[str]:
    return broker.call(lambda: set(broker.broker.topics))


# -- a topic named anywhere needs publish on it ----------------------------------

def test_a_dead_letter_topic_named_or_implied_needs_publish_on_it(broker):
    mallory = client(broker, "foo-only")
    mallory.publish("foo", b"poison")
    denied(lambda: mallory.create_channel("foo", "dlx", max_attempts=1,
                                          dead_letter_topic="payments"))
    denied(lambda: mallory.create_channel("foo", "dlx", max_attempts=1))  # foo.dead implied
    status, body = http(broker, "/channel/create?topic=foo&channel=dlx&max_attempts=1"
                                "&dead_letter_topic=payments", "foo-only", b"")
    assert (status, json.loads(body)) == (403, {"message": "E_UNAUTHORIZED"})
    # Without settings the channel is the subscriber's own: REQ keeps the message in foo.
    mallory.create_channel("foo", "dlx")
    with mallory.subscribe("foo", "dlx") as sub:
        msg = sub.get(10)
        sub.req(msg.id)
        assert sub.get(10).id == msg.id
    assert not topics(broker) & {"payments", "foo.dead"}
    admin = client(broker, "admin")
    admin.create_channel("foo", "audited", max_attempts=1, dead_letter_topic="payments")
    audited = broker.call(lambda: broker.broker.channel("foo", "audited"))
    assert audited.dead_letter_topic == "payments"       # one with rights on it may
    mallory.close()
    admin.close()


def test_changing_an_existing_channels_settings_needs_publish_and_subscribe(broker):
    alice, reader = client(broker, "alice"), client(broker, "alice-reader")
    alice.create_channel("a-events", "main")
    reader.create_channel("a-events", "main")       # no change: a subscriber's create
    denied(lambda: reader.create_channel("a-events", "main", max_attempts=5))
    status, _ = http(broker, "/channel/create?topic=a-events&channel=main&max_attempts=5",
                     "alice-reader", b"")
    assert status == 403
    alice.create_channel("a-events", "main", max_attempts=5)  # both rights: an admin
    reader.create_channel("a-events", "main", max_attempts=5)  # the same value: no change
    channel = broker.call(lambda: broker.broker.channel("a-events", "main"))
    assert channel.max_attempts == 5
    # A new channel naming only its dead-letter topic; then a subscriber's create of it
    # as it stands (no settings) changes nothing and needs no publish right.
    alice.create_channel("a-events", "routed", dead_letter_topic="a-events-failed")
    reader.create_channel("a-events", "routed")
    routed = broker.call(lambda: broker.broker.channel("a-events", "routed"))
    assert routed.dead_letter_topic == "a-events-failed"
    alice.close()
    reader.close()


# -- leases answer to their owner, live or dead ------------------------------------

def test_a_lease_answers_only_to_its_owner_while_live_and_after_it_timed_out(broker):
    alice, bob = client(broker, "alice"), client(broker, "bob-on-a")
    ids = set(alice.multi_publish("a-leased", [b"1", b"2", b"3"]))
    session = alice.open_lease_session("planner")
    lease = alice.reserve(session.session_id, "a-leased", "spark", 10, msg_timeout_ms=300)
    assert lease.count == 3

    def bob_tries_everything() -> None:
        refused = denied(lambda: bob.finish_leases([lease.lease_id]))
        assert f"lease {lease.lease_id}: it belongs to another identity" in str(refused)
        denied(lambda: bob.requeue_leases([lease.lease_id]))
        denied(lambda: bob.touch_leases([lease.lease_id]))
        denied(lambda: list(bob.fetch_lease(lease.lease_id)))

    bob_tries_everything()
    depth = lambda: alice.stats("a-leased", "spark").topics[0].channels[0]   # noqa: E731
    wait_for(lambda: depth().in_flight_count == 0 and depth().depth == 3, 10,
             message="the lease to time out")
    bob_tries_everything()
    outsider = client(broker, "bob")
    denied(lambda: outsider.finish_leases([lease.lease_id]))
    assert depth().depth == 3
    assert alice.finish_leases([lease.lease_id]).count == 3    # the owner still may
    assert depth().depth == 0 and len(ids) == 3
    session.close()
    for c in (alice, bob, outsider):
        c.close()


def test_a_lease_session_is_resumed_and_reserved_into_only_by_its_owner(broker):
    alice, bob = client(broker, "alice"), client(broker, "bob-on-a")
    alice.multi_publish("a-sessions", [b"1", b"2"])
    session = alice.open_lease_session("planner", grace_ms=60_000)
    lease = alice.reserve(session.session_id, "a-sessions", "spark", 1)
    session.close()
    refused = denied(lambda: bob.open_lease_session("thief", session_id=session.session_id))
    assert f"lease session {session.session_id}: it belongs to another identity" in str(refused)
    denied(lambda: bob.reserve(session.session_id, "a-sessions", "spark", 1))
    mine = bob.open_lease_session("own")
    denied(lambda: bob.adopt_leases(mine.session_id, [lease.lease_id]))
    denied(lambda: bob.adopt_leases(session.session_id, []))
    resumed = alice.open_lease_session("planner", session_id=session.session_id)
    assert resumed.resumed and resumed.session_id == session.session_id
    assert alice.finish_leases([lease.lease_id]).count == 1
    for s in (resumed, mine):
        s.close()
    alice.close()
    bob.close()


# -- revocation: every new connection asks ---------------------------------------------

@pytest.mark.parametrize("revoked", [None, 500, b"{not json", b'{"ttl": 0}'],
                         ids=["refused", "server-error", "garbage", "invalid"])
def test_a_revoked_secret_is_refused_on_every_new_connection(broker, auth, revoked):
    auth.secrets["rotating"] = grant("^r-", "publish", identity="rotating")
    c = client(broker, "rotating")
    c.publish("r-x", b"before")
    assert http(broker, "/pub?topic=r-x", "rotating", b"before") == (200, b"OK")
    published = broker.call(lambda: broker.broker.topic("r-x").message_count)
    if revoked is None:
        del auth.secrets["rotating"]
    else:
        auth.secrets["rotating"] = revoked
    fresh = on_a_new_connection(broker, "rotating")
    with pytest.raises(ClientError) as err:
        fresh.publish("r-x", b"after")
    assert err.value.status == grpc.StatusCode.UNAUTHENTICATED
    assert str(err.value).startswith("E_AUTH_FAILED")
    assert http(broker, "/pub?topic=r-x", "rotating", b"after")[0] == 401
    raw = Raw(broker.tcp_address)
    raw.identify()
    raw.send("AUTH", b"rotating")
    assert raw.error_then_closed().startswith(b"E_AUTH_FAILED")
    assert broker.call(lambda: broker.broker.topic("r-x").message_count) == published
    for x in (c, fresh):
        x.close()


# -- producer ids are the tenant's own -------------------------------------------------

def test_one_tenant_cannot_claim_another_tenants_producer_id(broker):
    alice, bob = client(broker, "alice"), client(broker, "bob")
    bob.publish("b-squat", b"first", producer_id="writer-0", sequence=7)
    ids = alice.multi_publish("a-writes", [b"x", b"y"], producer_id="writer-0", sequence=7)
    assert alice.multi_publish("a-writes", [b"x", b"y"], producer_id="writer-0",
                               sequence=7) == ids            # her replay is still de-duplicated
    assert alice.stats("a-writes").topics[0].message_count == 2
    alice.close()
    bob.close()


@pytest.mark.parametrize("call", ["publish", "multi_publish"])
def test_a_publish_replayed_is_published_once_within_its_own_tenant_only(broker, call):
    """gRPC Publish and MultiPublish: a replayed (producer_id, sequence) answers the first
    ids and publishes nothing, the next sequence publishes, and another tenant's same
    producer id and sequence are its own (not a conflict with hers)."""
    alice, bob = client(broker, "alice"), client(broker, "bob")

    def send(c: Client, topic: str, body: bytes, sequence: int):
        if call == "publish":
            return c.publish(topic, body, producer_id=call, sequence=sequence)
        return c.multi_publish(topic, [body, body + b"!"], producer_id=call, sequence=sequence)

    per_call = 1 if call == "publish" else 2
    try:
        bobs = send(bob, f"b-{call}", b"bob's", 7)
        first = send(alice, f"a-{call}", b"one", 7)
        assert send(alice, f"a-{call}", b"one", 7) == first
        assert send(alice, f"a-{call}", b"two", 8) != first
        assert send(bob, f"b-{call}", b"bob's", 7) == bobs
        assert alice.stats(f"a-{call}").topics[0].message_count == 2 * per_call
        assert bob.stats(f"b-{call}").topics[0].message_count == per_call
    finally:
        alice.close()
        bob.close()


# -- grant regexes: linear time, searched as nsqd searches -------------------------------

def test_a_grant_regex_that_backtracks_is_answered_at_once():
    """``^(a+)+$`` against 40 a's and a b: Python's backtracking ``re`` would take
    hours (2.8 s at 26); RE2, as Go's regexp in nsqd, answers in linear time."""
    code = ("import json; from broker.security.auth import parse_reply\n"
            "s = parse_reply(json.dumps({'ttl': 1, 'authorizations': [{'topic': '^(a+)+$',"
            " 'channels': ['^(a+)+$'], 'permissions': ['subscribe']}]}), now=0)\n"
            "print(s.is_allowed('a' * 40 + 'b', 'a' * 40 + 'b'), s.is_allowed('a' * 40, 'a'))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=20)
    assert result.stdout.split() == ["False", "True"], result.stderr[-2000:]


def test_channel_regexes_are_searched_not_matched_as_nsqd_does():
    state = parse_reply(json.dumps(grant("^events$", "subscribe", identity="x",
                                         channels=("spark",))), now=0)
    assert state.is_allowed("events", "my-spark")        # found inside: Go's MatchString
    assert state.is_allowed("events", "spark-2")
    assert not state.is_allowed("events", "archive")


def test_a_regex_go_would_not_compile_is_refused():
    with pytest.raises(InvalidAuthReply, match="unable to compile topic"):
        parse_reply(json.dumps(grant("^(?=ev)events", "publish", identity="x")), now=0)


# -- DNS rebinding: the Host a request names ----------------------------------------------

def request_with_host(address: str, path: str, host: str, body: bytes | None = None
                      ) -> tuple[int, bytes]:
    request = urllib.request.Request(f"http://{address}{path}", data=body,
                                     method="POST" if body is not None else "GET",
                                     headers={"Host": host})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def test_a_loopback_listener_refuses_a_request_for_another_host():
    with EmbeddedBroker() as b:
        port = b.http_address.rpartition(":")[2]
        refused = (403, b'{"message": "HOST_NOT_ALLOWED"}')
        assert request_with_host(b.http_address, "/pub?topic=rebound", f"evil.example:{port}",
                                 b"x") == refused
        assert request_with_host(b.http_address, "/stats?format=json",
                                 f"evil.example:{port}") == refused
        assert "rebound" not in topics(b)
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", "localhost", f"[::1]:{port}",
                     f"app.localhost:{port}"):
            assert request_with_host(b.http_address, "/pub?topic=home", host, b"x") == \
                (200, b"OK"), host


def test_http_allowed_hosts_names_the_hosts_a_request_may_name():
    with EmbeddedBroker(http_allowed_hosts=("broker.internal",)) as b:
        assert request_with_host(b.http_address, "/ping", "broker.internal:4151") == \
            (200, b"OK")
        assert request_with_host(b.http_address, "/ping", "evil.example")[0] == 403


def test_a_loopback_listener_answers_to_its_broadcast_address_and_names_with_a_final_dot():
    """nsqadmin reaches a broker by the address nsqlookupd hands out (--broadcast-address);
    ``name.`` is the same host as ``name``."""
    with EmbeddedBroker(broadcast_address="pynsq-node.example") as b:
        port = b.http_address.rpartition(":")[2]
        for host in (f"pynsq-node.example:{port}", f"PYNSQ-node.example.:{port}",
                     f"localhost.:{port}"):
            assert request_with_host(b.http_address, "/ping", host) == (200, b"OK"), host
        assert request_with_host(b.http_address, "/ping", f"other.example:{port}")[0] == 403


def test_allowed_hosts_take_any_host_name_and_star_takes_every_name():
    from broker.options import Options
    from broker.security.hosts import policy

    listed = policy(Options(http_allowed_hosts=("XN--BCHER-KVA.example",)), "127.0.0.1:4151")
    assert listed.allows("xn--bcher-kva.example:4151") and not listed.allows("localhost")
    with EmbeddedBroker(http_allowed_hosts=("*",)) as b:
        assert request_with_host(b.http_address, "/ping", "anything.example") == (200, b"OK")


def test_allowed_hosts_come_from_the_flag_and_a_listener_beyond_loopback_accepts_any():
    from broker.daemon import build_parser, options_from_args
    from broker.options import Options
    from broker.security.hosts import policy

    args = build_parser().parse_args(["--http-allowed-hosts", "Broker.Internal,10.0.0.5",
                                      "--http-allowed-hosts", "[fd00::1]:4151"])
    listed = policy(options_from_args(args), "10.0.0.5:4151")
    assert [listed.allows(h) for h in ("broker.internal:80", "10.0.0.5", "[fd00::1]:4151",
                                       "localhost", "evil.example")] == \
        [True, True, True, False, False]
    assert policy(Options(), "10.0.0.5:4151").allows("anything.example")
    assert not policy(Options(), "127.0.0.1:4151").allows("anything.example")
    with pytest.raises(ValueError, match="http-allowed-hosts"):
        Options(http_allowed_hosts=("http://evil/",))
