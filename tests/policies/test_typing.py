"""What mypy sees of policies: execute_sync returns T, on_error="wrap" returns Ok[T] | Err."""

from __future__ import annotations

from pathlib import Path

from mypy import api as mypy_api

CASES = Path(__file__).with_name("typing_cases.py")


def test_mypy_sees_the_types_users_get() -> None:
    """mypy --strict accepts every assert_type in typing_cases.py."""
    out, err, status = mypy_api.run(
        ["--strict", "--no-incremental", "--follow-imports=silent", str(CASES)]
    )
    assert status == 0, out + err
