"""``timebound ops``: a host's deferred operations over its API (D8.16): list, show, poll now,
cancel. Options, output and exit codes as ``timebound runs``."""

from __future__ import annotations

import argparse
import json
from typing import Any

from ..host import Client
from ._runs import common_options, emit, remote, table

__all__ = ["register"]


def _op_row(op: Any) -> list[str]:
    return [
        op["operation/id"],
        op["module"],
        op["status"],
        str(op["attempts"]),
        op.get("next_poll_at") or "-",
        op.get("last_error_code") or "",
    ]


def _list(client: Client, args: argparse.Namespace) -> None:
    page = client.operations(status=args.status, module=args.module, cursor=args.cursor)

    def human(page: Any) -> str:
        rows = [_op_row(op) for op in page["operations"]]
        out = table(rows, ["OPERATION", "MODULE", "STATUS", "POLLS", "NEXT POLL", "LAST ERROR"])
        if page["next_cursor"]:
            out += f"\nmore: --cursor {page['next_cursor']}"
        return out

    emit(args, page, human)


def _describe(op: Any) -> str:
    return "\n".join(f"{k:<26}{json.dumps(v)}" for k, v in op.items())


def _show(client: Client, args: argparse.Namespace) -> None:
    def human(detail: Any) -> str:
        out = _describe(detail["operation"])
        for entry in detail["history"]:
            out += "\n  " + json.dumps(entry, sort_keys=True)
        return out

    emit(args, client.operation(args.op_id), human)


def _poll(client: Client, args: argparse.Namespace) -> None:
    def human(outcome: Any) -> str:
        said = "applied" if outcome["applied"] else "not applied"
        return f"{outcome['operation']['operation/id']} polled: {said} ({outcome['code']}), " + (
            f"now {outcome['operation']['status']}"
        )

    emit(args, client.poll(args.op_id), human)


def _cancel(client: Client, args: argparse.Namespace) -> None:
    emit(
        args,
        client.cancel_operation(args.op_id),
        lambda d: f"{d.get('operation/id', args.op_id)} {d.get('status', '')}".rstrip(),
    )


def register(sub: Any) -> None:
    p = sub.add_parser("ops", help="list, show, poll or cancel a host's deferred operations")
    verbs = p.add_subparsers(dest="verb", metavar="VERB", required=True)

    v = verbs.add_parser("list", help="operations, newest first, a page at a time")
    common_options(v)
    v.add_argument("--status", help="pending, running, completed, failed, cancelled, expired")
    v.add_argument("--module", help="only operations of this module")
    v.add_argument("--cursor", help="the page after this cursor (printed as 'more:')")
    v.set_defaults(handler=remote("ops list", _list))

    for verb, action, text in (
        ("show", _show, "an operation and its status history"),
        ("poll", _poll, "poll the operation now through the host's connector"),
        ("cancel", _cancel, "ask the operation's connector to cancel it"),
    ):
        v = verbs.add_parser(verb, help=text)
        common_options(v)
        v.add_argument("op_id")
        v.set_defaults(handler=remote(f"ops {verb}", action))
