"""``timebound runs``: drive a host's runs over its API (D8.16).

``--url`` (default ``TIMEBOUND_URL``, else http://127.0.0.1:8080) names the host, the token comes
from ``TIMEBOUND_TOKEN``; ``--json`` prints the host's answers as JSON. Exit codes: 0 done,
1 the call failed (one line on stderr: the host's problem, an unreachable host, the deadline),
2 usage (argparse, or an option that is not valid), 130 interrupted.
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import httpx

from .. import ConfigurationError, DeadlineExceeded, InvalidInput, fail_after, format_duration
from ..host import Client, HostError, telemetry_event
from ..telemetry import Timeline
from ._render import stored_line

__all__ = ["common_options", "register", "remote"]


class UsageError(Exception):
    """An option's value is not valid (exit 2)."""


def _ms_text(ms: Any) -> str:
    """A span the host's answer gives in ms, as every duration is shown (D1.14)."""
    return "?" if not isinstance(ms, int | float) else format_duration(ms / 1000)


def common_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--url",
        default=os.environ.get("TIMEBOUND_URL"),
        help="the host's URL (default $TIMEBOUND_URL, else http://127.0.0.1:8080); "
        "the token comes from $TIMEBOUND_TOKEN",
    )
    p.add_argument("--json", action="store_true", help="print the host's answers as JSON")
    p.add_argument(
        "--timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="a deadline for the whole command, sent to the host",
    )


def remote(
    command: str, action: Callable[[Client, argparse.Namespace], None]
) -> Callable[[argparse.Namespace], int]:
    """A handler running ``action`` with a client, every failure one line and an exit code."""

    def handler(args: argparse.Namespace) -> int:
        try:
            with Client(args.url) as client, _bounded(args.timeout):
                action(client, args)
        except UsageError as exc:
            print(f"timebound {command}: {exc}", file=sys.stderr)
            return 2
        except HostError as exc:
            print(
                f"timebound {command}: {exc.detail} (HTTP {exc.status}, {exc.code})",
                file=sys.stderr,
            )
            return 1
        except DeadlineExceeded as exc:
            print(f"timebound {command}: {exc}", file=sys.stderr)
            return 1
        except InvalidInput as exc:  # refused before sending (an empty --reason)
            print(f"timebound {command}: {exc}", file=sys.stderr)
            return 2
        except httpx.TransportError as exc:
            where = args.url or os.environ.get("TIMEBOUND_URL") or "http://127.0.0.1:8080"
            reason = str(exc) or type(exc).__name__
            print(
                f"timebound {command}: cannot reach the host at {where}: {reason}", file=sys.stderr
            )
            return 1
        except KeyboardInterrupt:
            print(f"timebound {command}: interrupted", file=sys.stderr)
            return 130
        return 0

    return handler


@contextmanager
def _bounded(timeout: float | None) -> Iterator[None]:
    if timeout is None:
        yield
        return
    if not timeout > 0:
        raise UsageError(f"--timeout: expected a positive number of seconds, got {timeout}")
    with fail_after(timeout):
        yield


def emit(args: argparse.Namespace, value: Any, human: Callable[[Any], str]) -> None:
    print(json.dumps(value, indent=2, sort_keys=True) if args.json else human(value))


def when(ms: Any) -> str:
    """Epoch milliseconds as local date-time (``-`` for none)."""
    if not isinstance(ms, int):
        return "-"
    return datetime.fromtimestamp(ms / 1000, UTC).astimezone().strftime("%Y-%m-%d %H:%M:%S")


def table(rows: list[list[str]], header: list[str]) -> str:
    if not rows:
        return "(none)"
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = [header, *rows]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in lines
    )


# ------------------------------------------------------------------------------- runs


def _list(client: Client, args: argparse.Namespace) -> None:
    page = client.runs(status=args.status, definition=args.definition, cursor=args.cursor)

    def human(page: Any) -> str:
        rows = [
            [r["id"], r["definition_id"], r["status"], when(r["started_at"]), r.get("error") or ""]
            for r in page["runs"]
        ]
        out = table(rows, ["RUN", "DEFINITION", "STATUS", "STARTED", "ERROR"])
        if page["next_cursor"]:
            out += f"\nmore: --cursor {page['next_cursor']}"
        return out

    emit(args, page, human)


def _show_detail(detail: Any) -> str:
    run = detail["run"]
    lines = [
        f"run         {run['id']}",
        f"definition  {run['definition_id']} v{run['definition_version']}",
        f"status      {run['status']}",
        f"started     {when(run['started_at'])}",
        f"deadline    {when(run['timeout_at'])}",
        f"finished    {when(run.get('finished_at'))}",
    ]
    if run.get("error"):
        lines.append(f"error       {run['error']}")
    fired = detail.get("bound_fired")
    if fired:
        where = " ".join(str(fired[k]) for k in ("bound_set_by", "bound_set_by_id") if fired.get(k))
        lines.append(
            f"bound fired {fired.get('timeout_type')} {_ms_text(fired.get('timeout_duration_ms'))}"
            f" (set by {where or '?'})"
        )
    lines.append(f"input       {json.dumps(run.get('input'))}")
    return "\n".join(lines)


def _show(client: Client, args: argparse.Namespace) -> None:
    emit(args, client.get(args.run_id), _show_detail)


def _json_arg(text: str | None, option: str) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise UsageError(f"{option}: not JSON: {exc}") from None


def _start(client: Client, args: argparse.Namespace) -> None:
    if args.deadline is not None and not args.deadline > 0:
        raise UsageError(f"--deadline: expected a positive number of seconds, got {args.deadline}")
    run_id = client.start(
        args.definition,
        _json_arg(args.input, "--input"),
        deadline=args.deadline,
        idempotency_key=args.idempotency_key,
        run_id=args.run_id,
    )
    if args.wait:
        emit(args, client.wait(run_id), _show_detail)
    else:
        emit(args, {"run_id": run_id}, lambda v: v["run_id"])


def _cancel(client: Client, args: argparse.Namespace) -> None:
    emit(args, client.cancel(args.run_id), lambda v: f"{v['run_id']} {v['status']}")


def _operator() -> str | None:
    """Who runs the command: the local user's name, recorded with the host's own ``api``."""
    try:
        return getpass.getuser() or None
    except (OSError, KeyError):  # no user name in the environment nor the password database
        return None


def _by(text: str) -> Any:
    """``--by``: a duration as timebound spells it (``90s``, ``5min``), or plain seconds."""
    try:
        return float(text)
    except ValueError:
        return text


def _acted(value: Any) -> str:
    if "extended" in value:
        used = _ms_text(value["extension_used_ms"])
        return f"{value['run_id']} extended (used {used} of the cap)"
    after = f" from {value['from_node']}" if value.get("from_node") else ""
    return f"{value['run_id']} {value['status']}{after}"


def _retry(client: Client, args: argparse.Namespace) -> None:
    answer = client.retry(
        args.run_id,
        reason=args.reason,
        from_node=args.from_node,
        from_start=args.from_start,
        operator=args.operator,
    )
    emit(args, answer, _acted)


def _terminate(client: Client, args: argparse.Namespace) -> None:
    emit(args, client.terminate(args.run_id, reason=args.reason, operator=args.operator), _acted)


def _extend(client: Client, args: argparse.Namespace) -> None:
    try:
        answer = client.extend(
            args.run_id, by=_by(args.by), reason=args.reason, node=args.node, operator=args.operator
        )
    except ConfigurationError as exc:
        raise UsageError(f"--by: {exc}") from None
    emit(args, answer, _acted)


def _operator_options(v: argparse.ArgumentParser) -> None:
    v.add_argument("run_id")
    v.add_argument("--reason", required=True, help="why, recorded in the run's events")
    v.add_argument(
        "--operator",
        default=_operator(),
        help="who acts, recorded with the reason (default: your user name)",
    )


def _event_line(event: Any) -> str:
    data = " ".join(f"{k}={json.dumps(v)}" for k, v in sorted(event["data"].items()))
    return f"{event['seq']:>4} {event['kind']} {data}".rstrip()


def _events(client: Client, args: argparse.Namespace) -> None:
    events = client.follow(args.run_id) if args.follow else iter(client.events(args.run_id))
    if args.timeline and not args.json:
        # The wire's events as the events the run's listeners heard, in the one timeline
        # (D10.9, D10.12).
        timeline = Timeline(sys.stdout)
        for event in events:
            stored_line(timeline, telemetry_event(event))
            sys.stdout.flush()
        return
    for event in events:
        print(json.dumps(event, sort_keys=True) if args.json else _event_line(event), flush=True)


def register(sub: Any) -> None:
    p = sub.add_parser(
        "runs", help="list, show, start, cancel, retry, terminate, extend runs; read their events"
    )
    verbs = p.add_subparsers(dest="verb", metavar="VERB", required=True)

    v = verbs.add_parser("list", help="runs, newest first, a page at a time")
    common_options(v)
    v.add_argument("--status", help="running, completed, failed, timed_out, cancelled")
    v.add_argument("--definition", help="only runs of this definition")
    v.add_argument("--cursor", help="the page after this cursor (printed as 'more:')")
    v.set_defaults(handler=remote("runs list", _list))

    v = verbs.add_parser("show", help="a run: status, deadline, bound that fired")
    common_options(v)
    v.add_argument("run_id")
    v.set_defaults(handler=remote("runs show", _show))

    v = verbs.add_parser("start", help="start a run (prints its id)")
    common_options(v)
    v.add_argument("definition")
    v.add_argument("--input", metavar="JSON", help="the run's input as JSON")
    v.add_argument("--deadline", type=float, metavar="SECONDS", help="bound the run further")
    v.add_argument(
        "--idempotency-key",
        metavar="KEY",
        help="the same key and input start one run, however often the command is repeated",
    )
    v.add_argument("--run-id", metavar="ID", help="the run's id, chosen by you (idempotent too)")
    v.add_argument("--wait", action="store_true", help="wait for the run to end, then show it")
    v.set_defaults(handler=remote("runs start", _start))

    v = verbs.add_parser("cancel", help="cancel a running run")
    common_options(v)
    v.add_argument("run_id")
    v.set_defaults(handler=remote("runs cancel", _cancel))

    v = verbs.add_parser("retry", help="run a failed or timed-out run again")
    common_options(v)
    _operator_options(v)
    where = v.add_mutually_exclusive_group()
    where.add_argument("--from-node", metavar="NODE", help="from this node (default: the failed)")
    where.add_argument("--from-start", action="store_true", help="from the start, state cleared")
    v.set_defaults(handler=remote("runs retry", _retry))

    v = verbs.add_parser("terminate", help="end a running run failed (retryable)")
    common_options(v)
    _operator_options(v)
    v.set_defaults(handler=remote("runs terminate", _terminate))

    v = verbs.add_parser("extend", help="give a run (or a live node) more time")
    common_options(v)
    _operator_options(v)
    v.add_argument(
        "--by", required=True, metavar="DURATION", help="how much later: 90s, 5min, 1h or seconds"
    )
    v.add_argument("--node", metavar="NODE", help="extend this node's live tokens, not the run")
    v.set_defaults(handler=remote("runs extend", _extend))

    v = verbs.add_parser("events", help="a run's events (--follow: until it ends)")
    common_options(v)
    v.add_argument("run_id")
    v.add_argument("--follow", "-f", action="store_true", help="stream events until the run ends")
    v.add_argument(
        "--timeline",
        action="store_true",
        help="print what each event means, offset from the first (the timeline of "
        "'timebound workflow run')",
    )
    v.set_defaults(handler=remote("runs events", _events))
