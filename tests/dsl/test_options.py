"""Every module-call option and every interaction of D3's table, on virtual time, exact instants."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TypedDict

import pytest

from timebound import DeadlineExceeded, RetryExhausted
from timebound._core import _clock
from timebound.dsl import CompileError, ModuleRegistry, Program, compile
from timebound.policies import Err, Ok
from timebound.testing import VirtualClock

from ._modules import unique


class Inner(TypedDict):
    tags: list[str]
    m: dict[str, int]


class Rec(TypedDict):
    s: str
    i: int
    f: float
    b: bool
    o: int | None
    inner: Inner


class Service:
    """A module whose attempts take ``duration`` s and fail while ``failures`` remain
    (``hang``: an attempt never answers). Records each attempt's start instant."""

    def __init__(
        self, failures: int = 0, duration: float = 0.0, hang: bool = False, value: int = 7
    ) -> None:
        self.failures = failures
        self.duration = duration
        self.hang = hang
        self.value = value
        self.starts: list[float] = []

    async def __call__(self, x: int) -> int:
        self.starts.append(_clock.now())
        if self.hang:
            await asyncio.sleep(10**9)
        if self.duration:
            await asyncio.sleep(self.duration)
        if self.failures > 0:
            self.failures -= 1
            raise ConnectionError(f"attempt {len(self.starts)} failed")
        return self.value + x


def module(service: Service) -> Callable[[int], Awaitable[int]]:
    """A registrable function (annotated) that delegates to ``service``."""

    async def fn(x: int) -> int:
        return await service(x)

    return fn


def _program(
    options: str, service: Service, *, extra: str = "", name: str | None = None, **more: Service
) -> tuple[Program, str]:
    name = name or unique("Svc")
    registry = ModuleRegistry()
    registry.register(name, module(service))
    for other, s in more.items():
        registry.register(other, module(s))
    source = f"in x: Int\ny = {name}(x) {options}\n{extra}out y"
    return compile(source, modules=registry), name


# retry -----------------------------------------------------------------------------------


async def test_retry_n_allows_n_plus_one_attempts(virtual_clock: VirtualClock) -> None:
    """retry: 2 rescues a call that fails twice: three attempts, back to back."""
    s = Service(failures=2, duration=1)
    program, _ = _program("with retry: 2", s)
    assert await program.run({"x": 1}) == {"y": 8}
    assert s.starts == [0.0, 1.0, 2.0]
    assert virtual_clock.now() == 3.0


async def test_retry_zero_surfaces_the_module_error(virtual_clock: VirtualClock) -> None:
    """Without retry the module's own exception comes out, unwrapped, with the call site."""
    s = Service(failures=1, duration=1)
    program, name = _program("with timeout: 5s", s)
    with pytest.raises(ConnectionError) as info:
        await program.run({"x": 1})
    assert info.value.call_site.line == 2 and info.value.call_site.module == name
    assert str(info.value) == f"attempt 1 failed [at line 2, column 5: {name}]"


async def test_exhausted_retries_raise_retry_exhausted(virtual_clock: VirtualClock) -> None:
    """Four failed attempts: RetryExhausted, 'failed after 4 attempts', one line per attempt."""
    s = Service(failures=10, duration=1)
    program, name = _program("with retry: 3", s)
    with pytest.raises(RetryExhausted) as info:
        await program.run({"x": 1})
    err = info.value
    assert err.attempts == 4 and len(err.errors) == 4
    lines = str(err).splitlines()
    assert lines[0] == f"{name} failed after 4 attempts [at line 2, column 5: {name}]"
    assert lines[1:] == [f"  attempt {i}: ConnectionError: attempt {i} failed" for i in range(1, 5)]
    assert virtual_clock.now() == 4.0


# backoff ------------------------------------------------------------------------------------


async def test_exponential_backoff_gaps(virtual_clock: VirtualClock) -> None:
    """delay: 50ms, exponential: waits of exactly 50, 100, 200 ms between instant failures."""
    s = Service(failures=3)
    program, _ = _program("with retry: 3, delay: 50ms, backoff: exponential", s)
    result = await program.run_traced({"x": 0})
    assert result.trace[0].delays == [0.05, 0.1, 0.2]
    assert [a.start for a in result.trace[0].attempt_log] == [
        0.0,
        0.05,
        0.05 + 0.1,
        0.05 + 0.1 + 0.2,
    ]


async def test_exponential_backoff_instants(virtual_clock: VirtualClock) -> None:
    """delay: 500ms, exponential: attempts at 0, 0.5, 1.5 and 3.5 s."""
    s = Service(failures=3)
    program, _ = _program("with retry: 3, delay: 500ms, backoff: exponential", s)
    await program.run({"x": 0})
    assert s.starts == [0.0, 0.5, 1.5, 3.5]


async def test_linear_backoff_gaps(virtual_clock: VirtualClock) -> None:
    """linear waits n*D: 1, 2, 3 s."""
    s = Service(failures=3)
    program, _ = _program("with retry: 3, delay: 1s, backoff: linear", s)
    await program.run({"x": 0})
    assert s.starts == [0.0, 1.0, 3.0, 6.0]


async def test_fixed_backoff_is_the_default(virtual_clock: VirtualClock) -> None:
    """Without backoff the delay is fixed."""
    s = Service(failures=3)
    program, _ = _program("with retry: 3, delay: 2s", s)
    await program.run({"x": 0})
    assert s.starts == [0.0, 2.0, 4.0, 6.0]


async def test_backoff_is_capped_at_30s(virtual_clock: VirtualClock) -> None:
    """exponential from 20 s: 20, then 30 (not 40), then 30 (not 80)."""
    s = Service(failures=3)
    program, _ = _program("with retry: 3, delay: 20s, backoff: exponential", s)
    await program.run({"x": 0})
    assert s.starts == [0.0, 20.0, 50.0, 80.0]


async def test_no_delay_after_the_last_attempt(virtual_clock: VirtualClock) -> None:
    """The run fails right when the last attempt fails, with no trailing delay."""
    s = Service(failures=5)
    program, _ = _program("with retry: 1, delay: 10s", s)
    with pytest.raises(RetryExhausted):
        await program.run({"x": 0})
    assert virtual_clock.now() == 10.0


# timeout ------------------------------------------------------------------------------------


async def test_timeout_retry_delay_against_a_hang_ends_at_43s(virtual_clock: VirtualClock) -> None:
    """timeout 10s, retry 3, delay 1s against a module that never answers: exactly 43 s."""
    s = Service(hang=True)
    program, _ = _program("with timeout: 10s, retry: 3, delay: 1s", s)
    with pytest.raises(RetryExhausted) as info:
        await program.run({"x": 0})
    assert virtual_clock.now() == 43.0
    assert s.starts == [0.0, 11.0, 22.0, 33.0]
    assert all(isinstance(e, DeadlineExceeded) and e.source == "attempt" for e in info.value.errors)


async def test_timeout_alone_raises_deadline_exceeded(virtual_clock: VirtualClock) -> None:
    """A timed-out call fails the run with DeadlineExceeded (a TimeoutError) at the timeout."""
    s = Service(hang=True)
    program, name = _program("with timeout: 250ms", s)
    with pytest.raises(TimeoutError) as info:
        await program.run({"x": 0})
    assert virtual_clock.now() == 0.25
    assert isinstance(info.value, DeadlineExceeded) and info.value.source == "attempt"
    assert str(info.value).startswith(f"{name} timed out after 250ms")
    assert str(info.value).endswith(f"[at line 2, column 5: {name}]")


async def test_a_fast_call_is_not_affected_by_its_timeout(virtual_clock: VirtualClock) -> None:
    """A call that answers at 1 s under timeout 2s returns at 1 s."""
    program, _ = _program("with timeout: 2s", Service(duration=1))
    assert await program.run({"x": 1}) == {"y": 8}
    assert virtual_clock.now() == 1.0


# fallback ------------------------------------------------------------------------------------


async def test_fallback_after_every_attempt_failed(virtual_clock: VirtualClock) -> None:
    """The fallback is used only once retries are exhausted."""
    s = Service(failures=10, duration=1)
    program, _ = _program("with retry: 2, fallback: x * 100", s)
    assert await program.run({"x": 3}) == {"y": 300}
    assert len(s.starts) == 3 and virtual_clock.now() == 3.0


async def test_fallback_on_timeout(virtual_clock: VirtualClock) -> None:
    """A timeout triggers the fallback at the timeout."""
    program, _ = _program("with timeout: 100ms, fallback: -1", Service(hang=True))
    assert await program.run({"x": 3}) == {"y": -1}
    assert virtual_clock.now() == 0.1


async def test_fallback_module_is_lazy(virtual_clock: VirtualClock) -> None:
    """A fallback call is never made when the primary call succeeds."""
    backup = Service(duration=1, value=100)
    program, _ = _program("with fallback: Backup(x)", Service(duration=1), Backup=backup)
    assert await program.run({"x": 1}) == {"y": 8}
    assert backup.starts == []


async def test_fallback_module_with_its_own_options(virtual_clock: VirtualClock) -> None:
    """A parenthesised fallback call keeps its own retry; the outer options stay outer."""
    backup = Service(failures=1, duration=1, value=100)
    program, _ = _program(
        "with timeout: 2s, fallback: (Backup(x) with retry: 1, delay: 500ms)",
        Service(hang=True),
        Backup=backup,
    )
    assert await program.run({"x": 1}) == {"y": 101}
    assert backup.starts == [2.0, 3.5]
    assert virtual_clock.now() == 4.5


async def test_fallback_runs_once(virtual_clock: VirtualClock) -> None:
    """The fallback expression is evaluated once even though the value is used twice."""
    backup = Service(value=100)
    program, _ = _program(
        "with fallback: Backup(x)",
        Service(failures=1),
        Backup=backup,
        extra="z = y + y\nout z\n",
    )
    assert await program.run({"x": 1}) == {"y": 101, "z": 202}
    assert len(backup.starts) == 1


async def test_fallback_values_are_never_cached(virtual_clock: VirtualClock) -> None:
    """A fallback result is not stored: the next run calls the module again."""
    s = Service(failures=1)
    program, _ = _program("with cache: 1min, fallback: 0", s)
    assert await program.run({"x": 1}) == {"y": 0}
    assert await program.run({"x": 1}) == {"y": 8}
    assert await program.run({"x": 1}) == {"y": 8}
    assert len(s.starts) == 2


async def test_fallback_skips_on_error(virtual_clock: VirtualClock) -> None:
    """With a fallback, on_error never applies (the fallback wins)."""
    program, _ = _program("with on_error: skip, fallback: 42", Service(failures=1))
    assert await program.run({"x": 1}) == {"y": 42}


async def test_fallback_may_use_other_values(virtual_clock: VirtualClock) -> None:
    """A fallback expression reads any value of the program, not only the call's arguments."""
    registry = ModuleRegistry()
    s = Service(failures=1)
    registry.register("Primary", module(s))
    registry.register("Other", module(Service(duration=3)))
    program = compile(
        "in x: Int\nother = Other(x)\ny = Primary(x) with fallback: other * 2\nout y",
        modules=registry,
    )
    assert await program.run({"x": 1}) == {"y": 16}
    assert s.starts == [3.0]  # the call waited for the value its fallback may need


# cache ---------------------------------------------------------------------------------------


async def test_cache_hit_returns_at_once(virtual_clock: VirtualClock) -> None:
    """A second run within the TTL does not call the module and takes no time."""
    s = Service(duration=1)
    program, _ = _program("with cache: 1min", s)
    await program.run({"x": 1})
    result = await program.run_traced({"x": 1})
    assert result.outputs == {"y": 8} and len(s.starts) == 1
    assert result.duration == 0.0
    assert result.trace[0].cache_hit and result.trace[0].outcome == "cache"


async def test_cache_entries_expire(virtual_clock: VirtualClock) -> None:
    """After the TTL the module is called again."""
    s = Service()
    program, _ = _program("with cache: 10s", s)
    await program.run({"x": 1})
    virtual_clock.advance(9.999)
    await program.run({"x": 1})
    virtual_clock.advance(0.001)
    await program.run({"x": 1})
    assert s.starts == [0.0, 10.0]


async def test_cache_keys_on_the_arguments(virtual_clock: VirtualClock) -> None:
    """Different arguments are different entries."""
    s = Service()
    program, _ = _program("with cache: 1min", s)
    await program.run({"x": 1})
    await program.run({"x": 2})
    await program.run({"x": 1})
    assert len(s.starts) == 2


async def test_failures_and_timeouts_are_not_cached(virtual_clock: VirtualClock) -> None:
    """An error or a timeout leaves nothing in the cache."""
    s = Service(failures=1)
    program, _ = _program("with cache: 1min", s)
    with pytest.raises(ConnectionError):
        await program.run({"x": 1})
    assert await program.run({"x": 1}) == {"y": 8}
    h = Service(hang=True)
    program, _ = _program("with cache: 1min, timeout: 1s", h)
    for _ in range(2):
        with pytest.raises(DeadlineExceeded):
            await program.run({"x": 1})
    assert len(h.starts) == 2


async def test_call_sites_of_one_module_share_the_cache(virtual_clock: VirtualClock) -> None:
    """Cache key = module name + inputs: a later call site hits what an earlier one stored."""
    s = Service(duration=1)
    name = unique("Shared")
    registry = ModuleRegistry()
    registry.register(name, module(s))
    program = compile(
        f"in x: Int\na = {name}(x) with cache: 1min\nb = {name}(a - 7) with cache: 1min\nout b",
        modules=registry,
    )
    assert await program.run({"x": 1}) == {"b": 8}
    assert s.starts == [0.0] and virtual_clock.now() == 1.0


async def test_cache_backend_by_name(virtual_clock: VirtualClock) -> None:
    """cache_backend picks a backend registered on the registry, where successes are stored."""
    from timebound.policies import InMemoryCache

    backend = InMemoryCache()
    name = unique("Svc")
    registry = ModuleRegistry()
    registry.register(name, module(Service()))
    registry.register_cache_backend("shared", backend)
    program = compile(
        f'in x: Int\ny = {name}(x) with cache: 1min, cache_backend: "shared"\nout y',
        modules=registry,
    )
    await program.run({"x": 1})
    assert len(backend) == 1


# on_error -------------------------------------------------------------------------------------


async def test_on_error_skip_gives_the_zero_value(virtual_clock: VirtualClock) -> None:
    """skip: a failed call yields its type's zero value."""
    program, _ = _program("with on_error: skip", Service(failures=1))
    assert await program.run({"x": 1}) == {"y": 0}


async def test_on_error_handles_timeouts(virtual_clock: VirtualClock) -> None:
    """on_error also absorbs a timeout, at the timeout."""
    program, _ = _program("with timeout: 3s, on_error: skip", Service(hang=True))
    assert await program.run({"x": 1}) == {"y": 0}
    assert virtual_clock.now() == 3.0


async def test_on_error_log_warns_and_gives_zero(
    virtual_clock: VirtualClock, caplog: pytest.LogCaptureFixture
) -> None:
    """log: a warning is logged and the zero value returned."""
    program, name = _program("with on_error: log", Service(failures=1))
    with caplog.at_level(logging.WARNING):
        assert await program.run({"x": 1}) == {"y": 0}
    assert any(name in r.getMessage() for r in caplog.records)


async def test_on_error_wrap_gives_ok_and_err(virtual_clock: VirtualClock) -> None:
    """wrap: the value is Ok/Err; ok, value and error are readable in the program."""
    program, _ = _program(
        "with on_error: wrap",
        Service(failures=1),
        extra='ok = y.ok\nv = y.value ?? -1\ne = y.error ?? ""\nout ok\nout v\nout e\n',
    )
    first = await program.run({"x": 1})
    assert isinstance(first["y"], Err) and first["ok"] is False and first["v"] == -1
    assert first["e"] == "ConnectionError: attempt 1 failed"
    second = await program.run({"x": 1})
    assert second["y"] == Ok(8) and second["ok"] is True and second["v"] == 8


def test_on_error_wrap_types_the_call_as_a_result() -> None:
    """The call's type is Result<T>; using it as T is a type error."""
    program, _ = _program("with on_error: wrap", Service())
    assert str(program.outputs["y"]) == "Result<Int>"
    with pytest.raises(Exception, match="E011"):
        _program("with on_error: wrap", Service(), extra="z = y + 1\nout z\n")


async def test_skip_zero_value_of_a_record(virtual_clock: VirtualClock) -> None:
    """A record's zero value is its fields' zero values (nested)."""
    registry = ModuleRegistry()

    def Broken(x: int) -> Rec:
        raise ValueError("no")

    registry.register("Broken", Broken)
    program = compile("y = Broken(1) with on_error: skip\nout y", modules=registry)
    assert await program.run({}) == {
        "y": {"s": "", "i": 0, "f": 0.0, "b": False, "o": None, "inner": {"tags": [], "m": {}}}
    }


# throttle and concurrency ------------------------------------------------------------------------


async def test_throttle_spaces_calls(virtual_clock: VirtualClock) -> None:
    """throttle: 2/1s is a bucket of two tokens refilled at 2 per second: the third call
    waits half a second."""
    s = Service()
    name = unique("Throttled")
    registry = ModuleRegistry()
    registry.register(name, module(s))
    program = compile(
        "in x: Int\n"
        + "".join(f"y{i} = {name}(x + {i}) with throttle: 2/1s\n" for i in range(3))
        + "out y0\nout y1\nout y2",
        modules=registry,
    )
    await program.run({"x": 0})
    assert sorted(s.starts) == [0.0, 0.0, 0.5]


async def test_throttle_wait_counts_against_the_timeout(virtual_clock: VirtualClock) -> None:
    """Waiting for a token uses the attempt's time: a 500ms timeout cannot wait 1 s."""
    s = Service()
    name = unique("Throttled")
    registry = ModuleRegistry()
    registry.register(name, module(s))
    program = compile(
        f"a = {name}(1) with throttle: 1/1s\n"
        f"b = {name}(a) with throttle: 1/1s, timeout: 500ms, fallback: -1\nout b",
        modules=registry,
    )
    assert await program.run({}) == {"b": -1}
    assert s.starts == [0.0] and virtual_clock.now() == 0.5


async def test_concurrency_is_per_module_across_call_sites(virtual_clock: VirtualClock) -> None:
    """concurrency: 1 on two call sites of one module: they run one after the other."""
    s = Service(duration=1)
    name = unique("Limited")
    registry = ModuleRegistry()
    registry.register(name, module(s))
    program = compile(
        f"a = {name}(1) with concurrency: 1\nb = {name}(2) with concurrency: 1\nout a\nout b",
        modules=registry,
    )
    await program.run({})
    assert sorted(s.starts) == [0.0, 1.0] and virtual_clock.now() == 2.0


@pytest.mark.parametrize(
    ("first", "second"),
    [("concurrency: 1", "concurrency: 2"), ("throttle: 2/1s", "throttle: 5/1s")],
)
def test_conflicting_limits_across_call_sites_are_an_error(first: str, second: str) -> None:
    """D3.7 shares one limiter per module name, so call sites must agree on it (E013)."""
    registry = ModuleRegistry()
    registry.register("Limited", module(Service()))
    source = f"a = Limited(1) with {first}\nb = Limited(2) with {second}\nout a\nout b"
    with pytest.raises(CompileError) as info:
        compile(source, modules=registry)
    [diag] = info.value.diagnostics
    option = first.split(":")[0]
    # Both diagnostics point at the option's value: its column is after "option: ".
    value_col = source.splitlines()[0].index(first) + len(option) + 3
    assert (diag.code, diag.line, diag.column) == ("E013", 2, value_col)
    assert diag.message == (
        f"Conflicting '{option}' for 'Limited': every call site of a module shares one "
        f"limiter, and line 1, column {value_col} already declares a different one"
    )


# deadline first and the whole-run timeout -----------------------------------------------------


async def test_run_timeout_cuts_retries(virtual_clock: VirtualClock) -> None:
    """A 15 s run deadline under timeout 10s/retry 3: the second attempt gets 4 s, then stop."""
    s = Service(hang=True)
    program, _ = _program("with timeout: 10s, retry: 3, delay: 1s", s)
    with pytest.raises(DeadlineExceeded):
        await program.run({"x": 0}, timeout=15)
    assert virtual_clock.now() == 15.0
    assert s.starts == [0.0, 11.0]


async def test_no_delay_that_the_deadline_cannot_fit(virtual_clock: VirtualClock) -> None:
    """D3.3: at t=1 a 5 s delay cannot fit a 4 s run budget: stop at once, without sleeping."""
    s = Service(failures=10, duration=1)
    program, _ = _program("with retry: 3, delay: 5s", s)
    with pytest.raises(DeadlineExceeded) as info:
        await program.run({"x": 0}, timeout=4)
    assert virtual_clock.now() == 1.0
    assert isinstance(info.value.__cause__, ConnectionError)


async def test_run_deadline_does_not_trigger_fallback(virtual_clock: VirtualClock) -> None:
    """A spent run deadline is not the call's own failure: no fallback, the run fails."""
    program, _ = _program("with fallback: 0", Service(hang=True))
    with pytest.raises(DeadlineExceeded):
        await program.run({"x": 0}, timeout="2s")
    assert virtual_clock.now() == 2.0


async def test_cancellation_is_never_retried(virtual_clock: VirtualClock) -> None:
    """Cancelling the run cancels the attempt: no retry, no fallback."""
    s = Service(hang=True)
    program, _ = _program("with retry: 5, fallback: 0", s)
    task = asyncio.ensure_future(program.run({"x": 0}))
    await asyncio.sleep(1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert s.starts == [0.0]


# priority and lazy ---------------------------------------------------------------------------


async def test_priority_never_changes_a_timeout(virtual_clock: VirtualClock) -> None:
    """A critical call times out exactly like a background one."""
    for level in ("critical", "background"):
        program, _ = _program(
            f"with timeout: 2s, priority: {level}, fallback: 0", Service(hang=True)
        )
        start = virtual_clock.now()
        await program.run({"x": 0})
        assert virtual_clock.now() - start == 2.0


async def test_lazy_call_with_options(virtual_clock: VirtualClock) -> None:
    """A lazy call keeps its options when it is finally evaluated."""
    s = Service(failures=1, duration=1)
    program, _ = _program("with lazy, retry: 1, delay: 1s", s)
    assert await program.run({"x": 1}) == {"y": 8}
    assert s.starts == [0.0, 2.0]


# more interactions -------------------------------------------------------------------------


async def test_each_attempt_takes_its_own_token(virtual_clock: VirtualClock) -> None:
    """throttle 1/1s with retries: every attempt waits for its own token."""
    s = Service(failures=2)
    program, _ = _program("with retry: 2, throttle: 1/1s", s)
    assert await program.run({"x": 1}) == {"y": 8}
    assert s.starts == [0.0, 1.0, 2.0]


async def test_a_success_after_retries_is_cached(virtual_clock: VirtualClock) -> None:
    """The module's own success, even on a later attempt, is stored."""
    s = Service(failures=1)
    program, _ = _program("with retry: 1, cache: 1min", s)
    await program.run({"x": 1})
    await program.run({"x": 1})
    assert len(s.starts) == 2


async def test_wrap_with_a_fallback_wraps_the_fallback(virtual_clock: VirtualClock) -> None:
    """on_error: wrap with a fallback: the fallback value comes back as Ok."""
    program, _ = _program("with on_error: wrap, fallback: 5", Service(failures=1))
    assert await program.run({"x": 1}) == {"y": Ok(5)}


async def test_lazy_and_cache(virtual_clock: VirtualClock) -> None:
    """A lazy cached call is a hit on the next run when it is needed, and not run if not."""
    s = Service(duration=1)
    program, _ = _program("with lazy, cache: 1min", s)
    await program.run({"x": 1})
    result = await program.run_traced({"x": 1})
    assert len(s.starts) == 1 and result.trace[0].cache_hit and result.trace[0].lazy


async def test_fallback_may_be_a_record(virtual_clock: VirtualClock) -> None:
    """A record fallback with extra fields fits the module's record type (width subtyping)."""
    registry = ModuleRegistry()

    async def Lookup(user_id: str) -> Rec:
        raise LookupError(user_id)

    registry.register("Lookup", Lookup)
    program = compile(
        "in id: String\nu = Lookup(id) with fallback: { s: id, i: 0, f: 0.5, b: false, o: 3, "
        'inner: { tags: ["guest"], m: {} }, extra: "ignored by the type" }\nout u',
        modules=registry,
    )
    out = await program.run({"id": "u1"})
    assert out["u"]["s"] == "u1" and out["u"]["inner"]["tags"] == ["guest"]
