"""Registration with nsqlookupd, as nsqd does it: NSQ's lookup protocol V1.

    pynsqd --lookupd-tcp-address 127.0.0.1:4160 --broadcast-address 10.0.0.5

For each ``--lookupd-tcp-address`` the broker keeps one connection: it sends
the ``"  V1"`` magic, ``IDENTIFY`` (broadcast address, TCP and HTTP ports,
version, hostname), then ``REGISTER topic`` and ``REGISTER topic channel`` for
everything it has; from then on it registers and unregisters topics and
channels as they come and go, and sends ``PING`` every 15 seconds. When the
connection drops (nsqlookupd restarted, say), it reconnects with a growing
delay and registers everything again, since nsqlookupd forgets a producer
whose connection closed.

Clients then find the broker with nsqlookupd's ``/lookup?topic=NAME``, which
gives its broadcast address with its TCP and HTTP ports; the HTTP port's
``/info`` names the gRPC address too.

The wire part (``*_command`` and ``parse_response``) is pure functions of bytes.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import struct
from dataclasses import dataclass
from typing import Awaitable, Callable

from . import __version__
from .core import Broker
from .options import split_host_port
from .tasks import cancel_and_wait

log = logging.getLogger("pynsqd")

MAGIC = b"  V1"
PING = b"PING\n"
RESPONSE_TIMEOUT = 10.0
CONNECT_TIMEOUT = 5.0
SIZE = struct.Struct(">i")
# Largest response frame read from nsqlookupd (its answers are "OK" or a short error):
# a frame declared larger closes the connection before any of it is buffered.
MAX_RESPONSE = 1 << 20


class LookupdError(Exception):
    """nsqlookupd answered a command with an error (``E_INVALID ...``)."""


@dataclass(frozen=True)
class Timing:
    """When a connection PINGs and how long it waits before reconnecting: nsqd's.

    ``sleep`` waits out a reconnect delay; a test gives its own to see the delays
    without waiting them.
    """
    ping_interval: float = 15.0          # idle this long, a PING
    reconnect_delay_min: float = 0.25    # doubling after each failed attempt...
    reconnect_delay_max: float = 5.0     # ...up to this; back to the least once registered
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep


NSQD_TIMING = Timing()


# -- the wire: pure functions of bytes ----------------------------------------
def identify_command(peer_info: dict) -> bytes:
    body = json.dumps(peer_info).encode()
    return b"IDENTIFY\n" + SIZE.pack(len(body)) + body


def register_command(topic: str, channel: str | None = None) -> bytes:
    return _topic_command(b"REGISTER", topic, channel)


def unregister_command(topic: str, channel: str | None = None) -> bytes:
    return _topic_command(b"UNREGISTER", topic, channel)


def _topic_command(verb: bytes, topic: str, channel: str | None) -> bytes:
    args = [topic] if channel is None else [topic, channel]
    return verb + b" " + " ".join(args).encode() + b"\n"


def parse_response(buffer: bytes) -> tuple[bytes | None, int]:
    """One size-prefixed response from the front of ``buffer``.

    Returns (response, bytes consumed), or (None, 0) while it is incomplete.
    Raises LookupdError on a size that cannot be right.
    """
    if len(buffer) < 4:
        return None, 0
    (size,) = SIZE.unpack_from(buffer, 0)
    if size < 0:
        raise LookupdError(f"bad response size {size} from nsqlookupd")
    if size > MAX_RESPONSE:
        raise LookupdError(f"response of {size} bytes from nsqlookupd, over the largest "
                           f"{MAX_RESPONSE} (MAX_RESPONSE)")
    if len(buffer) < 4 + size:
        return None, 0
    return bytes(buffer[4:4 + size]), 4 + size


def registration_commands(broker: Broker) -> list[bytes]:
    """REGISTER for every topic and channel the broker has now."""
    commands = []
    for name, topic in sorted(broker.topics.items()):
        commands.append(register_command(name))
        commands.extend(register_command(name, channel) for channel in sorted(topic.channels))
    return commands


# -- the connections -----------------------------------------------------------
class LookupdPeer:
    """One nsqlookupd: a connection kept up, registering what the broker has."""

    def __init__(self, address: str, broker: Broker, peer_info: Callable[[], dict],
                 timing: Timing = NSQD_TIMING) -> None:
        self.address = address
        self.timing = timing
        self.host, self.port = split_host_port(address, "lookupd-tcp-address")
        self.broker = broker
        self.peer_info = peer_info
        self.connected = asyncio.Event()  # set while identified and registered
        self._commands: asyncio.Queue[bytes] = asyncio.Queue()
        self._task: asyncio.Task | None = None
        self._registered = False

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"lookupd {self.address}")

    async def close(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait(task)

    def send(self, command: bytes) -> None:
        """Queue a command; dropped while disconnected (reconnecting registers all)."""
        if self.connected.is_set():
            self._commands.put_nowait(command)

    async def _run(self) -> None:
        least, most = self.timing.reconnect_delay_min, self.timing.reconnect_delay_max
        delay, reported = least, False
        while True:
            try:
                # asyncio.timeout, not wait_for: on Python 3.11 wait_for swallows a cancel
                # that arrives as the connection completes, and close() would wait forever.
                async with asyncio.timeout(CONNECT_TIMEOUT):
                    reader, writer = await asyncio.open_connection(self.host, self.port)
            except (OSError, asyncio.TimeoutError) as err:
                if not reported:
                    log.warning("nsqlookupd %s: cannot connect (%s); retrying", self.address,
                                err)
                    reported = True
                await self.timing.sleep(delay)
                delay = min(delay * 2, most)
                continue
            try:
                await self._session(reader, writer)
            except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError,
                    LookupdError) as err:
                log.warning("nsqlookupd %s: connection lost (%s); reconnecting", self.address,
                            err or type(err).__name__)
            finally:
                self.connected.clear()
                writer.close()
            if self._registered:  # it worked for a while: retry soon
                delay, reported, self._registered = least, False, False
            await self.timing.sleep(delay)
            delay = min(delay * 2, most)

    async def _session(self, reader: asyncio.StreamReader,
                       writer: asyncio.StreamWriter) -> None:
        responses: asyncio.Queue[bytes] = asyncio.Queue()
        reading = asyncio.create_task(_read_responses(reader, responses))

        async def call(command: bytes) -> bytes:
            writer.write(command)
            await writer.drain()
            response = await _first(responses.get(), reading, RESPONSE_TIMEOUT)
            if response is None:
                raise asyncio.TimeoutError(f"no answer to {command.split()[0].decode()}")
            if response.startswith(b"E_"):
                log.warning("nsqlookupd %s: %s answered %s", self.address,
                            command.split(b"\n")[0].decode(errors="replace"),
                            response.decode(errors="replace"))
            return response

        try:
            writer.write(MAGIC)
            response = await call(identify_command(self.peer_info()))
            if response.startswith(b"E_"):
                raise LookupdError(f"IDENTIFY refused: {response.decode(errors='replace')}")
            self._commands = asyncio.Queue()  # the registration below covers all before it
            self.connected.set()
            self._registered = True
            for command in registration_commands(self.broker):
                await call(command)
            log.info("nsqlookupd %s: registered", self.address)
            while True:
                command = await _first(self._commands.get(), reading,
                                       self.timing.ping_interval)
                await call(command or PING)
        finally:
            reading.cancel()


async def _first(getting: Awaitable[bytes], reading: asyncio.Task,
                 timeout: float) -> bytes | None:
    """What ``getting`` gives, or None after ``timeout``; ConnectionError if
    ``reading`` ends first (the connection closed)."""
    task = asyncio.ensure_future(getting)
    try:
        done, _ = await asyncio.wait({task, reading}, timeout=timeout,
                                     return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not task.done():
            task.cancel()
    if task in done:
        return task.result()
    if reading in done:
        reading.result()  # raises why the connection ended, if it failed
        raise ConnectionError("nsqlookupd closed the connection")
    return None


async def _read_responses(reader: asyncio.StreamReader, into: asyncio.Queue) -> None:
    """Read responses until the connection ends (then return)."""
    buffer = b""
    while True:
        chunk = await reader.read(65536)
        if not chunk:
            return
        buffer += chunk
        while True:
            response, used = parse_response(buffer)
            if response is None:
                break
            buffer = buffer[used:]
            into.put_nowait(response)


class LookupdRegistration:
    """Registration with every ``--lookupd-tcp-address``, following the core's changes."""

    def __init__(self, broker: Broker, addresses: dict[str, str],
                 timing: Timing | None = None) -> None:
        self.broker = broker
        self.addresses = addresses  # the bound servers' addresses: tcp, http, grpc
        options = broker.options
        self.broadcast_address = options.broadcast_address or socket.gethostname()
        self.peers = [LookupdPeer(a, broker, self.peer_info, timing or NSQD_TIMING)
                      for a in options.lookupd_tcp_address]

    def peer_info(self) -> dict:
        return {"broadcast_address": self.broadcast_address, "hostname": socket.gethostname(),
                "tcp_port": (self.broker.options.broadcast_tcp_port
                             or _port(self.addresses.get("tcp", ""))),
                "http_port": (self.broker.options.broadcast_http_port
                              or _port(self.addresses.get("http", ""))),
                "version": __version__}

    def start(self) -> None:
        self.broker.listeners.append(self._on_change)
        for peer in self.peers:
            peer.start()

    async def close(self) -> None:
        if self._on_change in self.broker.listeners:
            self.broker.listeners.remove(self._on_change)
        for peer in self.peers:
            await peer.close()

    def _on_change(self, event: str, topic: str, channel: str | None) -> None:
        command = (register_command if event.endswith("_created") else
                   unregister_command)(topic, channel)
        for peer in self.peers:
            peer.send(command)


def _port(address: str) -> int:
    port = address.rpartition(":")[2]
    return int(port) if port.isdigit() else 0
