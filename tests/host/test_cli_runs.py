"""``timebound runs`` and ``timebound ops`` against a real host (D8.16): output, --json, the
token from TIMEBOUND_TOKEN, --url from TIMEBOUND_URL, one-line errors with exit 1, usage exit 2."""

from __future__ import annotations

import asyncio
import getpass
import io
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import redirect_stderr, redirect_stdout
from unittest import mock

import pytest

from timebound.cli import main as cli_main

from ..cli.test_interrupt import default_sigint
from .conftest import ROOT, Server, launch, stop
from .test_deferred_ops import OP_ID, _plant

TOKEN = "cli-token-for-tests"


@pytest.fixture(scope="module")
def secured(host_factory: Callable[..., Server]) -> Server:
    return host_factory(token=TOKEN)


def tb(
    *args: str, url: str | None = None, token: str | None = TOKEN, check: int | None = 0
) -> subprocess.CompletedProcess[str]:
    """``timebound ARGS`` with only the given TIMEBOUND_* variables set: its exit code and output.

    In this process (``cli.main``, which ``python -m timebound`` calls): a fresh interpreter per
    command cost about a second each, seventeen in one test. That the command works in a process
    of its own is shown by the Ctrl-C test below and by tests/cli."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIMEBOUND_")}
    if url is not None:
        env["TIMEBOUND_URL"] = url
    if token is not None:
        env["TIMEBOUND_TOKEN"] = token
    out, err = io.StringIO(), io.StringIO()
    with mock.patch.dict(os.environ, env, clear=True), redirect_stdout(out), redirect_stderr(err):
        try:
            code: int | str | None = cli_main(list(args))
        except SystemExit as exc:  # argparse's usage errors and --help
            code = exc.code
    returncode = code if isinstance(code, int) else 0 if code is None else 1
    done = subprocess.CompletedProcess(args, returncode, out.getvalue(), err.getvalue())
    if check is not None:
        assert done.returncode == check, (done.returncode, done.stdout, done.stderr)
    return done


def test_start_show_list_and_events(secured: Server) -> None:
    """start --wait shows the ended run; list, show and events find it; --json is JSON."""
    done = tb("runs", "start", "quick", "--input", '{"sleep_s": 0}', "--wait", url=secured.url)
    assert "status      completed" in done.stdout
    run_id = done.stdout.split()[1]
    listed = json.loads(tb("runs", "list", "--json", url=secured.url).stdout)
    assert run_id in [r["id"] for r in listed["runs"]]
    assert run_id in tb("runs", "list", "--status", "completed", url=secured.url).stdout
    shown = json.loads(tb("runs", "show", run_id, "--json", url=secured.url).stdout)
    assert shown["run"]["status"] == "completed"
    events = tb("runs", "events", run_id, url=secured.url).stdout.splitlines()
    assert events[0].split()[:2] == ["1", "run_started"]
    assert events[-1].split()[1] == "run_completed"
    timeline = tb("runs", "events", run_id, "--timeline", url=secured.url).stdout.splitlines()
    # The one timeline of `timebound workflow run`: what each event means, offset from the first.
    assert timeline[0] == "  +    0.0 ms  run: started"
    assert timeline[-1].endswith("ms  run: completed")
    assert any(re.fullmatch(r"  \+ *[0-9.]+ ms  token \S+: executing", line) for line in timeline)
    followed = tb("runs", "events", run_id, "--follow", "--json", url=secured.url).stdout
    assert [json.loads(line)["seq"] for line in followed.splitlines()] == list(
        range(1, len(events) + 1)
    )


def test_an_idempotent_start_from_the_command_line(secured: Server) -> None:
    """The same --idempotency-key and input print one run id; --url wins over TIMEBOUND_URL."""
    args = ("runs", "start", "quick", "--input", "{}", "--idempotency-key", "cli-1")
    first = tb(*args, "--url", secured.url, url="http://127.0.0.1:1").stdout.strip()
    again = tb(*args, url=secured.url).stdout.strip()
    assert first == again and first


def test_cancel_and_errors_are_one_line_exit_1(secured: Server) -> None:
    """cancel prints the run's new status; cancelling it again, an unknown run and a wrong token
    are each one line on stderr and exit 1."""
    run_id = tb("runs", "start", "quick", "--input", '{"sleep_s": 30}', url=secured.url).stdout
    run_id = run_id.strip()
    assert tb("runs", "cancel", run_id, url=secured.url).stdout.strip() == f"{run_id} cancelled"
    again = tb("runs", "cancel", run_id, url=secured.url, check=1)
    assert again.stderr.count("\n") == 1 and "409" in again.stderr and "conflict" in again.stderr
    missing = tb("runs", "show", "no-such-run", url=secured.url, check=1)
    assert missing.stderr.startswith("timebound runs show: no run 'no-such-run' (HTTP 404")
    refused = tb("runs", "list", url=secured.url, token="wrong", check=1)
    assert "HTTP 401" in refused.stderr and refused.stderr.count("\n") == 1
    assert "Traceback" not in again.stderr + missing.stderr + refused.stderr


def test_usage_errors_exit_2(secured: Server) -> None:
    """A missing verb, bad --input JSON and a non-positive --deadline or --timeout exit 2."""
    assert "required: VERB" in tb("runs", url=secured.url, check=2).stderr
    bad = tb("runs", "start", "quick", "--input", "{oops", url=secured.url, check=2)
    assert bad.stderr.startswith("timebound runs start: --input: not JSON")
    tb("runs", "start", "quick", "--deadline", "0", url=secured.url, check=2)
    tb("runs", "list", "--timeout", "-1", url=secured.url, check=2)


def test_an_unreachable_host_is_one_line(tmp_path: object) -> None:
    """No host at the URL: one line naming the URL, exit 1."""
    done = tb("ops", "list", url="http://127.0.0.1:1", check=1)
    assert done.stderr.startswith("timebound ops list: cannot reach the host at http://127.0.0.1:1")
    assert done.stderr.count("\n") == 1


def test_events_follow_stops_quietly_on_ctrl_c(secured: Server) -> None:
    """Ctrl-C (SIGINT) on events --follow of a long run exits 130 without a traceback."""
    run_id = tb("runs", "start", "quick", "--input", '{"sleep_s": 30}', url=secured.url).stdout
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIMEBOUND_")}
    env.update(PYTHONPATH=str(ROOT), TIMEBOUND_URL=secured.url, TIMEBOUND_TOKEN=TOKEN)
    proc = subprocess.Popen(
        [sys.executable, "-m", "timebound", "runs", "events", run_id.strip(), "--follow"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=default_sigint,
    )
    assert proc.stdout is not None
    assert "run_started" in proc.stdout.readline()  # streaming: the first event has arrived
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and err.strip() == "timebound runs events: interrupted"
    tb("runs", "cancel", run_id.strip(), url=secured.url)


@pytest.fixture(scope="module")
def with_ops(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("cli-ops")
    asyncio.run(_plant(f"sqlite:///{tmp}/host.db"))
    server = launch(tmp)
    yield server
    stop(server)


def test_ops_list_show_poll_cancel(with_ops: Server) -> None:
    """ops list and show print the operation; poll without a connector is one line, exit 1;
    cancel prints its new status."""
    assert OP_ID in tb("ops", "list", url=with_ops.url, token=None).stdout
    listed = json.loads(tb("ops", "list", "--json", url=with_ops.url, token=None).stdout)
    assert [op["operation/id"] for op in listed["operations"]] == [OP_ID]
    assert '"pending"' in tb("ops", "show", OP_ID, url=with_ops.url, token=None).stdout
    polled = tb("ops", "poll", OP_ID, url=with_ops.url, token=None, check=1)
    assert "no connector" in polled.stderr and "HTTP 409" in polled.stderr
    cancelled = tb("ops", "cancel", OP_ID, url=with_ops.url, token=None).stdout
    assert cancelled.startswith(OP_ID)


def _run(server: Server, run_id: str) -> dict:  # type: ignore[type-arg]
    return json.loads(tb("runs", "show", run_id, "--json", url=server.url).stdout)["run"]


def test_terminate_retry_and_extend(secured: Server) -> None:
    """terminate fails the run, naming the local user as operator; retry runs it again from the
    failed node, or --from-start; extend --by 90s moves the deadline; the store says so after
    each; refusals are one line with the refusal's code, exit 1."""
    # Node "a" sleeps past the test however slow the machine, so it is the node terminated.
    run_id = tb("runs", "start", "quick", "--input", '{"sleep_s": 3600}', url=secured.url).stdout
    run_id = run_id.strip()
    before = _run(secured, run_id)["timeout_at"]
    done = tb("runs", "extend", run_id, "--by", "90s", "--reason", "slow", url=secured.url)
    assert done.stdout.strip() == f"{run_id} extended (used 1min 30s of the cap)"
    tb("runs", "extend", run_id, "--by", "1.5", "--reason", "more", url=secured.url)
    assert _run(secured, run_id)["timeout_at"] == before + 91_500
    over = tb("runs", "extend", run_id, "--by", "2d", "--reason", "r", url=secured.url, check=1)
    assert "(HTTP 409, over-cap)" in over.stderr and over.stderr.count("\n") == 1
    node = tb(
        "runs",
        "extend",
        run_id,
        "--by",
        "1s",
        "--node",
        "zz",
        "--reason",
        "r",
        url=secured.url,
        check=1,
    )
    assert "unknown-node" in node.stderr
    running = tb("runs", "retry", run_id, "--reason", "r", url=secured.url, check=1)
    assert "(HTTP 409, run-not-failed)" in running.stderr

    ended = tb("runs", "terminate", run_id, "--reason", "stuck", url=secured.url)
    assert ended.stdout.strip() == f"{run_id} failed"
    run = _run(secured, run_id)
    assert run["status"] == "failed"
    assert run["error"] == f"terminated by api ({getpass.getuser()}): stuck"
    again = tb("runs", "terminate", run_id, "--reason", "x", url=secured.url, check=1)
    assert "(HTTP 409, run-ended)" in again.stderr and "Traceback" not in again.stderr

    retried = tb("runs", "retry", run_id, "--reason", "fixed", "--operator", "ann", url=secured.url)
    assert retried.stdout.strip() == f"{run_id} running from a"
    assert _run(secured, run_id)["status"] == "running"
    tb("runs", "terminate", run_id, "--reason", "again", url=secured.url)
    answer = tb(
        "runs", "retry", run_id, "--reason", "r", "--from-start", "--json", url=secured.url
    ).stdout
    assert json.loads(answer) == {"run_id": run_id, "status": "running", "from_node": "a"}
    assert _run(secured, run_id)["status"] == "running"
    lines = tb("runs", "events", run_id, "--json", url=secured.url).stdout.splitlines()
    retries = [json.loads(line)["data"] for line in lines if '"run_retried"' in line]
    assert [(e["operator"], e["reason"]) for e in retries] == [
        ("api (ann)", "fixed"),
        (f"api ({getpass.getuser()})", "r"),
    ]
    tb("runs", "cancel", run_id, url=secured.url)
    missing = tb("runs", "retry", "no-such-run", "--reason", "r", url=secured.url, check=1)
    assert "(HTTP 404, run-not-found)" in missing.stderr


def test_operator_usage_errors_exit_2(secured: Server) -> None:
    """No --reason, an empty one, --by in no duration grammar, and both --from-node and
    --from-start exit 2 without reaching the host."""
    tb("runs", "terminate", "r", url=secured.url, check=2)
    assert "reason" in tb("runs", "terminate", "r", "--reason", "", url=secured.url, check=2).stderr
    bad = tb("runs", "extend", "r", "--reason", "x", "--by", "5m", url=secured.url, check=2)
    assert bad.stderr.startswith("timebound runs extend: --by: invalid by '5m'")
    assert bad.stderr.count("\n") == 1
    tb("runs", "extend", "r", "--reason", "x", "--by", "0", url=secured.url, check=2)
    both = ("--from-node", "a", "--from-start")
    tb("runs", "retry", "r", "--reason", "x", *both, url=secured.url, check=2)
