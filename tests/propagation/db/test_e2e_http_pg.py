"""HTTP (300 ms) → HTTP → PostgreSQL end to end, cut by the server (docs/databases.md).

Service A (FastAPI behind ``DeadlineMiddleware``) receives ``X-YaTaxi-Client-TimeoutMs: 300``
and calls service B over httpx (``AsyncDeadlineTransport``, static timeout 5 s). B runs
``SELECT pg_sleep(5)`` on an asyncpg ``DeadlineConnection``. B receives at most 300 ms,
PostgreSQL cancels the statement at B's deadline (SQLSTATE 57014), B answers 498, and so does A.
Both services are real uvicorn servers on 127.0.0.1; the app factory is the HTTP suite's.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

import timebound as tb
from timebound.propagation import current_request
from timebound.propagation.asyncpg import connect

from ..http.conftest import ServerThread, build_propagating_service

pytestmark = pytest.mark.postgres

SETTING = "SELECT setting::int FROM pg_settings WHERE name = 'statement_timeout'"


def test_request_deadline_reaches_postgres_through_two_hops(postgres_dsn: str) -> None:
    """300 ms at A → <= 300 ms at B → PostgreSQL cancels ``pg_sleep(5)`` (57014) → A answers 498."""
    seen: dict[str, Any] = {}

    async def query() -> Any:
        state = current_request()
        seen["b_received_ms"] = None if state is None else state.deadline_received_ms
        con = await connect(postgres_dsn)
        try:
            seen["statement_timeout_ms"] = await con.fetchval(SETTING)
            try:
                return await con.fetchval("SELECT pg_sleep(5)")
            except tb.DeadlineExceeded as exc:
                seen["source"] = exc.source
                seen["sqlstate"] = getattr(exc.__cause__, "sqlstate", None)
                raise
            finally:
                # The deadline is spent here, so only a detached check may still query.
                with tb.no_deadline():
                    seen["usable_after"] = await con.fetchval("SELECT 1")
        finally:
            await con.close()

    with ServerThread(build_propagating_service(work=query)) as b:
        with ServerThread(build_propagating_service(downstream_url=f"{b.url}/work")) as a:
            response = httpx.get(
                f"{a.url}/work", headers={"X-YaTaxi-Client-TimeoutMs": "300"}, timeout=10
            )

    assert (response.status_code, response.text) == (498, "Deadline expired")
    assert response.headers["x-yataxi-deadline-expired"] == "1"
    assert 1 <= seen["b_received_ms"] <= 300
    assert 0 < seen["statement_timeout_ms"] <= seen["b_received_ms"]
    assert seen["sqlstate"] == "57014"
    assert seen["source"] == "inherited"
    assert seen["usable_after"] == 1
