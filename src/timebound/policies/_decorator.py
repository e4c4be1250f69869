"""``timebound.resilient``: one decorator for sync and async callables (as stamina's)."""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Callable
from typing import Any, TypeVar

from .._core._durations import Duration
from ._cache import CacheBackend
from ._policy import MISSING, Policy
from ._zero import zero_value_for

__all__ = ["resilient"]

_F = TypeVar("_F", bound=Callable[..., Any])


def resilient(
    *,
    name: str | None = None,
    timeout: Duration | None = None,
    retry: int = 0,
    delay: Duration | None = None,
    backoff: str = "fixed",
    max_delay: Duration = 30.0,
    jitter: bool | Duration = False,
    fallback: Any = MISSING,
    fallback_on: type[BaseException] | tuple[type[BaseException], ...] | None = None,
    cache: Duration | None = None,
    cache_backend: CacheBackend | str | None = None,
    on_error: str = "propagate",
    zero: Any = MISSING,
    throttle: str | tuple[int, Duration] | None = None,
    concurrency: int | None = None,
    total_timeout: Duration | None = None,
) -> Callable[[_F], _F]:
    """Run every call of the decorated function under one :class:`~timebound.policies.Policy`.

    Works on ``def`` and ``async def`` functions alike. The policy is built (and every option
    validated, raising :class:`~timebound.ConfigurationError` naming the bad one) when the
    function is decorated; its name is the function's ``__qualname__`` unless ``name=`` is given
    (policies with the same name share their throttle, concurrency slots and default cache).
    The zero value for ``on_error="skip"``/``"log"`` comes from the return annotation unless
    ``zero=`` is given. The policy is available as ``wrapper.policy``.

    >>> import timebound as tb
    >>> @tb.resilient(retry=2, fallback="n/a")
    ... def lookup(key: str) -> str:
    ...     raise ConnectionError("down")
    >>> lookup("k")
    'n/a'
    """

    options: dict[str, Any] = {
        "timeout": timeout,
        "retry": retry,
        "delay": delay,
        "backoff": backoff,
        "max_delay": max_delay,
        "jitter": jitter,
        "fallback": fallback,
        "fallback_on": fallback_on,
        "cache": cache,
        "cache_backend": cache_backend,
        "on_error": on_error,
        "throttle": throttle,
        "concurrency": concurrency,
        "total_timeout": total_timeout,
    }
    # Validate now, so a bad option fails where resilient(...) is written even if it is never
    # applied; the real policy (named after the function) is built when it is.
    Policy(name if name is not None else "resilient", **options)

    def decorate(fn: _F) -> _F:
        if zero is MISSING:
            zero_value = (
                zero_value_for(_return_annotation(fn)) if on_error in ("skip", "log") else None
            )
        else:
            zero_value = zero
        policy = Policy(name if name is not None else fn.__qualname__, zero=zero_value, **options)
        execute = policy.execute
        execute_sync = policy.execute_sync

        if inspect.iscoroutinefunction(fn):

            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                return await execute(fn, args, kwargs)

            wrapper: Any = async_wrapper
        else:

            def sync_wrapper(*args: Any, **kwargs: Any) -> Any:
                return execute_sync(fn, args, kwargs)

            wrapper = sync_wrapper
        functools.update_wrapper(wrapper, fn)
        wrapper.policy = policy
        return typing.cast(_F, wrapper)

    return decorate


def _return_annotation(fn: Callable[..., Any]) -> Any:
    try:
        return typing.get_type_hints(fn).get("return")
    except Exception:
        # Unresolvable forward references: use the raw annotation if it is a real type.
        ann = getattr(fn, "__annotations__", {}).get("return")
        return None if isinstance(ann, str) else ann
