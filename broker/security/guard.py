"""``Security``: what every listener needs to know about TLS and auth, built once
from the options by the app and handed to each server."""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from . import tls
from .auth import Authenticator, ClientAuth

if TYPE_CHECKING:
    from ..options import Options


@dataclass
class Security:
    tls_context: ssl.SSLContext | None = None
    tls_required: str = tls.NOT_REQUIRED       # false, tcp-https or true
    authenticator: Authenticator | None = None
    options: Any = None

    @classmethod
    def from_options(cls, options: "Options") -> "Security":
        """Load certificates now, so a bad file stops the broker at start (an OSError)."""
        return cls(tls.server_context(options), options.tls_required,
                   Authenticator.from_options(options), options)

    @property
    def auth_required(self) -> bool:
        return self.authenticator is not None

    def tcp_tls_required(self) -> bool:
        return self.tls_required != tls.NOT_REQUIRED

    def http_tls_required(self) -> bool:
        return self.tls_required == tls.REQUIRED

    def grpc_credentials(self) -> Any:
        return tls.grpc_server_credentials(self.options) if self.options else None

    def client_auth(self, remote_ip: str, **kwargs: Any) -> ClientAuth | None:
        if self.authenticator is None:
            return None
        return ClientAuth(self.authenticator, remote_ip, **kwargs)

    async def close(self) -> None:
        if self.authenticator is not None:
            await self.authenticator.close()
