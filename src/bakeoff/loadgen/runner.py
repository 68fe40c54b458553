"""Drive one load cell: warm-up, then fixed concurrency or a Poisson arrival rate, over one or more workers.

The cell's requests are sent by ``workers`` event loops (bakeoff.loadgen.workers: the split, the barriers,
the shared clock) and merged here into one cell: one list of records on one clock, one duration, the same
metric definitions. Beside the records it reports each worker's health (bakeoff.loadgen.health), so a
saturated client cannot pass for a slow server.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from bakeoff.loadgen.cellload import CellLoad, Start
from bakeoff.loadgen.client import finish_deferred
from bakeoff.loadgen.health import cell_health
from bakeoff.loadgen.metrics import RequestRecord, summarize
from bakeoff.loadgen.workers import Plan, deal, run_local, run_processes, split


@dataclass
class CellResult:
    """A cell's requests (measured ones, by index), its duration, the client's health, and how its load started:
    ``start`` as run (``burst`` for any load that does not ramp) and the ramp's length in seconds (0: none).
    :meth:`summary` gives its metrics with those."""

    records: list[RequestRecord]
    duration_s: float
    client: dict[str, Any] = field(default_factory=dict)
    start: Start = "burst"
    ramp_s: float = 0.0

    def summary(self, slos_ms: dict[str, float] | None = None, concurrency: int | None = None) -> dict[str, Any]:
        """:func:`bakeoff.loadgen.metrics.summarize` of this cell, its start and ramp named."""
        return summarize(self.records, self.duration_s, slos_ms, concurrency, start=self.start, ramp_s=self.ramp_s)


def arrival_gaps(request_rate: float, count: int, seed: int) -> list[float]:
    """Seconds between one open-loop arrival and the next (Poisson at ``request_rate``); the same for a seed."""
    rng = np.random.default_rng(seed)
    return [float(g) for g in rng.exponential(1.0 / request_rate, size=count)]


def schedule(request_rate: float, count: int, seed: int) -> list[float]:
    """Each open-loop request's send time from the cell's start: the first at 0, then the arrival gaps."""
    gaps = arrival_gaps(request_rate, count, seed)
    return [0.0, *np.cumsum(gaps[:-1]).tolist()][:count]


def worker_count(workers: int, concurrency: int, n: int, open_loop: bool) -> int:
    """Workers actually used: no more than the requests, nor (closed loop) than the concurrency to split."""
    return max(1, min(workers, n, n if open_loop else concurrency))


def plans(url: str, model: str, load: CellLoad, workers: int, headers: dict[str, str] | None = None) -> list[Plan]:
    """Each worker's part of the cell (bakeoff.loadgen.workers states the split); each carries the ``load``.

    An open loop's schedule is ``load.offsets`` where given (a trace's), else Poisson arrivals at
    ``load.request_rate`` drawn from ``load.seed``, dealt round-robin; a closed loop's concurrency is split.
    Multi-turn sessions are handed out by the shared counter as a closed loop's requests are."""
    n = load.requests
    w = worker_count(workers, load.concurrency, n, load.open_loop)
    warm = load.warmup_prompts or []
    warm_slots = split(max(load.concurrency, load.warmup_concurrency or 0, w), w)
    # closed loop: slot j of c on worker j mod w, so each worker holds its split share and a ramp's starts interleave
    slots = [tuple(range(k, load.concurrency, w)) if not load.open_loop else () for k in range(w)]
    dealt: list[list[tuple[int, float]] | None]
    if load.offsets is not None:
        dealt = list(deal(load.offsets, w))
    elif load.request_rate is not None:
        dealt = list(deal(schedule(load.request_rate, n, load.seed), w))
    else:
        dealt = [None] * w
    return [Plan(worker=k, url=url, model=model, load=load, headers=headers, slots=slots[k], schedule=dealt[k],
                 warm=warm[k::w], warm_slots=warm_slots[k]) for k in range(w)]


def run_cell(
    base_url: str,
    model: str,
    load: CellLoad,
    *,
    api_key: str | None = None,
    count_tokens: Callable[[str], int] | None = None,
    label: str = "",
    show_progress: bool = True,
    on_measure_start: Callable[[], None] | None = None,
    on_measure_end: Callable[[], None] | None = None,
    stop_when: Callable[[RequestRecord], bool] | None = None,
    workers: int = 1,
) -> CellResult:
    """Run ``load``'s warm-up, then its measured requests, over ``workers`` event loops.

    ``stop_when`` sees each measured request as it completes; once it returns True no further request is
    sent, those in flight finish, and the result holds only the requests sent (``client["stopped_early"]``).

    ``on_measure_start``/``on_measure_end`` run right before the first and right after the last measured
    request (warm-up excluded): per-cell telemetry such as the GPU energy counter is read exactly over the
    measured window.

    A ramped load (``load.start == "ramp"``, bakeoff.loadgen.cellload) marks the requests sent during its ramp
    (``RequestRecord.ramp``), and the cell's latency statistics leave them out: give it ``steady=n`` and
    ``n + load.ramp_extra()`` prompts for ``n`` requests after the ramp. It sends ``n`` after the ramp and leaves
    the ramp's unused supply unsent; where the ramp took it all, fewer (:func:`short_of_steady`). Every request
    sent is recorded; nothing here adds prompts. ``stop_when`` sees the ramp's requests too, marked. The result
    names the start and the ramp's length as run (``CellResult.start``, ``ramp_s``; :meth:`CellResult.summary`).
    """
    url = base_url.rstrip("/") + "/v1/completions"
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    parts = plans(url, model, load, workers, headers)
    n = len(load.prompts)
    takes = load.requests  # what the shared counter hands out
    records: list[RequestRecord | None] = [None] * n
    ends: list[float] = []
    stopped = [False]
    progress = Progress(TextColumn(f"[bold]{label}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        disable=not show_progress, transient=False,
                        console=Console(stderr=True))  # stdout stays the caller's (`bakeoff load` prints JSON)

    with progress:
        cap = load.steady_cap
        task = progress.add_task(label, total=n if cap is None else min(n, cap + load.concurrency))

        def on_done(record: RequestRecord, end: float) -> bool:
            records[record.index] = record
            ends.append(end)
            progress.advance(task)
            if stop_when is not None and not stopped[0] and stop_when(record):
                stopped[0] = True
            return stopped[0]

        if len(parts) == 1:
            ran = run_local(parts[0], takes, on_done, on_measure_start)
        else:
            ran = run_processes(parts, takes, on_done, on_measure_start)
        health = ran.health
        if on_measure_end is not None:
            on_measure_end()
    sent = [finish_deferred(r) for r in records if r is not None]
    for r in sent:
        if r.success and r.tokens_from == "none" and count_tokens is not None:
            r.output_tokens = count_tokens(r.generated_text)
            r.tokens_from = "client-tokenizer"
    duration = (max(ends) - min(r.start for r in sent)) if sent else 0.0
    streamed = sum(r.output_tokens for r in sent if r.success)
    client = cell_health(health)
    client["client_cpu_s_per_1k_tokens"] = 1000.0 * client["client_cpu_s"] / streamed if streamed else float("nan")
    client["stopped_early"] = stopped[0]
    if load.sessions is not None:  # the workers' time assembling each turn's prompt, all together
        client["client_prompt_build_s"] = sum(float(h.get("prompt_build_s", 0.0)) for h in health)
    return CellResult(sent, duration, client, "ramp" if load.ramped else "burst", ran.ramp_s)


def short_of_steady(res: CellResult, load: CellLoad) -> bool:
    """Whether a ramped cell sent fewer requests after its ramp than ``load.steady_cap`` without being stopped:
    its ramp drew on every prompt of its supply, and the cell must be run again with more to be read whole."""
    cap = load.steady_cap
    if cap is None or res.client.get("stopped_early"):
        return False
    return sum(not r.ramp for r in res.records) < cap


async def run_cell_async(base_url: str, model: str, load: CellLoad, **kwargs: Any) -> CellResult:
    """:func:`run_cell` from a coroutine: the cell runs in a thread of its own, off the caller's loop."""
    return await asyncio.to_thread(functools.partial(run_cell, base_url, model, load, **kwargs))
