"""``timebound serve``: the host (API, operator UI, metrics) over a workflow store.

Exit codes: 0 stopped cleanly (or ``--check`` passed); 2 bad configuration or definitions, or
a start-up error (a busy port, a store that cannot be opened), always one line (D8.17).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from ..host import ConfigError, Host, load_config, publish, serve
from ..workflow import StoreError

__all__ = ["register"]


def register(sub: Any) -> None:
    p = sub.add_parser("serve", help="serve workflows over HTTP with an operator UI")
    p.add_argument("--config", metavar="FILE", help="TOML file with a [host] table")
    p.add_argument("--db", help="store URL (default sqlite:///timebound.db; postgresql://…)")
    p.add_argument("--actions", nargs="+", metavar="MODULE", help="modules of python handlers")
    p.add_argument(
        "--connectors",
        nargs="+",
        metavar="MODULE",
        help="modules whose connectors() give the deferred operations' connectors",
    )
    p.add_argument("--workflows", metavar="DIR", help="directory of *.json/*.yaml definitions")
    p.add_argument("--host", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", help="port (default 8080; 0 picks a free one)")
    p.add_argument(
        "--token-file",
        metavar="FILE",
        help="file holding the API/UI token (at least 16 characters, no whitespace)",
    )
    p.add_argument(
        "--allowed-host",
        action="append",
        metavar="NAME",
        help="a host name the Host header may carry besides loopback names and IP addresses "
        "(repeat for more)",
    )
    p.add_argument(
        "--forwarded-allow-ips",
        nargs="+",
        metavar="ADDRESS",
        help="addresses or networks of reverse proxies whose X-Forwarded-For and "
        "X-Forwarded-Proto headers are believed",
    )
    p.add_argument(
        "--drain-timeout",
        metavar="DURATION",
        help="on SIGTERM, how long requests and then running actions may take to finish "
        "(seconds or a duration such as 30s; default 10s)",
    )
    p.add_argument(
        "--retain",
        metavar="DURATION",
        help="delete the runs that ended longer ago than this, with their events (default 7d; "
        "never keeps them)",
    )
    p.add_argument(
        "--no-worker",
        action="store_true",
        help="serve the API and UI only; `timebound worker` processes run the work (PostgreSQL)",
    )
    p.add_argument("--check", action="store_true", help="validate configuration and exit")
    p.set_defaults(handler=_serve)


def _serve(args: argparse.Namespace) -> int:
    options = {
        "db": args.db,
        "actions": args.actions,
        "connectors": args.connectors,
        "workflows": args.workflows,
        "host": args.host,
        "port": args.port,
        "token_file": args.token_file,
        "allowed_hosts": args.allowed_host,
        "forwarded_allow_ips": args.forwarded_allow_ips,
        "drain": args.drain_timeout,
        "retain": args.retain,
        "worker": False if args.no_worker else None,
    }
    try:
        config = load_config(options, os.environ, args.config)
        host = Host.build(config)
    except StoreError as exc:
        # An unsupported or malformed store URL (D8.17): one line, exit 2.
        print(f"timebound serve: db: {exc}", file=sys.stderr)
        return 2
    except ConfigError as exc:
        print(f"timebound serve: {exc}", file=sys.stderr)
        return 2
    if args.check:
        names = ", ".join(sorted(host.definitions)) or "none"
        print(f"configuration is valid; definitions: {names}")
        return 0
    try:
        publish(config, host)
        serve(config, host)
    except ConfigError as exc:
        print(f"timebound serve: {exc}", file=sys.stderr)
        return 2
    return 0
