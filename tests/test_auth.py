"""NSQ's auth protocol: the answer's rules (pure), then a TLS + auth broker asking a
real auth server over HTTP, refusing with nsqd's codes on TCP, gRPC and HTTP
while other clients keep working; NSQ's own clients (pynsq, gnsq) with
``tls_v1`` and ``auth_secret``."""

from __future__ import annotations

import asyncio
import json
import struct
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from broker import Client, ClientError, EmbeddedBroker
from broker import columns
from broker.api import broker_pb2 as pb
from broker.options import Options
from broker.security.auth import (AuthError, Authenticator, AuthFailed, ClientAuth, Identity,
                                  InvalidAuthReply, auth_url, parse_reply)

from .authserver import AuthServer, reply
from .securitykit import CLIENT_NAME, Raw, http, make_certs

CLIENTS = Path(__file__).parent / "clients"

SECRETS = {
    "writer": reply(publish="^sec"),
    "reader": reply(subscribe="^sec", channels=("^ok$",)),
    "admin": {"ttl": 3600, "identity": "admin", "authorizations": [
        {"topic": ".*", "channels": [".*"], "permissions": ["publish", "subscribe"]}]},
    "nothing": {"ttl": 3600, "authorizations": []},
}


# -- the answer's rules, as nsqd applies them ----------------------------------

def test_publish_needs_publish_and_a_channel_regex_found_in_the_empty_channel():
    state = parse_reply(json.dumps(reply(publish="vent")), now=0)
    assert state.is_allowed("events")               # a search, not a full match
    assert not state.is_allowed("metrics")
    assert not state.is_allowed("events", "archive")  # no subscribe permission
    narrow = parse_reply(json.dumps(reply(publish=".*", channels=("^a$",))), now=0)
    assert not narrow.is_allowed("events")          # "^a$" is not found in ""


def test_subscribe_needs_subscribe_and_both_regexes():
    state = parse_reply(json.dumps(reply(subscribe="^events$", channels=("^arch",))), now=0)
    assert state.is_allowed("events", "archive")
    assert not state.is_allowed("events", "other")
    assert not state.is_allowed("events2", "archive")
    assert not state.is_allowed("events")           # publishing needs publish
    inside = parse_reply(json.dumps(reply(subscribe="vent", channels=("rch",))), now=0)
    assert inside.is_allowed("events", "archive")   # both regexes searched, not matched
    assert not inside.is_allowed("events", "spark")


@pytest.mark.parametrize("doc, problem", [
    ({"ttl": 60, "authorizations": [{"topic": ".*", "channels": [".*"],
                                     "permissions": ["delete"]}]}, "unknown permission delete"),
    ({"ttl": 60, "authorizations": [{"topic": "(", "channels": [],
                                     "permissions": ["publish"]}]}, "unable to compile topic"),
    ({"ttl": 60, "authorizations": [{"topic": ".*", "channels": ["[a"],
                                     "permissions": ["publish"]}]}, "unable to compile channel"),
    ({"ttl": 60, "authorizations": [{"topic": 5, "channels": [],
                                     "permissions": ["publish"]}]},
     "unable to compile topic 5: not a string"),
    ({"ttl": 0, "authorizations": []}, "invalid TTL 0"),
    ({"authorizations": []}, "invalid TTL"),
])
def test_an_answer_breaking_nsqds_rules_is_refused_naming_why(doc, problem):
    with pytest.raises(InvalidAuthReply, match=problem):
        parse_reply(json.dumps(doc), now=0)


def test_an_answer_keeps_its_identity_and_a_missing_topic_regex_is_nsqds_empty_one():
    doc = {"ttl": 60, "identity": "alice", "identity_url": "http://id/alice",
           "authorizations": [{"channels": [".*"], "permissions": ["publish"]}]}
    state = parse_reply(json.dumps(doc), now=0)
    assert (state.identity, state.identity_url) == ("alice", "http://id/alice")
    assert state.is_allowed("any-topic")            # "" is found in every name
    assert parse_reply(json.dumps({"ttl": 60}), now=0).identity == ""


def test_auth_addresses_are_host_port_or_a_full_url_and_the_method_is_the_options():
    assert auth_url("127.0.0.1:4181") == "http://127.0.0.1:4181/auth"
    assert auth_url("https://auth.example/check") == "https://auth.example/check"
    options = Options(auth_http_addresses=("127.0.0.1:4181",), auth_http_request_method="POST")
    assert Authenticator.from_options(options).method == "post"


def test_a_connection_keeps_its_answer_for_its_ttl_and_every_auth_asks_again():
    now = [100.0]
    with AuthServer({"s": reply(publish=".*", ttl=30)}) as auth:
        authn = Authenticator([auth.address], clock=lambda: now[0])

        async def connect_twice() -> None:
            first = ClientAuth(authn, "127.0.0.1")
            await first.auth("s")
            now[0] += 29
            assert not first.needs_query()     # within the ttl: kept by the connection
            second = ClientAuth(authn, "127.0.0.1")
            await second.auth("s")             # another AUTH: asked, nothing shared
            now[0] += 2
            assert first.needs_query()         # the ttl ran out: asked again
            await first.refresh()
            await authn.close()

        asyncio.run(connect_twice())
        assert len(auth.queries) == 3
        assert auth.queries[0] == {"remote_ip": "127.0.0.1", "tls": "false", "secret": "s",
                                   "common_name": "", "method": "GET"}


def test_post_method_and_a_failing_first_server_still_authenticate():
    with AuthServer({"s": reply(publish=".*")}) as auth:
        authn = Authenticator(["127.0.0.1:1", auth.address], method="post")

        async def ask() -> None:
            for _ in range(4):   # whichever server is tried first
                assert (await authn.query(Identity("127.0.0.1", True, "s"))).is_allowed("t")
            with pytest.raises(AuthFailed):
                await authn.query(Identity("127.0.0.1", True, "wrong"))
            await authn.close()

        asyncio.run(ask())
        assert {q["method"] for q in auth.queries} == {"POST"}


# -- a TLS + auth broker ---------------------------------------------------------

@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return make_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def auth_server():
    with AuthServer(SECRETS) as auth:
        yield auth


@pytest.fixture(scope="module")
def secure(certs, auth_server):
    """TLS (no client certificates asked) and auth; TCP may upgrade or stay plain."""
    with EmbeddedBroker(tls_cert=certs.server_cert, tls_key=certs.server_key,
                        auth_http_addresses=[auth_server.address],
                        https_address="127.0.0.1:0") as b:
        yield b


def client(broker, certs, secret=None) -> Client:
    return Client(broker.address, tls_ca=certs.ca, auth_secret=secret, timeout=10)


def test_identify_says_auth_required_and_tls_then_auth_then_publish(secure, certs,
                                                                   auth_server):
    raw = Raw(secure.tcp_address)
    features = raw.identify(tls_v1=True)
    assert features["auth_required"] is True and features["tls_v1"] is True
    raw.upgrade(certs.ca)
    raw.send("AUTH", b"writer")
    kind, data = raw.frame()
    assert kind == 0 and json.loads(data)["permission_count"] == 1
    raw.send("PUB sec-tcp", b"hello")
    assert raw.frame() == (0, b"OK")
    asked = [q for q in auth_server.queries if q["secret"] == "writer"]
    assert asked and asked[-1]["tls"] == "true" and asked[-1]["remote_ip"] == "127.0.0.1"


@pytest.mark.parametrize("secret, line, body, code", [
    (None, "PUB sec-x", b"m", b"E_AUTH_FIRST"),
    (None, "SUB sec-x ok", None, b"E_AUTH_FIRST"),
    ("wrong", None, None, b"E_AUTH_FAILED"),
    ("nothing", None, None, b"E_UNAUTHORIZED AUTH no authorizations found"),
    ("writer", "PUB elsewhere", b"m", b"E_UNAUTHORIZED"),
    ("writer", "SUB sec-x ok", None, b"E_UNAUTHORIZED"),
    ("reader", "SUB sec-x other", None, b"E_UNAUTHORIZED"),
    ("reader", "MPUB sec-x", struct.pack(">ii", 1, 1) + b"m",
     b"E_UNAUTHORIZED AUTH failed for MPUB on 'sec-x'"),
    ("reader", "DPUB sec-x 10", b"m", b"E_UNAUTHORIZED AUTH failed for DPUB on 'sec-x'"),
])
def test_tcp_refusals_carry_nsqds_code_and_others_keep_publishing(secure, certs, secret,
                                                                  line, body, code):
    good = Raw(secure.tcp_address)
    good.identify()
    good.send("AUTH", b"writer")
    good.frame()
    raw = Raw(secure.tcp_address)
    raw.identify()
    if secret is not None:
        raw.send("AUTH", secret.encode())
        if line is not None:
            assert raw.frame()[0] == 0
    if line is not None:
        raw.send(line, body)
    assert raw.error_then_closed().startswith(code)
    good.send("PUB sec-still", b"after")
    assert good.frame() == (0, b"OK")


def test_grpc_refusals_carry_nsqds_code_and_status(secure, certs):
    cases = [(None, "Publish", grpc.StatusCode.UNAUTHENTICATED, "E_AUTH_FIRST"),
             ("wrong", "Publish", grpc.StatusCode.UNAUTHENTICATED, "E_AUTH_FAILED"),
             ("writer", "PublishElsewhere", grpc.StatusCode.PERMISSION_DENIED, "E_UNAUTHORIZED"),
             ("writer", "Stats", None, None),
             ("reader", "Publish", grpc.StatusCode.PERMISSION_DENIED, "E_UNAUTHORIZED"),
             ("reader", "DeleteTopic", grpc.StatusCode.PERMISSION_DENIED, "E_UNAUTHORIZED"),
             ("writer", "EmptyChannel", grpc.StatusCode.PERMISSION_DENIED, "E_UNAUTHORIZED"),
             ("nothing", "Stats", grpc.StatusCode.PERMISSION_DENIED, "E_UNAUTHORIZED"),
             (None, "Stats", grpc.StatusCode.UNAUTHENTICATED, "E_AUTH_FIRST")]
    good = client(secure, certs, "admin")
    published = []
    for secret, call, status, code in cases:
        c = client(secure, certs, secret)
        act = {"Publish": lambda: c.publish("sec-g", b"x"),
               "PublishElsewhere": lambda: c.publish("other", b"x"),
               "Stats": lambda: c.stats(),
               "DeleteTopic": lambda: c.admin("topic", "delete", "sec-g"),
               "EmptyChannel": lambda: c.admin("channel", "empty", "sec-g", "ok")}[call]
        if status is None:
            act()
        else:
            with pytest.raises(ClientError) as err:
                act()
            assert err.value.status == status and str(err.value).startswith(code), (secret, call)
            # the code also comes as pynsq-error-code, so the client raises the auth error
            assert isinstance(err.value, AuthError) and err.value.code == code, (secret, call)
        published.append(good.publish("sec-g", f"m{len(published)}"))
        c.close()
    assert good.ping() == "OK"
    assert len(set(published)) == len(cases)
    assert good.stats("sec-g").topics[0].message_count == len(cases)
    good.close()


def test_grpc_subscribe_needs_subscribe_on_the_channel(secure, certs):
    writer, reader = client(secure, certs, "writer"), client(secure, certs, "reader")
    ids = writer.multi_publish("sec-sub", [b"a", b"b", b"c"])
    with pytest.raises(ClientError) as err:
        writer.subscribe("sec-sub", "ok")
    assert err.value.status == grpc.StatusCode.PERMISSION_DENIED
    with pytest.raises(ClientError, match="E_UNAUTHORIZED"):
        reader.subscribe("sec-sub", "other")
    got = set()
    with reader.subscribe("sec-sub", "ok", rdy=10) as sub:
        while len(got) < 3:
            msg = sub.get(10)
            assert msg is not None
            got.add(msg.id)
            sub.fin(msg.id)
    assert got == set(ids)
    writer.close()
    reader.close()


def test_lease_calls_of_the_spark_source_need_subscribe(secure, certs):
    writer, reader = client(secure, certs, "writer"), client(secure, certs, "reader")
    ids = set(writer.multi_publish("sec-lease", [b"1", b"2", b"3", b"4"]))
    events = reader.stub.OpenLeaseSession(pb.LeaseSessionRequest(client_id="planner"))
    session = next(events).session_id
    with pytest.raises(grpc.RpcError) as err:
        writer.stub.Reserve(pb.ReserveRequest(session_id=session, topic="sec-lease",
                                              channel="ok", max_messages=10))
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    lease = reader.stub.Reserve(pb.ReserveRequest(session_id=session, topic="sec-lease",
                                                  channel="ok", max_messages=10))
    assert lease.count == 4
    for denied in (lambda: list(writer.stub.FetchLease(pb.FetchLeaseRequest(
                       lease_id=lease.lease_id, partition=0, num_partitions=1))),
                   lambda: writer.stub.FinishLeases(pb.LeaseRequest(
                       lease_ids=[lease.lease_id]))):
        with pytest.raises(grpc.RpcError) as err:
            denied()
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    frames = list(reader.stub.FetchLease(pb.FetchLeaseRequest(
        lease_id=lease.lease_id, partition=0, num_partitions=1)))
    assert {row[0] for f in frames for row in columns.decode(f)} == ids
    assert reader.stub.FinishLeases(pb.LeaseRequest(lease_ids=[lease.lease_id])).count == 4
    events.cancel()
    writer.close()
    reader.close()


def test_http_publish_and_admin_are_authorised_and_ping_is_open(secure, certs):
    assert http(secure, "/ping") == (200, b"OK")
    assert http(secure, "/pub?topic=sec-h", body=b"x") == (401, b'{"message": "E_AUTH_FIRST"}')
    assert http(secure, "/pub?topic=sec-h", "wrong", b"x")[0] == 401
    assert http(secure, "/pub?topic=other", "writer", b"x") == (
        403, b'{"message": "E_UNAUTHORIZED"}')
    assert http(secure, "/channel/empty?topic=sec-h&channel=ok", "writer", b"")[0] == 403
    assert http(secure, "/stats", None)[0] == 401
    assert http(secure, "/pub?topic=sec-h", "writer", b"x") == (200, b"OK")
    https = secure.app.https_address
    assert http(secure, "/mpub?topic=sec-h", "writer", b"y\nz", ca=certs.ca,
                address=https) == (200, b"OK")
    status, stats = http(secure, "/stats?format=json&topic=sec-h", "admin")
    assert status == 200 and json.loads(stats)["topics"][0]["message_count"] == 3


def run(script: str, *args: str) -> object:
    result = subprocess.run([sys.executable, str(CLIENTS / script), *args],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_pynsq_writer_and_reader_over_tls_with_auth_secret(secure, certs):
    admin = client(secure, certs, "admin")
    admin.admin("channel", "create", "sec-pynsq", "ok")
    assert run("pynsq_secure.py", "publish", secure.tcp_address, certs.ca, "writer",
               "sec-pynsq", "10") == ["OK", "OK"]
    seen = run("pynsq_secure.py", "consume", secure.tcp_address, certs.ca, "reader",
               "sec-pynsq", "ok", "10")
    assert sorted(seen.values()) == sorted(f"p-{i}" for i in range(10))
    assert len(seen) == 10
    refused = run("pynsq_secure.py", "refused", secure.tcp_address, certs.ca, "reader",
                  "sec-pynsq")
    assert "E_UNAUTHORIZED" in refused[0]
    admin.close()


def test_gnsq_producer_and_consumer_over_tls_with_auth_secret(secure, certs):
    admin = client(secure, certs, "admin")
    admin.admin("channel", "create", "sec-gnsq", "ok")
    assert run("gnsq_secure.py", "produce", secure.tcp_address, certs.ca, "writer",
               "sec-gnsq", "6") == "ok"
    seen = run("gnsq_secure.py", "consume", secure.tcp_address, certs.ca, "reader",
               "sec-gnsq", "ok", "6")
    assert sorted(seen.values()) == sorted(f"g-{i}" for i in range(6))
    admin.close()


def test_client_certificate_common_name_reaches_the_auth_server(certs):
    with AuthServer({"cn": reply(publish=".*")}) as auth, \
            EmbeddedBroker(tls_cert=certs.server_cert, tls_key=certs.server_key,
                           tls_root_ca_file=certs.ca, tls_client_auth_policy="require-verify",
                           auth_http_addresses=[auth.address]) as b:
        c = Client(b.address, tls_ca=certs.ca, tls_cert=certs.client_cert,
                   tls_key=certs.client_key, auth_secret="cn", timeout=10)
        c.publish("t", b"x")
        raw = Raw(b.tcp_address)
        raw.identify(tls_v1=True)
        raw.upgrade(certs.ca, certs.client_cert, certs.client_key)
        raw.send("AUTH", b"cn")
        assert raw.frame()[0] == 0
        c.close()
        assert [(q["tls"], q["common_name"]) for q in auth.queries] == \
            [("true", CLIENT_NAME)] * len(auth.queries)
        assert auth.queries


def test_the_spark_options_tls_files_and_secret_make_a_client_and_the_secret_is_never_shown(
        certs):
    import pickle

    from broker.security.client import ClientSecurity

    security = ClientSecurity.from_options({
        "tlscafile": certs.ca, "tlscertfile": certs.client_cert,
        "tlskeyfile": certs.client_key, "authsecret": "s3cret"})
    assert security.client_kwargs() == {"tls_ca": certs.ca, "tls_cert": certs.client_cert,
                                        "tls_key": certs.client_key, "auth_secret": "s3cret"}
    assert "s3cret" not in repr(security) and "auth_secret='***'" in repr(security)
    assert repr(ClientSecurity()) == ("ClientSecurity(tls_ca=None, tls_cert=None, "
                                      "tls_key=None, auth_secret=None)")
    shipped = pickle.loads(pickle.dumps(security))     # as Spark ships it to executors
    assert shipped == security and hash(shipped) == hash(security)
    assert shipped != ClientSecurity(tls_ca=certs.ca)
    with pytest.raises(ValueError, match="tlsCertFile and tlsKeyFile go together"):
        ClientSecurity(tls_cert=certs.client_cert)
    with AuthServer({"s3cret": reply(publish=".*")}) as auth, \
            EmbeddedBroker(tls_cert=certs.server_cert, tls_key=certs.server_key,
                           tls_root_ca_file=certs.ca, tls_client_auth_policy="require-verify",
                           auth_http_addresses=[auth.address]) as b, \
            Client(b.address, timeout=10, **shipped.client_kwargs()) as c:
        assert c.publish("t", b"x")
        assert [(q["secret"], q["common_name"]) for q in auth.queries] == [("s3cret",
                                                                            CLIENT_NAME)]


def test_https_asks_the_auth_server_once_per_connection_with_tls_and_the_common_name(certs):
    import http.client
    import ssl

    with AuthServer({"cn": reply(publish=".*")}) as auth, \
            EmbeddedBroker(tls_cert=certs.server_cert, tls_key=certs.server_key,
                           tls_root_ca_file=certs.ca, tls_client_auth_policy="require-verify",
                           https_address="127.0.0.1:0", auth_http_addresses=[auth.address]) as b:
        context = ssl.create_default_context(cafile=certs.ca)
        context.load_cert_chain(certs.client_cert, certs.client_key)
        host, port = b.https_address.rsplit(":", 1)
        connection = http.client.HTTPSConnection(host, int(port), context=context, timeout=10)
        try:
            for body in (b"one", b"two", b"three"):   # one keep-alive connection
                connection.request("POST", "/pub?topic=t", body=body,
                                   headers={"Authorization": "Bearer cn"})
                answer = connection.getresponse()
                assert (answer.status, answer.read()) == (200, b"OK")
        finally:
            connection.close()
        assert [(q["secret"], q["tls"], q["common_name"]) for q in auth.queries] == [
            ("cn", "true", CLIENT_NAME)]
        assert b.call(lambda: b.broker.topic("t").message_count) == 3


def test_tcp_asks_again_when_the_ttl_runs_out_and_a_revoked_secret_is_refused():
    now = [1000.0]
    secrets = {"rotating": reply(publish=".*", ttl=60)}
    with AuthServer(secrets) as auth, \
            EmbeddedBroker(auth_http_addresses=[auth.address]) as b:
        b.app.security.authenticator.clock = lambda: now[0]
        raw, other = Raw(b.tcp_address), Raw(b.tcp_address)
        for conn in (raw, other):
            conn.identify()
        raw.send("AUTH", b"rotating")
        assert raw.frame()[0] == 0
        now[0] += 61
        raw.send("PUB t", b"asked again, still valid")
        assert raw.frame() == (0, b"OK")
        del secrets["rotating"]             # revoked at the auth server
        raw.send("PUB t", b"cached answer")
        assert raw.frame() == (0, b"OK")    # within the ttl: not asked again
        now[0] += 61
        raw.send("PUB t", b"asked again, revoked")
        assert raw.error_then_closed() == b"E_AUTH_FAILED AUTH failed"
        assert len(auth.queries) == 3
        other.send("PUB t", b"x")
        assert other.error_then_closed().startswith(b"E_AUTH_FIRST")
        assert b.call(lambda: b.broker.topic("t").message_count) == 2
