"""Stage: one server per (engine, format, engine settings) serves all its load cells, then its quality.

For each cell (concurrency x prompt length x repeat) it writes the per-request
records (``<cell>.jsonl``) and the cell's summary (``<cell>.json``), then an
index (``cells.json``) that the summary rule reads. Cells whose summary already
says ``ok`` are skipped, so re-running the stage redoes only what is missing
or failed.

On the same server it then generates the fixed sample prompts
(``samples.json``) and, where the engine can score prompts (vLLM), runs the
quality evaluation (``quality.json``, bakeoff.quality.plan): the issue's
rule is that a variant is evaluated on the very server its load tests used.
Engines that cannot score prompts (llama-server) name an ``eval_server`` for
the same artifact, started after the load server is stopped. Quality and
samples are reused like cells, when made with the same settings.

Outcomes, all of them results rather than crashes:

* ``ok`` / ``degraded`` -- every / some requests succeeded;
* ``unsupported`` -- the server exited while starting with one of the engine's
  known refusals (``Engine.unsupported_patterns``: this build or hardware cannot
  run the format); ``reason`` is the engine's own error line;
* ``failed`` -- any other start failure (a resource such as memory or a port,
  a bad flag, a program that cannot run), a server not ready in time, or one that died mid-cell (the
  cell's requests fail with their errors; the server is restarted for the
  remaining cells).

The server is always stopped -- on success, error, SIGTERM or Ctrl-C. This module
keeps the order of events; the server session, the cells, the quality plan and
the samples each live with their own concern.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from bakeoff.config.schema import LoadCfg
from bakeoff.engines import ServerSpec, get_engine
from bakeoff.engines.session import Session, stop_on_signals
from bakeoff.layout import CELLS_INDEX, SAMPLES_FILE, SERVER_LOG, variant_name
from bakeoff.loadgen.cells import (
    Cell,
    cell_note,
    cell_spec_hash,
    cells_of,
    check_load_before_start,
    record_base,
    requests_for,
    reusable,
    stable_seed,
    warmup_for,
)
from bakeoff.models.artifacts import restore_kept, write_kept
from bakeoff.models.manifest import verify
from bakeoff.quality import lmeval
from bakeoff.quality.plan import QualityPlan
from bakeoff.quality.samples import generate, made_with, samples_hash
from bakeoff.stages import serve_capacity
from bakeoff.stages.measure_cell import measure, write_json
from bakeoff.stages.serve_job import ServeJob

__all__ = ["ServeJob", "run"]


def _write_kept_json(path: Path, data: Any) -> None:
    write_kept(path, json.dumps(data, indent=2, default=str) + "\n")


def run(job: ServeJob, out: Path | None = None) -> dict[str, Any]:
    """Run every pending cell of one variant (of the job's block, its last), then its samples and quality.

    Returns the index written to ``out`` (``cells.json`` beside the cells by default), over every block's
    cells; the earlier blocks are bakeoff.stages.serve_block's jobs.
    """
    with stop_on_signals(job.launcher_pid):
        return _run(job, out)


@dataclass
class Prepared:
    """What every serving job sets up before its first server start: checked load, tokenizer, session, cells."""

    load: LoadCfg
    manifest: dict[str, Any]
    tokenizer: Any
    spec: ServerSpec
    session: Session
    base: dict[str, Any]
    cells: list[Cell]  # every cell of the variant, all blocks
    mine: list[Cell]  # this job's block's (all of them when the job has no block)
    pending: list[Cell]  # of ``mine``, those not already made with these settings
    job: ServeJob  # the job, its llama.cpp slots sized for a capacity search (serve_capacity.sized_engine)


def prepare(job: ServeJob) -> Prepared:
    """Check the load and the inputs, build the cell records' common fields, and find the cells still to run."""
    from transformers import AutoTokenizer

    engine_cfg, out_dir, fmt = job.engine_cfg, job.out_dir, job.fmt
    load, load_note = job.load.for_variant(engine_cfg.load, fmt)
    check_load_before_start(load, get_engine(engine_cfg.plugin).request_context(engine_cfg.settings))
    manifest = verify(job.model_dir)
    verify(job.tokenizer_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(job.tokenizer_dir)
    variant = variant_name(job.engine_name, fmt)
    engine_cfg, parallel_set_by = serve_capacity.sized_engine(job, load)
    spec = ServerSpec(engine=engine_cfg, hardware=job.hardware, model_dir=job.model_dir, served_name=job.model,
                      log_path=out_dir / SERVER_LOG, toolchain_dir=job.toolchain_dir,
                      job_name=f"{job.experiment}-{job.model}-{variant}")
    base = {"experiment": job.experiment, "model": job.model, "engine": job.engine_name, "format": fmt,
            "hardware": job.hardware.name, "output_len": load.output_len,
            "weight_bytes": get_engine(engine_cfg.plugin).served_weight_bytes(manifest, engine_cfg.settings),
            "bits_per_weight": manifest.get("bits_per_weight"), "n_params": manifest.get("n_params"),
            "request_rate": load.request_rate, "engine_settings": engine_cfg.settings,
            "engine_extra_args": engine_cfg.extra_args, "load_note": load_note,
            **({"parallel_set_by": parallel_set_by} if parallel_set_by else {})}
    base["spec_hash"] = cell_spec_hash(base, load)
    cells = cells_of(load)
    mine = cells if job.block is None else [c for c in cells if c.repeat == job.block]
    pending = [c for c in mine if not reusable(out_dir, c, base["spec_hash"], requests_for(load, c.concurrency))]
    return Prepared(load, manifest, tokenizer, spec, Session(spec, engine_cfg.plugin), base, cells, mine, pending,
                    replace(job, engine_cfg=engine_cfg))


def run_cells(job: ServeJob, p: Prepared) -> tuple[str, str]:
    """Run ``p.pending`` on the session's server (started here; restarted for a new repeat or after it died)."""
    return _run_pending(p.job, p.session, p.pending, p.base, p.load, p.tokenizer)


def _run(job: ServeJob, out: Path | None = None) -> dict[str, Any]:
    p = prepare(job)
    job = p.job
    engine_cfg, eval_cfg, out_dir, fmt = job.engine_cfg, job.eval_cfg, job.out_dir, job.fmt
    load, manifest, tokenizer, spec, session, base = p.load, p.manifest, p.tokenizer, p.spec, p.session, p.base
    cells, pending = p.cells, p.pending
    variant = variant_name(job.engine_name, fmt)
    quality = QualityPlan.make(engine_cfg, eval_cfg, manifest, out_dir, job.synthetic, job.eval_toolchain_dir)
    if quality.needed:
        lmeval.check_tasks(eval_cfg.tasks)  # an unknown task fails now, not after minutes of load tests
    samples_digest = samples_hash(base["spec_hash"], eval_cfg.samples)
    need_samples = not made_with(out_dir / SAMPLES_FILE, samples_digest)
    if not need_samples:
        restore_kept(out_dir / SAMPLES_FILE)
    start_status = ("ok", "")
    last_block = job.block is None or job.block == load.repeats - 1
    cap_digest = serve_capacity.capacity_hash(base["spec_hash"], load)
    capacity = serve_capacity.reused(out_dir, cap_digest) if load.mode == "capacity" and last_block else None
    need_capacity = load.mode == "capacity" and last_block and capacity is None
    try:
        if pending or quality.on_load_server or (need_samples and eval_cfg.samples.prompts) or need_capacity:
            start_status = _run_pending(job, session, pending, base, load, tokenizer)
            if need_capacity and start_status[0] == "ok":
                fixed = [json.loads(f.read_text()) for c in cells if (f := out_dir / f"{c.name}.json").exists()]
                capacity = serve_capacity.run(job, session, base, load, tokenizer, fixed)
                serve_capacity.write(out_dir, cap_digest, capacity)
            engine = session.engine
            up = start_status[0] == "ok" and engine is not None and engine.alive()
            if up and need_samples and engine is not None:
                _write_kept_json(out_dir / SAMPLES_FILE, {"samples_hash": samples_digest, "variant": variant,
                                                     "samples": generate(engine.base_url, job.model,
                                                                         eval_cfg.samples.prompts,
                                                                         eval_cfg.samples.max_tokens,
                                                                         engine_cfg.api_key)})
                need_samples = False
            if quality.on_load_server:
                quality.run(session if up else None, start_status, tokenizer, job.tokenizer_dir, job.model)
    finally:
        session.stop()
    if need_samples:  # no prompts configured, or the server could not serve them
        reason = "" if not eval_cfg.samples.prompts else f"{start_status[0]}: {start_status[1]}"
        final = not reason or start_status[0] == "unsupported"  # a failure is retried next run; unsupported is a result
        _write_kept_json(out_dir / SAMPLES_FILE, {"samples_hash": samples_digest if final else None,
                                             "variant": variant, "samples": [], "reason": reason})
    if quality.needed and not quality.on_load_server:
        unsupported = [c for c in cells if json.loads((out_dir / f"{c.name}.json").read_text())["status"] == "unsupported"]
        if unsupported:  # the variant cannot run here; its quality is not measured on another route
            quality.record_status("unsupported", json.loads((out_dir / f"{unsupported[0].name}.json").read_text())["reason"])
        else:
            quality.run_on_eval_server(spec, tokenizer, job.tokenizer_dir, job.model)
    # A reused cell was made with settings equal for it (cell_spec_hash): it stands for the current config.
    index = {"variant": base, "config_hash": job.config_hash,
             "cells": [{**json.loads((out_dir / f"{c.name}.json").read_text()), "config_hash": job.config_hash}
                       for c in cells] + [{**r, "config_hash": job.config_hash}
                                          for r in (capacity or {}).get("probes", [])],
             "capacity": [{**r, "config_hash": job.config_hash} for r in (capacity or {}).get("capacity", [])]}
    write_json(out or out_dir / CELLS_INDEX, index)
    return index


def _run_pending(job: ServeJob, session: Session, pending: list[Cell], base: dict, load: LoadCfg,
                 tokenizer: Any) -> tuple[str, str]:
    """Run ``pending`` on the session's server, restarting it for a new repeat or after it died."""
    out_dir = job.out_dir
    status, reason = session.start()
    versions = session.engine.versions() if session.engine else {}
    if status != "ok":
        for cell in pending:
            n = requests_for(load, cell.concurrency)
            write_json(out_dir / f"{cell.name}.json",
                        {**record_base(base, cell, n, versions, None), "status": status, "reason": reason,
                         "completed": 0, "failed": 0})
        print(f"{base['engine']}-{base['format']}: {status}: {reason}", file=sys.stderr)
        return status, reason
    served_repeat: int | None = None  # the repeat this server start has served
    for i, cell in enumerate(pending):
        # A new repeat gets a fresh server, so the spread across repeats includes restart drift.
        new_repeat = served_repeat is not None and cell.repeat != served_repeat
        if new_repeat or not session.engine or not session.engine.alive():
            session.stop()
            served_repeat = None
            status, reason = session.start()  # a new repeat, or the previous cell killed it
            if status != "ok":
                for rest in pending[i:]:
                    n = requests_for(load, rest.concurrency)
                    write_json(out_dir / f"{rest.name}.json",
                                {**record_base(base, rest, n, versions, None), "status": "failed",
                                 "reason": f"server restart failed: {reason}", "completed": 0, "failed": n})
                return status, reason
        served_repeat = cell.repeat
        slots = job.slots_to_warm(session.starts, get_engine(job.engine_cfg.plugin).slots(job.engine_cfg.settings))
        n, n_warm = requests_for(load, cell.concurrency), warmup_for(load, cell.concurrency, slots)
        seed = stable_seed(cell.concurrency, cell.prompt_len, cell.repeat)
        measure(job, session, base, load, tokenizer, versions, cell, n=n, n_warm=n_warm, seed=seed,
                request_rate=load.request_rate, notes=[cell_note(load, cell.concurrency, slots)])
    return "ok", ""
