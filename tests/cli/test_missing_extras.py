"""A missing extra is named, with the command that installs it (D8.17): ``timebound demo
--showcase`` without pyarrow or uvicorn, ``workflow validate`` of a YAML file without PyYAML. The
package is made unimportable for the child process only, by a stand-in earlier on its path."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _without(tmp: Path, package: str, *args: str) -> subprocess.CompletedProcess[str]:
    blocker = tmp / "blocked" / package
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text(
        f'raise ModuleNotFoundError("No module named {package!r}", name={package!r})\n'
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIMEBOUND_")}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp / "blocked"), str(ROOT)])
    return subprocess.run(
        [sys.executable, "-m", "timebound", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("package", ["pyarrow", "uvicorn"])
def test_demo_showcase_names_the_extras(tmp_path: Path, package: str) -> None:
    """Without one of its packages, the showcase says which extras to install, exit 2."""
    done = _without(tmp_path, package, "demo", "--showcase")
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    assert done.stderr == (
        f"timebound demo --showcase: needs the host,pipeline,deferred,httpx extras ({package} is "
        "not installed); install them with: pip install 'timebound[host,pipeline,deferred,httpx]'\n"
    )


def test_workflow_validate_of_yaml_without_pyyaml(tmp_path: Path) -> None:
    """A YAML definition without PyYAML: the 'workflow' extra is named, not 'not valid YAML';
    a JSON definition still validates."""
    (tmp_path / "flow.yaml").write_text("id: x\n")
    done = _without(tmp_path, "yaml", "workflow", "validate", str(tmp_path / "flow.yaml"))
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert "not valid YAML" not in done.stderr
    assert "pip install 'timebound[workflow]'" in done.stderr
    assert done.stderr.count("\n") == 1
    flow = ROOT / "tests" / "host" / "flows" / "quick.json"
    ok = _without(tmp_path / "again", "yaml", "workflow", "validate", str(flow))
    assert ok.returncode == 0, ok.stderr
