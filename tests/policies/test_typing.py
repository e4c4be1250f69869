"""What mypy sees of policies: execute_sync returns T, on_error="wrap" returns Ok[T] | Err."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

CASES = Path(__file__).with_name("typing_cases.py")


def test_mypy_sees_the_types_users_get() -> None:
    """mypy --strict accepts every assert_type in typing_cases.py.

    mypy runs in a child process: its in-process API raises the interpreter's recursion limit to
    16,384 and leaves it there, and later tests rely on Python's default limit.
    """
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--no-incremental",
            "--follow-imports=silent",
            str(CASES),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
