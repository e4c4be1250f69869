"""``timebound.resilient``: one decorator for sync and async callables (as stamina's)."""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Awaitable, Callable
from typing import Any, Literal, ParamSpec, Protocol, TypeVar, Unpack, overload

from .._core._errors import ConfigurationError
from . import _call
from ._options import MISSING, PolicyOptions
from ._policy import Policy
from ._result import Err, Ok
from ._zero import zero_value_for

__all__ = ["resilient"]

_F = TypeVar("_F", bound=Callable[..., Any])
_P = ParamSpec("_P")
_T = TypeVar("_T")


class _Wrapping(Protocol):
    """What ``resilient(on_error="wrap")`` returns: a decorator whose functions return
    ``Ok``/``Err`` (awaitably for ``async def`` functions)."""

    @overload
    def __call__(  # type: ignore[overload-overlap]
        self, fn: Callable[_P, Awaitable[_T]], /
    ) -> Callable[_P, Awaitable[Ok[_T] | Err]]: ...

    @overload
    def __call__(self, fn: Callable[_P, _T], /) -> Callable[_P, Ok[_T] | Err]: ...


@overload
def resilient(
    fn: None = None,
    /,
    *,
    name: str | None = None,
    on_error: Literal["wrap"],
    zero: Any = MISSING,
    **options: Unpack[PolicyOptions],
) -> _Wrapping: ...


@overload
def resilient(
    fn: None = None,
    /,
    *,
    name: str | None = None,
    on_error: Literal["propagate", "skip", "log"] = "propagate",
    zero: Any = MISSING,
    **options: Unpack[PolicyOptions],
) -> Callable[[_F], _F]: ...


@overload
def resilient(
    fn: None = None,
    /,
    *,
    name: str | None = None,
    on_error: str = "propagate",
    zero: Any = MISSING,
    **options: Unpack[PolicyOptions],
) -> Callable[[Callable[_P, Any]], Callable[_P, Any]]: ...


def resilient(
    fn: Any = None,
    /,
    *,
    name: str | None = None,
    on_error: str = "propagate",
    zero: Any = MISSING,
    **options: Unpack[PolicyOptions],
) -> Any:
    """Run every call of the decorated function under one :class:`~timebound.policies.Policy`.

    Works on ``def`` and ``async def`` functions alike (not on generator functions: a policy
    cannot retry a generator already handed to its consumer). The policy is built (and every
    option validated, raising :class:`~timebound.ConfigurationError` naming the bad one) when
    the function is decorated; its name is the function's ``__qualname__`` unless ``name=`` is
    given. The name labels errors and telemetry only: each decorated function has its own
    cache, throttle and concurrency slots unless a cache object, a ``TokenBucket`` or a
    ``Slots`` is passed to share. The zero value for ``on_error="skip"``/``"log"`` comes from
    the return annotation unless ``zero=`` is given. The policy is available as
    ``wrapper.policy``.

    >>> import timebound as tb
    >>> @tb.resilient(retry=2, fallback="n/a")
    ... def lookup(key: str) -> str:
    ...     raise ConnectionError("down")
    >>> lookup("k")
    'n/a'
    """
    if fn is not None:
        what = getattr(fn, "__qualname__", None)
        hint = (
            f"write @resilient() or @resilient(retry=3, ...) above {what}"
            if callable(fn) and what is not None
            else "write @resilient(...) above a function"
        )
        raise ConfigurationError(
            f"resilient takes options only, as keywords: {hint}", option="resilient"
        )
    unknown = sorted(set(options) - PolicyOptions.__optional_keys__)
    if unknown:
        raise TypeError(f"resilient() got an unexpected keyword argument {unknown[0]!r}")
    settings: dict[str, Any] = {**options, "on_error": on_error}
    # Validate now, so a bad option fails where resilient(...) is written even if it is never
    # applied; the real policy (named after the function) is built when it is.
    Policy(name if name is not None else "resilient", **settings)

    def decorate(fn: Any) -> Any:
        _check_decoratable(fn)
        if zero is MISSING:
            zero_value = (
                zero_value_for(_return_annotation(fn)) if on_error in ("skip", "log") else None
            )
        else:
            zero_value = zero
        policy: Policy[Any] = Policy(
            name if name is not None else fn.__qualname__, zero=zero_value, **settings
        )
        # The drivers themselves, not the Policy methods around them: one call frame less on
        # every call (bench/core.py's policy rows measure this path).
        execute = _call.execute_async
        execute_sync = _call.execute_sync

        if inspect.iscoroutinefunction(fn):

            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                return await execute(policy, fn, args, kwargs, None)

            wrapper: Any = async_wrapper
        else:

            def sync_wrapper(*args: Any, **kwargs: Any) -> Any:
                return execute_sync(policy, fn, args, kwargs, None)

            wrapper = sync_wrapper
        functools.update_wrapper(wrapper, fn)
        wrapper.policy = policy
        return wrapper

    return decorate


def _check_decoratable(fn: Any) -> None:
    """A clear ConfigurationError for what a policy cannot run."""
    if not callable(fn):
        raise ConfigurationError(
            f"resilient(...) decorates a function, got {type(fn).__name__} {fn!r}: "
            "write @resilient(...) above a def or async def",
            option="resilient",
        )
    what = getattr(fn, "__qualname__", repr(fn))
    if inspect.isasyncgenfunction(fn) or inspect.isgeneratorfunction(fn):
        kind = "an async generator" if inspect.isasyncgenfunction(fn) else "a generator"
        raise ConfigurationError(
            f"resilient(...) cannot decorate {what}: it is {kind} function, whose values reach "
            "the consumer before the policy could retry or time it; decorate a function that "
            "returns the collected values instead",
            option="resilient",
        )


def _return_annotation(fn: Callable[..., Any]) -> Any:
    try:
        return typing.get_type_hints(fn).get("return")
    except Exception:
        # Unresolvable forward references: use the raw annotation if it is a real type.
        ann = getattr(fn, "__annotations__", {}).get("return")
        return None if isinstance(ann, str) else ann
