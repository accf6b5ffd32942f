"""TLS from nsqd's options: one server context for TCP (after IDENTIFY) and HTTPS,
and the gRPC server credentials.

    pynsqd --tls-cert broker.pem --tls-key broker.key \\
           --tls-root-ca-file clients-ca.pem --tls-client-auth-policy require-verify

``--tls-client-auth-policy``: empty, no client certificate is asked for;
``require`` or ``require-verify``, every client must present a certificate that
the ``--tls-root-ca-file`` authority signed (Python's ``ssl`` verifies every
certificate it asks for, so both policies verify; nsqd's ``require`` accepts any
certificate). A policy implies ``--tls-required``, as in nsqd.

``--tls-required``: ``false``; ``true`` (TCP commands other than IDENTIFY are
refused until the connection is upgraded, and the plain HTTP listener answers
403 ``TLS_REQUIRED``); ``tcp-https`` (the same on TCP, plain HTTP stays open).
gRPC speaks TLS whenever a certificate is configured (one port cannot offer both).
"""

from __future__ import annotations

import ssl
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..options import Options

TLS_VERSIONS = {
    "tls1.0": ssl.TLSVersion.TLSv1,
    "tls1.1": ssl.TLSVersion.TLSv1_1,
    "tls1.2": ssl.TLSVersion.TLSv1_2,
    "tls1.3": ssl.TLSVersion.TLSv1_3,
}
CLIENT_AUTH_POLICIES = ("", "require", "require-verify")
NOT_REQUIRED, REQUIRED_EXCEPT_HTTP, REQUIRED = "false", "tcp-https", "true"
_TRUE = ("true", "1", "t", "yes")
_FALSE = ("false", "0", "f", "no", "")


def _tls_required(value: Any) -> str:
    if isinstance(value, bool):
        return REQUIRED if value else NOT_REQUIRED
    text = str(value).strip().lower()
    if text == REQUIRED_EXCEPT_HTTP:
        return text
    if text in _TRUE:
        return REQUIRED
    if text in _FALSE:
        return NOT_REQUIRED
    raise ValueError(f"tls-required: expected true, false or tcp-https, got {value!r}")


def check_options(options: "Options") -> None:
    """Normalise and check the TLS and auth options; a ValueError names the option."""
    options.tls_required = _tls_required(options.tls_required)
    if options.tls_client_auth_policy not in CLIENT_AUTH_POLICIES:
        raise ValueError(f"tls-client-auth-policy: expected require or require-verify, "
                         f"got {options.tls_client_auth_policy!r}")
    if options.tls_min_version.lower() not in TLS_VERSIONS:
        raise ValueError(f"tls-min-version: expected one of {', '.join(TLS_VERSIONS)}, "
                         f"got {options.tls_min_version!r}")
    if bool(options.tls_cert) != bool(options.tls_key):
        raise ValueError("tls-cert and tls-key go together: give both or neither")
    if options.tls_client_auth_policy and options.tls_required == NOT_REQUIRED:
        options.tls_required = REQUIRED  # as nsqd: asking for client certificates means TLS
    if options.tls_required != NOT_REQUIRED and not options.tls_cert:
        raise ValueError("cannot require TLS client connections without tls-cert and tls-key")
    if options.https_address and not options.tls_cert:
        raise ValueError("https-address needs tls-cert and tls-key")
    if options.tls_client_auth_policy and not options.tls_root_ca_file:
        raise ValueError("tls-client-auth-policy needs tls-root-ca-file: the authority "
                         "that signs client certificates")
    if options.auth_http_request_method.lower() not in ("get", "post"):
        raise ValueError("auth-http-request-method must be post or get")
    options.auth_http_request_method = options.auth_http_request_method.lower()
    addresses = options.auth_http_addresses
    options.auth_http_addresses = tuple(
        a for a in ((addresses,) if isinstance(addresses, str) else addresses) if a)


def tls_enabled(options: "Options") -> bool:
    return bool(options.tls_cert)


def server_context(options: "Options") -> ssl.SSLContext | None:
    """The broker's TLS context for TCP and HTTPS, or None without a certificate.

    Raises OSError (``ssl.SSLError`` is one) naming the file that cannot be used.
    """
    if not options.tls_cert:
        return None
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = TLS_VERSIONS[options.tls_min_version.lower()]
    try:
        ctx.load_cert_chain(options.tls_cert, options.tls_key)
    except (OSError, ssl.SSLError) as err:
        raise OSError(f"tls-cert/tls-key: cannot load {options.tls_cert} with "
                      f"{options.tls_key}: {err}") from None
    if options.tls_root_ca_file:
        try:
            ctx.load_verify_locations(cafile=options.tls_root_ca_file)
        except (OSError, ssl.SSLError) as err:
            raise OSError(f"tls-root-ca-file: cannot load {options.tls_root_ca_file}: "
                          f"{err}") from None
    ctx.verify_mode = (ssl.CERT_REQUIRED if options.tls_client_auth_policy
                       else ssl.CERT_NONE)
    return ctx


def grpc_server_credentials(options: "Options") -> Any:
    """``grpc.ServerCredentials`` for the gRPC listener, or None without a certificate.

    Mutual TLS when a client auth policy is set. gRPC itself refuses anything
    older than TLS 1.2.
    """
    if not options.tls_cert:
        return None
    import grpc

    try:
        with open(options.tls_key, "rb") as f:
            key = f.read()
        with open(options.tls_cert, "rb") as f:
            cert = f.read()
        roots = None
        if options.tls_root_ca_file:
            with open(options.tls_root_ca_file, "rb") as f:
                roots = f.read()
    except OSError as err:
        raise OSError(f"TLS file {err.filename}: {err.strerror}") from None
    return grpc.ssl_server_credentials(
        [(key, cert)], root_certificates=roots,
        require_client_auth=bool(options.tls_client_auth_policy))


def peer_common_name(ssl_object: Any) -> str:
    """The subject common name of the peer's certificate, or "" (nsqd's ``common_name``)."""
    if ssl_object is None:
        return ""
    cert = ssl_object.getpeercert()
    for rdn in (cert or {}).get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return value
    return ""


def is_loopback(address: str) -> bool:
    """True for an address only this machine can reach (``127.x``, ``::1``, ``localhost``)."""
    import ipaddress

    host = address.rpartition(":")[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def exposure_warnings(options: "Options") -> list[str]:
    """What a daemon should warn of at start: listeners others can reach, in plain
    text or open to anyone."""
    listeners = {"grpc-address": options.grpc_address, "tcp-address": options.tcp_address,
                 "http-address": options.http_address, "https-address": options.https_address}
    exposed = [f"--{flag} {address}" for flag, address in listeners.items()
               if address and not is_loopback(address)]
    if not exposed:
        return []
    missing = []
    if not options.tls_cert:
        missing.append("without TLS (--tls-cert/--tls-key): traffic is plain text")
    if not options.auth_http_addresses:
        missing.append("without auth (--auth-http-address): anyone who connects may "
                       "publish, consume, empty or delete")
    return [f"listening beyond loopback ({', '.join(exposed)}) {m}" for m in missing]
