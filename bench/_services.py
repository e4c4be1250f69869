"""One service of the propagation benchmark's chain ``A -> B -> C``, run as its own process.

``python bench/_services.py --role C --mode M2 --port 8003 --iters 11000 --quanta 80`` serves one
uvicorn service on 127.0.0.1. ``bench/propagation.py`` starts three of them per run and drives
them; nothing here is meant to be run by hand.

Roles
-----
- ``A`` and ``B`` forward each request to the next service (``--next``) with an httpx client
  (static timeouts A->B 1 s, B->C 0.5 s; B retries a timed-out call once).
- ``C`` is the bottleneck: CPU-bound work in quanta of ~0.5 ms (``--iters`` loop iterations,
  calibrated by the harness) with a checkpoint before each quantum, one request at a time in
  arrival order (one FIFO worker; ``--queue lifo`` for the diagnostic variant), yielding to the
  event loop between quanta.

Modes (what each service does; see ``docs/propagation.md``)
-----------------------------------------------------------
- ``M0``: plain ``httpx.AsyncClient(timeout=static)``; no middleware; headers ignored.
- ``M1``: clients only. A and B run each request under their *own* request budget
  (``timebound.fail_after(budget)``: A 250 ms, B 200 ms — the latency each promises its caller)
  and call downstream through ``AsyncDeadlineTransport``, which clamps the static timeout to
  that budget, fails fast when it is spent and sends ``X-YaTaxi-Client-TimeoutMs``. No server reads
  that header: C has no middleware and works every request to the end.
- ``M2``: ``DeadlineMiddleware`` on A, B and C plus the transports; no local budgets — the deadline
  is the one received on the wire.
- ``M3``: M2 with ``DeadlineMiddleware(cancel_on_expiry=True)``.
- ``M4``/``M5``: M2/M3 with C's middleware an ``AdmissionMiddleware`` (default knobs: adaptive
  limit, CoDel queue with adaptive LIFO, hopeless requests answered 498 before any work).

Accounting (never behaviour)
----------------------------
Every request carries ``X-Bench-Origin-Deadline-Epoch-Ms`` (the load generator's absolute
wall-clock deadline, ms with a fraction) and ``X-Bench-Id``. CPU is attributed per request by
timing every event-loop callback (``asyncio.events.Handle._run``) with ``time.thread_time`` and
reading the request's accounting object from the callback's context; C also closes a segment after
every work quantum. A segment's CPU counts as *after the deadline* in proportion to the part of its
wall-clock span that lies past the origin deadline. Outgoing calls get ``X-Bench-Sent-Epoch-Us``
stamped when their request headers are actually written to a connection (httpcore's ``trace``
extension), so a call that waited in the connection pool is stamped when it really left; the
receiving service counts it as *late* (metric L) when that stamp is at or after the origin
deadline. The harness talks to each service over stdin/stdout from a thread, so a service whose
event loop is saturated still answers ``mark``/``stats`` at once.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextvars
import json
import math
import os
import sys
import threading
import time
from typing import Any

import httpx
import uvicorn

import timebound as tb

ORIGIN_HDR = b"x-bench-origin-deadline-epoch-ms"
SENT_HDR = b"x-bench-sent-epoch-us"
ID_HDR = b"x-bench-id"

#: Static client timeouts and retries (all modes), as services are typically configured without
#: knowing their callers' deadlines: a ladder narrowing down the chain, like the one userver's
#: design shows (A 20 s, B 15 s, C 10 s), scaled down; B retries a timed-out call to C once. The load
#: generator gives up at 250 ms.
STATIC_TIMEOUT = {"A": 1.0, "B": 0.5}
RETRIES = {"A": 0, "B": 1}
#: M1 only: each service's own request budget (its handler timeout, the SLA it promises its
#: caller): A promises the public 250 ms, B promises A 200 ms.
M1_BUDGET = {"A": 0.250, "B": 0.200}


# --- CPU accounting --------------------------------------------------------------------------


class Acct:
    """Per-request accounting: the origin deadline (epoch seconds)."""

    __slots__ = ("deadline",)

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline


class Meter:
    """Process-wide counters; the harness diffs two snapshots to get one window's figures."""

    def __init__(self) -> None:
        self.cpu_attr = 0.0  # CPU attributed to requests (s)
        self.cpu_after = 0.0  # ... of which after the request's origin deadline (s)
        self.work_cpu = 0.0  # C: CPU of work quanta (s)
        self.quanta = 0  # C: work quanta done
        self.received = 0  # requests that reached the service's app
        self.late_calls = 0  # L: requests sent (stamp) at/after their origin deadline
        self.ok = 0  # responses with status 200

    def snapshot(self) -> dict[str, float]:
        return {
            "cpu_attr": self.cpu_attr,
            "cpu_after": self.cpu_after,
            "work_cpu": self.work_cpu,
            "quanta": self.quanta,
            "received": self.received,
            "late_calls": self.late_calls,
            "ok": self.ok,
            "process_cpu": time.process_time(),
            "wall": time.time(),
        }


METER = Meter()
#: Per request: (id, app start epoch s, app end epoch s, C's queue + work wall s, origin deadline
#: epoch s, ms left by the received deadline headers (the earlier of X-YaTaxi-Client-TimeoutMs and
#: X-Request-Deadline) or -1, status, sent stamp epoch s or -1).
#: Bounded by the run's load.
RECORDS: list[tuple[int, float, float, float, float, float, int, float]] = []
_ACCT: contextvars.ContextVar[Acct | None] = contextvars.ContextVar("bench_acct", default=None)
_thread_time = time.thread_time
_wall = time.time
_cur: Acct | None = None
_cpu0 = 0.0
_wall0 = 0.0


def _account(acct: Acct, cpu: float, w0: float, w1: float) -> None:
    METER.cpu_attr += cpu
    dl = acct.deadline
    if w1 > dl:
        frac = 1.0 if (w0 >= dl or w1 <= w0) else (w1 - dl) / (w1 - w0)
        METER.cpu_after += cpu * frac


def tick() -> None:
    """Close the current CPU segment now (C calls this after every quantum)."""
    global _cpu0, _wall0
    acct = _cur
    if acct is None:
        return
    c, w = _thread_time(), _wall()
    _account(acct, c - _cpu0, _wall0, w)
    _cpu0, _wall0 = c, w


def begin(acct: Acct) -> None:
    """Make ``acct`` the current request's accounting object (this task and its callbacks)."""
    global _cur
    _ACCT.set(acct)
    _cur = acct


_orig_run = asyncio.events.Handle._run


def _timed_run(self: asyncio.events.Handle) -> None:
    # Every task step and loop callback goes through Handle._run (pure Python in CPython's
    # asyncio), and the handle carries the context the step runs in: that context holds the
    # request's Acct, so each step's CPU is charged to the request it served.
    global _cur, _cpu0, _wall0
    ctx: contextvars.Context | None = self._context  # type: ignore[attr-defined]
    _cur = ctx.get(_ACCT) if ctx is not None else None
    _cpu0, _wall0 = _thread_time(), _wall()
    try:
        _orig_run(self)
    finally:
        acct = _cur
        if acct is not None:
            _account(acct, _thread_time() - _cpu0, _wall0, _wall())
        _cur = None


def install_accounting() -> None:
    """Time every event-loop callback of this process (the service processes only)."""
    asyncio.events.Handle._run = _timed_run  # type: ignore[method-assign]


# --- the apps ------------------------------------------------------------------------------

Scope = dict[str, Any]


async def respond(send: Any, status: int, body: bytes) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"text/plain"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def quantum(iters: int) -> int:
    """~0.5 ms of pure-Python CPU work (``iters`` calibrated by the harness)."""
    acc = 0
    for i in range(iters):
        acc = (acc + i * i) % 1_000_003
    return acc


class OrderedLock:
    """An async lock handing itself to waiters first-in-first-out or last-in-first-out.

    FIFO (the default, like ``asyncio.Lock``) is how a CPU-bound service's queue behaves; LIFO is
    a diagnostic variant of the benchmark (``--queue lifo``) showing how much of the work saved
    depends on the queue discipline. A waiter cancelled while waiting (M3's
    ``cancel_on_expiry``) leaves the queue; one cancelled after the lock was handed to it passes
    the lock on.
    """

    def __init__(self, lifo: bool = False) -> None:
        self._lifo = lifo
        self._locked = False
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    async def __aenter__(self) -> None:
        if not self._locked and not self._waiters:
            self._locked = True
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self._release()  # handed over, then cancelled: pass it on
            elif fut in self._waiters:
                self._waiters.remove(fut)
            # Otherwise the future was cancelled with the task and a release has already
            # popped and skipped it (between the cancel and this handler): nothing to undo.
            raise
        # Handed over by _release: still locked, now ours.

    async def __aexit__(self, *exc: object) -> None:
        self._release()

    def _release(self) -> None:
        while self._waiters:
            fut = self._waiters.pop() if self._lifo else self._waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                return
        self._locked = False


class Work:
    """C's handler: ``quanta`` quanta of CPU work, one request at a time, checkpoint before each.

    One worker (an ``asyncio.Lock``, FIFO) stands for a CPU-bound service with one core: requests
    queue for it in arrival order. The worker yields to the event loop between quanta
    (``acheckpoint`` is ``checkpoint`` plus a yield), so the loop keeps accepting requests while
    C works — each request enters the ASGI app, and its propagated deadline starts, when it
    arrives, not when the worker gets to it.
    """

    def __init__(self, iters: int, quanta: int, lifo: bool = False) -> None:
        self.iters = iters
        self.quanta = quanta
        self.lock = OrderedLock(lifo)

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        w0 = _wall()
        status = 200
        scope["bench.ran"] = True  # the handler ran: the request was not shed
        try:
            async with self.lock:
                for _ in range(self.quanta):
                    # With a propagated deadline this raises at the first checkpoint past it
                    # (also before any work when the deadline passed in the queue); with none
                    # (M0, M1) it only yields, so every mode runs the same code.
                    await tb.acheckpoint()
                    c0 = _thread_time()
                    quantum(self.iters)
                    METER.work_cpu += _thread_time() - c0
                    METER.quanta += 1
                    tick()
        except tb.DeadlineExceeded:
            status = 504
        # Queue + work: subtracted from C's app time to get its own (HTTP + middleware) time.
        scope["bench.work_wall"] = _wall() - w0
        await respond(send, status, b"ok" if status == 200 else b"deadline")


async def _stamp(event: str, info: dict[str, Any]) -> None:
    # Runs when httpcore is about to write the request head on a connection: the moment the call
    # really leaves (after any wait for a pooled connection). Accounting only.
    if event == "http11.send_request_headers.started":
        info["request"].headers.append((SENT_HDR, str(int(_wall() * 1e6)).encode()))


class Forward:
    """A's and B's handler: call the next service, answer with its status."""

    def __init__(
        self,
        role: str,
        mode: str,
        next_url: str,
        save_connections: bool = True,
        escalate: bool = False,
    ) -> None:
        self.url = next_url
        #: Under a middleware reserve (D1.18) the handler lets a spent deadline escape, so the
        #: middleware answers 498 (with its breakdown) while the caller still waits.
        self.escalate = escalate
        self.budget = M1_BUDGET[role] if mode == "M1" else None
        self.retries = RETRIES[role]
        static = STATIC_TIMEOUT[role]
        limits = httpx.Limits(max_connections=100, max_keepalive_connections=100)
        if mode == "M0":
            self.client = httpx.AsyncClient(timeout=static, limits=limits)
        else:
            from timebound.propagation.httpx import AsyncDeadlineTransport

            transport = AsyncDeadlineTransport(
                inner=httpx.AsyncHTTPTransport(limits=limits), save_connections=save_connections
            )
            self.client = httpx.AsyncClient(timeout=static, transport=transport)

    async def _call(self, headers: dict[str, str]) -> int:
        for attempt in range(self.retries + 1):
            try:
                r = await self.client.get(self.url, headers=headers, extensions={"trace": _stamp})
                return r.status_code
            except httpx.TimeoutException:
                # The static timeout fired (in M1-M3 only an attempt's own timeout is an
                # httpx.TimeoutException; a spent deadline is DeadlineExceeded, never retried).
                if attempt == self.retries:
                    raise
        raise AssertionError("unreachable")

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        hdrs = scope["bench.headers"]
        fwd = {
            "x-bench-origin-deadline-epoch-ms": hdrs.get(ORIGIN_HDR, b"").decode(),
            "x-bench-id": hdrs.get(ID_HDR, b"0").decode(),
        }
        try:
            if self.budget is not None:
                with tb.fail_after(self.budget):
                    status = await self._call(fwd)
            else:
                status = await self._call(fwd)
        except (tb.DeadlineExceeded, httpx.TimeoutException) as exc:
            if self.escalate and isinstance(exc, tb.DeadlineExceeded):
                raise
            status = 504
        except httpx.HTTPError:
            status = 502
        await respond(send, 200 if status == 200 else 504, b"ok" if status == 200 else b"failed")


class BenchApp:
    """Outermost ASGI app: accounting around the mode's stack (middleware + handler)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        t0 = _wall()
        hdrs = dict(scope["headers"])
        scope["bench.headers"] = hdrs
        origin = hdrs.get(ORIGIN_HDR)
        deadline = float(origin) / 1000.0 if origin else math.inf
        begin(Acct(deadline))
        METER.received += 1
        sent = hdrs.get(SENT_HDR)
        if sent is not None and int(sent) / 1e6 >= deadline:
            METER.late_calls += 1
        status = 0

        async def send_wrapper(message: Any) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        await self.inner(scope, receive, send_wrapper)
        if status == 200:
            METER.ok += 1
        received_ms = hdrs.get(b"x-yataxi-client-timeoutms", b"")
        absolute_us = hdrs.get(b"x-request-deadline", b"")
        if received_ms.isdigit() and absolute_us.isdigit():
            # The deadline the middleware took: the earlier of the two headers (D9.3), as ms
            # left at the app's start.
            left = (int(absolute_us) / 1e6 - t0) * 1e3
            received_ms = str(max(0, min(int(received_ms), math.floor(left)))).encode()
        RECORDS.append(
            (
                int(hdrs.get(ID_HDR, b"0")),
                t0,
                _wall(),
                float(scope.get("bench.work_wall", 0.0)),
                deadline,
                float(received_ms) if received_ms.isdigit() else -1.0,
                status,
                int(sent) / 1e6 if sent is not None else -1.0,
                1 if scope.get("bench.ran") else 0,
            )
        )


def build_app(
    role: str,
    mode: str,
    next_url: str | None,
    iters: int,
    quanta: int,
    lifo: bool = False,
    save_connections: bool = True,
) -> Any:
    # bench/breakdown.py: every middleware attaches its breakdown (D13.5), and A and B serve
    # with a reserve (D1.18) when one is given: the pattern docs/breakdown.md recommends.
    extra: dict[str, Any] = {}
    if os.environ.get("TB_BENCH_EXPOSE_BREAKDOWN"):
        extra["expose_breakdown"] = True
    reserve = os.environ.get("TB_BENCH_RESERVE") if role in ("A", "B") else None
    if reserve and mode in ("M2", "M3", "M4", "M5"):
        extra["reserve"] = reserve
    handler: Any = (
        Work(iters, quanta, lifo)
        if role == "C"
        else Forward(role, mode, next_url or "", save_connections, escalate="reserve" in extra)
    )
    cancel = mode in ("M3", "M5")
    if mode in ("M4", "M5") and role == "C":
        # Admission where the overload is: C, the bottleneck, with the default (adaptive) limit.
        from timebound.propagation.asgi import AdmissionMiddleware

        handler = AdmissionMiddleware(handler, cancel_on_expiry=cancel, **extra)
    elif mode in ("M2", "M3", "M4", "M5"):
        from timebound.propagation.asgi import DeadlineMiddleware

        handler = DeadlineMiddleware(handler, cancel_on_expiry=cancel, **extra)
    return BenchApp(handler)


# --- control channel -----------------------------------------------------------------------


def _control() -> None:
    """Answer the harness on stdin/stdout from a thread (the event loop may be saturated)."""
    base = METER.snapshot()
    base_records = 0
    for line in sys.stdin:
        cmd = line.strip()
        if cmd == "mark":
            base = METER.snapshot()
            base_records = len(RECORDS)
            print(json.dumps({"marked": base["wall"]}), flush=True)
        elif cmd == "stats":
            now = METER.snapshot()
            out: dict[str, Any] = {k: now[k] - base[k] for k in now}
            out["records"] = RECORDS[base_records:]
            print(json.dumps(out), flush=True)
    # stdin closed: the harness is gone; do not outlive it.
    import os

    os._exit(0)


async def _serve(args: argparse.Namespace) -> None:
    install_accounting()
    app = build_app(
        args.role,
        args.mode,
        args.next,
        args.iters,
        args.quanta,
        args.queue == "lifo",
        not args.no_save_connections,
    )
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=args.port,
        http="h11",
        lifespan="off",
        access_log=False,
        log_level="warning",
        backlog=4096,
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            await task
            raise SystemExit("uvicorn failed to start")
        await asyncio.sleep(0.01)
    threading.Thread(target=_control, daemon=True).start()
    print(json.dumps({"ready": args.role}), flush=True)
    await task


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--role", choices=["A", "B", "C"], required=True)
    p.add_argument("--mode", choices=["M0", "M1", "M2", "M3", "M4", "M5"], required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--next", default=None)
    p.add_argument("--iters", type=int, default=1000)
    p.add_argument("--quanta", type=int, default=40)
    p.add_argument("--queue", choices=["fifo", "lifo"], default="fifo", help="C's queue order")
    p.add_argument(
        "--no-save-connections",
        action="store_true",
        help="A's and B's transports with save_connections=False (D4.8)",
    )
    args = p.parse_args()
    asyncio.run(_serve(args))


if __name__ == "__main__":
    main()
