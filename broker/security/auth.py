"""NSQ's auth protocol: the broker asks an auth server what a secret may do.

With ``--auth-http-address`` (repeatable; ``host:port`` or a full URL) the broker
asks one of the servers, starting at a random one and trying the others when one
fails, ``GET /auth?remote_ip=&tls=&secret=&common_name=`` (``POST`` of the same
form with ``--auth-http-request-method post``). The answer, nsqd's::

    {"ttl": 3600, "identity": "...", "identity_url": "...",
     "authorizations": [{"topic": "^events$", "channels": [".*"],
                         "permissions": ["subscribe", "publish"]}]}

is valid when every permission is ``publish`` or ``subscribe``, every regex
compiles and ``ttl > 0``. A client may publish to a topic when an authorisation with
``publish`` has a topic regex found in the topic name and a channel regex found in ""
(so ``.*``), and may subscribe to a channel when one with ``subscribe`` has regexes
found in both: Go's ``MatchString`` is a search, and the regexes are RE2's (Go's
syntax, linear time: a grant cannot stall the broker by backtracking).

Revocation as nsqd: every AUTH asks the auth servers; nothing is shared between
connections. The answer is kept by the connection that asked (``ClientAuth``) for
its ``ttl``, then asked again; an auth server that refuses, fails (not 200) or
answers what breaks these rules refuses the client.

The auth servers are a dependency the broker bounds (``docs/threat-model.md``): at
most ``AUTH_CONNECTIONS`` queries are asked at once (one connection each), and a
query waits at most the request timeout for its turn, apart from the connect timeout
(``--http-client-connect-timeout``) and the request timeout
(``--http-client-request-timeout``) it then has; one client address may have at most
``MAX_PENDING_PER_ADDRESS`` queries pending, and one more is refused at once, so a
secret the auth server is slow to answer delays only the clients that send it. An
answer is read up to ``MAX_REPLY_BYTES`` and must name at most ``MAX_AUTHORIZATIONS``
authorizations, ``MAX_REGEXES`` regexes in all, and an identity (and identity URL) of
at most ``MAX_IDENTITY_LENGTH`` characters: anything larger is refused as invalid, so
parsing one costs the event loop a bounded time.

Errors, nsqd's codes: ``AuthFirst`` (E_AUTH_FIRST, no secret given),
``AuthFailed`` (E_AUTH_FAILED, the auth servers refused the secret or could not
be asked; the reason is logged, never sent to the client), ``Unauthorized``
(E_UNAUTHORIZED, valid secret, not for this topic or channel).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import random
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable
from urllib.parse import quote, quote_plus

import re2

from ..errors import BrokerError

if TYPE_CHECKING:
    from ..options import Options

log = logging.getLogger("pynsqd")

PERMISSIONS = ("publish", "subscribe")

#: Queries to the auth servers asked at once (each holds a connection, a descriptor).
AUTH_CONNECTIONS = 256
#: Queries pending at once for one client address; one more is refused at once.
MAX_PENDING_PER_ADDRESS = 32
#: The largest answer read from an auth server.
MAX_REPLY_BYTES = 1 << 20
#: Authorizations, and regexes in all of them (topic and channels), in one answer.
MAX_AUTHORIZATIONS = 1024
MAX_REGEXES = 4096
#: The longest identity (and identity URL) an answer may give: it names the client in
#: the broker's log, /stats and the AUTH reply.
MAX_IDENTITY_LENGTH = 1024

_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False     # a bad regex is the auth server's error, answered once


class AuthError(BrokerError):
    """A client refused by the auth rules; ``code`` is nsqd's."""

    code = "E_AUTH_FAILED"


class AuthFirst(AuthError):
    """No secret was given, and the broker requires one."""

    code = "E_AUTH_FIRST"


class AuthFailed(AuthError):
    """The auth servers did not accept the secret (or could not be asked)."""

    code = "E_AUTH_FAILED"


class Unauthorized(AuthError):
    """The secret is valid but does not allow this topic or channel."""

    code = "E_UNAUTHORIZED"


class InvalidAuthReply(ValueError):
    """An auth server's answer that breaks nsqd's rules."""


@dataclass(frozen=True)
class Authorization:
    topic: Any                      # compiled RE2 patterns
    channels: tuple[Any, ...]
    permissions: frozenset[str]

    def is_allowed(self, topic: str, channel: str) -> bool:
        """Publish when ``channel`` is "", else subscribe (nsqd's rule)."""
        if ("subscribe" if channel else "publish") not in self.permissions:
            return False
        if not self.topic.search(topic):
            return False
        return any(c.search(channel) for c in self.channels)


@dataclass
class AuthState:
    """An auth server's answer for one client, good until ``expires`` (clock seconds)."""

    ttl: int
    authorizations: list[Authorization]
    identity: str = ""
    identity_url: str = ""
    expires: float = 0.0

    def is_allowed(self, topic: str, channel: str = "") -> bool:
        return any(a.is_allowed(topic, channel) for a in self.authorizations)

    def is_expired(self, now: float) -> bool:
        return self.expires <= now


def parse_reply(data: bytes | str, now: float) -> AuthState:
    """An auth server's JSON answer, checked as nsqd checks it and within this module's
    bounds; InvalidAuthReply if not."""
    if len(data) > MAX_REPLY_BYTES:
        raise InvalidAuthReply(f"the answer is over {MAX_REPLY_BYTES} bytes")
    try:
        doc = json.loads(data)
    except ValueError as err:
        raise InvalidAuthReply(f"the answer is not JSON: {err}") from None
    except RecursionError:
        raise InvalidAuthReply("the answer is not JSON: nested too deeply") from None
    if not isinstance(doc, dict):
        raise InvalidAuthReply("the answer is not a JSON object")
    raws = doc.get("authorizations") or []
    if not isinstance(raws, list):
        raise InvalidAuthReply("authorizations is not a list")
    if len(raws) > MAX_AUTHORIZATIONS:
        raise InvalidAuthReply(f"{len(raws)} authorizations, over {MAX_AUTHORIZATIONS}")
    regexes = sum(1 + len(r["channels"] if isinstance(r.get("channels"), list) else ())
                  for r in raws if isinstance(r, dict))
    if regexes > MAX_REGEXES:
        raise InvalidAuthReply(f"{regexes} regexes, over {MAX_REGEXES}")
    auths = []
    for raw in raws:
        if not isinstance(raw, dict):
            raise InvalidAuthReply(f"an authorization is not an object: {_shown(raw)}")
        perms = raw.get("permissions") or []
        if not isinstance(perms, list):
            raise InvalidAuthReply("permissions is not a list")
        for p in perms:
            if p not in PERMISSIONS:
                raise InvalidAuthReply(f"unknown permission {_shown(p)}")
        channels = raw.get("channels") or []
        if not isinstance(channels, list):
            raise InvalidAuthReply("channels is not a list")
        auths.append(Authorization(_compile(raw.get("topic", ""), "topic"),
                                   tuple(_compile(c, "channel") for c in channels),
                                   frozenset(perms)))
    ttl = doc.get("ttl", 0)
    if not isinstance(ttl, int) or isinstance(ttl, bool) or ttl <= 0:
        raise InvalidAuthReply(f"invalid TTL {_shown(ttl)} (must be >0)")
    identity = str(doc.get("identity") or "")
    identity_url = str(doc.get("identity_url") or "")
    for name, value in (("identity", identity), ("identity_url", identity_url)):
        if len(value) > MAX_IDENTITY_LENGTH:
            raise InvalidAuthReply(f"{name} of {len(value)} characters, over "
                                   f"{MAX_IDENTITY_LENGTH}")
    return AuthState(ttl=ttl, authorizations=auths, identity=identity,
                     identity_url=identity_url, expires=now + ttl)


def _shown(value: Any, quoted: bool = False) -> str:
    """A value of the answer as an error names it (a string as it is, unless
    ``quoted``; anything else as its repr), escaped and cut short."""
    from .printable import printable
    return printable(value if isinstance(value, str) and not quoted else repr(value), 80)


def _compile(pattern: Any, what: str) -> Any:
    if not isinstance(pattern, str):
        raise InvalidAuthReply(f"unable to compile {what} {_shown(pattern, True)}: "
                               f"not a string")
    try:
        return re2.compile(pattern, _RE2_OPTIONS)
    except re2.error as err:
        reason = err.args[0] if err.args else ""
        reason = reason.decode(errors="replace") if isinstance(reason, bytes) else reason
        raise InvalidAuthReply(f"unable to compile {what} {_shown(pattern, True)} "
                               f"{_shown(reason)}") from None


_URL = re.compile(r"[a-zA-Z][a-zA-Z0-9+.-]*://[^\s'\"<>]*")


def redacted(err: BaseException, secret: str) -> str:
    """What went wrong asking an auth server, said without the secret: a URL named
    (aiohttp's errors name the one asked, whose query holds the secret) loses its
    query, and the secret, however encoded, is replaced, wherever the text came from
    (an answer that echoes it among them)."""
    text = str(err) or type(err).__name__
    text = _URL.sub(lambda m: m.group().split("?", 1)[0].split("#", 1)[0], text)
    if secret:
        from .printable import printable
        forms = {secret, quote(secret), quote_plus(secret), quote(secret, safe=""),
                 repr(secret)[1:-1], printable(secret, len(secret))}
        for form in sorted(forms, key=len, reverse=True):
            text = text.replace(form, "<secret>")
    return text


def auth_url(address: str) -> str:
    return address if "://" in address else f"http://{address}/auth"


@dataclass(frozen=True)
class Identity:
    """Who asks, as the auth server is told: what the broker knows of a client."""

    remote_ip: str
    tls: bool
    secret: str = field(repr=False)
    common_name: str = ""

    def form(self) -> dict[str, str]:
        return {"remote_ip": self.remote_ip, "tls": "true" if self.tls else "false",
                "secret": self.secret, "common_name": self.common_name}


@dataclass
class Authenticator:
    """The broker's side of the auth protocol: asks the auth servers. It keeps no
    answers: each ``ClientAuth`` keeps its own, for its ``ttl``.

    One per broker, shared by every listener; must be used on the broker's loop.
    """

    addresses: list[str]
    method: str = "get"
    connect_timeout: float = 2.0
    request_timeout: float = 5.0
    clock: Callable[[], float] = time.monotonic
    max_connections: int = AUTH_CONNECTIONS
    max_pending_per_address: int = MAX_PENDING_PER_ADDRESS
    _session: Any = None
    _slots: asyncio.Semaphore | None = None
    _pending: Counter = field(default_factory=Counter)

    @classmethod
    def from_options(cls, options: "Options") -> "Authenticator | None":
        if not options.auth_http_addresses:
            return None
        return cls(list(options.auth_http_addresses), options.auth_http_request_method,
                   options.http_client_connect_timeout / 1000,
                   options.http_client_request_timeout / 1000)

    async def query(self, who: Identity) -> AuthState:
        """Ask the auth servers, a random one first; AuthFailed when none gives a valid
        answer, or at once when ``who``'s address has too many queries pending."""
        if self._pending[who.remote_ip] >= self.max_pending_per_address:
            log.warning("AUTH refused for %s: %d AUTHs from it already pending",
                        who.remote_ip, self._pending[who.remote_ip])
            raise AuthFailed("AUTH failed")
        self._pending[who.remote_ip] += 1
        try:
            return await self._query(who)
        finally:
            self._pending[who.remote_ip] -= 1
            if not self._pending[who.remote_ip]:
                del self._pending[who.remote_ip]

    async def _query(self, who: Identity) -> AuthState:
        start = random.randrange(len(self.addresses))
        problems = []
        for i in range(len(self.addresses)):
            address = self.addresses[(start + i) % len(self.addresses)]
            try:
                return await self._query_one(address, who)
            except Exception as err:  # every failure is the same to the client: logged
                problems.append(f"failed to auth against {address} - "
                                f"{redacted(err, who.secret)}")
        log.warning("AUTH failed for %s: %s", who.remote_ip, "; ".join(problems))
        raise AuthFailed("AUTH failed")

    async def _query_one(self, address: str, who: Identity) -> AuthState:
        """One query: a turn among ``max_connections`` (waited for at most the request
        timeout), then the connect timeout and the request timeout, each its own."""
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.max_connections)
        # A timeout of 0 is none, as Go's (and so nsqd's) http client reads it.
        request_timeout = self.request_timeout or None
        try:
            async with asyncio.timeout(request_timeout):
                await self._slots.acquire()
        except asyncio.TimeoutError:
            raise InvalidAuthReply(f"no connection free within {self.request_timeout:g}s "
                                   f"({self.max_connections} queries pending)") from None
        try:
            async with asyncio.timeout(request_timeout
                                       and self.connect_timeout + self.request_timeout):
                return await self._ask(address, who)
        except asyncio.TimeoutError:
            raise InvalidAuthReply(f"no answer within {self.request_timeout:g}s") from None
        finally:
            self._slots.release()

    async def _ask(self, address: str, who: Identity) -> AuthState:
        import aiohttp

        if self._session is None or self._session.closed:
            # The pool is this class's turns (max_connections), so aiohttp's own limit
            # is off: waiting for a turn never counts against the connect timeout.
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0),
                timeout=aiohttp.ClientTimeout(total=None,
                                              sock_connect=self.connect_timeout or None,
                                              sock_read=self.request_timeout or None))
        url = auth_url(address)
        # Redirects are not followed: the secret goes to the servers the operator named.
        if self.method == "post":
            request = self._session.post(url, data=who.form(), allow_redirects=False)
        else:
            request = self._session.get(url, params=who.form(), allow_redirects=False)
        try:
            return await self._answer(request)
        except aiohttp.ConnectionTimeoutError:
            raise InvalidAuthReply(f"could not connect within {self.connect_timeout:g}s") \
                from None
        except aiohttp.SocketTimeoutError:
            raise InvalidAuthReply(f"no answer within {self.request_timeout:g}s") from None

    async def _answer(self, request: Any) -> AuthState:
        async with request as reply:
            if reply.status != 200:
                raise InvalidAuthReply(f"got response {reply.status}")
            if (reply.content_length or 0) > MAX_REPLY_BYTES:
                raise InvalidAuthReply(f"the answer is over {MAX_REPLY_BYTES} bytes")
            body = await reply.content.read(MAX_REPLY_BYTES + 1)
            while len(body) <= MAX_REPLY_BYTES and not reply.content.at_eof():
                body += await reply.content.read(MAX_REPLY_BYTES + 1 - len(body))
        return parse_reply(body, self.clock())

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


class ClientAuth:
    """One connection's standing with the auth servers (a TCP connection; a gRPC or
    HTTP connection, known by its peer address).

    ``auth(secret)`` is nsqd's AUTH; ``check(command, topic, channel)`` its
    checkAuth. ``needs_query()`` says ``check`` would have to ask the auth
    server again first (no answer yet, or its ttl ran out): call ``refresh()``.
    ``principal`` names who the answer says the client is, for what the broker
    keeps on its behalf (leases, producer ids).
    """

    def __init__(self, authenticator: Authenticator, remote_ip: str, *, tls: bool = False,
                 common_name: str = "", secret: str | None = None) -> None:
        self.authenticator = authenticator
        self.remote_ip = remote_ip
        self.tls = tls
        self.common_name = common_name
        self.secret = secret
        self.state: AuthState | None = None

    def identity(self) -> Identity:
        return Identity(self.remote_ip, self.tls, self.secret or "", self.common_name)

    async def auth(self, secret: str) -> AuthState:
        """nsqd's AUTH: ask for ``secret``; Unauthorized when it allows nothing."""
        self.secret = secret
        await self.refresh()
        assert self.state is not None
        if not self.state.authorizations:
            raise Unauthorized("AUTH no authorizations found")
        return self.state

    def needs_query(self) -> bool:
        if self.secret is None:
            return False
        if self.state is None or self.state.is_expired(self.authenticator.clock()):
            return True
        return False

    async def refresh(self) -> None:
        """Ask the auth servers now (AuthFailed when they refuse or fail)."""
        self.state = None
        self.state = await self.authenticator.query(self.identity())

    @property
    def principal(self) -> str:
        """Who the client is: the auth server's ``identity``, else (none given) a digest
        of the secret. Two secrets the auth server names alike are one principal."""
        if self.state is not None and self.state.identity:
            return "identity:" + self.state.identity
        return "secret:" + hashlib.sha256((self.secret or "").encode()).hexdigest()[:32]

    def check(self, command: str, topic: str | None, channel: str = "") -> None:
        """Raise unless this client may ``command``: publish with no channel, subscribe
        with one; with ``topic`` None, any accepted secret will do."""
        if self.secret is None or self.state is None:
            raise AuthFirst(f"AUTH required before {command}")
        if not self.state.authorizations:
            raise Unauthorized("AUTH no authorizations found")
        if topic is not None and not self.state.is_allowed(topic, channel):
            raise Unauthorized(f"AUTH failed for {command} on {topic!r} {channel!r}")

    def require(self, command: str, needs: "Iterable[Any]") -> None:
        """Raise unless this client has every right of ``needs`` (``rules.Need``); with
        none, any accepted secret will do."""
        self.check(command, None)
        for need in needs:
            if need.permission == "subscribe" and not need.channel:
                raise Unauthorized(f"AUTH failed for {command} on {need.topic!r}: "
                                   f"subscribing needs a channel")
            self.check(command, need.topic, need.channel if need.permission == "subscribe"
                       else "")

    def reply(self) -> bytes:
        """nsqd's answer to a successful AUTH."""
        assert self.state is not None
        return json.dumps({"identity": self.state.identity,
                           "identity_url": self.state.identity_url,
                           "permission_count": len(self.state.authorizations)}).encode()
