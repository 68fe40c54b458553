"""Measure one load cell on a running server: the client's requests, the server's metrics, the node's telemetry.

Why its own module: the fixed cells (bakeoff.stages.serve_load) and the capacity probes
(bakeoff.serving.capacity) are measured the same way and recorded with the same fields, so a probe
row reads like any cell row.
"""

from __future__ import annotations

import copy
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bakeoff.config.schema import LoadCfg
from bakeoff.engines import get_engine
from bakeoff.engines.session import Session
from bakeoff.engines.window import MeasuredWindow
from bakeoff.hardware.fingerprint import node_id
from bakeoff.hardware.memory import PeakSampler
from bakeoff.loadgen import workload
from bakeoff.loadgen.cellload import RAMP_SUPPLY, CellLoad, ramp_extra
from bakeoff.loadgen.cells import Cell, record_base
from bakeoff.loadgen.metrics import RequestRecord
from bakeoff.loadgen.prompts import make_prompts
from bakeoff.loadgen.runner import CellResult, run_cell, short_of_steady
from bakeoff.loadgen.workers import available_cores
from bakeoff.models.artifacts import atomic_write_text
from bakeoff.serving.job import ServeJob

# A cell whose steady-state throughput and vLLM-defined throughput differ by more than this says so.
STEADY_GAP = 0.05
MAX_REFILLS = 2  # re-runs of a ramped cell whose ramp drew on all its prompts (measure)


def write_json(path: Path, data: Any) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, default=str) + "\n")


def write_jsonl(path: Path, rows: list[dict]) -> None:
    atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in rows))


def ramp_short(res: CellResult, load: CellLoad, refills: int) -> tuple[bool, str] | None:
    """Where a ramped cell's ramp drew on all its prompts (bakeoff.loadgen.runner.short_of_steady): whether to run
    it again on a supply twice as large (``refills`` so far under ``MAX_REFILLS``), and the row's note. None where
    the cell sent its ``steady_cap`` requests after the ramp."""
    if not short_of_steady(res, load):
        return None
    after, n, supply = sum(not r.ramp for r in res.records), load.steady_cap, len(load.prompts) - (load.steady_cap or 0)
    if refills >= MAX_REFILLS:
        return False, (f"short of its steady span: {after} of {n} requests after the ramp, which drew all {supply} "
                       f"prompts of its supply")
    return True, (f"the ramp drew all {supply} prompts of its supply, leaving {after} of {n} requests after it: "
                  f"run again on fresh prompts with twice the supply")


def client_workers(job: ServeJob, load: LoadCfg, in_flight: int) -> int:
    """The workers a cell starts with: ``load.client.workers``, or under ``auto`` what the job's sizer picks
    (bakeoff.loadgen.sizing) for ``in_flight`` requests at once."""
    if load.client.workers != "auto":
        return max(1, min(int(load.client.workers), in_flight))
    return job.sizer.workers(in_flight, available_cores())


def client_shares_cores(job: ServeJob) -> bool:
    """Whether the client runs on the cores that serve: a CPU backend's server computes on this machine's cores,
    so a client short of CPU there is not helped by more workers, which take cores from the server."""
    return job.hardware.backend == "cpu"


def measure(job: ServeJob, session: Session, base: dict, load: LoadCfg, tokenizer: Any, versions: dict, cell: Cell, *,
            n: int, n_warm: int, seed: int, request_rate: float | None, notes: list[str],
            stop_when: Callable[[RequestRecord], bool] | None = None, slos_ms: dict[str, float] | None = None,
            extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Measure one cell on the session's running server; write its records and summary; return the summary.

    ``cell.name`` names its files; a capacity probe passes its own (``extra`` adds its fields to the record).

    A workload other than ``fixed`` (bakeoff.loadgen.workload) decides the cell's requests: their number (``n``
    is what the load asks), prompts, lengths and schedule; a concurrency probe (``extra["probe_of"]``) runs it
    closed loop. Its warm-up prompts stay fixed-style, unique, so the warm-up never fills a prefix cache.
    """
    kind = load.workload.kind
    closed = (extra or {}).get("probe_of") == "concurrency"
    if kind != "fixed":
        n = workload.requests(load, n, cell.concurrency)
    open_loop = request_rate is not None or (kind == "trace" and not closed)
    out_dir = job.out_dir
    count_tokens = lambda text: len(tokenizer.encode(text, add_special_tokens=False))  # noqa: E731
    engine = session.engine
    assert engine is not None
    window = MeasuredWindow(engine, gpu=job.hardware.backend == "cuda")  # GPU telemetry and server metrics, warm-up excluded
    in_flight = cell.concurrency if not open_loop else n
    # Probes of a concurrency search start as load.capacity.start says (a ramp: users, not one burst); fixed cells
    # as load.start (a burst: comparable with `vllm bench serve`). A ramp's requests are extra to the n measured.
    start = load.capacity.start if closed else load.start
    # The ramp draws what it needs on a supply of RAMP_SUPPLY prompts a slot, and n are sent after it; a ramp that
    # drew on all of it (short_of_steady) is run again on a supply twice as large, at most MAX_REFILLS times.
    supply, refills = RAMP_SUPPLY, 0
    ramp_n = ramp_extra(start, cell.concurrency, open_loop=open_loop, sessions=kind == "multiturn", supply=supply)
    workers = client_workers(job, load, in_flight)
    shares_cores = client_shares_cores(job)
    pristine = copy.deepcopy(stop_when)  # an early stop counts what it saw: a re-run starts from none
    attempts = 0
    while True:
        work: workload.CellWork | None = None
        if kind == "fixed":
            prompts = make_prompts(tokenizer, cell.prompt_len, n + ramp_n + n_warm, seed=seed + attempts + 2 * refills,
                                   tag=f"{cell.name}-")
            warm, measured = prompts[:n_warm], prompts[n_warm:]
            requests: dict[str, Any] = {"prompts": measured}
        else:
            warm = make_prompts(tokenizer, cell.prompt_len, n_warm, seed=seed + attempts + 2 * refills,
                                tag=f"{cell.name}-w")
            work = workload.build(load, tokenizer, cell.name, cell.prompt_len, n + ramp_n, cell.concurrency,
                                  seed + attempts + 2 * refills, request_rate, closed)
            requests = work.run_kwargs()
        # The server's memory: its process tree's RSS, or its container's (never the docker client's);
        # GPU memory comes from the window, on the server's own GPUs.
        with PeakSampler(engine.pid() or os.getpid(), sample=engine.memory_bytes) as mem:
            t_cell = time.time()
            cell_load = CellLoad(**requests, prompt_len=cell.prompt_len, output_len=load.output_len,
                                 concurrency=cell.concurrency, request_rate=request_rate, warmup_prompts=warm,
                                 warmup_concurrency=n_warm, temperature=load.temperature, seed=seed,
                                 start=start, ramp_s=load.ramp_s, steady=n if ramp_n else None)
            res = run_cell(engine.base_url, base["model"], cell_load,
                           api_key=engine.spec.engine.api_key, count_tokens=count_tokens,
                           label=f"{base['engine']}-{base['format']} {cell.name}", show_progress=job.show_progress,
                           on_measure_start=window.start, on_measure_end=window.stop, stop_when=stop_when,
                           workers=workers)
        if (short := ramp_short(res, cell_load, refills)) and engine.alive():
            again, note = short
            notes = [*notes, note]
            if again:
                supply, refills = 2 * supply, refills + 1
                ramp_n = ramp_extra(start, cell.concurrency, open_loop=open_loop, sessions=kind == "multiturn",
                                    supply=supply)
                stop_when = copy.deepcopy(pristine)
                window = MeasuredWindow(engine, gpu=job.hardware.backend == "cuda")
                continue
        more = min(2 * workers, in_flight)
        if not res.client["client_saturated"] or attempts or more <= workers or not engine.alive():
            break
        if shares_cores:
            notes = [*notes, f"client saturated with {workers} worker(s) ({res.client['client_saturated_reason']}); "
                             "not re-run: the client shares this machine's cores with the server, so more workers "
                             "would take cores from the server they measure"]
            break
        # A saturated client measured itself: the cell is run once more, on fresh prompts, with twice the workers.
        notes = [*notes, f"client saturated with {workers} worker(s) ({res.client['client_saturated_reason']}); "
                         f"re-run with {more} workers on fresh prompts (seed + 1)"]
        workers, stop_when, attempts = more, copy.deepcopy(pristine), 1
        window = MeasuredWindow(engine, gpu=job.hardware.backend == "cuda")
    t_end = time.time()
    # The steady span: a closed loop that keeps c requests in flight (sessions pause between turns: not one).
    steady = not open_loop and kind != "multiturn"
    metrics = res.summary(slos_ms or job.slos_ms, concurrency=cell.concurrency if steady else None)
    # a client short on the server's own cores is no reason to start the next cell with more workers
    job.sizer.observe(in_flight, metrics.get("output_throughput"), res.client.get("client_cpu_s_per_1k_tokens"),
                      needed=workers if attempts else 1, workers=workers,
                      saturated=bool(res.client["client_saturated"]) and not shares_cores)
    telemetry = window.columns(metrics["total_output_tokens"], metrics["total_input_tokens"])
    notes = [base["load_note"], *notes, *session.notes]
    steady, vllm_def = metrics.get("steady_output_throughput"), metrics.get("output_throughput")
    if steady and vllm_def and abs(steady / vllm_def - 1.0) > STEADY_GAP:
        notes.append(f"steady-state output {steady:.1f} tok/s differs from output_throughput {vllm_def:.1f} by "
                     f"{100.0 * (steady / vllm_def - 1.0):+.1f}% (ramp {metrics['ramp_s']:.2f} s, "
                     f"tail {metrics['tail_s']:.2f} s)")
    died = not engine.alive()
    if died:
        cell_status, cell_reason = "failed", f"server died mid-cell: {engine.failure_reason()}"
    elif metrics["failed"] == 0:
        cell_status, cell_reason = "ok", ""
    elif metrics["completed"] == 0:
        cell_status, cell_reason = "failed", "; ".join(metrics["errors"])[:500]
    else:
        cell_status, cell_reason = "degraded", "; ".join(metrics["errors"])[:500]
    record = {**record_base(base, cell, n, versions, session.startup_s), "status": cell_status,
              "reason": cell_reason, **metrics, **res.client, "client_rerun": attempts > 0,
              "client_shares_cores": shares_cores,
              "peak_rss_bytes": mem.peak_rss,
              "load_note": "; ".join(x for x in notes if x), "warmup_requests": n_warm,
              "block": cell.repeat, "order": job.order,
              "node_id": node_id(telemetry.get("gpu_uuids")),
              "memory_source": engine.memory_source(),
              "peak_gpu_bytes": mem.peak_gpu, **telemetry, "started_utc": t_cell,
              "ended_utc": t_end, "server_start": session.starts, **session.facts,
              "workload": kind, **(workload.after(load, work, res.records) if work is not None else {}),
              "prefix_caching": get_engine(job.engine_cfg.plugin).prefix_caching_state(job.engine_cfg.settings),
              **(extra or {})}
    if request_rate is not None:
        record["request_rate"] = request_rate
    write_jsonl(out_dir / f"{cell.name}.jsonl", [r.to_json() for r in res.records])
    write_json(out_dir / f"{cell.name}.json", record)
    return record
