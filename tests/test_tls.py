"""TLS with nsqd's options: gRPC with server credentials and mutual TLS, TCP upgraded
after IDENTIFY, HTTPS on its own address; wrong certificates and untrusted CAs
refused while other clients keep working; options checked at start."""

from __future__ import annotations

import json
import ssl

import pytest

from broker import BrokerUnavailable, Client, EmbeddedBroker, Options
from broker.cli import main as pynsq
from broker.security.tls import exposure_warnings

from .authserver import AuthServer, reply
from .securitykit import Raw, http, make_certs


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return make_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def tls_broker(certs):
    """TLS required on TCP and HTTP; no client certificates asked."""
    with EmbeddedBroker(tls_cert=certs.server_cert, tls_key=certs.server_key,
                        tls_required="true", https_address="127.0.0.1:0") as b:
        yield b


@pytest.fixture(scope="module")
def mtls_broker(certs):
    with EmbeddedBroker(tls_cert=certs.server_cert, tls_key=certs.server_key,
                        tls_root_ca_file=certs.ca,
                        tls_client_auth_policy="require-verify") as b:
        yield b


def test_grpc_over_tls_publishes_and_consumes_and_plain_text_is_refused(tls_broker, certs):
    client = Client(tls_broker.address, tls_ca=certs.ca, timeout=10)
    ids = client.multi_publish("t", [b"a", b"b"])
    with pytest.raises(BrokerUnavailable):
        Client(tls_broker.address, timeout=3).publish("t", b"plain")
    with client.subscribe("t", "c", rdy=5) as sub:
        got = {sub.get(10).id for _ in ids}
    assert got == set(ids)
    client.close()


def test_a_client_trusting_another_ca_is_refused_while_others_work(tls_broker, certs):
    good = Client(tls_broker.address, tls_ca=certs.ca, timeout=10)
    rogue = Client(tls_broker.address, tls_ca=certs.rogue_ca, timeout=3)
    with pytest.raises(BrokerUnavailable):
        rogue.publish("t2", b"x")
    assert good.publish("t2", b"y")
    assert good.stats("t2").topics[0].message_count == 1
    good.close()
    rogue.close()


def test_a_broker_with_a_certificate_from_an_untrusted_ca_is_refused(certs):
    with EmbeddedBroker(tls_cert=certs.rogue_server_cert, tls_key=certs.rogue_server_key) as b:
        with pytest.raises(BrokerUnavailable):
            Client(b.address, tls_ca=certs.ca, timeout=3).ping()
        raw = Raw(b.tcp_address)
        assert raw.identify(tls_v1=True)["tls_v1"] is True
        with pytest.raises(ssl.SSLCertVerificationError):
            raw.upgrade(certs.ca)


def test_mutual_tls_needs_a_client_certificate_the_ca_signed(mtls_broker, certs):
    good = Client(mtls_broker.address, tls_ca=certs.ca, tls_cert=certs.client_cert,
                  tls_key=certs.client_key, timeout=10)
    assert good.publish("m", b"x")
    for cert, key in ((None, None), (certs.rogue_client_cert, certs.rogue_client_key)):
        c = Client(mtls_broker.address, tls_ca=certs.ca, tls_cert=cert, tls_key=key,
                   timeout=3)
        with pytest.raises(BrokerUnavailable):
            c.publish("m", b"refused")
        c.close()
    assert good.publish("m", b"y")
    assert good.stats("m").topics[0].message_count == 2
    good.close()


def test_tcp_mutual_tls_upgrade_with_and_without_a_client_certificate(mtls_broker, certs):
    raw = Raw(mtls_broker.tcp_address)
    raw.identify(tls_v1=True)
    raw.upgrade(certs.ca, certs.client_cert, certs.client_key)
    raw.send("PUB m-tcp", b"over mutual tls")
    assert raw.frame() == (0, b"OK")
    anonymous = Raw(mtls_broker.tcp_address)
    anonymous.identify(tls_v1=True)
    with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
        anonymous.upgrade(certs.ca)   # TLS 1.3 reports the refusal on the first read
        anonymous.send("PUB m-tcp", b"never")
        anonymous.frame()
    raw.send("PUB m-tcp", b"still fine")
    assert raw.frame() == (0, b"OK")


def test_tcp_commands_before_the_tls_upgrade_are_refused_when_tls_is_required(tls_broker):
    raw = Raw(tls_broker.tcp_address)
    raw.send("PUB t", b"plain")
    assert raw.error_then_closed() == b"E_INVALID cannot PUB in current state (TLS required)"


def test_tcp_without_tls_v1_in_identify_stays_plain_when_tls_is_optional(certs):
    with EmbeddedBroker(tls_cert=certs.server_cert, tls_key=certs.server_key) as b:
        raw = Raw(b.tcp_address)
        assert raw.identify()["tls_v1"] is False
        raw.send("PUB t", b"plain")
        assert raw.frame() == (0, b"OK")


def test_tls_required_tcp_https_refuses_plain_tcp_and_keeps_plain_http_open(certs):
    """``--tls-required tcp-https``: TCP as with ``true``; plain HTTP serves as usual."""
    with EmbeddedBroker(tls_cert=certs.server_cert, tls_key=certs.server_key,
                        tls_required="tcp-https", https_address="127.0.0.1:0") as b:
        plain = Raw(b.tcp_address)
        plain.send("PUB tcp-https", b"plain")
        assert plain.error_then_closed() == (
            b"E_INVALID cannot PUB in current state (TLS required)")
        upgraded = Raw(b.tcp_address)
        assert upgraded.identify(tls_v1=True)["tls_v1"] is True
        upgraded.upgrade(certs.ca)
        upgraded.send("PUB tcp-https", b"over tls")
        assert upgraded.frame() == (0, b"OK")
        assert http(b, "/pub?topic=tcp-https", body=b"plain http") == (200, b"OK")
        assert http(b, "/pub?topic=tcp-https", body=b"https", ca=certs.ca,
                    address=b.https_address) == (200, b"OK")
        stats = Client(b.address, tls_ca=certs.ca, timeout=10)
        assert stats.stats("tcp-https").topics[0].message_count == 3
        stats.close()


def test_client_auth_policy_require_serves_a_client_with_a_certificate_and_refuses_one_without(
        certs):
    """``--tls-client-auth-policy require`` on live TCP and gRPC connections; it implies
    ``--tls-required``, so a TCP client that never upgrades is refused too."""
    with EmbeddedBroker(tls_cert=certs.server_cert, tls_key=certs.server_key,
                        tls_root_ca_file=certs.ca, tls_client_auth_policy="require") as b:
        with_cert = Raw(b.tcp_address)
        with_cert.identify(tls_v1=True)
        with_cert.upgrade(certs.ca, certs.client_cert, certs.client_key)
        with_cert.send("PUB require", b"with a certificate")
        assert with_cert.frame() == (0, b"OK")
        without = Raw(b.tcp_address)
        without.identify(tls_v1=True)
        with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
            without.upgrade(certs.ca)   # TLS 1.3 reports the refusal on the first read
            without.send("PUB require", b"never")
            without.frame()
        never_upgraded = Raw(b.tcp_address)
        never_upgraded.send("PUB require", b"plain")
        assert never_upgraded.error_then_closed() == (
            b"E_INVALID cannot PUB in current state (TLS required)")
        grpc_without = Client(b.address, tls_ca=certs.ca, timeout=3)
        with pytest.raises(BrokerUnavailable):
            grpc_without.publish("require", b"refused")
        grpc_without.close()
        grpc_with = Client(b.address, tls_ca=certs.ca, tls_cert=certs.client_cert,
                           tls_key=certs.client_key, timeout=10)
        assert grpc_with.publish("require", b"with a certificate over grpc")
        with_cert.send("PUB require", b"still served")
        assert with_cert.frame() == (0, b"OK")
        assert grpc_with.stats("require").topics[0].message_count == 3
        grpc_with.close()


def test_https_serves_and_plain_http_answers_tls_required(tls_broker, certs):
    status, body = http(tls_broker, "/ping")
    https_port = int(tls_broker.https_address.rpartition(":")[2])
    assert (status, json.loads(body)) == (403, {"message": "TLS_REQUIRED",
                                                "https_port": https_port})
    assert http(tls_broker, "/pub?topic=h", body=b"x", ca=certs.ca,
                address=tls_broker.https_address) == (200, b"OK")
    with pytest.raises(Exception, match="CERTIFICATE_VERIFY_FAILED"):
        http(tls_broker, "/ping", ca=certs.rogue_ca, address=tls_broker.https_address)


def test_tls_min_version_refuses_an_older_client_and_serves_a_newer_one(certs):
    import urllib.error
    import urllib.request

    with EmbeddedBroker(tls_cert=certs.server_cert, tls_key=certs.server_key,
                        https_address="127.0.0.1:0", tls_min_version="tls1.3") as b:
        assert http(b, "/ping", ca=certs.ca, address=b.https_address) == (200, b"OK")
        old = ssl.create_default_context(cafile=certs.ca)
        old.maximum_version = ssl.TLSVersion.TLSv1_2
        with pytest.raises(urllib.error.URLError, match="SSL"):
            urllib.request.urlopen(f"https://{b.https_address}/ping", timeout=10, context=old)
        assert http(b, "/ping", ca=certs.ca, address=b.https_address) == (200, b"OK")


def test_pynsq_takes_its_auth_secret_from_the_environment(certs, capsys, monkeypatch):
    with AuthServer({"cli": reply(publish="^cli$")}) as auth, \
            EmbeddedBroker(tls_cert=certs.server_cert, tls_key=certs.server_key,
                           auth_http_addresses=[auth.address]) as b:
        flags = ["--address", b.address, "--tls-ca", certs.ca]
        monkeypatch.setenv("PYNSQ_AUTH_SECRET", "cli")
        assert pynsq([*flags, "pub", "cli", "hello"]) == 0
        monkeypatch.setenv("PYNSQ_AUTH_SECRET", "wrong")
        assert pynsq([*flags, "pub", "cli", "hello"]) == 1
        assert "E_AUTH_FAILED" in capsys.readouterr().err


def test_pynsq_cli_speaks_tls_and_the_auth_secret(certs, capsys):
    with AuthServer({"cli": reply(publish="^cli$")}) as auth, \
            EmbeddedBroker(tls_cert=certs.server_cert, tls_key=certs.server_key,
                           auth_http_addresses=[auth.address]) as b:
        flags = ["--address", b.address, "--tls-ca", certs.ca]
        assert pynsq([*flags, "--auth-secret", "cli", "pub", "cli", "hello"]) == 0
        assert pynsq([*flags, "pub", "cli", "hello"]) == 1
        assert "E_AUTH_FIRST" in capsys.readouterr().err
        assert pynsq([*flags, "--auth-secret", "cli", "pub", "other", "hello"]) == 1
        assert "E_UNAUTHORIZED" in capsys.readouterr().err
        assert auth.queries[0]["tls"] == "true"


@pytest.mark.parametrize("options, problem", [
    ({"tls_required": "true"}, "cannot require TLS client connections without tls-cert"),
    ({"tls_cert": "a.pem"}, "tls-cert and tls-key go together"),
    ({"tls_required": "sometimes"}, "tls-required: expected true, false or tcp-https"),
    ({"tls_min_version": "ssl3.0", "tls_cert": "a", "tls_key": "b"}, "tls-min-version"),
    ({"tls_client_auth_policy": "maybe"}, "tls-client-auth-policy"),
    ({"tls_client_auth_policy": "require", "tls_cert": "a", "tls_key": "b"},
     "needs tls-root-ca-file"),
    ({"https_address": "127.0.0.1:0"}, "^https-address needs tls-cert and tls-key$"),
    ({"auth_http_request_method": "put"}, "must be post or get"),
])
def test_bad_security_options_are_refused_naming_the_option(options, problem):
    with pytest.raises(ValueError, match=problem):
        Options(**options)


def test_a_missing_certificate_file_stops_the_broker_at_start(tmp_path):
    with pytest.raises(OSError, match="tls-cert/tls-key"):
        EmbeddedBroker(tls_cert=str(tmp_path / "no.pem"), tls_key=str(tmp_path / "no.key"),
                       grpc_address="127.0.0.1:0").start()


def test_toml_keys_match_nsqds(tmp_path, certs):
    config = tmp_path / "pynsqd.toml"
    config.write_text(f'tls_cert = "{certs.server_cert}"\ntls_key = "{certs.server_key}"\n'
                      f'tls_required = true\ntls_min_version = "tls1.3"\n'
                      f'auth_http_addresses = ["127.0.0.1:4181"]\n')
    options = Options.from_toml(config)
    assert (options.tls_required, options.tls_min_version, options.auth_http_addresses) == (
        "true", "tls1.3", ("127.0.0.1:4181",))


def test_listening_beyond_loopback_without_tls_or_auth_is_warned_of(certs):
    assert exposure_warnings(Options()) == []
    warnings = exposure_warnings(Options(tcp_address="0.0.0.0:4150"))
    assert warnings == [
        "listening beyond loopback (--tcp-address 0.0.0.0:4150) without TLS "
        "(--tls-cert/--tls-key): traffic is plain text",
        "listening beyond loopback (--tcp-address 0.0.0.0:4150) without auth "
        "(--auth-http-address): anyone who connects may publish, consume, empty or delete"]
    named = exposure_warnings(Options(http_address="broker.example:4151"))
    assert len(named) == 2 and "(--http-address broker.example:4151)" in named[0]
    assert exposure_warnings(Options(http_address="localhost:4151")) == []
    assert exposure_warnings(Options(
        grpc_address="10.0.0.1:4170", tls_cert=certs.server_cert, tls_key=certs.server_key,
        auth_http_addresses=["127.0.0.1:4181"])) == []


def test_pynsqd_flags_take_auth_http_address_more_than_once():
    from broker.daemon import build_parser, options_from_args

    args = build_parser().parse_args(["--auth-http-address", "127.0.0.1:4181",
                                      "--auth-http-address", "http://127.0.0.1:4182/auth",
                                      "--auth-http-request-method", "POST"])
    options = options_from_args(args)
    assert options.auth_http_addresses == ("127.0.0.1:4181", "http://127.0.0.1:4182/auth")
    assert options.auth_http_request_method == "post"
