"""The showcase (examples/one_deadline) runs end to end on real loopback and prints one timeline.

The script runs in a child process (it starts uvicorn servers, a workflow engine and a poller, and
the child's exit leaves nothing behind in the test process), bounded by a timeout. The request's
300 ms deadline, the Constellation call timeouts and the propagated HTTP deadline are measured on
the real clock, so whether they are met depends on the machine's load: the tests assert that the
timeline's verdict for each of them agrees with what the request returned. The shared run gives the
request 3 s (``--deadline-ms``) so that a loaded machine cannot cancel the storefront before its
pipeline runs; the pipeline region (5.5 ms against a 120 ms feature store) and the workflow's
deferred resume do not depend on load. The CLI test runs the default 300 ms.
"""

from __future__ import annotations

import os
import re
import selectors
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from timebound.cli import main as cli_main

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "one_deadline" / "showcase.py"
LINE = re.compile(r"^\s+\+\s*(?P<at>[\d.]+) ms  (?P<lane>\S+)\s+(?P<text>.*)$")


@dataclass(frozen=True)
class Entry:
    at_ms: float
    lane: str
    text: str


def _timeline(stdout: str) -> list[Entry]:
    entries = []
    for raw in stdout.splitlines():
        match = LINE.match(raw)
        if match:
            entries.append(Entry(float(match["at"]), match["lane"], match["text"]))
    return entries


def _verdicts(entries: list[Entry]) -> dict[str, str]:
    found = {}
    for entry in entries:
        if entry.text.startswith("bound "):
            name, _, verdict = entry.text[len("bound ") :].rpartition(": ")
            found[name] = verdict
    return found


def _index(entries: list[Entry], needle: str) -> int:
    return next(i for i, e in enumerate(entries) if needle in e.text)


@pytest.fixture(scope="module")
def showcase_output() -> str:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--deadline-ms", "3000"],
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_every_bound_appears_with_a_verdict(showcase_output: str) -> None:
    """The timeline names every bound of the run and says whether it fired or was met (the
    storefront's own bounds only when the request was answered: a fired request deadline
    cancels its handler before it reports them)."""
    verdicts = _verdicts(_timeline(showcase_output))
    expected = {
        "timeout_wrapper region (5.5 ms)",
        "request deadline (3000 ms)",
        "workflow node and run timeouts",
    }
    storefront = {"Rank call timeout", "Stock call timeout", "propagated HTTP deadline"}
    if verdicts.get("request deadline (3000 ms)") == "met":
        expected |= storefront
    assert expected <= set(verdicts) <= expected | storefront
    assert set(verdicts.values()) <= {"FIRED", "met"}


def test_the_pipeline_region_fires_and_its_fallback_branch_is_chosen(showcase_output: str) -> None:
    """The 5.5 ms region budget fires against the 120 ms feature store and the fail branch runs."""
    entries = _timeline(showcase_output)
    assert _verdicts(entries)["timeout_wrapper region (5.5 ms)"] == "FIRED"
    chosen = entries[_index(entries, "chosen_branch=")]
    assert (chosen.lane, chosen.text) == ("pipeline", "chosen_branch='fail'")
    assert "ranked [102, 104, 105]" in entries[_index(entries, "ranked [")].text


def test_the_summary_lists_the_fired_bounds(showcase_output: str) -> None:
    """The closing summary names exactly the bounds the timeline marked as fired."""
    verdicts = _verdicts(_timeline(showcase_output))
    fired = [name for name, verdict in verdicts.items() if verdict == "FIRED"]
    assert f"Fired: {', '.join(fired)}." in showcase_output


def test_the_request_verdict_agrees_with_its_answer(showcase_output: str) -> None:
    """A met request deadline comes with the ranked answer; a fired one with no answer."""
    entries = _timeline(showcase_output)
    verdicts = _verdicts(entries)
    client = [e.text for e in entries if e.lane == "client"]
    if verdicts["request deadline (3000 ms)"] == "met":
        assert any(t.startswith("200 {'ranked': [102, 104, 105], 'stock': ") for t in client)
    else:
        assert not any(t.startswith("200 ") for t in client)


def test_the_stock_verdict_agrees_with_the_fallback(showcase_output: str) -> None:
    """The Stock call's fallback value (-1) is answered exactly when its timeout fired."""
    entries = _timeline(showcase_output)
    verdicts = _verdicts(entries)
    client = [e.text for e in entries if e.lane == "client" and e.text.startswith("200 ")]
    if verdicts["request deadline (3000 ms)"] == "met":
        stock = re.search(r"'stock': (-?\d+)", client[0])
        assert stock is not None, client[0]
        fell_back = stock[1] == "-1"
        assert fell_back == (verdicts["Stock call timeout"] == "FIRED")


def test_each_hop_sees_no_more_budget_than_its_caller(showcase_output: str) -> None:
    """The budget seen by the storefront, the modules and the inventory service only shrinks."""
    entries = _timeline(showcase_output)
    seen = []
    for needle in (
        "arrives with",
        "Rank('ada') starts, sees",
        "calls the inventory service",
        "GET /stock/ada arrives with",
    ):
        text = entries[_index(entries, needle)].text.split(needle, 1)[1]
        budget = re.search(r"(-?\d+) ms", text)
        assert budget is not None, text
        seen.append(int(budget[1]))
    assert seen[0] <= 3000
    assert seen[1] <= min(seen[0], 250)
    assert seen[2] <= min(seen[0], 150)
    assert seen[3] <= seen[2]


def test_the_workflow_is_suspended_on_the_deferred_operation_and_resumed(
    showcase_output: str,
) -> None:
    """The token is suspended on the 202, the work finishes, then the token resumes and the run
    completes with the operation's result as the node's output."""
    entries = _timeline(showcase_output)
    suspended = _index(entries, "answered 202 (deferred")
    work_done = _index(entries, "background work done")
    resumed = _index(entries, "token resumed: node notify sees render={'pages': 2}")
    completed = _index(entries, "run completed: {'render': {'pages': 2}, 'notify': 'sent'}")
    assert suspended < work_done < resumed < completed
    # The host polls no earlier than the clamped 1 s retry-after hint (D7.6).
    assert entries[resumed].at_ms - entries[suspended].at_ms >= 1000


def test_the_cli_runs_the_showcase(tmp_path: Path) -> None:
    """``timebound demo --showcase`` runs the same script and prints its timeline."""
    done = subprocess.run(
        [sys.executable, "-m", "timebound", "demo", "--showcase"],
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    verdicts = _verdicts(_timeline(done.stdout))
    assert verdicts["request deadline (300 ms)"] in {"FIRED", "met"}
    assert "run completed: {'render': {'pages': 2}, 'notify': 'sent'}" in done.stdout


def test_keep_without_showcase_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    """``timebound demo --keep`` alone is an error that says --keep needs --showcase."""
    assert cli_main(["demo", "--keep"]) == 2
    assert "--keep only applies with --showcase" in capsys.readouterr().err


def _read_until(proc: subprocess.Popen[bytes], marker: str, limit_s: float) -> str:
    """The child's stdout up to the end of the line holding ``marker``, waiting at most
    ``limit_s`` seconds for it."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    seen = b""
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        end = time.monotonic() + limit_s
        while b"\n" not in seen.partition(marker.encode())[2] and time.monotonic() < end:
            if selector.select(timeout=max(0.0, end - time.monotonic())):
                chunk = os.read(fd, 65536)  # unbuffered: select sees every byte not yet read
                if not chunk:
                    break
                seen += chunk
    text = seen.decode()
    assert marker in text, f"{marker!r} never printed; output so far:\n{text}"
    return text


def test_keep_serves_the_same_runs_in_the_host() -> None:
    """With ``--keep`` the host serves the showcase's workflow run and its deferred operation."""
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPT), "--keep", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    try:
        output = _read_until(proc, "timebound host listening on ", limit_s=90)
        base = re.search(r"listening on (http://\S+/)", output)
        assert base is not None, output
        runs = httpx.get(f"{base[1]}v1/runs", timeout=10).json()["runs"]
        assert [(r["definition_id"], r["status"]) for r in runs] == [("report", "completed")]
        assert runs[0]["id"][:8] in output  # the run the timeline printed
        ops = httpx.get(f"{base[1]}v1/deferred-operations", timeout=10).json()["operations"]
        assert [(o["operation/kind"], o["status"]) for o in ops] == [("report.render", "completed")]
        assert httpx.get(f"{base[1]}ui/runs/{runs[0]['id']}", timeout=10).status_code == 200
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        assert proc.stdout is not None
        proc.stdout.close()


def test_showcase_outside_a_source_tree_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without the example sources, ``demo --showcase`` exits 2 and says where to run it."""
    from timebound.cli import _demo

    monkeypatch.setattr(_demo, "_showcase_script", lambda: None)
    assert cli_main(["demo", "--showcase"]) == 2
    assert "run it from a clone of the timebound repository" in capsys.readouterr().err


def test_a_deadline_that_is_not_positive_is_refused() -> None:
    """``--deadline-ms 0`` exits 2 naming the option and the value, before anything starts."""
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--deadline-ms", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "--deadline-ms must be a positive number of milliseconds, got 0" in done.stderr
    assert "One deadline" not in done.stdout


@pytest.mark.parametrize("stop_with", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_demo_keep_serves_the_ui_and_stops_cleanly(
    tmp_path: Path, stop_with: signal.Signals
) -> None:
    """``timebound demo --showcase --keep --port 0`` leaves the host running on the showcase's
    store: its UI lists the run and opens its page. SIGINT or SIGTERM then stops it with exit
    status 0 and removes the store: nothing is left in the temporary directory it was given
    (TMPDIR) nor in its working directory."""
    cwd, tmp = tmp_path / "cwd", tmp_path / "tmp"
    cwd.mkdir()
    tmp.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIMEBOUND_")}
    with (tmp_path / "stderr.txt").open("wb") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "timebound", "demo", "--showcase", "--keep", "--port", "0"],
            stdout=subprocess.PIPE,
            stderr=stderr,
            cwd=cwd,
            env={**env, "TMPDIR": str(tmp)},
        )
        try:
            output = _read_until(proc, "timebound host listening on ", limit_s=90)
            base = re.search(r"listening on (http://\S+/)", output)
            assert base is not None, output
            assert [p.name.startswith("timebound-showcase-") for p in tmp.iterdir()] == [True]
            with httpx.Client(base_url=base[1], timeout=10) as client:
                runs = client.get("ui/")
                assert runs.status_code == 200
                link = re.search(r'href="/ui/runs/([^"]+)">', runs.text)
                assert link is not None and link[1][:8] in output
                assert "report v" in runs.text
                run_page = client.get(f"ui/runs/{link[1]}")
                assert run_page.status_code == 200
                assert '<span class="badge completed" id="run-status">' in run_page.text
                assert client.get("ui/traces").status_code == 200
            proc.send_signal(stop_with)
            assert proc.wait(timeout=30) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            assert proc.stdout is not None
            proc.stdout.close()
    assert list(tmp.iterdir()) == []
    assert list(cwd.iterdir()) == []
    errors = (tmp_path / "stderr.txt").read_text()
    assert "Application shutdown complete." in errors
    assert "Traceback" not in errors


def test_demo_port_needs_keep(capsys: pytest.CaptureFixture[str]) -> None:
    """``--port`` without ``--showcase --keep`` is refused (exit 2), saying what it needs."""
    assert cli_main(["demo", "--showcase", "--port", "0"]) == 2
    assert "--port only applies with --showcase --keep" in capsys.readouterr().err
