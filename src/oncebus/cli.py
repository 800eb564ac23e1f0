"""The ``oncebus`` command line: serve a data directory, manage entities, send, receive, peek, stats.

While ``oncebus serve`` runs on a data directory, every other command on that
directory goes through the server's control socket; otherwise the command
opens the directory itself, holding its lock for the command's duration.

Exit codes: 0 success, 1 the broker refused (the message says why), 2 bad
usage, 3 the server could not be reached, 4 the data directory is busy.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import math
import socket
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from oncebus import __version__
from oncebus.auth import KeyRing, SasKey, parse_key_spec, read_keys_file
from oncebus.cli_rules import add_rule_parser, rule_command
from oncebus.core.durations import parse_duration, to_micros
from oncebus.core.errors import InvalidArgumentError, MessageSizeExceededError, OncebusError
from oncebus.core.properties import SENDER_PROPERTIES
from oncebus.server import ServeError, ServeOptions, run
from oncebus.server import loop as event_loop
from oncebus.server.control import LATEST_US, MAX_REQUEST_LINE, dispatch, error_from_json, open_local
from oncebus.server.datadir import DataDir, resolve_data_dir
from oncebus.server.settings import Settings, SettingsError
from oncebus.store.postgres_url import open_store, store_spec

EXIT_REFUSED, EXIT_USAGE, EXIT_UNREACHABLE, EXIT_BUSY = 1, 2, 3, 4


class CliError(Exception):
    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


# ---------------------------------------------------------------------------------- targets
class _Remote:
    """A running server, reached through its control socket."""

    max_request = MAX_REQUEST_LINE

    def __init__(self, info: dict[str, Any]) -> None:
        self.info = info
        try:
            self._sock = socket.create_connection(("127.0.0.1", int(info["control_port"])), timeout=60)
        except OSError as exc:
            raise CliError(
                f"the data directory is served by oncebus (pid {info.get('pid')}) but its control port "
                f"{info.get('control_port')} does not answer: {exc}",
                EXIT_UNREACHABLE,
            ) from exc
        self._file = self._sock.makefile("rwb")

    def call(self, op: str, args: dict[str, Any]) -> Any:
        request = {"token": self.info["control_token"], "op": op, "args": args}
        line = json.dumps(request).encode() + b"\n"
        if len(line) > self.max_request:
            raise CliError(
                f"the request is {len(line)} bytes, over the control socket's limit of {self.max_request}; "
                "send a message this large with an AMQP client, or with no server running",
                EXIT_REFUSED,
            )
        self._file.write(line)
        self._file.flush()
        line = self._file.readline()
        if not line:
            raise CliError("the server closed the control connection", EXIT_UNREACHABLE)
        reply = json.loads(line)
        if not reply.get("ok"):
            raise error_from_json(reply)
        return reply.get("result")

    def close(self) -> None:
        self._file.close()
        self._sock.close()


class _Local:
    """The data directory opened in this process (no server runs on it)."""

    max_request: int | None = None

    def __init__(self, datadir: DataDir, settings: Settings) -> None:
        self.datadir = datadir
        try:
            quotas = settings.quotas(stored=datadir.read_tier())  # as `serve` would take it (no --tier here)
            spec = store_spec(settings.store, option="ONCEBUS_STORE")  # as serve reads it
        except InvalidArgumentError:
            datadir.unlock()
            raise
        self._runner = asyncio.Runner()
        self._store = open_store(spec, datadir.store_path)
        self._namespace = self._runner.run(open_local(self._store, quotas))

    def call(self, op: str, args: dict[str, Any]) -> Any:
        return self._runner.run(dispatch(self._namespace, op, args))

    def close(self) -> None:
        self._runner.run(self._namespace.close())
        self._runner.close()
        self._store.close()
        self.datadir.unlock()


def _open_target(data_dir: Path, settings: Settings) -> _Remote | _Local:
    datadir = DataDir(data_dir)
    deadline = time.monotonic() + 5.0
    while True:
        if datadir.try_lock():
            return _Local(datadir, settings)
        info = datadir.read_server_info()
        if info is not None and info.get("role") == "standby":
            raise CliError(
                f"{data_dir} is served by a standby node of a cluster (oncebus serve --cluster), which forwards its "
                "clients to the leader and holds no broker of its own: run the command with the leader's data "
                "directory, or use the administration API through any node's port",
                EXIT_BUSY,
            )
        if info is not None:
            return _Remote(info)
        if time.monotonic() > deadline:  # locked, but nobody serves: another CLI command or a starting server
            raise CliError(
                f"the data directory {data_dir} is in use by another oncebus process (pid {datadir.owner_pid()}) "
                "that does not serve it; wait for it to finish",
                EXIT_BUSY,
            )
        time.sleep(0.05)


# ---------------------------------------------------------------------------------- serve
def _serve(args: argparse.Namespace, settings: Settings) -> int:
    for option, value in (("--port", args.port), ("--tls-port", args.tls_port), ("--http-port", args.http_port)):
        if value is not None and not (0 if option == "--port" else -1) <= value <= 65535:
            raise CliError(f"{option} {value}: use a port from 0 to 65535 (0 picks a free one)", EXIT_USAGE)
    options = ServeOptions(
        data_dir=resolve_data_dir(args.data_dir, settings.data_dir),
        host=args.host,
        port=args.port,
        tls_port=args.tls_port,
        http_port=args.http_port,
        keys=_keys(args, settings),
        allow_default_key=args.allow_default_key,
        allow_faults=args.allow_faults,
        config=args.config,
        send_log=args.send_log,
        clock_file=settings.clock_file,  # tests only: time read from a file
        store=_store(args, settings),
        tier=args.tier,
        cluster=args.cluster,
        advertise=args.advertise,
        settings=settings,
    )
    try:
        return event_loop.run(run(options, install_signal_handlers=True), settings.event_loop)
    except ServeError as exc:
        raise CliError(str(exc), EXIT_BUSY if exc.busy else EXIT_REFUSED) from exc


def _store(args: argparse.Namespace, settings: Settings) -> str | None:
    try:
        if args.store is not None:
            return store_spec(args.store)
        return store_spec(settings.store, option="ONCEBUS_STORE")
    except InvalidArgumentError as exc:
        raise CliError(str(exc), EXIT_USAGE) from None


def _keys(args: argparse.Namespace, settings: Settings) -> KeyRing | None:
    """The SAS keys from --key, --keys-file and ONCEBUS_SAS_KEYS, together (None: the emulator's default key)."""
    entries: list[SasKey] = []
    try:
        for item in args.key or []:
            try:
                entries.append(parse_key_spec(item))
            except ValueError as exc:
                raise ValueError(f"--key: {exc}") from None
        if args.keys_file:
            entries += read_keys_file(args.keys_file).entries()
        if settings.keys is not None:  # ONCEBUS_SAS_KEYS
            entries += settings.keys.entries()
        return KeyRing(entries) if entries else None
    except ValueError as exc:
        raise CliError(str(exc), EXIT_USAGE) from None


# ---------------------------------------------------------------------------------- entity commands
def _entity_properties(args: argparse.Namespace, kind: str) -> dict[str, Any]:
    props: dict[str, Any] = {}
    mapping = {
        "duplicate_detection": "requires_duplicate_detection",
        "window": "duplicate_detection_history_time_window",
        "partitioned": "enable_partitioning",
        "sessions": "requires_session",
        "lock_duration": "lock_duration",
        "max_delivery_count": "max_delivery_count",
        "ttl": "default_message_time_to_live",
        "dead_letter_on_expiration": "dead_lettering_on_message_expiration",
        "max_size_mb": "max_size_in_megabytes",
        "max_message_size_kb": "max_message_size_in_kilobytes",
        "auto_delete_on_idle": "auto_delete_on_idle",
        "forward_to": "forward_to",
        "forward_dead_lettered_to": "forward_dead_lettered_messages_to",
        "dead_letter_on_filter_exceptions": "dead_lettering_on_filter_evaluation_exceptions",
    }
    for option, prop in mapping.items():
        value = getattr(args, option, None)
        if value is not None:
            props[prop] = value
    return props


def _print_properties(props: dict[str, Any]) -> None:
    width = max(len(k) for k in props)
    for key, value in props.items():
        print(f"{key:<{width}}  {value}")


def _print_table(rows: list[dict[str, Any]], columns: Sequence[str]) -> None:
    if not rows:
        print("(none)")
        return
    cells = [[("" if r.get(c) is None else str(r.get(c))) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    print("  ".join(c.upper().ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip())
    for row in cells:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())


def _entity_command(args: argparse.Namespace, target: _Remote | _Local) -> int:
    kind, action = args.kind, args.action
    base: dict[str, Any] = {}
    if kind == "subscription":
        base["topic"] = args.topic
    if action in ("create", "update"):
        result = target.call(
            f"{kind}.{action}", {**base, "name": args.name, "properties": _entity_properties(args, kind)}
        )
        _output(args, result, lambda r: _print_properties(r))
    elif action == "show":
        _output(args, target.call(f"{kind}.show", {**base, "name": args.name}), _print_properties)
    elif action == "delete":
        target.call(f"{kind}.delete", {**base, "name": args.name})
        print(f"deleted {kind} {args.name}")
    elif action == "list":
        rows = target.call(f"{kind}.list", base)
        columns = ["name", "requires_duplicate_detection", "duplicate_detection_history_time_window"]
        if kind == "subscription":
            columns = ["name", "requires_session", "lock_duration", "max_delivery_count"]
        elif kind == "queue":
            columns += ["enable_partitioning", "requires_session"]
        else:
            columns += ["enable_partitioning"]
        _output(args, rows, lambda r: _print_table(r, columns))
    return 0


def _output(args: argparse.Namespace, result: Any, human: Any) -> None:
    if getattr(args, "json", False):
        print(json.dumps(result, indent=2, default=str))
    else:
        human(result)


# ---------------------------------------------------------------------------------- messages
def _body(args: argparse.Namespace) -> bytes:
    if args.file is not None:
        return Path(args.file).read_bytes()
    if args.body is not None and args.body != "-":
        return str(args.body).encode()
    if args.body == "-" or not sys.stdin.isatty():
        return sys.stdin.buffer.read()
    raise CliError("no message body: give it as an argument, with --file, or on stdin ('-')", EXIT_USAGE)


# the sender's text properties but the message id (which --count numbers), as options of ``oncebus send``
_STRING_PROPERTIES = tuple(p.field for p in SENDER_PROPERTIES if p.kind is str and p.field and p.field != "message_id")


def _send(args: argparse.Namespace, target: _Remote | _Local) -> int:
    body = base64.b64encode(_body(args)).decode()
    properties: dict[str, str] = {}
    for item in args.property or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise CliError(f"--property {item!r}: use KEY=VALUE", EXIT_USAGE)
        properties[key] = value
    if args.count < 1 or args.batch_size < 1:
        raise CliError("--count and --batch-size must be at least 1", EXIT_USAGE)
    scheduled_us = None
    if args.schedule_in is not None:
        scheduled_us = time.time_ns() // 1000 + to_micros(parse_duration(args.schedule_in, name="--schedule-in"))
        if not 0 <= scheduled_us <= LATEST_US:
            raise InvalidArgumentError(
                f"--schedule-in {args.schedule_in}: the scheduled time would be "
                f"{'after year 9999' if scheduled_us > 0 else 'before 1970'}; Service Bus cannot hold it"
            )

    def message(i: int) -> dict[str, Any]:
        out: dict[str, Any] = {"body_b64": body}
        if args.message_id is not None:
            out["message_id"] = args.message_id.replace("{i}", str(i))
        for name in _STRING_PROPERTIES:
            if getattr(args, name) is not None:
                out[name] = getattr(args, name)
        if args.ttl is not None:
            out["time_to_live"] = args.ttl
        if scheduled_us is not None:
            out["scheduled_enqueue_time_utc"] = scheduled_us
        if properties:
            out["application_properties"] = properties
        return out

    progress = _Progress(args.count, enabled=args.count > 1 and (sys.stderr.isatty() or args.progress))
    accepted = duplicates = 0
    last: list[dict[str, Any]] = []
    batch_size = args.batch_size
    if target.max_request is not None:  # a batch is one request line: fewer messages when they are large
        room = target.max_request - 4096 - len(json.dumps(args.entity))
        batch_size = max(1, min(batch_size, room // (len(json.dumps(message(args.count - 1))) + 2)))
    start = 0
    while start < args.count:
        chunk = [message(i) for i in range(start, min(args.count, start + batch_size))]
        try:
            last = target.call("send", {"entity": args.entity, "messages": chunk})
        except MessageSizeExceededError:
            if len(chunk) == 1:
                raise
            batch_size = len(chunk) // 2  # over the entity's limit for one send: nothing was stored; halve
            continue
        duplicates += sum(1 for o in last if o["duplicate"])
        accepted += sum(1 for o in last if not o["duplicate"])
        start += len(chunk)
        progress.update(start)
    progress.done()
    if args.json:
        print(json.dumps({"sent": args.count, "stored": accepted, "duplicates_dropped": duplicates}))
    elif args.count == 1:
        outcome = last[0]
        if outcome["duplicate"]:
            print(f"accepted (duplicate of message_id {outcome['message_id']!r}: dropped, as Service Bus does)")
        else:
            late = outcome.get("late_resend_delay_seconds")
            extra = f"; late resend: first sent {late:.3f} s ago, outside the window" if late is not None else ""
            print(
                f"accepted: message_id {outcome['message_id']!r}, sequence number {outcome['sequence_number']}{extra}"
            )
    else:
        print(f"sent {args.count}: {accepted} stored, {duplicates} duplicates dropped")
    return 0


class _Progress:
    def __init__(self, total: int, *, enabled: bool) -> None:
        self.total = total
        self.enabled = enabled
        self.started = time.monotonic()

    def update(self, done: int) -> None:
        if not self.enabled:
            return
        width = 30
        filled = int(width * done / self.total)
        rate = done / max(time.monotonic() - self.started, 1e-9)
        sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{self.total}  {rate:,.0f} msg/s")
        sys.stderr.flush()

    def done(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")


def _print_messages(messages: list[dict[str, Any]]) -> None:
    if not messages:
        print("(no messages)")
    for m in messages:
        extra = []
        for name in ("session_id", "partition_key", "dead_letter_reason"):
            if m.get(name):
                extra.append(f"{name}={m[name]}")
        print(f"#{m['sequence_number']} message_id={m['message_id']} {' '.join(extra)}".rstrip())
        print(f"  enqueued {m['enqueued_time_utc']}  delivery_count={m['delivery_count']}  state={m['state']}")
        print(f"  {m['body']}")


def _receive(args: argparse.Namespace, target: _Remote | _Local) -> int:
    result = target.call(
        "receive",
        {
            "path": args.path,
            "max_message_count": args.max,
            "max_wait_time": args.wait,
            "session_id": args.session_id,
            "next_session": args.next_session,
        },
    )
    _output(args, result, _print_messages)
    return 0


def _peek(args: argparse.Namespace, target: _Remote | _Local) -> int:
    result = target.call(
        "peek",
        {
            "path": args.path,
            "max_message_count": args.max,
            "sequence_number": args.from_sequence_number,
            "session_id": args.session_id,
        },
    )
    _output(args, result, _print_messages)
    return 0


def _token(args: argparse.Namespace, target: _Remote | _Local) -> int:
    """A SAS token for the REST data plane and the administration API, signed by the running server."""
    if not isinstance(target, _Remote):
        raise CliError(
            "oncebus token asks the running server to sign with its keys: start oncebus serve on this data "
            "directory first",
            EXIT_UNREACHABLE,
        )
    host = args.host or str(target.info.get("amqp_host") or "127.0.0.1")
    if host in ("0.0.0.0", "::", ""):  # listening everywhere: name the host clients use with --host
        host = "127.0.0.1"
    entity = (args.entity or "").strip("/")
    request: dict[str, Any] = {"resource": f"sb://{host}/{entity}", "ttl": args.ttl}
    if args.key_name:
        request["key_name"] = args.key_name
    result = target.call("token", request)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(result["token"])
    return 0


def _stats(args: argparse.Namespace, target: _Remote | _Local) -> int:
    rows = target.call("stats", {"name": args.entity})

    def human(rows: list[dict[str, Any]]) -> None:
        table = []
        for r in rows:
            late = r["late_resend_delay_seconds"]
            table.append(
                {
                    "entity": r["name"],
                    "kind": r["kind"],
                    "dedup": r["duplicate_detection_history_time_window"]
                    if r["requires_duplicate_detection"]
                    else "off",
                    "active": r["active_message_count"],
                    "scheduled": r["scheduled_message_count"],
                    "deferred": r["deferred_message_count"],
                    "dead_lettered": r["dead_letter_message_count"],
                    "accepted": r["accepted"],
                    "duplicates": r["duplicates_dropped"],
                    "keys_held": r["keys_held"],
                    "oldest_key_s": "" if r["oldest_key_age_seconds"] is None else f"{r['oldest_key_age_seconds']:.1f}",
                    "late_resends": r["late_resends"],
                    "late_p50_s": "" if late["p50"] is None else f"{late['p50']:.1f}",
                }
            )
        _print_table(table, list(table[0]) if table else ["entity"])

    _output(args, rows, human)
    return 0


# ---------------------------------------------------------------------------------- faults
def _fault(args: argparse.Namespace, target: _Remote | _Local) -> int:
    if isinstance(target, _Local):
        raise CliError(
            f"faults are armed on a running oncebus serve, and none serves {target.datadir.path}; start one first",
            EXIT_REFUSED,
        )
    if args.action == "arm":
        spec = {"kind": args.kind, "entity": args.entity, "count": args.count, "duration": args.duration}
        spec.update(after=args.after, delay=args.delay, seconds=args.seconds, how=args.how)
        fault = target.call("fault.arm", {"fault": {k: v for k, v in spec.items() if v is not None}})
        _output(args, fault, lambda f: print(f"armed {f['id']}: {_fault_text(f)}"))
    elif args.action == "list":
        rows = target.call("fault.list", {})
        _output(
            args, rows, lambda r: _print_table([{"id": f["id"], "fault": _fault_text(f)} for f in r], ["id", "fault"])
        )
    else:
        cleared = target.call("fault.clear", {"id": args.id})
        _output(args, cleared, lambda c: print(f"cleared {c['cleared']} fault(s)"))
    return 0


def _fault_text(fault: dict[str, Any]) -> str:
    parts = [fault["kind"], f"on {fault['entity'] or 'every entity'}"]
    if fault.get("how") and fault["kind"] == "lost-ack":
        parts.append(f"({fault['how']})")
    if fault.get("seconds") is not None:
        parts.append(f"by {fault['seconds']:g} s")
    if fault.get("after"):
        parts.append(f"after {fault['after']} operation(s)")
    if fault.get("delay"):
        parts.append(f"from {fault['delay']:g} s after arming")
    if fault.get("remaining") is not None:
        parts.append(f"{fault['remaining']} more time(s)")
    else:
        parts.append(f"for {fault['duration']:g} s")
    if fault.get("fired"):
        parts.append(f"fired {fault['fired']}")
    return " ".join(parts)


def _add_fault_parser(commands: Any) -> None:
    from oncebus.broker import FAULT_KINDS

    fault = commands.add_parser(
        "fault", help="arm, list and clear faults on a running oncebus serve (for tests)"
    ).add_subparsers(dest="action", required=True)
    arm = fault.add_parser("arm", help="arm a fault: the next operations on an entity (or all) fail on cue")
    arm.add_argument("kind", choices=FAULT_KINDS)
    arm.add_argument("--entity", help="the queue or topic (its subscriptions included); default: every entity")
    arm.add_argument("--count", type=int, help="fire on the next N matching operations (default 1)")
    arm.add_argument("--duration", type=_seconds, help="fire on every matching operation for this many seconds")
    arm.add_argument("--after", type=int, help="let N matching operations through first")
    arm.add_argument("--delay", type=_seconds, help="live only this many seconds from now")
    arm.add_argument("--seconds", type=_seconds, help="slow-ack, slow-delivery: how long to hold each one back")
    arm.add_argument("--how", choices=("drop", "close", "detach"), help="lost-ack: cut, close or detach (drop)")
    arm.add_argument("--json", action="store_true")
    listing = fault.add_parser("list", help="the faults armed now")
    listing.add_argument("--json", action="store_true")
    clear = fault.add_parser("clear", help="disarm a fault by id, or all of them")
    clear.add_argument("id", nargs="?")
    clear.add_argument("--json", action="store_true")


# ---------------------------------------------------------------------------------- parser
def _add_entity_options(parser: argparse.ArgumentParser, kind: str) -> None:
    if kind in ("queue", "topic"):
        parser.add_argument(
            "--duplicate-detection",
            action=argparse.BooleanOptionalAction,
            default=None,
            help="requires_duplicate_detection (fixed at creation)",
        )
        parser.add_argument("--window", help="duplicate_detection_history_time_window, ISO-8601 (PT20S..P7D)")
        parser.add_argument(
            "--partitioned", action=argparse.BooleanOptionalAction, default=None, help="enable_partitioning"
        )
        parser.add_argument("--max-size-mb", type=int, help="max_size_in_megabytes")
        parser.add_argument("--max-message-size-kb", type=int, help="max_message_size_in_kilobytes")
    if kind in ("queue", "subscription"):
        parser.add_argument("--sessions", action=argparse.BooleanOptionalAction, default=None, help="requires_session")
        parser.add_argument("--lock-duration", help="lock_duration, ISO-8601 (PT5S..PT5M)")
        parser.add_argument("--max-delivery-count", type=int, help="max_delivery_count")
        parser.add_argument(
            "--dead-letter-on-expiration",
            action=argparse.BooleanOptionalAction,
            default=None,
            help="dead_lettering_on_message_expiration",
        )
    parser.add_argument("--ttl", help="default_message_time_to_live, ISO-8601")
    parser.add_argument("--auto-delete-on-idle", help="auto_delete_on_idle, ISO-8601 (at least PT5M)")
    if kind in ("queue", "subscription"):
        parser.add_argument("--forward-to", help="forward_to: a queue or topic ('' stops forwarding)")
        parser.add_argument(
            "--forward-dead-lettered-to", help="forward_dead_lettered_messages_to: a queue or topic ('' stops it)"
        )
    if kind == "subscription":
        parser.add_argument(
            "--dead-letter-on-filter-exceptions",
            action=argparse.BooleanOptionalAction,
            default=None,
            help="dead_lettering_on_filter_evaluation_exceptions (default true)",
        )


class _Parser(argparse.ArgumentParser):
    """Options and positional arguments in any order (``send orders --message-id m1 hello``).

    A command's own parser reads its options first, then its positionals (argparse's intermixed
    parsing); parsers that dispatch to sub-commands parse as usual.
    """

    def __init__(self, *args: Any, intermixed: bool = True, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._intermixed = intermixed
        self._inside = False

    def parse_known_args(  # type: ignore[override]  # argparse's overloads, one signature here
        self, args: Any = None, namespace: Any = None
    ) -> tuple[argparse.Namespace, list[str]]:
        if not self._intermixed or self._inside or self._subparsers is not None:
            return super().parse_known_args(args, namespace)
        self._inside = True  # parse_known_intermixed_args calls parse_known_args twice
        try:
            return self.parse_known_intermixed_args(args, namespace)
        finally:
            self._inside = False


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 <= value < math.inf:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds (0 or more)")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="oncebus", description="A local Azure Service Bus with exact dedup.")
    parser.add_argument("--version", action="version", version=f"oncebus {__version__}")
    parser.add_argument("--data-dir", help="data directory (default: $ONCEBUS_DATA_DIR or ./.oncebus)", default=None)
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run the broker on the data directory")
    serve.add_argument("--host", default="127.0.0.1", help="listen address of every port (default 127.0.0.1)")
    serve.add_argument(
        "--port",
        type=int,
        default=5672,
        help="the main port: AMQP, AMQP over TLS, HTTPS and HTTP (default 5672; 0 picks a free one)",
    )
    serve.add_argument(
        "--tls-port",
        type=int,
        default=None,
        help="TLS-only port for UseDevelopmentEmulator=false clients (default 5671, or a free one with --port 0; "
        "-1: none)",
    )
    serve.add_argument(
        "--http-port",
        type=int,
        default=None,
        help="plain-HTTP port like the emulator's (default 5300, or a free one with --port 0; -1: none)",
    )
    serve.add_argument("--config", help="topology file in the Service Bus emulator's config.json format")
    serve.add_argument("--send-log", help="directory to record every send attempt in (JSON lines)")
    serve.add_argument(
        "--key",
        action="append",
        help="SAS key NAME=KEY (all rights) or NAME:RIGHTS=KEY, RIGHTS a comma-separated list of Send, Listen, "
        "Manage (repeatable; shows in the process list: prefer --keys-file or $ONCEBUS_SAS_KEYS)",
    )
    serve.add_argument(
        "--keys-file",
        help="file of SAS keys, one NAME=KEY or NAME:RIGHTS=KEY a line (# comments); "
        "$ONCEBUS_SAS_KEYS holds the same, separated by ';'",
    )
    serve.add_argument(
        "--allow-default-key",
        action="store_true",
        help="serve beyond loopback (--host) with the emulator's default key, which is public (refused otherwise)",
    )
    serve.add_argument(
        "--allow-faults",
        action="store_true",
        help="let faults be armed ('oncebus fault', POST /$faults) when serving beyond loopback (refused otherwise)",
    )
    serve.add_argument(
        "--store",
        help="where messages and dedup keys are kept: a postgresql://user:password@host:port/database URL, or sqlite "
        "(default: $ONCEBUS_STORE, else oncebus.db in the data directory)",
    )
    serve.add_argument(
        "--cluster",
        action="store_true",
        help="one node of several on the same PostgreSQL store: one leads, the others forward their clients to it "
        "and take over when it stops (see the README's cluster section)",
    )
    serve.add_argument(
        "--advertise",
        metavar="HOST",
        help="with --cluster: the name or address other nodes reach this one at (default: --host, or this "
        "machine's name when --host is 0.0.0.0 or ::)",
    )
    serve.add_argument("--log-format", choices=["text", "json"], default="text", help="stderr log lines: text or json")
    serve.add_argument(
        "--tier",
        type=str.lower,
        choices=["standard", "premium"],
        default=None,
        help="the namespace's Service Bus tier, whose quotas (message size, entity counts, ...) apply as Azure "
        "enforces them (default: $ONCEBUS_TIER, else standard; $ONCEBUS_MESSAGING_UNITS sets a premium "
        "namespace's messaging units, 1 by default)",
    )

    for kind in ("queue", "topic", "subscription"):
        group = commands.add_parser(kind, help=f"manage {kind}s").add_subparsers(dest="action", required=True)
        for action in ("create", "update", "delete", "show", "list"):
            sub = group.add_parser(action)
            sub.set_defaults(kind=kind)
            if kind == "subscription":
                sub.add_argument("topic")
            if action != "list":
                sub.add_argument("name")
            if action in ("create", "update"):
                _add_entity_options(sub, kind)
            sub.add_argument("--json", action="store_true", help="print JSON")

    add_rule_parser(commands)
    _add_fault_parser(commands)

    send = commands.add_parser("send", help="send a message (or --count N of them)")
    send.add_argument("entity", help="queue or topic")
    send.add_argument("body", nargs="?", help="message body; '-' or omitted reads stdin")
    send.add_argument("--file", help="read the body from a file")
    send.add_argument("--message-id", help="message_id; '{i}' is replaced by the message's number with --count")
    for field in _STRING_PROPERTIES:  # the message model's other text properties, from its table
        send.add_argument(f"--{field.replace('_', '-')}", dest=field, help=field)
    send.add_argument("--property", action="append", help="application property KEY=VALUE (repeatable)")
    send.add_argument("--ttl", help="time to live, ISO-8601")
    send.add_argument("--schedule-in", help="schedule the message this far ahead, ISO-8601")
    send.add_argument("--count", type=int, default=1, help="send N messages (load)")
    send.add_argument(
        "--batch-size",
        type=int,
        default=100,
        help="messages per atomic send with --count (fewer when a batch would pass the entity's size limit)",
    )
    send.add_argument("--progress", action="store_true", help="show the progress bar even when not on a terminal")
    send.add_argument("--json", action="store_true")

    receive = commands.add_parser("receive", help="receive and remove messages")
    receive.add_argument("path", help="queue, TOPIC/Subscriptions/SUB, or .../$DeadLetterQueue")
    receive.add_argument("--max", type=int, default=1)
    receive.add_argument("--wait", type=_seconds, default=0.0, help="seconds to wait for the first message")
    receive.add_argument("--session-id")
    receive.add_argument("--next-session", action="store_true", help="take the next available session")
    receive.add_argument("--json", action="store_true")

    peek = commands.add_parser("peek", help="look at messages without locking or removing them")
    peek.add_argument("path")
    peek.add_argument("--max", type=int, default=10)
    peek.add_argument("--from-sequence-number", type=int, default=0)
    peek.add_argument("--session-id")
    peek.add_argument("--json", action="store_true")

    token = commands.add_parser(
        "token",
        help="print a SAS token for the REST API (Authorization header), signed by the running server",
        description="Prints a SharedAccessSignature token for ENTITY (default: the whole namespace) made with one of "
        'the running server\'s keys, e.g. curl -H "Authorization: $(oncebus token orders)" ...',
    )
    token.add_argument("entity", nargs="?", help="queue or topic (and its subscriptions) the token is for")
    token.add_argument("--key-name", help="the key to sign with (default: the key of the printed connection string)")
    token.add_argument("--ttl", type=int, default=3600, help="seconds the token is valid (default 3600)")
    token.add_argument("--host", help="the host clients use (default: the server's --host)")
    token.add_argument("--json", action="store_true", help="the token with its expiry and rights, as JSON")

    stats = commands.add_parser("stats", help="per-entity statistics, duplicates and late resends included")
    stats.add_argument("entity", nargs="?")
    stats.add_argument("--json", action="store_true")

    advise = commands.add_parser(
        "advise",
        intermixed=False,  # its own options are passed on to the advisor
        help="window advisor over a send log (needs the spark extra)",
        description="Options: --share 0.999, --candidates PT1M,PT10M, --out DIR, --master URL.",
    )
    advise.add_argument("log", help="send-log directory written by 'oncebus serve --send-log'")
    _data_dir_everywhere(commands)
    return parser


def _data_dir_everywhere(commands: argparse._SubParsersAction[Any]) -> None:
    """``--data-dir`` after the command too (``oncebus serve --data-dir DIR``, the order people type), on every
    command and action; given there, it wins over one given before the command."""
    for sub in set(commands.choices.values()):
        sub.add_argument("--data-dir", default=argparse.SUPPRESS, help="data directory (as before the command)")
        for action in sub._actions:
            if isinstance(action, argparse._SubParsersAction):
                _data_dir_everywhere(action)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown and args.command != "advise":
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    settings = Settings()
    try:
        try:
            settings = Settings.from_environ()  # every ONCEBUS_* variable, read and checked once
        except SettingsError as exc:
            raise CliError(str(exc), EXIT_USAGE) from None
        if args.command == "serve":
            from oncebus.logs import configure_logging

            configure_logging(args.log_format)
            return _serve(args, settings)
        if args.command == "advise":
            try:
                from oncebus.spark._advisor import main as advise_main
            except ImportError as exc:
                raise CliError(
                    f"'oncebus advise' needs the spark extra: pip install 'oncebus[spark]' ({exc})", EXIT_USAGE
                ) from exc
            return int(advise_main([args.log, *unknown]) or 0)
        target = _open_target(resolve_data_dir(args.data_dir, settings.data_dir), settings)
        try:
            handlers = {
                "send": _send,
                "receive": _receive,
                "peek": _peek,
                "stats": _stats,
                "token": _token,
                "rule": rule_command,
            }
            handler = {**handlers, "fault": _fault}.get(args.command)
            if handler is not None:
                return handler(args, target)
            return _entity_command(args, target)
        finally:
            target.close()
    except CliError as exc:
        print(f"oncebus: error: {exc}", file=sys.stderr)
        return exc.code
    except InvalidArgumentError as exc:
        print(f"oncebus: error: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    except OncebusError as exc:
        print(f"oncebus: error: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    except OSError as exc:
        print(f"oncebus: error: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    except Exception as exc:  # a bug: one line, the traceback only when asked for
        if settings.debug:
            raise
        print(
            f"oncebus: error: internal error ({type(exc).__name__}: {exc}); "
            "run with ONCEBUS_DEBUG=1 for the traceback and please report it",
            file=sys.stderr,
        )
        return EXIT_REFUSED


if __name__ == "__main__":
    sys.exit(main())
