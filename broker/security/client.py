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


# -- the Spark source's and writers' options ----------------------------------

SPARK_OPTIONS = ("tlsCaFile", "tlsCertFile", "tlsKeyFile", "authSecret")


class ClientSecurity:
    """TLS files and auth secret a client needs, shipped to Spark executors with the
    options. The secret is never shown: not in ``repr``, logs, plans or errors."""

    __slots__ = ("tls_ca", "tls_cert", "tls_key", "_secret")

    def __init__(self, tls_ca: str | None = None, tls_cert: str | None = None,
                 tls_key: str | None = None, auth_secret: str | None = None) -> None:
        if bool(tls_cert) != bool(tls_key):
            raise ValueError("options tlsCertFile and tlsKeyFile go together: give both "
                             "or neither")
        self.tls_ca, self.tls_cert, self.tls_key = tls_ca or None, tls_cert or None, \
            tls_key or None
        self._secret = auth_secret or None

    @classmethod
    def from_options(cls, given: dict[str, str]) -> "ClientSecurity":
        """From Spark options whose names were lowered (``tlscafile``, ...)."""
        return cls(given.get("tlscafile"), given.get("tlscertfile"), given.get("tlskeyfile"),
                   given.get("authsecret"))

    def client_kwargs(self) -> dict[str, str | None]:
        """Keyword arguments of ``broker.Client``."""
        return {"tls_ca": self.tls_ca, "tls_cert": self.tls_cert, "tls_key": self.tls_key,
                "auth_secret": self._secret}

    def __getstate__(self) -> tuple:
        return (self.tls_ca, self.tls_cert, self.tls_key, self._secret)

    def __setstate__(self, state: tuple) -> None:
        self.tls_ca, self.tls_cert, self.tls_key, self._secret = state

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ClientSecurity) and self.__getstate__() == other.__getstate__()

    def __hash__(self) -> int:
        return hash(self.__getstate__())

    def __repr__(self) -> str:
        secret = "'***'" if self._secret else "None"
        return (f"ClientSecurity(tls_ca={self.tls_ca!r}, tls_cert={self.tls_cert!r}, "
                f"tls_key={self.tls_key!r}, auth_secret={secret})")
