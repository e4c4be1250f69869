"""Ctrl-C on ``timebound run`` and ``timebound workflow run`` (D8.17): one line, exit 130, no
traceback; SIGINT is sent by the test to a real process once it is running."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def default_sigint() -> None:
    """In the child before exec: SIGINT as a terminal would deliver it. A suite started in the
    background (``cmd &`` in a script) ignores SIGINT, children inherit that, and Python then
    never raises KeyboardInterrupt: Ctrl-C could not be tested at all."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


SLOW_ACTIONS = """
import asyncio

async def nap(ctx):
    await asyncio.sleep(60)
    return "ok"
"""

SLOW_MODULES = """
import asyncio
from timebound.dsl import ModuleRegistry

registry = ModuleRegistry()

@registry.module
async def Nap(name: str) -> str:
    print("napping", flush=True)
    await asyncio.sleep(60)
    return name
"""

SLOW_FLOW = {
    "id": "slow",
    "timeout_ms": 120_000,
    "initial_node": "a",
    "actions": [{"id": "nap", "kind": "python", "implementation": {"handler": "nap"}}],
    "nodes": [{"id": "a", "action_id": "nap"}],
}


def _interrupt(tmp: Path, ready: str, *args: str) -> tuple[int, str, str]:
    """Run ``timebound *args``, send SIGINT once stdout shows ``ready``, return what it said."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIMEBOUND_")}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp), str(ROOT)])
    proc = subprocess.Popen(
        [sys.executable, "-m", "timebound", *args],
        cwd=tmp,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=default_sigint,
    )
    assert proc.stdout is not None
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if ready in line:
            break
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    return proc.returncode, "".join(seen) + out, err


def test_ctrl_c_on_workflow_run(tmp_path: Path) -> None:
    """A run whose action is executing: SIGINT ends 'workflow run' with one line, exit 130."""
    (tmp_path / "slow_actions.py").write_text(SLOW_ACTIONS)
    (tmp_path / "slow.json").write_text(json.dumps(SLOW_FLOW))
    code, out, err = _interrupt(
        tmp_path, "executing", "workflow", "run", "slow.json", "--actions", "slow_actions.py"
    )
    assert code == 130, (out, err)
    assert err == "timebound workflow: interrupted\n"
    assert "Traceback" not in out + err


def test_ctrl_c_on_run(tmp_path: Path) -> None:
    """A Constellation program inside an async module call: SIGINT ends 'timebound run' with
    one line, exit 130, and no timeout is reported (none fired)."""
    (tmp_path / "slowmod.py").write_text(SLOW_MODULES)
    (tmp_path / "slow.cst").write_text(
        "in name: String\ngreeting = Nap(name) with timeout: 60s\nout greeting\n"
    )
    code, out, err = _interrupt(
        tmp_path, "napping", "run", "slow.cst", "--modules", "slowmod", "--input", "name=x"
    )
    assert code == 130, (out, err)
    assert err == "timebound run: interrupted\n"
    assert "Traceback" not in out + err and "timed out" not in out + err
