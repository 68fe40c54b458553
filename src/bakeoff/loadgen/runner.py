"""Drive one load cell: warm-up, then fixed concurrency or a Poisson arrival rate.

Besides request records it reports the client's own health -- event-loop lag
(p99) and client CPU time -- so a saturated client cannot pass for a slow
server.
"""

from __future__ import annotations

import asyncio
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import numpy as np
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from bakeoff.loadgen.client import send
from bakeoff.loadgen.health import verdict
from bakeoff.loadgen.metrics import RequestRecord


@dataclass
class CellResult:
    records: list[RequestRecord]
    duration_s: float
    client: dict[str, Any] = field(default_factory=dict)


def _cpu_seconds() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


async def _lag_monitor(samples: list[float], stop: asyncio.Event, interval: float = 0.05) -> None:
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        t = loop.time()
        await asyncio.sleep(interval)
        samples.append(max(0.0, loop.time() - t - interval))


async def run_cell_async(
    base_url: str,
    model: str,
    prompts: list[str],
    prompt_len: int,
    output_len: int,
    concurrency: int,
    request_rate: float | None = None,
    warmup_prompts: list[str] | None = None,
    warmup_concurrency: int | None = None,
    temperature: float = 0.0,
    api_key: str | None = None,
    timeout_s: float = 600.0,
    seed: int = 0,
    count_tokens: Callable[[str], int] | None = None,
    label: str = "",
    show_progress: bool = True,
    on_measure_start: Callable[[], None] | None = None,
    on_measure_end: Callable[[], None] | None = None,
    stop_when: Callable[[RequestRecord], bool] | None = None,
) -> CellResult:
    """Run warm-up, then the measured requests.

    ``stop_when`` sees each measured request as it completes; once it returns True no further request is
    sent, those in flight finish, and the result holds only the requests sent (``client["stopped_early"]``).

    ``on_measure_start``/``on_measure_end`` run right before the first and right
    after the last measured request (warm-up excluded): per-cell telemetry such
    as the GPU energy counter is read exactly over the measured window.
    """
    url = base_url.rstrip("/") + "/v1/completions"
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    # One connection per request: servers differ in keep-alive handling (llama-server drops idle
    # connections, which a pooled client would see as "Server disconnected"); loopback connects are cheap.
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        # Warm-up: not counted, at the cell's concurrency, or at ``warmup_concurrency`` where that is higher (one
        # warm-up per fixed server slot, all at once: each lands on its own idle slot).
        if warmup_prompts:
            sem = asyncio.Semaphore(max(concurrency, warmup_concurrency or 0))

            async def warm(p: str, i: int) -> None:
                async with sem:
                    await send(session, url, model, p, RequestRecord(-1 - i, prompt_len, output_len),
                               time.perf_counter(), temperature, headers, count_tokens)

            await asyncio.gather(*(warm(p, i) for i, p in enumerate(warmup_prompts)))

        records = [RequestRecord(i, prompt_len, output_len) for i in range(len(prompts))]
        lag: list[float] = []
        stop = asyncio.Event()
        monitor = asyncio.create_task(_lag_monitor(lag, stop))
        sem = asyncio.Semaphore(concurrency)
        done_times: list[float] = []
        sent: list[int] = []
        stopped = asyncio.Event()
        progress = Progress(TextColumn(f"[bold]{label}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                            disable=not show_progress, transient=False,
                            console=Console(stderr=True))  # stdout stays the caller's (`bakeoff load` prints JSON)
        if on_measure_start is not None:
            on_measure_start()
        cpu0 = _cpu_seconds()
        with progress:
            task = progress.add_task(label, total=len(prompts))
            t0 = time.perf_counter()

            async def one(i: int) -> None:
                async with sem:
                    if stopped.is_set():
                        return
                    sent.append(i)
                    await send(session, url, model, prompts[i], records[i], t0, temperature, headers, count_tokens)
                    done_times.append(time.perf_counter())
                    progress.advance(task)
                    if stop_when is not None and stop_when(records[i]):
                        stopped.set()

            if request_rate is None:
                await asyncio.gather(*(one(i) for i in range(len(prompts))))
            else:
                tasks = []
                for i, gap in enumerate(arrival_gaps(request_rate, len(prompts), seed)):
                    if stopped.is_set():
                        break
                    tasks.append(asyncio.create_task(one(i)))
                    await asyncio.sleep(gap)
                await asyncio.gather(*tasks)
        wall = time.perf_counter() - t0
        if on_measure_end is not None:
            on_measure_end()
        cpu = _cpu_seconds() - cpu0
        stop.set()
        await monitor
    records = [records[i] for i in sorted(sent)]
    first = t0 + min((r.start for r in records), default=0.0)
    duration = (max(done_times) - first) if done_times else 0.0
    streamed = sum(r.output_tokens for r in records if r.success)
    client = {
        "client_cpu_s": cpu,
        "client_cpu_s_per_1k_tokens": 1000.0 * cpu / streamed if streamed else float("nan"),
        "client_loop_lag_p99_ms": float(np.percentile(lag, 99) * 1000.0) if lag else 0.0,
        # The client's CPU time over the measured window's wall time: 1.0 is one core, the most one event loop uses.
        "client_cpu_share": cpu / wall if wall > 0 else float("nan"),
        "stopped_early": stopped.is_set(),
    }
    client.update(verdict(client))
    return CellResult(records, duration, client)


def arrival_gaps(request_rate: float, count: int, seed: int) -> list[float]:
    """Seconds between one open-loop arrival and the next (Poisson at ``request_rate``); the same for a seed."""
    rng = np.random.default_rng(seed)
    return [float(g) for g in rng.exponential(1.0 / request_rate, size=count)]


def run_cell(**kwargs: Any) -> CellResult:
    return asyncio.run(run_cell_async(**kwargs))
