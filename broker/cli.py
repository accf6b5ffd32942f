"""``pynsq``: publish, tail, stats and admin against a running broker.

    pynsq pub events 'hello'              # one message
    seq 3 | pynsq pub events              # one message per line of stdin
    pynsq tail events -n 10               # print 10 bodies, FIN each
    pynsq stats
    pynsq topic pause events
    pynsq channel empty events archive
    pynsq channel create events work --max-attempts 5   # then dead letters go to events.dead
    pynsq topic create events --ttl 60s                 # messages expire after a minute

Against ``pynsqd --workers N``: ``pub`` publishes on the worker its connection
reaches; admin commands, ``stats`` and ``tail`` act on every worker.
"""

from __future__ import annotations

import argparse
import os
import secrets
import sys
import threading

from . import __version__
from .client import Client, ClientError, Subscription, check_address
from .errors import NotFound
from .options import DEFAULT_GRPC_ADDRESS, format_duration, parse_duration_ms, suggest
from .workers import worker_addresses

ADMIN_ACTIONS = ("create", "delete", "empty", "pause", "unpause")
PUB_BATCH = 500
MAX_ATTEMPTS = 65535        # NSQ's attempts field is 16 bits
MAX_DEFER_MS = 2**32 - 1    # the wire's field; the broker refuses past --max-req-timeout


class OneLineParser(argparse.ArgumentParser):
    """Usage and value errors in one line, ``PROG: what was wrong (PROG --help)``,
    with exit code 2; an unknown option gets the closest known one suggested."""

    def error(self, message: str) -> None:  # type: ignore[override]
        if message.startswith("unrecognized arguments:"):
            first = message.split(":", 1)[1].split()[0]
            message += suggest(first.split("=")[0], self._all_flags())
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")

    def _all_flags(self) -> list[str]:
        flags: list[str] = []
        for action in self._actions:
            flags += [f for f in action.option_strings if f.startswith("--")]
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    flags += sub._all_flags()
        return flags


def bounded_int(low: int, high: int):
    """An argparse type: a whole number from ``low`` to ``high``."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be {low} to {high}, got {value}")
        return value
    parse.__name__ = "number"
    return parse


def _address(text: str) -> str:
    try:
        return check_address(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="pynsq", description="pynsq command-line client")
    parser.add_argument("--version", action="version", version=f"pynsq {__version__}")
    parser.add_argument("--address", default=DEFAULT_GRPC_ADDRESS, type=_address,
                        help=f"broker gRPC address host:port (default: {DEFAULT_GRPC_ADDRESS})")
    # -- on a network: TLS and NSQ's auth --
    parser.add_argument("--tls-ca", help="CA certificate that signed the broker's "
                        "(turns TLS on)")
    parser.add_argument("--tls-cert", help="client certificate, for mutual TLS")
    parser.add_argument("--tls-key", help="client private key, for mutual TLS")
    parser.add_argument("--auth-secret", default=os.environ.get("PYNSQ_AUTH_SECRET"),
                        help="secret for NSQ's auth (default: $PYNSQ_AUTH_SECRET)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    pub = sub.add_parser("pub", help="publish BODY, or one message per line of stdin")
    pub.add_argument("topic", help="the topic to publish to (made if it does not exist)")
    pub.add_argument("body", nargs="?", help="the message body; without it, each line of "
                     "stdin is one message (sent in MPUBs of %d)" % PUB_BATCH)
    pub.add_argument("--defer-ms", type=bounded_int(0, MAX_DEFER_MS), default=0,
                     help="deliver no earlier than this many milliseconds from now")
    pub.add_argument("--ttl", type=_duration, default=0,
                     help="never deliver after this long, e.g. 60s (default: the topic's)")

    tail = sub.add_parser("tail", help="print each message body on its own line and FIN it")
    tail.add_argument("topic", help="the topic to read")
    tail.add_argument("--channel", help="channel to read (default: a new ephemeral channel, "
                      "so that each tail sees every message, as nsq_tail does)")
    tail.add_argument("-n", type=bounded_int(0, 2**63 - 1), default=0,
                      help="stop after N messages (0: never)")

    stats = sub.add_parser("stats", help="print topics and channels with their counts")
    stats.add_argument("--topic", default="", help="only this topic")
    stats.add_argument("--channel", default="", help="only this channel")

    topic = sub.add_parser("topic", help="topic admin")
    topic.add_argument("action", choices=ADMIN_ACTIONS, help="what to do to the topic")
    topic.add_argument("topic", help="the topic's name")
    topic.add_argument("--ttl", type=_duration, default=None,
                       help="create: default ttl of the topic's messages, e.g. 60s (0: none)")

    channel = sub.add_parser("channel", help="channel admin")
    channel.add_argument("action", choices=ADMIN_ACTIONS, help="what to do to the channel")
    channel.add_argument("topic", help="the channel's topic")
    channel.add_argument("channel", help="the channel's name")
    channel.add_argument("--max-attempts", type=bounded_int(0, MAX_ATTEMPTS), default=None,
                         help="create: deliveries after which a message goes to the "
                              "dead-letter topic (0: never)")
    channel.add_argument("--dead-letter-topic", default="",
                         help="create: where dead letters go (default: TOPIC.dead)")
    return parser


def _duration(text: str) -> int:
    try:
        return parse_duration_ms(text, name="ttl")
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def check_admin_usage(args: argparse.Namespace) -> None:
    """Settings go with create only: refused before any broker is asked."""
    settings = ({"ttl_ms": args.ttl} if args.command == "topic" and args.ttl is not None
                else {"max_attempts": args.max_attempts,
                      "dead_letter_topic": args.dead_letter_topic}
                if args.command == "channel" else {})
    given = {k: v for k, v in settings.items() if v not in (None, "")}
    if given and args.action != "create":
        options = ", ".join("--" + k.replace("_ms", "").replace("_", "-") for k in given)
        raise UsageError(f"{options} only go with create")


def cmd_admin(client: Client, args: argparse.Namespace) -> int:
    if args.action == "create" and args.command == "topic":
        client.create_topic(args.topic, ttl_ms=args.ttl)
    elif args.action == "create":
        client.create_channel(args.topic, args.channel, max_attempts=args.max_attempts,
                              dead_letter_topic=args.dead_letter_topic)
    else:
        client.admin(args.command, args.action, args.topic, getattr(args, "channel", ""))
    return 0


def cmd_pub(client: Client, args: argparse.Namespace) -> int:
    if args.body is not None:
        client.publish(args.topic, args.body.encode(), defer_ms=args.defer_ms, ttl_ms=args.ttl)
        return 0
    if args.defer_ms:
        raise UsageError("--defer-ms needs a BODY argument")
    ttls = [args.ttl] if args.ttl else []
    batch: list[bytes] = []
    for line in sys.stdin.buffer:
        line = line.rstrip(b"\r\n")
        if line:
            batch.append(line)
        if len(batch) >= PUB_BATCH:
            client.multi_publish(args.topic, batch, ttl_ms=ttls * len(batch))
            batch = []
    if batch:
        client.multi_publish(args.topic, batch, ttl_ms=ttls * len(batch))
    return 0


def cmd_tail(clients: list[Client], args: argparse.Namespace) -> int:
    """Print and FIN each message; from every worker at once under pynsqd --workers.
    Every message printed is FINed before this returns (its stream is ended, not cut)."""
    out = sys.stdout.buffer
    channel = args.channel or f"tail{secrets.randbelow(10**6):06d}#ephemeral"
    lock, done, count = threading.Lock(), threading.Event(), [0]
    failures: list[ClientError] = []
    streams: list[Subscription] = []

    def tail_one(client: Client) -> None:
        try:
            with client.subscribe(args.topic, channel,
                                  rdy=max(1, min(args.n or 200, 200))) as sub:
                with lock:
                    streams.append(sub)
                for msg in sub:
                    with lock:
                        if done.is_set():   # not FINed: requeued as the stream closes
                            return
                        out.write(msg.body + b"\n")
                        out.flush()
                        sub.fin(msg.id)
                        count[0] += 1
                        if args.n and count[0] >= args.n:
                            done.set()
                            return
        except Exception as err:
            if done.is_set():        # the others' end closed this stream: nothing lost
                return
            if not isinstance(err, ClientError):
                raise
            failures.append(err)
            done.set()

    if len(clients) == 1:
        tail_one(clients[0])
    else:
        threads = [threading.Thread(target=tail_one, args=(c,), daemon=True) for c in clients]
        for thread in threads:
            thread.start()
        done.wait()
        # End each stream after what it was sent (the FINs of what was printed) is
        # processed: closing the clients at once would cut the last FINs off.
        with lock:
            ending = list(streams)
        for sub in ending:
            sub.close()
        for thread in threads:
            thread.join(timeout=10)
    if failures:
        raise failures[0]
    return 0


def cmd_stats(clients: list[Client], args: argparse.Namespace) -> int:
    for i, client in enumerate(clients):
        if len(clients) > 1:
            print(f"worker-{i} {client.address}:")
        _print_stats(client.stats(args.topic, args.channel))
    return 0


def _print_stats(stats) -> None:
    if not stats.topics:
        print("no topics")
    for t in stats.topics:
        flag = " (paused)" if t.paused else ""
        ttl = f" ttl: {format_duration(t.ttl_ms)}" if t.ttl_ms else ""
        print(f"[{t.name}]{flag} depth: {t.depth} msgs: {t.message_count}{ttl}")
        for c in t.channels:
            flag = " (paused)" if c.paused else ""
            if c.max_attempts:
                flag += f" (max-attempts: {c.max_attempts} -> {c.dead_letter_topic})"
            latency = " ".join(f"p{int(p.quantile * 100)}={p.value_ms:.1f}ms"
                               for p in c.e2e_processing_latency)
            print(f"    [{c.name}]{flag} depth: {c.depth} in-flight: {c.in_flight_count} "
                  f"deferred: {c.deferred_count} msgs: {c.message_count} "
                  f"fin: {c.finish_count} req: {c.requeue_count} timeout: {c.timeout_count} "
                  f"dead: {c.dead_letter_count} expired: {c.expired_count} "
                  f"clients: {len(c.clients)} {latency}".rstrip())


class UsageError(Exception):
    """Options that do not go together: reported in one line, exit code 2."""


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    security = {"tls_ca": args.tls_ca, "tls_cert": args.tls_cert, "tls_key": args.tls_key,
                "auth_secret": args.auth_secret}
    client = Client(args.address, **security)
    clients = [client]
    try:
        if args.command == "pub":
            return cmd_pub(client, args)
        if args.command in ("topic", "channel"):
            check_admin_usage(args)
        # pynsqd --workers: admin, stats and tail act on every worker (a publish on one).
        workers = worker_addresses(args.address, client.info().workers)
        clients = [Client(a, **security) for a in workers] or clients
        if args.command == "tail":
            return cmd_tail(clients, args)
        if args.command == "stats":
            return cmd_stats(clients, args)
        missing = []
        for each in clients:
            try:
                cmd_admin(each, args)
            except ClientError as err:   # a topic may be on some workers only
                if len(clients) == 1 or not isinstance(err, NotFound):
                    raise
                missing.append(err)
        if len(missing) == len(clients):
            raise missing[0]
        return 0
    except UsageError as err:
        print(f"pynsq {args.command}: {err} (see pynsq {args.command} --help)", file=sys.stderr)
        return 2
    except ClientError as err:
        print(f"pynsq {args.command}: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    finally:
        for each in {id(c): c for c in [client, *clients]}.values():
            each.close()


if __name__ == "__main__":
    sys.exit(main())
