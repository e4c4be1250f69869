"""Which failures to open a PostgreSQL store are worth waiting out (a worker started during a
server restart waits; a refused password ends it)."""

from __future__ import annotations

import pytest

from timebound._store._postgres import _unreachable


class _Refusal(Exception):
    def __init__(self, sqlstate: str) -> None:
        super().__init__(sqlstate)
        self.sqlstate = sqlstate


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (ConnectionRefusedError(111, "Connect call failed"), True),
        (TimeoutError(), True),
        (_Refusal("57P03"), True),  # the database system is starting up / shutting down
        (_Refusal("57P01"), True),  # terminating connection due to administrator command
        (_Refusal("08006"), True),  # connection failure
        (_Refusal("28P01"), False),  # password authentication failed
        (_Refusal("3D000"), False),  # the database does not exist
        (ValueError("bad"), False),
    ],
)
def test_a_server_not_taking_connections_yet_is_unreachable(
    exc: BaseException, expected: bool
) -> None:
    """Network errors and SQLSTATE classes 08 and 57P are for now; the rest are for good."""
    assert _unreachable(exc) is expected
