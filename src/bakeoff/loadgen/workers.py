"""The load client's workers: each an event loop with its own connection pool, all on one clock.

Why processes: one Python event loop streams a few thousand tokens a second a core at most, and a GPU node
serves several times that, so a client that is one loop becomes the ceiling it measures. A cell's load is
split across ``W`` workers, each a process (the first ``W = 1`` runs in the caller's process: a c=1 cell pays
no process start), and merged back into one cell:

* **Closed loop.** The cell's concurrency ``c`` is split across the workers (:func:`split`), and every slot
  takes the next request index from one counter shared by all workers, so exactly ``c`` requests are in flight
  until the requests run out, as with one process. A request's intended send time is the moment its slot
  freed (for its first request, the slot's start); its schedule delay is how much later it was sent.
* **Ramped start** (bakeoff.loadgen.cellload states why). Slots are numbered across the cell, worker ``k`` of
  ``W`` holding slots ``k, k + W, ...``, and slot ``j`` of ``c`` starts at ``j x ramp_s / c`` (a burst: all
  at 0). An automatic ramp's length is the median end-to-end latency of every worker's warm-up requests, which
  the workers bring to the second barrier; the caller fixes it with ``t0``. A request sent, or due, before the
  ramp ended is marked ``ramp``. A ramp sends as many requests as its slots' cycles allow, so the counter
  also counts the requests taken after the ramp and hands out no more once ``CellLoad.steady_cap`` of them
  were (the prompts left over, the ramp's unused supply, are not sent).
* **Open loop.** The one Poisson schedule (bakeoff.loadgen.runner.arrival_gaps) is dealt round-robin across
  the workers (:func:`deal`); each request is sent at its scheduled offset from the shared start, and its
  schedule delay is the actual send time minus that offset.
* **One start.** Workers warm up together (a first barrier, so every warm-up lands on its own idle server
  slot), then wait at a second barrier; the caller then fixes the start ``t0`` a little ahead on the machine's
  monotonic clock (``time.perf_counter``, system-wide on Linux) and releases them all. Every request's
  ``start`` is relative to that one ``t0``.
* **Early stop.** Each completed request goes to the caller, which applies the probe's ``stop_when`` and, once
  it holds, raises a shared flag; no worker sends another request after it sees the flag.
* **Lifetime.** Workers die with their cell: terminated at once where the caller raises (a worker's error, a
  stage's SIGTERM turned into an exception), and killed by the kernel where the caller dies without a word
  (SIGKILL; :func:`die_with_parent`), so no cancelled cell keeps loading a server.

Each worker reports its own health (bakeoff.loadgen.health): its event loop's lag, its requests' schedule
delay and its CPU time over the measured window.
"""

from __future__ import annotations

import asyncio
import ctypes
import multiprocessing as mp
import os
import queue as queue_mod
import resource
import signal
import threading
import time
import traceback
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

import aiohttp
import numpy as np

from bakeoff.loadgen.cellload import CellLoad, Sessions
from bakeoff.loadgen.client import send
from bakeoff.loadgen.metrics import RequestRecord

START_LEAD_S = 0.05  # how far ahead of the release the shared start is set, so every worker is waiting for it
LAG_INTERVAL_S = 0.05  # the loop-lag monitor's sleep


@dataclass(frozen=True)
class Plan:
    """One worker's part of a cell: picklable, so a worker process gets it whole.

    What describes the cell's requests is its ``load``, the same for every worker; the rest is this worker's.
    """

    worker: int
    url: str
    model: str
    load: CellLoad
    headers: dict[str, str] | None = None
    slots: tuple[int, ...] = ()  # closed loop: this worker's slots, by their index in the cell (0 .. c - 1)
    schedule: list[tuple[int, float]] | None = None  # open loop: (request index, send offset from t0 in s)
    warm: list[str] = field(default_factory=list)  # its warm-up prompts
    warm_slots: int = 1  # how many of them it sends at once (its share of the warm-up concurrency)


def split(total: int, workers: int) -> list[int]:
    """``total`` (a concurrency) over ``workers`` as evenly as can be; no share is 0 (``workers <= total``)."""
    if not 1 <= workers <= max(total, 1):
        raise ValueError(f"cannot split {total} over {workers} workers")
    return [total // workers + (k < total % workers) for k in range(workers)]


def deal(offsets: list[float], workers: int) -> list[list[tuple[int, float]]]:
    """The open-loop schedule dealt round-robin: request ``i`` goes to worker ``i mod W``, at its own offset."""
    return [[(i, offsets[i]) for i in range(k, len(offsets), workers)] for k in range(workers)]


class Release(NamedTuple):
    """What the measure barrier hands every worker: the cell's start, and its ramp's length (0: a burst)."""

    t0: float
    ramp_s: float


def ramp_length(load: CellLoad, warm_e2el: Sequence[float]) -> float:
    """The cell's ramp in seconds: 0 unless the load ramps; its ``ramp_s`` where given; else the median end-to-end
    latency of the warm-up's successful requests (``warm_e2el``, every worker's), one request cycle (0 if none)."""
    if not load.ramped:
        return 0.0
    if load.ramp_s is not None:
        return float(load.ramp_s)
    return float(np.median(warm_e2el)) if len(warm_e2el) else 0.0


def may_take(index: int, n: int, steady_taken: int, steady_cap: int | None, ramp: bool) -> bool:
    """Whether the cell's counter hands out request ``index`` of ``n``: not past the prompts, and, for a request
    after the ramp, not past ``steady_cap`` such requests (None: no cap)."""
    return index < n and (ramp or steady_cap is None or steady_taken < steady_cap)


class Control(Protocol):
    """What a worker shares with the cell: the request counter, the stop flag, the barriers, the results."""

    def take(self, ramp: bool = False) -> int | None: ...
    def stopped(self) -> bool: ...
    async def barrier(self, phase: str, warm_e2el: Sequence[float] = ()) -> Release: ...
    def done(self, record: RequestRecord, end: float) -> None: ...
    def end(self, health: dict[str, Any]) -> None: ...


@dataclass
class Local:
    """The control of a worker in the caller's process (``W = 1``): plain values, the caller's callbacks."""

    n: int
    on_done: Callable[[RequestRecord, float], bool]  # True: stop
    on_measure_start: Callable[[], None] | None = None
    load: CellLoad | None = None  # what the ramp's length is taken from (None: no ramp)
    ramp_s: float = 0.0  # the ramp's length, once the measure barrier fixed it
    next_index: int = 0
    steady_taken: int = 0  # requests taken after the ramp
    stop: bool = False
    health: list[dict[str, Any]] = field(default_factory=list)

    def take(self, ramp: bool = False) -> int | None:
        cap = self.load.steady_cap if self.load is not None else None
        if not may_take(self.next_index, self.n, self.steady_taken, cap, ramp):
            return None
        self.steady_taken += not ramp
        self.next_index += 1
        return self.next_index - 1

    def stopped(self) -> bool:
        return self.stop

    async def barrier(self, phase: str, warm_e2el: Sequence[float] = ()) -> Release:
        if phase != "measure":
            return Release(0.0, 0.0)
        self.ramp_s = ramp_length(self.load, warm_e2el) if self.load is not None else 0.0
        if self.on_measure_start is not None:
            self.on_measure_start()
        return Release(time.perf_counter(), self.ramp_s)

    def done(self, record: RequestRecord, end: float) -> None:
        if self.on_done(record, end):
            self.stop = True

    def end(self, health: dict[str, Any]) -> None:
        self.health.append(health)


@dataclass
class Shared:
    """The control of worker processes: shared-memory counter and flags, and one queue to the caller."""

    n: int
    counter: Any  # mp.Value("q")
    steady_taken: Any  # mp.Value("q"): requests taken after the ramp, under counter's lock
    steady_cap: int | None  # CellLoad.steady_cap
    stop: Any  # mp.Event
    releases: dict[str, Any]  # phase -> mp.Event
    t0: Any  # mp.Value("d")
    ramp_s: Any  # mp.Value("d"): the ramp's length, set with t0
    out: Any  # mp.Queue
    worker: int = 0

    def take(self, ramp: bool = False) -> int | None:
        with self.counter.get_lock():
            i = self.counter.value
            if not may_take(i, self.n, self.steady_taken.value, self.steady_cap, ramp):
                return None
            self.counter.value = i + 1
            self.steady_taken.value += not ramp
        return int(i)

    def stopped(self) -> bool:
        return bool(self.stop.is_set())

    async def barrier(self, phase: str, warm_e2el: Sequence[float] = ()) -> Release:
        self.out.put(("ready", self.worker, (phase, list(warm_e2el))))
        await asyncio.get_running_loop().run_in_executor(None, self.releases[phase].wait)
        return Release(float(self.t0.value), float(self.ramp_s.value))

    def done(self, record: RequestRecord, end: float) -> None:
        self.out.put(("done", self.worker, (record, end)))

    def end(self, health: dict[str, Any]) -> None:
        self.out.put(("end", self.worker, health))


async def _lag_monitor(samples: list[float], stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        t = loop.time()
        await asyncio.sleep(LAG_INTERVAL_S)
        samples.append(max(0.0, loop.time() - t - LAG_INTERVAL_S))


async def until(t: float) -> None:
    """Wait for the moment ``t`` (``time.perf_counter``), never returning before it: a loop's timers may fire
    up to a millisecond early, which would send a request before its time and start a worker before ``t0``."""
    if (wait := t - time.perf_counter()) > 0.002:
        await asyncio.sleep(wait - 0.001)
    while time.perf_counter() < t:
        await asyncio.sleep(0)


def _cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


class Driver:
    """One worker's cell, in named steps: :meth:`warm`, then the measured load (:meth:`closed_loop`,
    :meth:`sessions` or :meth:`open_loop`, as the plan says), watched by the loop-lag monitor, and last
    :meth:`health`. :func:`drive` runs them in order.

    ``cpu``: this worker's CPU clock (its process's, or its thread's where it shares the caller's process).
    """

    def __init__(self, plan: Plan, ctl: Control, cpu: Callable[[], float] = _cpu_s) -> None:
        self.plan, self.ctl, self.cpu, self.load = plan, ctl, cpu, plan.load
        self.t0 = 0.0  # the cell's start on the shared clock, once the measure barrier releases it
        self.ramp_s = 0.0  # the ramp's length (0: a burst), fixed with t0
        self.warm_e2el: list[float] = []  # this worker's successful warm-up requests' end-to-end latencies
        self.records: list[RequestRecord] = []  # this worker's measured requests, in the order sent
        self.build_s = 0.0  # seconds spent assembling multi-turn prompts, on this worker's clock
        self.lag: list[float] = []  # the loop-lag monitor's samples, seconds
        self.cpu_s = self.wall_s = 0.0  # over the measured window
        self._session: aiohttp.ClientSession | None = None
        self._fresh: aiohttp.ClientSession | None = None

    async def run(self) -> None:
        connector = aiohttp.TCPConnector(limit=0)  # kept alive and reused (bakeoff.loadgen.client)
        fresh_connector = aiohttp.TCPConnector(limit=0, force_close=True)
        timeout = aiohttp.ClientTimeout(total=self.load.timeout_s)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as self._session, \
                aiohttp.ClientSession(connector=fresh_connector, timeout=timeout) as self._fresh:
            await self.ctl.barrier("warm")
            await self.warm()
            self.t0, self.ramp_s = await self.ctl.barrier("measure", self.warm_e2el)
            stop_lag = asyncio.Event()
            monitor = asyncio.create_task(_lag_monitor(self.lag, stop_lag))
            await until(self.t0)
            cpu0, wall0 = self.cpu(), time.perf_counter()
            if self.load.sessions is not None:
                await self.sessions(self.load.sessions)
            elif self.plan.schedule is None:
                await self.closed_loop()
            else:
                await self.open_loop(self.plan.schedule)
            self.wall_s, self.cpu_s = time.perf_counter() - wall0, self.cpu() - cpu0
            stop_lag.set()
            await monitor
        self.ctl.end(self.health())

    async def one(self, rec: RequestRecord, prompt: Any, t0: float, defer: bool = False) -> RequestRecord:
        assert self._session is not None
        return await send(self._session, self.plan.url, self.plan.model, prompt, rec, t0,
                          temperature=self.load.temperature, headers=self.plan.headers, fresh=self._fresh,
                          defer=defer)

    async def warm(self) -> None:
        """The plan's warm-up prompts, at once where there are slots for them: each lands on its own idle server
        slot. Not measured."""
        if not self.plan.warm:
            return
        sem = asyncio.Semaphore(max(1, self.plan.warm_slots))

        async def warm_one(i: int, p: str) -> None:
            async with sem:
                rec = await self.one(RequestRecord(-1 - i, self.load.prompt_len, self.load.output_len), p,
                                     time.perf_counter())
                if rec.success:
                    self.warm_e2el.append(rec.e2el)

        await asyncio.gather(*(warm_one(i, p) for i, p in enumerate(self.plan.warm)))

    def in_ramp(self, intended: float) -> bool:
        """Whether a request due at ``intended`` (seconds from t0) belongs to the ramp: due before it ended."""
        return intended < self.ramp_s

    async def request(self, i: int, intended: float, prompt: Any = None) -> RequestRecord:
        """Send measured request ``i``, due at ``intended`` (seconds from t0), and report it to the cell."""
        load = self.load
        rec = RequestRecord(i, load.prompt_lens[i] if load.prompt_lens else load.prompt_len,
                            load.output_lens[i] if load.output_lens else load.output_len, worker=self.plan.worker)
        self.records.append(rec)
        # Decoded after the cell (bakeoff.loadgen.client.finish_deferred), except where a session's next turn
        # needs this answer's text now: a wave of streams ending together is then no burst of decoding.
        await self.one(rec, load.prompts[i] if prompt is None else prompt, self.t0, defer=load.sessions is None)
        rec.schedule_delay = rec.start - intended
        rec.ramp = self.in_ramp(min(rec.start, intended))
        rec.done = time.perf_counter() - self.t0
        self.ctl.done(rec, rec.done)
        return rec

    def slot_start(self, j: int) -> float:
        """When slot ``j`` of the cell's ``c`` sends its first request, from t0: ``j x ramp_s / c`` (0: a burst)."""
        return j * self.ramp_s / self.load.concurrency

    async def closed_loop(self) -> None:
        """The plan's slots, each from its start sending the cell's next request as soon as its previous one ended."""
        async def slot(j: int) -> None:
            intended = self.slot_start(j)
            if intended > 0:
                await until(self.t0 + intended)
            # a request is never sent before it is due, so whether it is the ramp's is known when it is taken
            while not self.ctl.stopped() and (i := self.ctl.take(self.in_ramp(intended))) is not None:
                await self.request(i, intended)
                intended = time.perf_counter() - self.t0  # the slot is free: its next request is due now

        await asyncio.gather(*(slot(j) for j in self.plan.slots))

    async def sessions(self, sessions: Sessions) -> None:
        """The plan's slots, each running the cell's next session: its turns in order, each after the think time."""
        async def session_slot() -> None:
            intended = 0.0
            while not self.ctl.stopped() and (s := self.ctl.take()) is not None:
                history = ""
                for k in range(sessions.turns):
                    i = s * sessions.turns + k
                    b = time.perf_counter()
                    prompt = history + self.load.prompts[i]
                    self.build_s += time.perf_counter() - b
                    rec = await self.request(i, intended, prompt)
                    intended = time.perf_counter() - self.t0  # the slot's next session is due when this one ends
                    if not rec.success or self.ctl.stopped() or k == sessions.turns - 1:
                        break  # a turn without an answer ends its session: the next has no history to grow
                    b = time.perf_counter()
                    history = prompt + rec.generated_text
                    self.build_s += time.perf_counter() - b
                    intended = (rec.done or intended) + sessions.think_s[i]
                    await until(self.t0 + intended)

        await asyncio.gather(*(session_slot() for _ in self.plan.slots))

    async def open_loop(self, schedule: list[tuple[int, float]]) -> None:
        """Each request of the plan's schedule at its offset from t0, however many are then in flight."""
        tasks = []
        for i, offset in schedule:
            await until(self.t0 + offset)
            if self.ctl.stopped():
                break
            tasks.append(asyncio.create_task(self.request(i, offset)))
        await asyncio.gather(*tasks)

    def health(self) -> dict[str, Any]:
        """This worker's health over the measured window (bakeoff.loadgen.health judges it).

        ``loop``: ``closed`` (slots, sessions included) or ``open``. A closed loop's ``slot_time_lost_share`` is
        its requests' schedule delays over its slots' time (each slot's from its start to the worker's end):
        the share of the load it was given that the client held back."""
        delays = [1000.0 * r.schedule_delay for r in self.records if r.schedule_delay is not None]
        lag = self.lag
        closed = self.plan.schedule is None
        slot_s = sum(max(0.0, self.wall_s - self.slot_start(j)) for j in self.plan.slots)
        lost = sum(max(0.0, d) for d in delays) / 1000.0 / slot_s if closed and slot_s > 0 else None
        return {"worker": self.plan.worker, "requests": len(self.records), "cpu_s": self.cpu_s,
                "cpu_share": self.cpu_s / self.wall_s if self.wall_s > 0 else float("nan"),
                "loop_lag_p99_ms": float(np.percentile(lag, 99) * 1000.0) if lag else 0.0,
                "schedule_delay_p50_ms": float(np.percentile(delays, 50)) if delays else 0.0,
                "schedule_delay_p99_ms": float(np.percentile(delays, 99)) if delays else 0.0,
                "loop": "closed" if closed else "open", "slot_time_lost_share": lost,
                "retried": sum(r.retried for r in self.records),
                **({"prompt_build_s": self.build_s} if self.load.sessions is not None else {})}


async def drive(plan: Plan, ctl: Control, cpu: Callable[[], float] = _cpu_s) -> None:
    """Run one worker's warm-up and measured requests; report each request and, last, the worker's health."""
    await Driver(plan, ctl, cpu).run()


def _event_loop_runner() -> Callable[[Any], Any]:
    """uvloop's ``run`` where it is installed (a cheaper loop: fewer CPU-seconds a token), else asyncio's."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        return asyncio.run
    return uvloop.run


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent(parent: int, poll_s: float = 0.2) -> None:
    """End this process the moment the process that started it dies, however it dies (SIGKILL included).

    On Linux the kernel's parent-death signal does it: SIGKILL once the thread that started this process exits
    (that thread waits in :func:`run_processes` while its workers run). Set after the process started, it misses
    a parent already gone, so the parent's pid is checked once it is set. Elsewhere a thread watches the pid.

    Multiprocessing's resource tracker (started for the cell's shared counters) then ends too: it reads a pipe
    whose writing ends only the caller and its workers hold, and exits once the pipe closes.
    """
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")
    except (OSError, AttributeError):  # not Linux: watch the parent instead

        def watch() -> None:
            while os.getppid() == parent:
                time.sleep(poll_s)
            os._exit(1)

        threading.Thread(target=watch, daemon=True, name="parent-watch").start()
    if os.getppid() != parent:  # died before the signal was set: this process was handed to another parent
        os._exit(1)


def _worker_main(plan: Plan, ctl: Shared, parent: int) -> None:
    """A worker process: drive its plan; any error goes to the caller, which fails the cell with it.
    It dies with the caller's process (:func:`die_with_parent`)."""
    die_with_parent(parent)
    try:
        _event_loop_runner()(drive(plan, ctl))
    except BaseException:  # noqa: BLE001 - reported to the caller, which raises it there
        ctl.out.put(("error", plan.worker, traceback.format_exc()[-2000:]))


class WorkerError(RuntimeError):
    """A worker process failed or vanished: the cell cannot be merged."""


@dataclass
class Ran:
    """What the workers report of a cell beside its requests: each one's health, and the ramp they all used."""

    health: list[dict[str, Any]]
    ramp_s: float


def run_processes(plans: list[Plan], n: int, on_done: Callable[[RequestRecord, float], bool],
                  on_measure_start: Callable[[], None] | None = None, join_timeout_s: float = 30.0,
                  ) -> Ran:
    """Run each plan in its own process, with the barriers and shared counter above.

    ``on_done(record, end)`` runs in this process for each measured request as it completes; True stops the
    cell. Every process is joined before this returns, or terminated at once where it raises (a worker's
    error, or a signal's exception such as a stage's SIGTERM): a cancelled cell sends nothing more. A caller
    that dies without raising (SIGKILL) takes its workers with it (:func:`die_with_parent`).
    """
    ctx = mp.get_context("spawn")  # never fork a process that holds threads (telemetry, progress)
    shared = dict(n=n, counter=ctx.Value("q", 0), steady_taken=ctx.Value("q", 0, lock=False),
                  steady_cap=plans[0].load.steady_cap, stop=ctx.Event(),
                  releases={"warm": ctx.Event(), "measure": ctx.Event()}, t0=ctx.Value("d", 0.0),
                  ramp_s=ctx.Value("d", 0.0), out=ctx.Queue())
    procs = [ctx.Process(target=_worker_main, args=(p, Shared(**shared, worker=p.worker), os.getpid()),
                         name=f"bakeoff-worker-{p.worker}", daemon=True) for p in plans]
    for proc in procs:
        proc.start()
    health: list[dict[str, Any]] = []
    ready: dict[str, int] = {"warm": 0, "measure": 0}
    warm_e2el: list[float] = []
    out = shared["out"]
    finished = False
    try:
        while len(health) < len(plans):
            try:
                kind, worker, body = out.get(timeout=1.0)
            except queue_mod.Empty:
                if dead := [p.name for p in procs if not p.is_alive() and p.exitcode not in (0, None)]:
                    raise WorkerError(f"load worker(s) exited: {', '.join(dead)}") from None
                continue
            if kind == "done":
                if on_done(*body):
                    shared["stop"].set()
            elif kind == "ready":
                phase, e2el = body
                ready[phase] += 1
                warm_e2el += e2el
                if ready[phase] == len(plans):
                    if phase == "measure":
                        shared["ramp_s"].value = ramp_length(plans[0].load, warm_e2el)
                        if on_measure_start is not None:
                            on_measure_start()
                        shared["t0"].value = time.perf_counter() + START_LEAD_S
                    shared["releases"][phase].set()
            elif kind == "end":
                health.append(body)
            else:
                raise WorkerError(f"load worker {worker} failed:\n{body}")
        finished = True
    finally:
        shared["stop"].set()
        for ev in shared["releases"].values():
            ev.set()
        for proc in procs:
            if finished:  # each sent its health: it is ending
                proc.join(timeout=join_timeout_s)
            if proc.is_alive():
                proc.terminate()
        for proc in procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)
    return Ran(sorted(health, key=lambda h: h["worker"]), float(shared["ramp_s"].value))


async def signals_end_the_cell(cell: Coroutine[Any, Any, None]) -> None:
    """Await ``cell``; a signal handler's exception (a stage's SIGTERM: bakeoff.engines.session.Interrupted)
    ends it and is raised here.

    Why: uvloop runs Python signal handlers inside a loop callback and only logs what they raise, so a stage's
    SIGTERM during an in-process cell was swallowed and the cell ran on (measured: still running 40 s after the
    signal, where asyncio's loop raised at once). A handler's exception is a BaseException that is not an
    Exception; the loop's exception handler takes it, cancels the cell, and it is raised once the cell has
    unwound. Anything else goes to the loop's default handler as before.
    """
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(cell)
    caught: list[BaseException] = []

    def on_error(lp: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        if isinstance(exc, BaseException) and not isinstance(exc, Exception):
            caught.append(exc)
            task.cancel()
            return
        lp.default_exception_handler(context)

    previous = loop.get_exception_handler()
    loop.set_exception_handler(on_error)
    try:
        await task
    except asyncio.CancelledError:
        if caught:
            raise caught[0] from None
        raise
    finally:
        loop.set_exception_handler(previous)
    if caught:  # the cell ended on its own as the signal came
        raise caught[0]


def run_local(plan: Plan, n: int, on_done: Callable[[RequestRecord, float], bool],
              on_measure_start: Callable[[], None] | None = None) -> Ran:
    """Run one plan in this process (a worker that needs no process of its own)."""
    ctl = Local(n, on_done, on_measure_start, plan.load)

    async def main() -> None:
        await signals_end_the_cell(drive(plan, ctl, time.thread_time))  # its own thread's CPU, not telemetry's

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        _event_loop_runner()(main())
    else:  # called from inside a running loop (an async caller): run in a thread of its own
        import concurrent.futures

        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            pool.submit(_event_loop_runner(), main()).result()
    return Ran(ctl.health, ctl.ramp_s)


def available_cores() -> int:
    """The CPUs this process may run on (its affinity), which bound the useful number of workers."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1
