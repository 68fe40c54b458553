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
keeps the order of events: set up (bakeoff.serving.variant), the steps on the
server (bakeoff.serving.steps: cells, capacity, samples, quality), the index.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bakeoff.config.stageargs import StageArgs
from bakeoff.engines.session import stop_on_signals
from bakeoff.hardware.doctor import ecc_gate
from bakeoff.layout import CELLS_INDEX
from bakeoff.serving.job import ServeJob
from bakeoff.serving.measure import write_json
from bakeoff.serving.steps import Capacity, Cells, Quality, Samples, serve
from bakeoff.serving.variant import Prepared, prepare

__all__ = ["ServeJob", "run"]


def run(job: ServeJob, out: Path | None = None) -> dict[str, Any]:
    """Run every pending cell of one variant (of the job's block, its last), then its samples and quality.

    Returns the index written to ``out`` (``cells.json`` beside the cells by default), over every block's
    cells; the earlier blocks are bakeoff.stages.serve_block's jobs.
    """
    with stop_on_signals(job.launcher_pid):
        p = prepare(job)
        capacity = Capacity(p)
        serve(p, [Cells(p), capacity, Samples(p), Quality(p)])
        return index(p, capacity.result or {}, out)


def index(p: Prepared, capacity: dict[str, Any], out: Path | None = None) -> dict[str, Any]:
    """The variant's index over every block's cells, its probes and its capacity rows, written to ``out``."""
    job = p.job
    # A reused cell was made with settings equal for it (cell_spec_hash): it stands for the current config.
    stamp = {"config_hash": job.config_hash}
    cells = [json.loads((job.out_dir / f"{c.name}.json").read_text()) for c in p.cells]
    idx = {"variant": p.base, "config_hash": job.config_hash,
           "cells": [{**r, **stamp} for r in cells + capacity.get("probes", [])],
           "capacity": [{**r, **stamp} for r in capacity.get("capacity", [])]}
    write_json(out or job.out_dir / CELLS_INDEX, idx)
    return idx


def run_stage(a: StageArgs) -> None:
    """``bakeoff stage serve-load``: the job from the rule's spec, after the ECC gate."""
    job = ServeJob.from_stage_args(a)
    ecc_gate(job.hardware, job.doctor)
    run(job, out=Path(a.out))
