"""The propagation benchmark — "the work saved".

A chain ``load generator -> A -> B -> C`` of uvicorn services on loopback, each its own process
(``bench/_services.py``). C is the bottleneck: CPU-bound work in ~0.5 ms quanta, one request at a
time in arrival order, with ``await timebound.acheckpoint()`` (a checkpoint and a yield) before
every quantum. The load generator (this process) sends open-loop Poisson arrivals at ``rho`` times
C's capacity measured through the chain (A, B and the load generator share the
cores with C) and gives up on each request at 250 ms.

Modes: M0 no propagation; M1 clients only (A and B clamp to their own static budget); M2 clients +
``DeadlineMiddleware`` on every server; M3 M2 with ``cancel_on_expiry=True``; M4 and M5: M2 and M3
with ``AdmissionMiddleware`` at C (see ``bench/_services.py`` and ``docs/propagation.md`` for the
precise definitions). ``--bursty`` also runs M2, M4 and M5 under an on/off load of the same mean.

Per mode and load it reports:

- PDW: the fraction of C's CPU (and of A+B+C's CPU) spent on requests after the client's
  deadline had passed, during the measurement window;
- goodput: responses delivered within the 250 ms deadline per second;
- L: downstream calls sent after the origin deadline had passed (counted at B and C).

At rho = 0.5 it also compares M2 with M0 for CPU per request and the latency each hop adds
(pooled over interleaved repeats, with the M0-against-M0 difference as the noise floor), times the
middleware and the transport in-process, and runs M0 and M2 at rho >= 2 once more with C's queue
LIFO (a diagnostic that separates the queue discipline from propagation).

``python bench/propagation.py --out bench/results/propagation.json`` runs everything (about 3-4
minutes a repeat on 2 cores, plus any wait for a quiet machine; results are written only with
``--out``); ``--quick`` leaves out the diagnostics, ``--smoke`` is a seconds-long run for the tests.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import Row, run_bench

HERE = Path(__file__).resolve().parent
SERVICES = HERE / "_services.py"
CLIENT_DEADLINE = 0.250  # seconds; the load generator gives up here in every mode
QUANTUM = 0.0005  # seconds of CPU per work quantum
MODES = ("M0", "M1", "M2", "M3", "M4", "M5")
#: Modes with admission control at C (D9.4): their targets are set at rho 2 and 3.
ADMISSION_MODES = ("M4", "M5")
LOADS = (0.5, 1.0, 2.0, 3.0)
#: The bursty load's rates, as multiples of the mean, in the on and the off half-second.
BURST_HIGH, BURST_LOW = 1.75, 0.25


# --- small helpers -------------------------------------------------------------------------


def log(msg: str) -> None:
    """Print a progress line now."""
    print(msg, flush=True)


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (loopback only)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def calibrate_iters() -> int:
    """Loop iterations of ``_services.quantum`` that take ~0.5 ms of CPU on this machine."""
    from _services import quantum

    n = 10_000
    samples = []
    for _ in range(20):
        c0 = time.thread_time()
        quantum(n)
        samples.append(time.thread_time() - c0)
    # The fastest sample: interference (another process, a cache flush) only ever adds time.
    per_iter = min(samples) / n
    return max(1, round(QUANTUM / per_iter))


async def _per_call(fn: Any, n: int) -> float:
    # CPU of this thread, not wall time: other processes on a shared machine (and, over
    # loopback, the server's own work) do not count.
    t0 = time.thread_time()
    for _ in range(n):
        await fn()
    return (time.thread_time() - t0) / n


async def _micro(loopback_url: str | None = None, rounds: int = 7) -> dict[str, dict[str, float]]:
    """In-process cost of the middleware and the transport: CPU seconds per request.

    ``asgi``: the middleware against the bare app. ``httpx``: clients over
    ``httpx.MockTransport`` (no sockets), bare, and through ``AsyncDeadlineTransport`` with
    ``save_connections`` on (``dp``) and off (``dp_nosave``). ``loopback`` (with
    ``loopback_url``): the same three over httpx's pooled transport to a real server process.
    Every client call runs under a 2 s deadline below the 5 s static timeout, the case
    where a cut could keep the exchange (D4.8). Each figure is the median over ``rounds``
    interleaved rounds of the best of three batches.
    """
    import timebound as tb
    from timebound.propagation.asgi import DeadlineMiddleware
    from timebound.propagation.httpx import AsyncDeadlineTransport

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Any) -> None:
        return None

    def scope(with_header: bool) -> dict[str, Any]:
        headers = [(b"host", b"c"), (b"x-bench-id", b"1")]
        if with_header:
            headers.append((b"x-yataxi-client-timeoutms", b"250"))
        return {"type": "http", "method": "GET", "path": "/", "headers": headers}

    mw = DeadlineMiddleware(app)
    plain_scope, dp_scope = scope(False), scope(True)

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=b"ok")

    clients: list[httpx.AsyncClient] = []

    def trio_of(inner: Any, url: str, n: int) -> dict[str, tuple[Any, int]]:
        made = {
            "plain": httpx.AsyncClient(transport=inner(), timeout=5.0),
            "dp": httpx.AsyncClient(transport=AsyncDeadlineTransport(inner=inner()), timeout=5.0),
            "dp_nosave": httpx.AsyncClient(
                transport=AsyncDeadlineTransport(inner=inner(), save_connections=False),
                timeout=5.0,
            ),
        }
        clients.extend(made.values())

        def call(client: httpx.AsyncClient) -> Any:
            async def one() -> None:
                with tb.inherit_deadline(tb.Deadline.after(2.0)):
                    await client.get(url)

            return one

        return {k: (call(c), n) for k, c in made.items()}

    variants: dict[str, dict[str, tuple[Any, int]]] = {
        "asgi": {
            "plain": (lambda: app(plain_scope, receive, send), 5000),
            "dp": (lambda: mw(dp_scope, receive, send), 5000),
        },
        "httpx": trio_of(lambda: httpx.MockTransport(handler), "http://c/", 1000),
    }
    if loopback_url is not None:
        variants["loopback"] = trio_of(httpx.AsyncHTTPTransport, loopback_url, 200)
    out: dict[str, dict[str, float]] = {}
    try:
        with tb.inherit_deadline(tb.Deadline.after(3600)):
            for name, group in variants.items():
                samples: dict[str, list[float]] = {k: [] for k in group}
                for _ in range(rounds):
                    for k, (fn, n) in group.items():
                        samples[k].append(min([await _per_call(fn, n) for _ in range(3)]))
                out[name] = {k: statistics.median(v) for k, v in samples.items()}
    finally:
        for client in clients:
            await client.aclose()
    return out


def micro_run(iters: int) -> dict[str, dict[str, float]]:
    """:func:`_micro` with a loopback server: a C service process with no work per request."""
    services = start_chain("M0", iters, 0, roles="C")
    try:
        return asyncio.run(_micro(services["C"].url))
    finally:
        stop_chain(services)


def cpu_busy() -> float | None:
    """Busy CPU seconds of the whole machine so far (all cores), from /proc/stat; None elsewhere."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()[1:]
    except OSError:
        return None
    ticks = [int(x) for x in fields]
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)  # idle + iowait
    return (sum(ticks[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def wait_quiet(limit: float, threshold: float = 0.3) -> float | None:
    """Wait (up to ``limit`` s) until other processes use at most ``threshold`` cores.

    The machine may be shared (2 cores): a benchmark measured under someone else's load measures
    that load. Returns the last measured busy cores (None where /proc/stat is unavailable).
    """
    deadline = time.monotonic() + limit
    while True:
        b0, c0 = cpu_busy(), time.process_time()
        time.sleep(1.0)
        b1, c1 = cpu_busy(), time.process_time()
        if b0 is None or b1 is None:
            return None
        busy = (b1 - b0) - (c1 - c0)
        if busy <= threshold or time.monotonic() >= deadline:
            return busy
        log(f"waiting for a quiet machine: other processes use {busy:.2f} cores")


def propagation_available() -> bool:
    """Whether the middleware and the transport exist yet (M1-M3 need them)."""
    try:
        import timebound.propagation.asgi
        import timebound.propagation.httpx  # noqa: F401
    except ImportError:
        return False
    return True


def median(values: Sequence[float]) -> float:
    """The median, NaN for no values."""
    return statistics.median(values) if values else math.nan


# --- the service processes ------------------------------------------------------------------


class Service:
    """One ``_services.py`` process, controlled over its stdin/stdout."""

    def __init__(
        self,
        role: str,
        mode: str,
        port: int,
        next_url: str | None,
        iters: int,
        quanta: int,
        queue: str = "fifo",
        save_connections: bool = True,
    ):
        cmd = [
            sys.executable,
            str(SERVICES),
            "--role",
            role,
            "--mode",
            mode,
            "--port",
            str(port),
            "--iters",
            str(iters),
            "--quanta",
            str(quanta),
            "--queue",
            queue,
        ]
        if next_url:
            cmd += ["--next", next_url]
        if not save_connections:
            cmd.append("--no-save-connections")
        self.role = role
        self.url = f"http://127.0.0.1:{port}/"
        # A new session: a Ctrl-C in the terminal reaches only the harness, which then stops
        # the services itself (in order, and for sure).
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self._lock = threading.Lock()

    def _ask(self, cmd: str | None, timeout: float = 15.0) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        result: list[str] = []

        def read() -> None:
            assert self.proc.stdout is not None
            result.append(self.proc.stdout.readline())

        with self._lock:
            if cmd is not None:
                self.proc.stdin.write(cmd + "\n")
                self.proc.stdin.flush()
            reader = threading.Thread(target=read, daemon=True)
            reader.start()
            reader.join(timeout)
        if not result or not result[0]:
            raise RuntimeError(f"service {self.role} did not answer {cmd or 'ready'!r}")
        return dict(json.loads(result[0]))

    def wait_ready(self) -> None:
        self._ask(None)

    def mark(self) -> None:
        self._ask("mark")

    def stats(self) -> dict[str, Any]:
        return self._ask("stats")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(2.0)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(2.0)
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                if f is not None:
                    f.close()
            except OSError:
                pass


_LIVE: list[Service] = []
VERBOSE = False


def stop_all() -> None:
    """Stop every service still running (the last line of defence: ``finally`` in main)."""
    while _LIVE:
        _LIVE.pop().stop()


def start_chain(
    mode: str,
    iters: int,
    quanta: int,
    roles: str = "ABC",
    queue: str = "fifo",
    save_connections: bool = True,
) -> dict[str, Service]:
    """Start the services of ``roles`` (C, then B, then A; each knows the next one's port)."""
    ports = {r: free_port() for r in roles}
    services: dict[str, Service] = {}
    nxt = {"A": "B", "B": "C"}
    for role in reversed(roles):
        nr = nxt.get(role)
        next_url = f"http://127.0.0.1:{ports[nr]}/" if nr in ports else None
        svc = Service(role, mode, ports[role], next_url, iters, quanta, queue, save_connections)
        _LIVE.append(svc)
        services[role] = svc
    for svc in services.values():
        svc.wait_ready()
        if VERBOSE:
            log(f"service {svc.role} ({mode}) pid={svc.proc.pid} url={svc.url}")
    return services


def stop_chain(services: dict[str, Service]) -> None:
    """Stop these services and forget them."""
    for svc in services.values():
        svc.stop()
        if svc in _LIVE:
            _LIVE.remove(svc)


# --- load generation ------------------------------------------------------------------------


@dataclass
class Outcome:
    sent: float  # epoch seconds
    status: int  # HTTP status; 0 = gave up at the deadline; -1 = transport error
    latency: float


async def closed_loop(url: str, seconds: float, warm: float, workers: int = 4) -> float:
    """Completions per second of a closed loop with ``workers`` callers (C's capacity)."""
    done: list[float] = []
    async with httpx.AsyncClient(timeout=10.0) as client:
        start = time.monotonic()

        async def worker() -> None:
            while time.monotonic() - start < warm + seconds:
                r = await client.get(url, headers={"x-bench-id": "0"})
                if r.status_code == 200:
                    done.append(time.monotonic())

        await asyncio.gather(*(worker() for _ in range(workers)))
    counted = [t for t in done if start + warm <= t < start + warm + seconds]
    return len(counted) / seconds


async def open_loop(
    url: str,
    rate: float,
    total: float,
    propagate: bool,
    seed: int,
    on_mark: float,
    mark: Any,
    bursty: bool = False,
    absolute: bool = True,
) -> tuple[list[Outcome], float]:
    """Poisson arrivals at ``rate``/s for ``total`` seconds; calls ``mark()`` at ``on_mark`` s.

    ``bursty``: the same mean rate, on and off — each second, half a second at 1.75 x ``rate``
    and half at 0.25 x (a Poisson process at the peak rate, thinned). ``absolute``: with
    ``propagate``, also send the deadline as ``X-Request-Deadline`` (microseconds of the Unix
    epoch), so A starts from the client's own instant rather than from when it read the
    relative header (every process here shares one clock).
    Returns every outcome and the epoch time of the mark.
    """
    rng = random.Random(seed)
    peak = rate * (BURST_HIGH if bursty else 1.0)
    outcomes: list[Outcome] = []
    limits = httpx.Limits(max_connections=4000, max_keepalive_connections=4000)
    tasks: set[asyncio.Task[None]] = set()
    mark_at = 0.0
    async with httpx.AsyncClient(timeout=2.0, limits=limits) as client:

        async def one(i: int) -> None:
            sent = time.time()
            headers = {
                "x-bench-origin-deadline-epoch-ms": f"{(sent + CLIENT_DEADLINE) * 1000:.3f}",
                "x-bench-id": str(i),
            }
            if propagate:
                headers["X-YaTaxi-Client-TimeoutMs"] = str(round(CLIENT_DEADLINE * 1000))
                if absolute:
                    headers["X-Request-Deadline"] = str(math.ceil((sent + CLIENT_DEADLINE) * 1e6))
            try:
                async with asyncio.timeout(CLIENT_DEADLINE):
                    r = await client.get(url, headers=headers)
                outcomes.append(Outcome(sent, r.status_code, time.time() - sent))
            except TimeoutError:
                outcomes.append(Outcome(sent, 0, CLIENT_DEADLINE))
            except httpx.HTTPError:
                outcomes.append(Outcome(sent, -1, time.time() - sent))

        loop = asyncio.get_running_loop()
        start = loop.time()
        t = 0.0
        i = 0
        marked = False
        while True:
            t += rng.expovariate(peak)
            if t >= total:
                break
            if bursty and t % 1.0 >= 0.5 and rng.random() >= BURST_LOW / BURST_HIGH:
                continue
            if not marked and t >= on_mark:
                await asyncio.sleep(max(0.0, start + on_mark - loop.time()))
                # The control channel is a blocking pipe round-trip: keep it off the loop.
                await asyncio.to_thread(mark)
                mark_at = time.time()
                marked = True
            delay = start + t - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            i += 1
            task = asyncio.create_task(one(i))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        await asyncio.sleep(max(0.0, start + total - loop.time()))
        if tasks:
            await asyncio.wait(tasks, timeout=CLIENT_DEADLINE + 1.0)
    return outcomes, mark_at


# --- one run ------------------------------------------------------------------------------


@dataclass
class RunResult:
    mode: str
    rho: float
    queue: str
    rate: float
    window: float
    sent: int
    goodput: float
    pdw_c: float
    pdw_total: float
    late_by_service: dict[str, int]
    cpu: dict[str, float]  # process CPU per service in the window (s)
    received: int  # requests that reached A in the window
    p50_latency: float  # end to end, successful requests (s)
    p99_latency: float = math.nan  # end to end, successful requests (s)
    #: Fraction of C's requests in the window answered without running its handler (498, 503).
    shed: float = 0.0
    load: str = "poisson"
    #: Per request, each service's own time (s): its app time minus the next service's (A, B);
    #: C's app time minus its queue and work (C).
    own: dict[str, list[float]] = field(default_factory=dict)
    #: C's own deadline minus the origin deadline (s), p50 and p90, where C reads the header
    #: (M2, M3): the time a relative header cannot account for (each hop's transit and queueing
    #: before its middleware sees the request).
    c_slack: tuple[float, float] = (math.nan, math.nan)
    #: p50 of C's app start minus the moment B wrote the request head (s): the part of the
    #: slack spent between the wire and the receiving app.
    c_wire_to_app: float = math.nan
    #: CPU of one work quantum at C, as measured there (s).
    quantum_cpu: float = math.nan
    #: Cores used by other processes on the machine during the window (noise indicator).
    foreign_cpu: float = math.nan
    #: A's and B's transports kept exchanges past a cut (D4.8, the default).
    save_connections: bool = True
    #: For a run whose goodput is judged against capacity: C's capacity through the chain
    #: measured just before and just after it (the same closed loop as the run's start), so the
    #: denominator saw the same machine as the run.
    capacity_before: float = math.nan
    capacity_after: float = math.nan
    #: Where the window's requests went, per second: at the client (``ok`` in time, ``late``
    #: 200s, ``498``, ``503``, ``gave_up`` at the deadline, ``error``) and at C (``c_ran``: its
    #: handler ran to a 200; ``c_ran_in_time``: of those, ended before the origin deadline).
    where: dict[str, float] = field(default_factory=dict)

    @property
    def capacity(self) -> float:
        """The capacity this run's goodput is judged against: the mean of before and after."""
        return (self.capacity_before + self.capacity_after) / 2

    @property
    def late_calls(self) -> int:
        return self.late_by_service["B"] + self.late_by_service["C"]


def _own_times(stats: dict[str, dict[str, Any]]) -> dict[str, list[float]]:
    recs = {r: {int(x[0]): x for x in stats[r]["records"]} for r in "ABC"}
    own: dict[str, list[float]] = {"A": [], "B": [], "C": []}
    for rid, a in recs["A"].items():
        b = recs["B"].get(rid)
        c = recs["C"].get(rid)
        if b is None or c is None or a[6] != 200:
            continue
        da, db, dc = a[2] - a[1], b[2] - b[1], c[2] - c[1]
        own["A"].append(da - db)
        own["B"].append(db - dc)
        own["C"].append(dc - c[3])
    return own


def run_one(
    mode: str,
    rho: float,
    capacity: float,
    iters: int,
    quanta: int,
    warm: float,
    measure: float,
    seed: int,
    queue: str = "fifo",
    bursty: bool = False,
    absolute: bool = True,
    save_connections: bool = True,
) -> RunResult:
    """One mode at one load: fresh services, warm-up, measured window, figures; always cleaned up."""
    services = start_chain(mode, iters, quanta, queue=queue, save_connections=save_connections)
    try:
        rate = rho * capacity

        marks: dict[str, float | None] = {}

        def mark() -> None:
            for svc in services.values():
                svc.mark()
            marks["busy"], marks["own"] = cpu_busy(), time.process_time()

        outcomes, mark_at = asyncio.run(
            open_loop(
                services["A"].url,
                rate,
                warm + measure,
                mode != "M0",
                seed,
                warm,
                mark,
                bursty,
                absolute,
            )
        )
        # Stats right after the window (not after the load generator's last give-up), so the
        # services' window matches the requests sent in it.
        stats = {r: services[r].stats() for r in "ABC"}
        busy_end, own_end = cpu_busy(), time.process_time()
    finally:
        stop_chain(services)
    window = float(stats["A"]["wall"])
    # CPU used by anything but this benchmark during the window, in cores (shared machines).
    foreign = math.nan
    b0, o0 = marks.get("busy"), marks.get("own")
    if b0 is not None and busy_end is not None and o0 is not None:
        ours = sum(float(stats[r]["process_cpu"]) for r in "ABC") + (own_end - o0)
        foreign = max(0.0, (busy_end - b0) - ours) / window
    end = mark_at + window
    in_window = [o for o in outcomes if mark_at <= o.sent < end]
    good = [o for o in in_window if o.status == 200 and o.latency < CLIENT_DEADLINE]
    cpu = {r: float(stats[r]["process_cpu"]) for r in "ABC"}
    after = {r: float(stats[r]["cpu_after"]) for r in "ABC"}
    slack = sorted(
        x[1] + x[5] / 1e3 - x[4]
        for x in stats["C"]["records"]
        if mode in ("M2", "M3", "M4", "M5")
        and x[5] >= 0
        and mark_at <= x[4] - CLIENT_DEADLINE < end
    )
    c_window = [x for x in stats["C"]["records"] if mark_at <= x[4] - CLIENT_DEADLINE < end]
    shed = sum(1 for x in c_window if x[6] in (498, 503) and not x[8])
    latencies = sorted(o.latency for o in good)
    where = {
        "ok": len(good),
        "late": sum(1 for o in in_window if o.status == 200 and o.latency >= CLIENT_DEADLINE),
        "498": sum(1 for o in in_window if o.status == 498),
        "503": sum(1 for o in in_window if o.status == 503),
        "gave_up": sum(1 for o in in_window if o.status == 0),
        "error": sum(1 for o in in_window if o.status not in (0, 200, 498, 503)),
        "c_ran": sum(1 for x in c_window if x[6] == 200),
        "c_ran_in_time": sum(1 for x in c_window if x[6] == 200 and x[2] <= x[4]),
        # Admitted, then cut by the deadline inside the handler: work done for nothing.
        "c_ran_cut": sum(1 for x in c_window if x[6] != 200 and x[8]),
    }
    return RunResult(
        where={k: v / window for k, v in where.items()},
        mode=mode,
        rho=rho,
        queue=queue,
        rate=rate,
        window=window,
        sent=len(in_window),
        goodput=len(good) / window,
        pdw_c=after["C"] / cpu["C"] if cpu["C"] > 0 else 0.0,
        pdw_total=sum(after.values()) / max(1e-9, sum(cpu.values())),
        late_by_service={r: int(stats[r]["late_calls"]) for r in "ABC"},
        cpu=cpu,
        received=max(1, int(stats["A"]["received"])),
        p50_latency=median(latencies),
        p99_latency=latencies[int(0.99 * (len(latencies) - 1))] if latencies else math.nan,
        shed=shed / len(c_window) if c_window else 0.0,
        load="bursty" if bursty else "poisson",
        save_connections=save_connections,
        own=_own_times(stats),
        c_slack=(
            (slack[len(slack) // 2], slack[int(0.9 * (len(slack) - 1))])
            if slack
            else (math.nan, math.nan)
        ),
        foreign_cpu=foreign,
        quantum_cpu=(
            float(stats["C"]["work_cpu"]) / int(stats["C"]["quanta"])
            if int(stats["C"]["quanta"])
            else math.nan
        ),
        c_wire_to_app=median(
            [
                x[1] - x[7]
                for x in stats["C"]["records"]
                if x[7] > 0 and mark_at <= x[4] - CLIENT_DEADLINE < end
            ]
        ),
    )


def measure_capacity(
    iters: int, quanta: int, seconds: float, warm: float, rounds: int = 2, roles: str = "C"
) -> float:
    """Completions per second of a closed loop into the first of ``roles`` (M0 services): the
    best of ``rounds`` runs, because interference (another process on a shared machine) only
    ever lowers it.

    ``roles="C"``: C alone, its standalone capacity. ``roles="ABC"``: through the whole chain,
    which shares the machine's cores with C — the most any mode can deliver in the runs, and
    so the capacity that offered load and goodput are measured against.
    """
    services = start_chain("M0", iters, quanta, roles=roles)
    try:
        url = services[roles[0]].url
        return max(asyncio.run(closed_loop(url, seconds, warm)) for _ in range(rounds))
    finally:
        stop_chain(services)


# --- rows ---------------------------------------------------------------------------------


@dataclass
class Overhead:
    """M2 against M0 at rho = 0.5, pooled over every run of each (interleaved repeats)."""

    cpu_per_request: dict[str, float]  # A+B+C (s)
    fwd_cpu_per_request: dict[str, float]  # A+B (s)
    hop_p50: dict[str, dict[str, float]]  # mode -> service -> s
    requests: dict[str, int]
    #: The same per-hop difference between two halves of the M0 runs (first run against the
    #: repeats): what the measurement shows when nothing changed, i.e. its noise.
    null_per_hop: float = math.nan

    @classmethod
    def pool(cls, runs: list[RunResult]) -> Overhead | None:
        by_mode = {m: [r for r in runs if r.mode == m] for m in ("M0", "M2")}
        if not by_mode["M0"] or not by_mode["M2"]:
            return None
        cpu, fwd, hop, n = {}, {}, {}, {}
        for m, rs in by_mode.items():
            received = sum(r.received for r in rs)
            cpu[m] = sum(sum(r.cpu.values()) for r in rs) / received
            fwd[m] = sum(r.cpu["A"] + r.cpu["B"] for r in rs) / received
            hop[m] = {h: median([x for r in rs for x in r.own[h]]) for h in "ABC"}
            n[m] = received
        m0 = by_mode["M0"]
        null = math.nan
        if len(m0) > 1:
            first = {h: median(m0[0].own[h]) for h in "ABC"}
            rest = {h: median([x for r in m0[1:] for x in r.own[h]]) for h in "ABC"}
            null = sum(rest[h] - first[h] for h in "ABC") / 3
        return cls(cpu, fwd, hop, n, null)

    @property
    def added_per_hop(self) -> float:
        return sum(self.hop_p50["M2"][h] - self.hop_p50["M0"][h] for h in "ABC") / 3


def rho_name(rho: float) -> str:
    """``rho2``, ``rho0.5``: the load part of a metric name."""
    return f"rho{rho:g}"


def _mode_rows(prefix: str, results: list[RunResult], capacity: float, targets: bool) -> list[Row]:
    """PDW, goodput and L rows per run, against M0 of the same load; targets where asked."""
    rows: list[Row] = []
    by = {(r.mode, r.rho): r for r in results}
    for r in results:
        base = by.get(("M0", r.rho)) if r.mode != "M0" else None
        bname = "M0" if base else None
        key = f"{prefix}.{r.mode}.{rho_name(r.rho)}"
        is_target = targets and r.mode == "M2" and r.rho == 2.0
        # With admission (D9.4), PDW <= 5 % and goodput >= 0.8 x capacity at rho 2 and 3.
        admitted = targets and r.mode in ADMISSION_MODES and r.rho in (2.0, 3.0)
        for name, value, bval in (
            ("pdw_c", r.pdw_c, base.pdw_c if base else None),
            ("pdw_total", r.pdw_total, base.pdw_total if base else None),
        ):
            target = passed = None
            if is_target and bval is not None:
                target = "<= 0.1 x M0 and <= 0.05"
                passed = value <= 0.1 * bval and value <= 0.05
            elif admitted and name == "pdw_c":
                target, passed = "<= 0.05", value <= 0.05
            rows.append(Row(f"{key}.{name}", value, "fraction", bname, bval, target, passed))
        target = passed = None
        if targets and r.mode in ADMISSION_MODES and r.rho == 0.5:
            target, passed = "<= 0.001", r.shed <= 0.001
        rows.append(Row(f"{key}.shed", r.shed, "fraction", None, None, target, passed))
        for name, value in (("p50_latency", r.p50_latency), ("p99_latency", r.p99_latency)):
            if not math.isnan(value):
                rows.append(Row(f"{key}.{name}", value * 1e3, "ms"))
        if is_target or admitted:
            paired = not math.isnan(r.capacity)
            cap = r.capacity if paired else capacity
            rows.append(
                Row(
                    f"{key}.goodput",
                    r.goodput,
                    "req/s",
                    "C capacity measured before and after this run" if paired else "C capacity",
                    cap,
                    ">= 0.8 x C capacity",
                    r.goodput >= 0.8 * cap,
                )
            )
            if paired:
                rows.append(Row(f"{key}.capacity_before", r.capacity_before, "req/s"))
                rows.append(Row(f"{key}.capacity_after", r.capacity_after, "req/s"))
        else:
            rows.append(
                Row(f"{key}.goodput", r.goodput, "req/s", bname, base.goodput if base else None)
            )
        target = passed = None
        if targets and r.mode != "M0":
            target, passed = "= 0", r.late_calls == 0
        rows.append(
            Row(
                f"{key}.late_calls",
                r.late_calls,
                "calls",
                bname,
                base.late_calls if base else None,
                target,
                passed,
            )
        )
        for svc in "BC":
            rows.append(Row(f"{key}.late_calls_at_{svc}", r.late_by_service[svc], "calls"))
        rows.append(Row(f"{key}.sent", r.sent, "requests"))
        if not math.isnan(r.c_slack[0]):
            rows.append(Row(f"{key}.c_deadline_slack_p50", r.c_slack[0] * 1e3, "ms"))
            rows.append(Row(f"{key}.c_deadline_slack_p90", r.c_slack[1] * 1e3, "ms"))
            rows.append(Row(f"{key}.c_wire_to_app_p50", r.c_wire_to_app * 1e3, "ms"))
    return rows


def build_rows(
    capacity: float,
    results: list[RunResult],
    overhead: Overhead | None,
    lifo: list[RunResult],
    bursty: Sequence[RunResult] = (),
) -> list[Row]:
    """Every result row, with targets and pass/miss where the brief sets them."""
    rows = [Row("propagation.c_capacity", capacity, "req/s")]
    quanta = [r.quantum_cpu for r in results if not math.isnan(r.quantum_cpu)]
    if quanta:
        rows.append(Row("propagation.c_quantum_cpu", statistics.median(quanta) * 1e6, "us"))
    foreign = [r.foreign_cpu for r in results + lifo if not math.isnan(r.foreign_cpu)]
    if foreign:
        rows.append(Row("propagation.other_processes_cpu_max", max(foreign), "cores"))
    rows += _mode_rows("propagation", results, capacity, targets=True)
    if overhead is not None:
        o = overhead
        rows.append(
            Row(
                "propagation.M2.rho0.5.cpu_per_request",
                o.cpu_per_request["M2"] * 1e3,
                "ms",
                "M0",
                o.cpu_per_request["M0"] * 1e3,
                "<= 1.03 x M0",
                o.cpu_per_request["M2"] <= 1.03 * o.cpu_per_request["M0"],
            )
        )
        rows.append(
            Row(
                "propagation.M2.rho0.5.fwd_cpu_per_request",
                o.fwd_cpu_per_request["M2"] * 1e3,
                "ms",
                "M0",
                o.fwd_cpu_per_request["M0"] * 1e3,
            )
        )
        for h in "ABC":
            rows.append(
                Row(
                    f"propagation.M2.rho0.5.hop_{h}_own_p50",
                    o.hop_p50["M2"][h] * 1e6,
                    "us",
                    "M0",
                    o.hop_p50["M0"][h] * 1e6,
                )
            )
        rows.append(
            Row(
                "propagation.M2.rho0.5.added_p50_per_hop",
                o.added_per_hop * 1e6,
                "us",
                None,
                None,
                "<= 100 us",
                o.added_per_hop <= 100e-6,
            )
        )
        if not math.isnan(o.null_per_hop):
            rows.append(Row("propagation.M0.rho0.5.null_p50_per_hop", o.null_per_hop * 1e6, "us"))
    rows += _mode_rows("propagation.lifo", lifo, capacity, targets=False)
    rows += _mode_rows("propagation.bursty", list(bursty), capacity, targets=False)
    return rows


def _table(results: list[RunResult], capacity: float) -> list[str]:
    """Markdown table lines, one row per run."""
    lines = [
        "| mode | rho | offered req/s | goodput req/s | goodput / capacity | PDW C | PDW A+B+C "
        "| L (at B + C) | shed at C | served p50 / p99 | C's deadline - origin's, p50 / p90 |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        slack = (
            "-"
            if math.isnan(r.c_slack[0])
            else f"{r.c_slack[0] * 1e3:.1f} / {r.c_slack[1] * 1e3:.1f} ms"
        )
        lines.append(
            f"| {r.mode} | {r.rho:g} | {r.rate:.0f} | {r.goodput:.1f} | "
            f"{r.goodput / capacity:.2f} | {r.pdw_c:.1%} | {r.pdw_total:.1%} | "
            f"{r.late_by_service['B']} + {r.late_by_service['C']} | {r.shed:.1%} | "
            f"{r.p50_latency * 1e3:.0f} / {r.p99_latency * 1e3:.0f} ms | {slack} |"
        )
    return lines


def markdown_table(
    capacity: float,
    results: list[RunResult],
    overhead: Overhead | None,
    lifo: list[RunResult],
    quanta: int,
    bursty: Sequence[RunResult] = (),
    standalone: float = math.nan,
) -> str:
    """The results as markdown, as ``docs/propagation.md`` shows them."""
    foreign = [r.foreign_cpu for r in results + lifo if not math.isnan(r.foreign_cpu)]
    max_foreign = max(foreign) if foreign else math.nan
    lines = [
        (
            f"C's capacity: {capacity:.1f} req/s through the chain A -> B -> C, the denominator "
            f"of rho and of goodput / capacity ({standalone:.1f} req/s for C alone; "
            if capacity != standalone
            else f"C's capacity: {capacity:.1f} req/s for C alone (nothing completed through "
            "the chain when measured; "
        )
        + f"{quanta} quanta of {QUANTUM * 1e3:g} ms per request). "
        f"Client deadline {CLIENT_DEADLINE * 1e3:g} ms. C's queue: FIFO. Other processes on "
        f"the machine used at most {max_foreign:.2f} cores during the runs.",
        "",
        *_table(results, capacity),
    ]
    if overhead is not None:
        o = overhead
        lines += [
            "",
            f"Overhead at rho = 0.5, M2 against M0 (pooled: {o.requests['M0']} and "
            f"{o.requests['M2']} requests):",
            "",
            "| | M0 | M2 | M2 - M0 |",
            "|---|---|---|---|",
            f"| CPU per request, A+B+C | {o.cpu_per_request['M0'] * 1e3:.2f} ms | "
            f"{o.cpu_per_request['M2'] * 1e3:.2f} ms | "
            f"{(o.cpu_per_request['M2'] / o.cpu_per_request['M0'] - 1):+.1%} |",
            f"| CPU per request, A+B (forwarders) | {o.fwd_cpu_per_request['M0'] * 1e3:.2f} ms | "
            f"{o.fwd_cpu_per_request['M2'] * 1e3:.2f} ms | "
            f"{(o.fwd_cpu_per_request['M2'] / o.fwd_cpu_per_request['M0'] - 1):+.1%} |",
        ]
        for h in "ABC":
            m0, m2 = o.hop_p50["M0"][h] * 1e6, o.hop_p50["M2"][h] * 1e6
            lines.append(
                f"| own latency of {h}, p50 | {m0:.0f} us | {m2:.0f} us | {m2 - m0:+.0f} us |"
            )
        lines.append(f"| added p50 latency per hop | | | {o.added_per_hop * 1e6:+.0f} us |")
        if not math.isnan(o.null_per_hop):
            lines.append(
                f"| the same, M0 repeats against the first M0 run (noise) | | | "
                f"{o.null_per_hop * 1e6:+.0f} us |"
            )
    if bursty:
        lines += [
            "",
            "Bursty load of mean rho = 1 (each second: half at 1.75 x, half at 0.25 x):",
            "",
            *_table(list(bursty), capacity),
        ]
    if lifo:
        lines += [
            "",
            "Diagnostic variant, C's queue LIFO (same load, same code otherwise):",
            "",
            *_table(lifo, capacity),
        ]
    return "\n".join(lines)


# --- main ---------------------------------------------------------------------------------


def _options(p: argparse.ArgumentParser) -> None:
    """The propagation benchmark's own options (the shared ones come from ``_common``)."""
    p.add_argument("--modes", default=None, help="comma-separated, e.g. M0,M2")
    p.add_argument("--loads", default=None, help="comma-separated rho values, e.g. 0.5,2")
    p.add_argument("--warm", type=float, default=1.0)
    p.add_argument("--measure", type=float, default=5.0)
    # 80 quanta (40 ms): C's capacity is ~23 req/s, so at rho = 3 the forwarders and the load
    # generator still fit on the second core and C stays the only bottleneck.
    p.add_argument("--quanta", type=int, default=80, help="work quanta per request at C")
    p.add_argument(
        "--overhead-repeats",
        type=int,
        default=2,
        help="extra M2/M0 runs at rho=0.5 for the overhead",
    )
    p.add_argument(
        "--max-foreign",
        type=float,
        default=0.5,
        help="re-run (twice at most) a run during which other processes used more cores",
    )
    p.add_argument("--no-lifo", action="store_true", help="skip the LIFO diagnostic variant")
    p.add_argument("--no-bursty", action="store_true", help="skip the bursty-load runs")
    p.add_argument(
        "--relative-only",
        action="store_true",
        help="the load generator sends only the relative deadline header (no X-Request-Deadline)",
    )
    p.add_argument("--markdown", type=Path, default=None, help="also write the markdown here")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--verbose", action="store_true", help="log each service's pid")
    p.add_argument(
        "--quiet-wait",
        type=float,
        default=180.0,
        help="wait up to this many seconds for other processes to go quiet (0: do not wait)",
    )


def measure(args: argparse.Namespace) -> list[Row]:
    """One repeat of the benchmark; exits 130 when interrupted (services stopped either way)."""
    global VERBOSE
    VERBOSE = args.verbose

    # A SIGINT or SIGTERM unwinds whatever runs (run_bench's signals_unwind): services stopped.
    t_start = time.monotonic()
    modes = tuple(args.modes.split(",")) if args.modes else MODES
    loads = tuple(float(x) for x in args.loads.split(",")) if args.loads else LOADS
    cap_seconds, cap_warm = 2.0, 0.5
    if args.smoke:
        modes = tuple(args.modes.split(",")) if args.modes else ("M0", "M2")
        loads = tuple(float(x) for x in args.loads.split(",")) if args.loads else (1.0,)
        args.warm, args.measure, args.quanta = 0.3, 0.7, 8
        args.overhead_repeats, args.no_lifo, args.quiet_wait = 0, True, 0.0
        args.no_bursty = True
        cap_seconds, cap_warm = 0.4, 0.1
    elif args.quick:
        args.measure = min(args.measure, 3.0)
        args.overhead_repeats, args.no_lifo, args.no_bursty = 0, True, True
    if any(m != "M0" for m in modes) and not propagation_available():
        log("timebound.propagation.asgi/httpx not importable: running M0 only")
        modes = ("M0",)

    def progress(r: RunResult) -> None:
        log(
            f"[{time.monotonic() - t_start:6.1f}s] {r.mode} rho={r.rho:g} queue={r.queue} "
            f"{'' if r.save_connections else 'save_connections=False '}"
            f"load={r.load}: goodput {r.goodput:.1f}/s, PDW C {r.pdw_c:.1%}, "
            f"total {r.pdw_total:.1%}, shed {r.shed:.1%}, "
            f"L {r.late_calls}, other processes {r.foreign_cpu:.2f} cores"
            + "; per s: "
            + ", ".join(f"{k} {v:.1f}" for k, v in r.where.items())
            + "; cores used by "
            + ", ".join(f"{k} {v / r.window:.2f}" for k, v in r.cpu.items())
            + (
                ""
                if math.isnan(r.capacity)
                else f", capacity {r.capacity_before:.1f} before / {r.capacity_after:.1f} after"
                f" (goodput {r.goodput / r.capacity:.2f} x)"
            )
        )

    def run(
        mode: str, rho: float, queue: str = "fifo", bursty: bool = False, save: bool = True
    ) -> RunResult:
        # A run whose goodput is judged against capacity gets a capacity of its own, measured
        # just before it (its offered load is rho times that) and just after: on a shared
        # machine the capacity measured once at the start is another machine's by then (a
        # committed one read half of what re-runs measured, and goodput "above capacity").
        judged = (
            queue == "fifo"
            and not bursty
            and ((mode in ADMISSION_MODES and rho in (2.0, 3.0)) or (mode == "M2" and rho == 2.0))
        )
        for attempt in range(3):
            before = (
                measure_capacity(iters, args.quanta, cap_seconds, cap_warm, roles="ABC")
                if judged
                else math.nan
            )
            r = run_one(
                mode,
                rho,
                before if judged and before > 0 else capacity,
                iters,
                args.quanta,
                args.warm,
                args.measure,
                args.seed,
                queue,
                bursty,
                not args.relative_only,
                save,
            )
            if judged:
                r.capacity_before = before
                r.capacity_after = measure_capacity(
                    iters, args.quanta, cap_seconds, cap_warm, roles="ABC"
                )
            progress(r)
            if args.smoke or not r.foreign_cpu > args.max_foreign or attempt == 2:
                return r
            # Someone else's load was measured too: wait for quiet and run it again.
            log(f"  other processes used {r.foreign_cpu:.2f} cores: running it again")
            wait_quiet(60.0)
        raise AssertionError("unreachable")

    results: list[RunResult] = []
    extra: list[RunResult] = []
    nosave: list[RunResult] = []
    lifo: list[RunResult] = []
    bursty: list[RunResult] = []
    try:
        if args.quiet_wait > 0:
            busy = wait_quiet(args.quiet_wait)
            if busy is not None:
                log(f"[{time.monotonic() - t_start:6.1f}s] other processes use {busy:.2f} cores")
        iters = calibrate_iters()
        log(f"[{time.monotonic() - t_start:6.1f}s] calibrated: {iters} iterations per quantum")
        standalone = measure_capacity(iters, args.quanta, cap_seconds, cap_warm)
        capacity = measure_capacity(iters, args.quanta, cap_seconds, cap_warm, roles="ABC")
        if capacity <= 0:
            # Nothing came back through the chain in time: the machine is saturated. Measure
            # against C alone rather than not at all (the markdown says which).
            log("no request completed through the chain: using C's capacity alone")
            capacity = standalone
        log(
            f"[{time.monotonic() - t_start:6.1f}s] C capacity: {capacity:.1f} req/s through "
            f"the chain, {standalone:.1f} req/s alone ({args.quanta} quanta per request)"
        )
        for rho in loads:
            for mode in modes:
                results.append(run(mode, rho))
        if 0.5 in loads and {"M0", "M2"} <= set(modes):
            # Interleaved repeats (M2 first this time) so drift hits both modes alike.
            for _ in range(args.overhead_repeats):
                extra += [run("M2", 0.5), run("M0", 0.5)]
            if not args.smoke:
                # The hop cost with save_connections=False (D4.8), against the same M0 runs.
                nosave += [run("M2", 0.5, save=False) for _ in range(1 + args.overhead_repeats)]
        if not args.no_lifo and {"M0", "M2"} <= set(modes):
            for rho in (x for x in loads if x >= 2.0):
                lifo += [run("M0", rho, "lifo"), run("M2", rho, "lifo")]
        if not args.no_bursty:
            # The same mean as rho = 1, in on/off bursts: admission must not over-shed them.
            bursty += [run(m, 1.0, bursty=True) for m in ("M0", "M2", "M4", "M5") if m in modes]
        micro = None
        if "M2" in modes and not args.smoke:
            micro = micro_run(iters)
            log(
                f"[{time.monotonic() - t_start:6.1f}s] CPU per request in process: middleware "
                f"+{(micro['asgi']['dp'] - micro['asgi']['plain']) * 1e6:.1f} us, transport "
                f"+{(micro['httpx']['dp'] - micro['httpx']['plain']) * 1e6:.1f} us "
                f"(save_connections=False "
                f"+{(micro['httpx']['dp_nosave'] - micro['httpx']['plain']) * 1e6:.1f} us), "
                f"over loopback +{(micro['loopback']['dp'] - micro['loopback']['plain']) * 1e6:.1f}"
                f" us (+{(micro['loopback']['dp_nosave'] - micro['loopback']['plain']) * 1e6:.1f}"
                " us)"
            )
    except KeyboardInterrupt:
        stop_all()
        log("interrupted")
        raise SystemExit(130) from None
    finally:
        stop_all()

    overhead = Overhead.pool([r for r in results + extra if r.rho == 0.5])
    overhead_nosave = Overhead.pool(
        [r for r in results + extra if r.mode == "M0" and r.rho == 0.5] + nosave
    )
    rows = build_rows(capacity, results, overhead, lifo, bursty)
    rows.insert(1, Row("propagation.c_capacity_alone", standalone, "req/s"))
    if overhead_nosave is not None:
        rows.append(
            Row(
                "propagation.M2.rho0.5.added_p50_per_hop_save_connections_off",
                overhead_nosave.added_per_hop * 1e6,
                "us",
                "save_connections on",
                overhead.added_per_hop * 1e6 if overhead is not None else None,
            )
        )
        rows.append(
            Row(
                "propagation.M2.rho0.5.fwd_cpu_per_request_save_connections_off",
                overhead_nosave.fwd_cpu_per_request["M2"] * 1e3,
                "ms",
                "M0",
                overhead_nosave.fwd_cpu_per_request["M0"] * 1e3,
            )
        )
    if micro is not None:
        for name, key, what in (
            ("asgi", "dp", "asgi_middleware"),
            ("httpx", "dp", "httpx_transport"),
            ("httpx", "dp_nosave", "httpx_transport_save_connections_off"),
            ("loopback", "dp", "loopback_transport"),
            ("loopback", "dp_nosave", "loopback_transport_save_connections_off"),
        ):
            rows.append(
                Row(
                    f"propagation.micro.{what}",
                    micro[name][key] * 1e6,
                    "us",
                    "without",
                    micro[name]["plain"] * 1e6,
                )
            )
    md = markdown_table(capacity, results, overhead, lifo, args.quanta, bursty, standalone)
    if micro is not None:
        m = {k: {v: x * 1e6 for v, x in d.items()} for k, d in micro.items()}
        md += (
            "\n\nCPU per request in process (median of interleaved rounds; client calls under a "
            "2 s deadline that lowers the 5 s static timeout):\n\n"
            "| | bare | timebound, save_connections on | off |\n|---|---|---|---|\n"
            f"| ASGI app, `DeadlineMiddleware` | {m['asgi']['plain']:.1f} us | "
            f"{m['asgi']['dp']:.1f} us | |\n"
            f"| httpx over `MockTransport` | {m['httpx']['plain']:.1f} us | "
            f"{m['httpx']['dp']:.1f} us | {m['httpx']['dp_nosave']:.1f} us |\n"
            f"| httpx over loopback (pooled) | {m['loopback']['plain']:.1f} us | "
            f"{m['loopback']['dp']:.1f} us | {m['loopback']['dp_nosave']:.1f} us |"
        )
    if overhead is not None and overhead_nosave is not None:
        md += (
            "\n\nAdded p50 latency per hop at rho = 0.5, M2 against M0: "
            f"{overhead.added_per_hop * 1e6:+.0f} us with save_connections on, "
            f"{overhead_nosave.added_per_hop * 1e6:+.0f} us with it off "
            f"({overhead_nosave.requests['M2']} requests)."
        )
    print()
    print(md)
    if args.markdown:
        args.markdown.write_text(md + "\n")
    log(f"[{time.monotonic() - t_start:6.1f}s] measured")
    return rows


METHOD = (
    "C's capacity: completions per second of a closed loop of 4 callers without a deadline "
    "into A of a fresh M0 chain A -> B -> C, the best of 2 rounds of 2 s after 0.5 s of warm-up. "
    "Measured once at the start (propagation.c_capacity: the offered load of runs whose goodput "
    "has no target is rho times it) and, for each run whose goodput is judged (M2 at rho 2, "
    "M4 and M5 at rho 2 and 3), again just before that run (its offered load is rho times this "
    "one) and just after it (*.capacity_before, *.capacity_after); the judged goodput row's "
    "baseline is the mean of the two."
)

if __name__ == "__main__":
    title = "Deadline propagation: the work saved"
    sys.exit(
        run_bench("propagation", __doc__, measure, configure=_options, title=title, method=METHOD)
    )
