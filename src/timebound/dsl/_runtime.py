"""Running a compiled Constellation program: calls under policies, lazy thunks, the trace.

Per-call hot path (kept lean on purpose; ``bench/dsl.py`` measures it): evaluate the argument
closures, then either call the module directly (a call without options needs no policy) or hand it
to the call site's one :class:`~timebound.policies.Policy`, built at compile time. Tracing, site
attachment on failure and record conversion cost nothing unless used.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import json
import math
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from .._core import _clock
from .._core._classify import classify
from .._core._durations import Duration, to_seconds
from .._core._errors import ConfigurationError, DeadlineExceeded, InvalidInput
from .._core._scopes import current_bound_error, fail_after
from .._engine import DagPlan
from ..telemetry import correlation
from ..telemetry._tracing import active as tracing_active
from ..telemetry._tracing import run_span
from ._diagnostics import Diagnostic
from ._types import Type, validate_value

if TYPE_CHECKING:
    from ._ir import CallNode, ProgramIR

__all__ = ["Annotation", "CallSite", "CallTrace", "InputError", "Program", "TracedRun"]


@dataclass(frozen=True, slots=True)
class CallSite:
    """Where a module call is written: attached to a failed run's error as ``.call_site``."""

    module: str
    line: int
    column: int

    def __str__(self) -> str:
        return f"line {self.line}, column {self.column}: {self.module}"


@dataclass(slots=True)
class AttemptTrace:
    """One attempt of a call: start and end in seconds since the run started, and its outcome
    (``ok``, ``error``, ``timeout`` — the call's own timeout —, ``deadline`` — the run's or an
    inherited deadline —, ``cancelled``). ``entered`` is when the module was entered: later than
    ``start`` when the attempt waited for a ``throttle`` token or a ``concurrency`` slot."""

    start: float
    end: float | None = None
    outcome: str = "running"
    entered: float | None = None


@dataclass(slots=True)
class CallTrace:
    """What one module call did, in seconds since the run started.

    ``outcome`` is ``ok``, ``cache`` (a cache hit), ``fallback``, ``skip``/``log``/``wrap``
    (``on_error`` absorbed a failure), ``error``, ``deadline`` (stopped by the run's or an
    inherited deadline, not by a failure of its own) or ``cancelled`` (another call failed).
    """

    module: str
    line: int
    column: int
    start: float
    end: float = math.nan
    attempts: int = 0
    timeouts: int = 0
    delays: list[float] = field(default_factory=list)
    fallback: bool = False
    cache_hit: bool = False
    outcome: str = "running"
    error: str | None = None
    lazy: bool = False
    priority: int = 50
    attempt_log: list[AttemptTrace] = field(default_factory=list)
    #: The call's identity in the program, stable across edits of other declarations: the
    #: binding's name for `y = F(x)`, else the declaration's name and the call's place in it.
    node: str | None = None
    _t0: float = field(default=0.0, repr=False)

    def observe(self, event: Any) -> None:
        """Policy observer: turn the policy's events into this record."""
        name = event.name
        attrs = event.attrs
        at = event.at - self._t0
        if name == "attempt.start":
            self.attempts += 1
            self.attempt_log.append(AttemptTrace(at))
        elif name == "attempt.end":
            outcome = str(attrs.get("outcome", "error"))
            err = attrs.get("error")
            if isinstance(err, DeadlineExceeded) and classify(err) != "own":
                outcome = "deadline"  # the run's (or an inherited) deadline, not the timeout
            elif isinstance(err, DeadlineExceeded) or outcome == "timeout":
                self.timeouts += 1
                outcome = "timeout"
            if self.attempt_log:
                self.attempt_log[-1].end = at
                self.attempt_log[-1].outcome = outcome
        elif name == "retry.delay":
            delay = float(attrs.get("delay", 0.0))
            if delay > 0:  # retries without `delay` follow each other at once
                self.delays.append(delay)
        elif name == "cache.hit":
            self.cache_hit = True
        elif name == "fallback":
            self.fallback = True
        elif name == "on_error":
            self.outcome = str(attrs.get("mode", "on_error"))


@dataclass(frozen=True, slots=True)
class Annotation:
    """An annotation of an input or output: ``@example(value)``, ``@source("kind", k: v)`` or
    ``@sink(...)``. Metadata for tools: ``values`` are the positional values, ``props`` the
    named ones."""

    kind: str
    values: tuple[Any, ...]
    props: dict[str, Any]


@dataclass(frozen=True, slots=True)
class TracedRun:
    """What :meth:`Program.run_traced` returns: the outputs and every call that ran."""

    outputs: dict[str, Any]
    trace: list[CallTrace]
    duration: float


class InputError(InvalidInput):
    """A run's inputs do not match the program's declarations; ``input`` names the input (an
    :class:`~timebound.InvalidInput`, D2.6)."""

    code = "constellation-input-error"

    @property
    def field(self) -> str | None:
        return self.input

    def __init__(self, message: str, *, input: str | None = None) -> None:
        super().__init__(message)
        self.input = input

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_input_error, (str(self), self.input))


def _rebuild_input_error(message: str, name: str | None) -> InputError:
    return InputError(message, input=name)


class _Run:
    """The state of one run: values by key, the trace (or None) and the start instant."""

    __slots__ = ("env", "t0", "trace")

    def __init__(self, env: dict[str, Any], trace: list[CallTrace] | None, t0: float) -> None:
        self.env = env
        self.trace = trace
        self.t0 = t0


#: The run being evaluated: read by fallback closures, which the policy calls with the module's
#: arguments only but which may refer to any value of the program.
CURRENT_RUN: contextvars.ContextVar[_Run] = contextvars.ContextVar("timebound.dsl.run")
_get_running_loop = asyncio._get_running_loop

_NEVER_ATTACH: Final = (asyncio.CancelledError, KeyboardInterrupt, SystemExit, GeneratorExit)


def attach_site(exc: BaseException, site: CallSite) -> None:
    """Attach ``site`` to ``exc`` (attribute and message), innermost call first (D3.10).

    The error keeps its type: ``except TimeoutError`` still works and the message still reads
    ``... timed out ...``/``... failed after N attempts``, now followed by where the call is.
    """
    if isinstance(exc, _NEVER_ATTACH) or getattr(exc, "call_site", None) is not None:
        return
    try:
        exc.call_site = site  # type: ignore[attr-defined]
    except Exception:
        exc.add_note(f"Constellation call at {site}")
        return
    where = f" [at {site}]"
    args = exc.args
    # Only where str() is the message itself (BaseException's or a one-argument OSError's,
    # which covers TimeoutError/DeadlineExceeded and ConnectionError); other types get a note.
    if (
        type(exc).__str__ in (BaseException.__str__, OSError.__str__, DeadlineExceeded.__str__)
        and len(args) <= 1
    ):
        text = args[0] if args else type(exc).__name__
        if isinstance(text, str):
            head, sep, tail = text.partition("\n")
            exc.args = (head + where + sep + tail,)
            return
    exc.add_note(f"Constellation call at {site}")


ArgSpec = tuple[bool, Callable[[_Run], Any], str | None]


def _arg_builder(args: list[ArgSpec]) -> Callable[[_Run], tuple[Any, ...]] | None:
    """A closure building the argument tuple in one step (None if an argument must await).

    Arguments that are plain reads of values (the usual case) become one ``itemgetter`` call.
    """
    if any(is_async for is_async, _, _ in args):
        return None
    n = len(args)
    if n == 0:
        return lambda run: ()
    keys = [k for _, _, k in args]
    if all(k is not None for k in keys):
        get = operator.itemgetter(*keys)
        if n == 1:
            return lambda run: (get(run.env),)
        return lambda run: get(run.env)
    fns = [f for _, f, _ in args]
    if n == 1:
        f0 = fns[0]
        return lambda run: (f0(run),)
    if n == 2:
        f0, f1 = fns
        return lambda run: (f0(run), f1(run))
    return lambda run: tuple([f(run) for f in fns])


class CompiledCall:
    """One call site, compiled from its IR node: argument closures, the function, its policy
    (or None). Its trace records are the node's: identity, module, position, laziness and
    priority."""

    __slots__ = (
        "_arg_fns",
        "_build",
        "_plain_keys",
        "fn",
        "is_async",
        "key",
        "lazy",
        "policy",
        "priority",
        "site",
    )

    def __init__(
        self,
        *,
        node: CallNode,
        fn: Callable[..., Any],
        is_async: bool,
        args: list[ArgSpec],
        policy: Any,
    ) -> None:
        self.site = node.site
        self.fn = fn
        self.is_async = is_async
        self._build = _arg_builder(args)
        keys = [k for _, _, k in args if k is not None]
        self._plain_keys: tuple[str, ...] | None = tuple(keys) if len(keys) == len(args) else None
        self._arg_fns = tuple((a, f) for a, f, _ in args)
        self.policy = policy
        self.lazy = node.placement == "thunk"
        self.priority = node.options.priority
        # The call's identity, stable across edits of other declarations (the trace's `node`).
        self.key = node.key

    async def _eval_args(self, run: _Run) -> tuple[Any, ...]:
        out = []
        for is_async, f in self._arg_fns:
            out.append(await f(run) if is_async else f(run))
        return tuple(out)

    async def invoke(self, run: _Run) -> Any:
        """Evaluate the arguments and make the call under this site's policy."""
        build = self._build
        args = build(run) if build is not None else await self._eval_args(run)
        if run.trace is not None:
            site = self.site
            with run_span("constellation.call", module=site.module, line=site.line):
                return await self._invoke_traced(run, args)
        try:
            policy = self.policy
            if policy is None:
                result = self.fn(*args)
                if self.is_async:
                    result = await result
                return result
            return await policy.execute(self.fn, args)
        except BaseException as exc:
            attach_site(exc, self.site)
            raise

    @property
    def sync_node(self) -> bool:
        """A sync module without options and with plain arguments: a sync DAG node."""
        return self.policy is None and not self.is_async and self._build is not None

    def start(self, run: _Run) -> Any:
        """The DAG node's action: an awaitable of the call's value.

        Equivalent to ``invoke(run)``, but hands the executor the policy's (or the module's)
        own coroutine: one coroutine per call instead of two on the path every call takes
        (bench/dsl.py). A failure gets its call site from the run (``Program._execute``).
        """
        build = self._build
        if build is None or run.trace is not None:
            return self.invoke(run)
        policy = self.policy
        if policy is None:
            return self.fn(*build(run))  # an async module (sync ones are sync nodes)
        return policy.execute(self.fn, build(run))

    def fast_action(self) -> Callable[[_Run], Any]:
        """The node's action for untraced runs, specialised once at compile time.

        Same result as :meth:`start` (or :meth:`call_now` for a sync node) without the per-call
        checks: the common one-argument call reads its argument straight from the run.
        """
        build = self._build
        if build is None:
            return self.invoke
        fn = self.fn
        keys = self._plain_keys
        policy = self.policy
        if policy is not None:
            execute = policy.execute
            if keys is not None and len(keys) == 1:
                k = keys[0]
                return lambda run: execute(fn, (run.env[k],))
            return lambda run: execute(fn, build(run))
        if keys is not None and len(keys) == 1:
            k = keys[0]
            return lambda run: fn(run.env[k])
        return lambda run: fn(*build(run))

    def call_now(self, run: _Run) -> Any:
        """The action of a sync node (see :attr:`sync_node`): call and return the value."""
        build = self._build
        assert build is not None
        if run.trace is None:
            return self.fn(*build(run))
        site = self.site
        t = _clock.now() - run.t0
        rec = CallTrace(
            site.module,
            site.line,
            site.column,
            t,
            priority=self.priority,
            _t0=run.t0,
            node=self.key,
        )
        rec.attempts = 1
        rec.attempt_log.append(AttemptTrace(t))
        assert run.trace is not None
        run.trace.append(rec)
        try:
            with run_span("constellation.call", module=site.module, line=site.line):
                value = self.fn(*build(run))
        except BaseException as exc:
            rec.outcome = "error"
            rec.error = f"{type(exc).__name__}: {str(exc).partition(chr(10))[0]}"
            raise
        finally:
            rec.end = _clock.now() - run.t0
            rec.attempt_log[-1].end = rec.end
            rec.attempt_log[-1].outcome = "ok" if rec.outcome == "running" else rec.outcome
        rec.outcome = "ok"
        return value

    async def _invoke_traced(self, run: _Run, args: tuple[Any, ...]) -> Any:
        site = self.site
        rec = CallTrace(
            site.module,
            site.line,
            site.column,
            _clock.now() - run.t0,
            lazy=self.lazy,
            priority=self.priority,
            _t0=run.t0,
            node=self.key,
        )
        assert run.trace is not None
        run.trace.append(rec)
        try:
            policy = self.policy
            if policy is None:
                rec.attempts = 1
                rec.attempt_log.append(AttemptTrace(rec.start))
                result = self.fn(*args)
                if self.is_async:
                    result = await result
                rec.attempt_log[-1].end = _clock.now() - run.t0
                rec.attempt_log[-1].outcome = "ok"
            else:
                result = await policy.execute(_entering(self.fn, rec), args, observer=rec.observe)
        except BaseException as exc:
            if (isinstance(exc, DeadlineExceeded) and classify(exc) != "own") or (
                isinstance(exc, asyncio.CancelledError) and current_bound_error() is not None
            ):
                # Stopped because the run's (or an inherited) deadline passed: not a failure of
                # this call, and drawn differently in the trace.
                rec.outcome = "deadline"
                for a in rec.attempt_log:
                    if a.outcome == "cancelled":
                        a.outcome = "deadline"
            elif isinstance(exc, asyncio.CancelledError):
                rec.outcome = "cancelled"
            else:
                rec.outcome = "error"
                rec.error = f"{type(exc).__name__}: {str(exc).partition(chr(10))[0]}"
            if policy is None and rec.attempt_log and rec.attempt_log[-1].end is None:
                rec.attempt_log[-1].end = _clock.now() - run.t0
                rec.attempt_log[-1].outcome = rec.outcome
            attach_site(exc, site)
            raise
        finally:
            rec.end = _clock.now() - run.t0
        if rec.outcome == "running":
            rec.outcome = "cache" if rec.cache_hit else "fallback" if rec.fallback else "ok"
        return result


def _entering(fn: Callable[..., Any], rec: CallTrace) -> Callable[..., Any]:
    """``fn`` noting in ``rec`` when each attempt enters the module: the policy calls it after
    admission, so the gap from the attempt's start is the throttle/concurrency wait. Traced runs
    only; ``wraps`` keeps the signature the policy's cache keys are bound to."""

    @functools.wraps(fn)
    def entering(*args: Any) -> Any:
        if rec.attempt_log:
            rec.attempt_log[-1].entered = _clock.now() - rec._t0
        return fn(*args)

    return entering


class Thunk:
    """A lazy call: evaluated once, when the first consumer needs it; later consumers share it."""

    __slots__ = ("call", "fut", "run")

    def __init__(self, call: CompiledCall, run: _Run) -> None:
        self.call = call
        self.run = run
        self.fut: asyncio.Future[Any] | None = None

    async def force(self) -> Any:
        fut = self.fut
        if fut is not None:
            # shield: a consumer that is cancelled must not cancel the shared evaluation.
            return await asyncio.shield(fut)
        fut = self.fut = asyncio.get_running_loop().create_future()
        try:
            value = await self.call.invoke(self.run)
        except BaseException as exc:
            if isinstance(exc, asyncio.CancelledError):
                fut.cancel()
            else:
                fut.set_exception(exc)
                fut.exception()  # retrieved here; other consumers re-raise it themselves
            raise
        fut.set_result(value)
        return value


def lazy_ref(key: str) -> Callable[[_Run], Any]:
    """An async closure reading ``key``, forcing it first if it is still a thunk."""

    async def ref(run: _Run) -> Any:
        v = run.env[key]
        if type(v) is Thunk:
            v = await v.force()
        return v

    return ref


def error_text(exc: BaseException) -> str:
    """How a wrapped error reads in a program (``r.error``) and in JSON: ``Type: message``."""
    return f"{type(exc).__name__}: {exc}"


def to_json_value(value: Any) -> Any:
    """A JSON-compatible form of a run value (``Ok``/``Err`` become records)."""
    if isinstance(value, dict):
        return {str(k): to_json_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_json_value(v) for v in value]
    ok = getattr(value, "ok", None)
    # A Result has every field of its type (ok, value, error), as `y.value`/`y.error` read them.
    if ok is True and hasattr(value, "value"):
        return {"ok": True, "value": to_json_value(value.value), "error": None}
    if ok is False and hasattr(value, "error"):
        return {"ok": False, "value": None, "error": error_text(value.error)}
    return value


def render_text(value: Any) -> str:
    """How ``${expr}`` renders a value: strings as is, booleans as true/false, others as JSON."""
    if isinstance(value, str):
        return value
    if value is True:
        return "true"
    if value is False:
        return "false"
    if value is None:
        return "none"
    if isinstance(value, int | float):
        return repr(value)
    return json.dumps(to_json_value(value), ensure_ascii=False, default=str)


class Program:
    """A compiled Constellation program. Build it with :func:`timebound.dsl.compile`.

    ``inputs`` and ``outputs`` map names to their types (``str(t)`` spells them); ``warnings``
    holds the compile-time warnings. A program is immutable and may run any number of times,
    concurrently too.
    """

    def __init__(
        self,
        *,
        inputs: dict[str, Type],
        outputs: dict[str, Type],
        warnings: list[Diagnostic],
        plan: DagPlan[_Run],
        fast_plan: DagPlan[_Run],
        lazy: list[tuple[str, CompiledCall]],
        output_keys: list[tuple[str, str]],
        sites: dict[str, CallSite],
        source: str,
        examples: dict[str, Any] | None = None,
        annotations: dict[str, tuple[Annotation, ...]] | None = None,
        ir: ProgramIR,
    ) -> None:
        self.inputs = inputs
        self.outputs = outputs
        self.warnings = warnings
        self.source = source
        self.examples: dict[str, Any] = examples or {}
        self.annotations: dict[str, tuple[Annotation, ...]] = annotations or {}
        #: The checked program's typed representation: its module calls, their types and
        #: options (see ``timebound.dsl.ProgramIR``).
        self.ir = ir
        self._plan = plan
        self._fast_plan = fast_plan
        self._lazy = lazy
        self._output_keys = output_keys
        self._sites = sites

    def _bind_inputs(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        if not isinstance(inputs, Mapping):
            raise InputError(
                f"inputs must be a mapping of names to values, not {type(inputs).__name__}"
            )
        env: dict[str, Any] = {}
        for name, t in self.inputs.items():
            if name not in inputs:
                raise InputError(f"missing input '{name}' ({t})", input=name)
            try:
                env[name] = validate_value(inputs[name], t, f"input '{name}'")
            except TypeError as exc:
                raise InputError(str(exc), input=name) from None
            except RecursionError:
                raise InputError(f"input '{name}' is nested too deeply", input=name) from None
        for name in inputs:
            if name not in self.inputs:
                known = ", ".join(self.inputs) or "none"
                raise InputError(f"unknown input '{name}' (declared inputs: {known})", input=name)
        return env

    async def _execute(
        self,
        inputs: Mapping[str, Any],
        timeout: Duration | None,
        concurrency: int | None,
        traced: bool,
        *,
        sink: list[CallTrace] | None = None,
    ) -> _Run:
        """One run; the outputs are in ``run.env``. ``sink`` receives the trace even when the
        run fails."""
        if concurrency is not None and (
            isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1
        ):
            raise ConfigurationError(
                f"concurrency must be an integer >= 1, got {concurrency!r}", option="concurrency"
            )
        if _get_running_loop() is None:
            # The DAG executor is asyncio's (tasks, futures); trio callers use run_sync().
            raise RuntimeError(
                "Constellation programs run on an asyncio event loop; "
                "from other code use run_sync()"
            )
        env = self._bind_inputs(inputs)
        seconds = (
            None if timeout is None else to_seconds(timeout, option="timeout", allow_zero=False)
        )
        # With spans exported every run is traced: each call is a span (D10.4).
        traced = traced or tracing_active()
        run = _Run(env, (sink if sink is not None else []) if traced else None, _clock.now())
        for key, call in self._lazy:
            env[key] = Thunk(call, run)
        plan = self._plan if traced else self._fast_plan
        token = CURRENT_RUN.set(run)
        try:
            # Every event of this run carries its id (one exporter serves every engine); with
            # spans exported the run is a span, its module calls' policy spans its children.
            with correlation("run") as run_id, run_span("constellation.run", run_id=run_id):
                if seconds is None:
                    await plan.execute(run, concurrency=concurrency, results=env)
                else:
                    with fail_after(seconds, source="scope", what="run"):
                        await plan.execute(run, concurrency=concurrency, results=env)
        except BaseException as exc:
            # A call node's error reaches here straight from the policy: name its call site.
            site = self._sites.get(getattr(exc, "__timebound_node__", None))  # type: ignore[arg-type]
            if site is not None:
                attach_site(exc, site)
            raise
        finally:
            CURRENT_RUN.reset(token)
        return run

    def _outputs(self, env: dict[str, Any]) -> dict[str, Any]:
        out = {}
        for name, key in self._output_keys:
            out[name] = env[key]
        return out

    async def run(
        self,
        inputs: Mapping[str, Any],
        *,
        timeout: Duration | None = None,
        concurrency: int | None = None,
    ) -> dict[str, Any]:
        """Run the program; returns the outputs by name.

        ``timeout`` is a deadline for the whole run that every call inherits (D1.5).
        ``concurrency`` limits how many calls run at once; ready calls then start by ``priority``
        (D3.8). A failed call fails the run with its own error, ``.call_site`` attached (D3.10).
        """
        run = await self._execute(inputs, timeout, concurrency, False)
        return self._outputs(run.env)

    async def run_traced(
        self,
        inputs: Mapping[str, Any],
        *,
        timeout: Duration | None = None,
        concurrency: int | None = None,
        sink: list[CallTrace] | None = None,
    ) -> TracedRun:
        """Like :meth:`run`, also recording a :class:`CallTrace` per call that ran.

        ``sink``, when given, receives each call's trace as the call starts, so a caller still
        has the trace of a run that fails.
        """
        run = await self._execute(inputs, timeout, concurrency, True, sink=sink)
        return TracedRun(self._outputs(run.env), run.trace or [], _clock.now() - run.t0)

    def run_sync(
        self,
        inputs: Mapping[str, Any],
        *,
        timeout: Duration | None = None,
        concurrency: int | None = None,
    ) -> dict[str, Any]:
        """:meth:`run` from synchronous code (starts an event loop; not inside a running one)."""
        outputs: dict[str, Any] = _run_in_new_loop(
            self.run(inputs, timeout=timeout, concurrency=concurrency)
        )
        return outputs

    def run_traced_sync(
        self,
        inputs: Mapping[str, Any],
        *,
        timeout: Duration | None = None,
        concurrency: int | None = None,
    ) -> TracedRun:
        """:meth:`run_traced` from synchronous code."""
        result: TracedRun = _run_in_new_loop(
            self.run_traced(inputs, timeout=timeout, concurrency=concurrency)
        )
        return result


def _run_in_new_loop(coro: Any) -> Any:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    coro.close()
    raise RuntimeError("run_sync() cannot be used inside a running event loop; await run()")
