"""Work that outlives the response: :func:`detached` (the problem it solves: background tasks
inherit the request's deadline).

A server adapter runs the whole request — in Starlette and FastAPI also the response's
``BackgroundTasks``, which run after the body is sent but inside the same ASGI call — under the
request's deadline, so work meant to outlive the response is cut by it (a database adapter
raising ``DeadlineExceeded`` after the client got its 200). :func:`detached` wraps such work so
that it runs with no inherited deadline and outside the request (a cut in it does not mark the
request); scopes it opens itself still bound it.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, ParamSpec, TypeVar, overload

from .._core._errors import ConfigurationError
from .._core._request import _request
from .._core._scopes import _clean_context, spawn_background

__all__ = ["detached"]

_P = ParamSpec("_P")
_T = TypeVar("_T")


@overload
def detached(
    fn: Callable[_P, Coroutine[Any, Any, _T]],
) -> Callable[_P, Coroutine[Any, Any, _T]]: ...
@overload
def detached(fn: Callable[_P, _T]) -> Callable[_P, _T]: ...
def detached(fn: Callable[_P, Any]) -> Callable[_P, Any]:
    """``fn``, run without the current request's deadline when called.

    ``background_tasks.add_task(detached(send_welcome_email), user)``, or as a decorator. An
    async ``fn`` runs in a task of its own (asyncio) that the caller awaits; it is shielded, so
    a middleware with ``cancel_on_expiry=True`` cancelling the request at its deadline does not
    cancel it. A sync ``fn`` runs in a clean copy of the current context (Starlette runs sync
    background tasks in a worker thread).
    """
    if not callable(fn):
        raise ConfigurationError(f"detached() takes the function to run, not {type(fn).__name__!r}")
    if inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004 - an object whose __call__ is async
    ):

        @functools.wraps(fn)
        async def run_async(*args: _P.args, **kwargs: _P.kwargs) -> Any:
            if asyncio._get_running_loop() is None:
                raise ConfigurationError(
                    "detached() runs an async function in an asyncio task; under trio, start"
                    " the work in a nursery opened outside the request"
                )
            task = spawn_background(_outside_request(fn(*args, **kwargs)))
            return await asyncio.shield(task)

        return run_async

    @functools.wraps(fn)
    def run_sync(*args: _P.args, **kwargs: _P.kwargs) -> Any:
        ctx = _clean_context()
        ctx.run(_request.set, None)
        return ctx.run(fn, *args, **kwargs)

    return run_sync


async def _outside_request(work: Awaitable[_T]) -> _T:
    # The task has its own copy of the context: this leaves the request's state where it was.
    _request.set(None)
    return await work
