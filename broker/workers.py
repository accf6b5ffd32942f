"""``pynsqd --workers N``: one broker process per core, used as one service.

    pynsqd --workers auto --data-path /var/lib/pynsq \\
           --lookupd-tcp-address 127.0.0.1:4160 --broadcast-address 10.0.0.5

A supervisor process starts N workers. Each worker is a broker of its own, as
each nsqd of a fleet is: its own data path (``DATA/worker-I``), node id (the
shared one plus I, so message ids never collide), and ports of its own, which
it registers with nsqlookupd; consumers find every worker there, as they find
every nsqd. Every worker also listens on the shared addresses
(``--grpc-address``, ``--tcp-address``, ``--http-address``) with
``SO_REUSEPORT``, so a producer pointed at one address is spread over the
workers by the kernel, one connection at a time. ``/info`` and the gRPC Info
call list every worker's own addresses (``workers``): a writer whose replays
must meet its de-duplication window picks a worker by a stable hash of its
producer id (the Spark writers do), and the ``pynsq`` CLI's admin, stats and
tail reach every worker.

The supervisor forwards SIGTERM and SIGINT to the workers and exits 0 once all
of them stopped cleanly. A worker that dies is started again on the same
ports, data path and node id (with a delay growing to 5 s while it keeps
dying within 10 s of its start); with ``--data-path`` it recovers everything it
had acknowledged. Workers watch the pipe from the supervisor: if the supervisor
itself is killed, they stop cleanly rather than hold the ports.

Each worker is ``python -m broker.workers``, reading its part (a JSON line) on
stdin and answering ``ready`` on stdout once it serves.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import re
import signal
import socket
import sys
import threading
import time
import zlib
from dataclasses import dataclass, fields
from pathlib import Path

from .options import Options, split_host_port

log = logging.getLogger("pynsqd")

KINDS = ("grpc", "tcp", "http", "https")  # listeners a worker has, own and shared
RESTART_DELAY_MIN, RESTART_DELAY_MAX = 0.1, 5.0
STABLE_AFTER = 10.0   # a worker that ran this long before dying is restarted at once
STOP_TIMEOUT = 120.0  # a worker still stopping after this long is killed
WORKER_DIR = re.compile(r"^worker-(\d+)$")


class WorkerFailed(RuntimeError):
    """A worker exited before it served (its own error is in the log above)."""


# -- planning: addresses, node ids, data paths ----------------------------------
@dataclass(frozen=True)
class Plan:
    """What each worker serves: the shared addresses, and per worker its own."""

    options: Options                       # as given (workers > 1)
    shared: dict[str, str]                 # kind -> host:port every worker listens on too
    own: list[dict[str, str]]              # per worker: kind -> its own host:port
    node_ids: list[int]
    # A socket bound to each port above, held for the supervisor's life (``release``).
    held: tuple[socket.socket, ...] = dataclasses.field(default=(), compare=False, repr=False)

    def worker_options(self, index: int) -> Options:
        o = self.options
        own = self.own[index]
        return o.replace(grpc_address=own["grpc"], tcp_address=own.get("tcp", ""),
                         http_address=own.get("http", ""), https_address=own.get("https", ""),
                         data_path=(str(Path(o.data_path) / f"worker-{index}")
                                    if o.data_path else ""),
                         node_id=self.node_ids[index], workers=1)

    def spec(self, index: int) -> dict:
        """A worker's part, as the JSON line it reads on stdin."""
        return {"index": index, "options": dataclasses.asdict(self.worker_options(index)),
                "shared": self.shared, "workers": self.own}

    def release(self) -> None:
        """Let the planned ports go (the supervisor is ending)."""
        for s in self.held:
            s.close()


def _split(address: str, kind: str) -> tuple[str, int]:
    """host:port, port 0 allowed (one picked once for every worker to share)."""
    host, sep, port = address.rpartition(":")
    if port == "0" and sep and host:
        return host.strip("[]"), 0
    return split_host_port(address, f"{kind}-address")


def hold_port(host: str, port: int = 0) -> socket.socket:
    """A socket bound to ``host:port`` (port 0: one the OS picks), not listening.

    Bound with ``SO_REUSEADDR`` alone, it fails where anything listens on the port
    (``SO_REUSEPORT`` sharers included), and, held, the OS gives the port to no other
    bind of port 0 nor to any outgoing connection, and refuses a bind without
    ``SO_REUSEADDR``. (A bind of this very port with ``SO_REUSEADDR``, by another
    program given it, still succeeds.) A worker binds and listens on it all the same
    (Linux lets a socket with ``SO_REUSEADDR`` share a port with others that have it
    and do not listen; asyncio's and gRPC's listeners set it), at its start and at
    every restart."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    s = socket.socket(family, socket.SOCK_STREAM)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((host, port))
    except BaseException:
        s.close()
        raise
    return s


def plan_workers(options: Options) -> Plan:
    """The shared addresses (a port 0 resolved once, for every worker to share) and
    each worker's own ports, picked now and kept across its restarts. Each port is
    held (``hold_port``) until ``Plan.release``, so no other program's free-port pick or
    connection takes it while a worker starts or restarts. A shared port something
    already listens on is an error naming it."""
    given = {"grpc": options.grpc_address, "tcp": options.tcp_address,
             "http": options.http_address, "https": options.https_address}
    shared: dict[str, str] = {}
    held: list[socket.socket] = []

    def hold(host: str, port: int = 0) -> int:
        held.append(hold_port(host, port))
        return held[-1].getsockname()[1]

    try:
        for kind in KINDS:
            address = given[kind].strip()
            if not address:
                continue
            host, port = _split(address, kind)
            try:
                port = hold(host, port)
            except OSError as err:
                raise OSError(f"cannot listen on {address} ({kind}): {err.strerror}") from None
            shared[kind] = _join(host, port)
        # A port held is not offered again, so every port below is another.
        own = [{kind: _join(_host(shared[kind]), hold(_host(shared[kind]))) for kind in shared}
               for _ in range(options.workers)]
    except BaseException:
        for s in held:
            s.close()
        raise
    base = options.node_id_for(shared["grpc"])
    return Plan(options, shared, own, [(base + i) % 1024 for i in range(options.workers)],
                tuple(held))


def _host(address: str) -> str:
    return address.rpartition(":")[0].strip("[]")


def _join(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


# -- for clients: reaching every worker, or the one a key belongs to -------------
def worker_addresses(address: str, workers) -> list[str]:
    """Each worker's own gRPC address as reached through ``address`` (the shared one a
    client was given): workers listen on the shared address's host, so the host a
    client used reaches them too (a wildcard listen host included). Empty when the
    broker at ``address`` is a single broker (Info's ``workers`` is empty)."""
    host = address.rpartition(":")[0]
    return [f"{host}:{w.rpartition(':')[2]}" for w in workers]


def worker_for(key: str, addresses: list[str]) -> str:
    """The worker ``key`` belongs to: the same for as long as the count of workers is
    the same (CRC-32, not Python's salted ``hash``), whichever process asks."""
    return addresses[zlib.crc32(key.encode()) % len(addresses)]


# -- the data path --------------------------------------------------------------
def worker_dirs(data_path: str) -> dict[int, Path]:
    """The ``worker-I`` directories of a data path that hold messages (more than a LOCK)."""
    root = Path(data_path) if data_path else None
    if root is None or not root.is_dir():
        return {}
    found = {int(m.group(1)): p for p in root.iterdir()
             if p.is_dir() and (m := WORKER_DIR.match(p.name))}
    return {i: p for i, p in found.items()
            if any(q.name not in ("LOCK", "identity") for q in p.iterdir())}


def uses_worker_layout(data_path: str) -> bool:
    """A data path made by ``--workers``: it is served that way, whatever ``--workers``
    says (a single broker would not read its ``worker-I`` directories)."""
    return bool(worker_dirs(data_path))


def check_data_path(data_path: str, workers: int) -> None:
    """Refuse a data path whose messages ``workers`` workers would not read: a single
    broker's data, or a ``worker-I`` holding messages with I past the count. Nothing
    acknowledged is left unread."""
    if not data_path or not Path(data_path).is_dir():
        return
    root = Path(data_path)
    others = sorted(p.name for p in root.iterdir()
                    if p.name != "LOCK" and not (p.is_dir() and WORKER_DIR.match(p.name)))
    if others:
        raise ValueError(f"data-path {data_path} holds a single broker's data "
                         f"({', '.join(others[:3])}{', ...' if len(others) > 3 else ''}): "
                         f"--workers needs an empty directory or one made by --workers; "
                         f"start it without --workers, or give another --data-path")
    beyond = sorted(i for i in worker_dirs(data_path) if i >= workers)
    if beyond:
        raise ValueError(f"data-path {data_path}: worker-{beyond[-1]} holds messages, "
                         f"so --workers must be at least {beyond[-1] + 1} (got {workers})")


def lock_data_path(data_path: str) -> int | None:
    """Hold ``DATA/LOCK`` for the supervisor's life: a single pynsqd or another
    supervisor on the same directory is refused (as a broker's own lock does)."""
    if not data_path:
        return None
    from .storage.store import lock_data_path as lock

    Path(data_path).mkdir(parents=True, exist_ok=True)
    return lock(data_path)


# -- the supervisor -------------------------------------------------------------
class Worker:
    """One worker process, started again on the same plan when it dies."""

    def __init__(self, plan: Plan, index: int) -> None:
        self.plan = plan
        self.index = index
        self.name = f"worker-{index}"
        self.proc: asyncio.subprocess.Process | None = None
        self.started_at = 0.0
        self.restarts = 0
        self.serving = False   # it said "ready" (a process still starting has not)

    async def spawn(self) -> None:
        """Start the process and wait until it serves; WorkerFailed if it exits first."""
        self.started_at = time.monotonic()
        self.serving = False
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "broker.workers", stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, start_new_session=True)
        # Its own session: a Ctrl-C in the terminal reaches the supervisor alone, which
        # stops the workers itself (a worker stopping on its own would be restarted).
        self.proc.stdin.write(json.dumps(self.plan.spec(self.index)).encode() + b"\n")
        await self.proc.stdin.drain()
        line = await self.proc.stdout.readline()
        if line.strip() != b"ready":
            code = await self.proc.wait()
            raise WorkerFailed(f"{self.name} exited with {_exit_status(code)} before serving")
        self.serving = True

    async def stop(self) -> int:
        """SIGTERM, and wait (SIGKILL after STOP_TIMEOUT). Its exit code; 0 for one not
        running (its end was logged when it died), and for one that had not started
        serving and ended by that SIGTERM: a process still starting up (its interpreter
        loading, before it can handle the signal) ends as it was asked to, having served
        no one, and its data path is as safe as after any kill."""
        proc = self.proc
        if proc is None or proc.returncode is not None:
            return 0
        proc.send_signal(signal.SIGTERM)
        try:
            async with asyncio.timeout(STOP_TIMEOUT):
                code = await proc.wait()
        except asyncio.TimeoutError:
            log.error("%s did not stop within %.0f s: killed", self.name, STOP_TIMEOUT)
            proc.kill()
            code = await proc.wait()
        if proc.stdin is not None:
            proc.stdin.close()
        if code == -signal.SIGTERM and not self.serving:
            log.info("%s stopped before it served", self.name)
            return 0
        return code


def _exit_status(code: int | None) -> str:
    if code is not None and code < 0:
        return f"signal {signal.Signals(-code).name}"
    return f"code {code}"


class Supervisor:
    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.workers = [Worker(plan, i) for i in range(len(plan.own))]
        self.stopping = asyncio.Event()
        self._watchers: list[asyncio.Task] = []

    async def start(self) -> None:
        results = await asyncio.gather(*(w.spawn() for w in self.workers),
                                       return_exceptions=True)
        failed = [r for r in results if isinstance(r, BaseException)]
        if failed:
            raise failed[0] if not isinstance(failed[0], WorkerFailed) else WorkerFailed(
                "; ".join(str(f) for f in failed))
        self._watchers = [asyncio.create_task(self._watch(w)) for w in self.workers]

    async def _watch(self, worker: Worker) -> None:
        delay = RESTART_DELAY_MIN
        while True:
            code = await worker.proc.wait()
            if self.stopping.is_set():
                return
            ran = time.monotonic() - worker.started_at
            delay = RESTART_DELAY_MIN if ran >= STABLE_AFTER else min(delay * 2,
                                                                      RESTART_DELAY_MAX)
            log.error("%s exited with %s after %.1f s: starting it again in %.1f s",
                      worker.name, _exit_status(code), ran, delay)
            try:
                async with asyncio.timeout(delay):
                    await self.stopping.wait()
                return
            except asyncio.TimeoutError:
                pass
            worker.restarts += 1
            try:
                await worker.spawn()
            except WorkerFailed as err:
                log.error("%s", err)
                continue
            log.info("%s (pid %d) serving again (restart %d)", worker.name, worker.proc.pid,
                     worker.restarts)

    async def stop(self) -> int:
        """Stop every worker; 0 when each stopped cleanly."""
        self.stopping.set()
        for task in self._watchers:
            task.cancel()
        await asyncio.gather(*self._watchers, return_exceptions=True)
        codes = await asyncio.gather(*(w.stop() for w in self.workers))
        bad = [f"{w.name} ({_exit_status(c)})" for w, c in zip(self.workers, codes) if c != 0]
        if bad:
            log.error("workers that did not stop cleanly: %s", ", ".join(bad))
        return 1 if bad else 0


def describe(supervisor: Supervisor) -> list[str]:
    """Log lines saying what serves where."""
    plan = supervisor.plan
    shared = ", ".join(f"{k} {a}" for k, a in plan.shared.items())
    lines = [f"{len(plan.own)} workers behind {shared}"]
    for worker, own, node_id in zip(supervisor.workers, plan.own, plan.node_ids):
        data = (f", data {Path(plan.options.data_path) / worker.name}"
                if plan.options.data_path else "")
        lines.append(f"{worker.name} (pid {worker.proc.pid}): "
                     + ", ".join(f"{k} {a}" for k, a in own.items())
                     + f", node id {node_id}{data}")
    return lines


async def supervise(options: Options) -> int:
    """Run ``options.workers`` workers until SIGTERM or SIGINT. The exit code."""
    plan = plan_workers(options)
    try:
        return await _supervise(Supervisor(plan))
    finally:
        plan.release()


async def _supervise(supervisor: Supervisor) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    starting = asyncio.create_task(supervisor.start())
    stopped = asyncio.create_task(stop.wait())
    await asyncio.wait({starting, stopped}, return_when=asyncio.FIRST_COMPLETED)
    if stopped.done() and not starting.done():
        starting.cancel()
    else:
        stopped.cancel()
        try:
            starting.result()
        except WorkerFailed as err:
            log.error("%s: stopping the others", err)
            await supervisor.stop()
            return 1
        for line in describe(supervisor):
            log.info("%s", line)
        await stop.wait()
    log.info("signal received: stopping the workers")
    await asyncio.gather(starting, return_exceptions=True)
    return await supervisor.stop()


def run_supervisor(options: Options) -> int:
    """``pynsqd --workers N`` (or a data path made by it): the exit code."""
    from .security.tls import exposure_warnings

    for warning in exposure_warnings(options):
        log.warning("%s", warning)
    check_data_path(options.data_path, options.workers)
    lock = lock_data_path(options.data_path)
    try:
        return asyncio.run(supervise(options))
    finally:
        if lock is not None:
            os.close(lock)


# -- a worker -------------------------------------------------------------------
def _options_from_spec(values: dict) -> Options:
    tuples = {f.name for f in fields(Options) if isinstance(f.default, tuple)}
    return Options(**{k: tuple(v) if k in tuples else v for k, v in values.items()})


async def serve_worker(spec: dict, ready) -> None:
    """Serve one worker until SIGTERM/SIGINT or the supervisor's pipe closes."""
    from .app import BrokerApp
    from .server.grpc_server import start_grpc_server
    from .server.http import HttpApi
    from .server.tcp import TcpServer

    # A stop asked for while starting (restoring a data path can take seconds) is
    # kept, and made once the worker serves: never the default action of the signal.
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    app = BrokerApp(_options_from_spec(spec["options"]))
    await app.start()
    app.broker.workers = tuple(spec["workers"])
    shared: list = []  # (kind, server)
    try:
        for kind, address in spec["shared"].items():
            if kind == "grpc":
                server, _ = await start_grpc_server(app.broker, address, app.security,
                                                    reuse_port=True)
            else:
                server = (TcpServer(app.broker, app.security) if kind == "tcp" else
                          HttpApi(app.broker, app.addresses, app.security,
                                  tls=kind == "https"))
                await server.start(address, reuse_port=True)
            shared.append((kind, server))
        log.info("sharing %s", ", ".join(f"{k} {a}" for k, a in spec["shared"].items()))

        def supervisor_gone() -> None:  # the pipe from the supervisor closed
            while os.read(0, 4096):   # unbuffered: nothing to hold at interpreter exit
                pass
            try:
                loop.call_soon_threadsafe(stop.set)
            except RuntimeError:      # the worker stopped first
                pass

        threading.Thread(target=supervisor_gone, daemon=True, name="supervisor-pipe").start()
        ready()
        await stop.wait()
        log.info("stopping")
    finally:
        # The shared ports first: new connections go to the other workers meanwhile.
        for kind, server in reversed(shared):
            await (server.stop(1.0) if kind == "grpc" else server.close())
        await app.stop()


def worker_main() -> int:
    from .app import new_event_loop
    from .daemon import freeze_start_up_objects, raise_open_file_limit, tune_garbage_collector
    from .storage import DataPathLocked

    spec = json.loads(sys.stdin.buffer.readline())
    options = _options_from_spec(spec["options"])
    logging.basicConfig(level=options.log_level.upper(), stream=sys.stderr,
                        format=f"[pynsqd worker-{spec['index']}] %(asctime)s %(levelname)s: "
                               f"%(message)s")
    raise_open_file_limit()
    tune_garbage_collector()
    freeze_start_up_objects()
    out = sys.stdout

    def ready() -> None:
        out.write("ready\n")
        out.flush()

    loop = new_event_loop(options.event_loop)
    try:
        with asyncio.Runner(loop_factory=lambda: loop) as runner:
            runner.run(serve_worker(spec, ready))
    except (OSError, DataPathLocked, ValueError) as err:
        log.error("%s", err)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(worker_main())
