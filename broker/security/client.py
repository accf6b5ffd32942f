"""The client side: a gRPC channel with TLS (a CA to trust, optionally a client
certificate for mutual TLS) and the auth secret sent on every call as
``authorization: Bearer <secret>``.

    channel = client_channel("broker.example:4170", options, tls_ca="ca.pem",
                             tls_cert="me.pem", tls_key="me.key", auth_secret="s3cret")
"""

from __future__ import annotations

from typing import Any, Sequence

import grpc

from .grpc_auth import METADATA_KEY, SCHEME


def _read(path: str, what: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as err:
        raise ValueError(f"{what}: cannot read {path}: {err.strerror}") from None


def channel_credentials(tls_ca: str | None = None, tls_cert: str | None = None,
                        tls_key: str | None = None) -> grpc.ChannelCredentials | None:
    """TLS credentials, or None for plain text (no TLS option given)."""
    if not (tls_ca or tls_cert or tls_key):
        return None
    if bool(tls_cert) != bool(tls_key):
        raise ValueError("tls_cert and tls_key go together: give both or neither")
    return grpc.ssl_channel_credentials(
        root_certificates=_read(tls_ca, "tls_ca") if tls_ca else None,
        private_key=_read(tls_key, "tls_key") if tls_key else None,
        certificate_chain=_read(tls_cert, "tls_cert") if tls_cert else None)


class _SecretInterceptor(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
                         grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    """Adds the secret to every call's metadata (works on plain and TLS channels)."""

    def __init__(self, secret: str) -> None:
        self._metadata = (METADATA_KEY, SCHEME + secret)

    def _details(self, details: Any) -> Any:
        metadata = list(details.metadata or ()) + [self._metadata]
        return details._replace(metadata=metadata) if hasattr(details, "_replace") \
            else _Details(details, metadata)

    def intercept_unary_unary(self, continuation, details, request):
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation, details, request):
        return continuation(self._details(details), request)

    def intercept_stream_unary(self, continuation, details, requests):
        return continuation(self._details(details), requests)

    def intercept_stream_stream(self, continuation, details, requests):
        return continuation(self._details(details), requests)


class _Details(grpc.ClientCallDetails):
    def __init__(self, details: Any, metadata: list) -> None:
        self.method = details.method
        self.timeout = details.timeout
        self.metadata = metadata
        self.credentials = details.credentials
        self.wait_for_ready = getattr(details, "wait_for_ready", None)
        self.compression = getattr(details, "compression", None)


def client_channel(address: str, options: Sequence[tuple[str, Any]] = (), *,
                   tls_ca: str | None = None, tls_cert: str | None = None,
                   tls_key: str | None = None, auth_secret: str | None = None) -> grpc.Channel:
    """A gRPC channel to ``address``: TLS when any TLS file is given, secret on every call."""
    credentials = channel_credentials(tls_ca, tls_cert, tls_key)
    channel = (grpc.secure_channel(address, credentials, options=list(options)) if credentials
               else grpc.insecure_channel(address, options=list(options)))
    if auth_secret:
        channel = grpc.intercept_channel(channel, _SecretInterceptor(auth_secret))
    return channel
