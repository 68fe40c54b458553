"""Stage: one earlier block of a variant (``load.repeats`` > 1): its cells on a fresh server, nothing else.

Why its own job: a block runs every variant once, in the schedule's order (bakeoff.loadgen.blocks), so a
variant's repeats are separate server starts interleaved with the other variants'. The variant's last
block is bakeoff.stages.serve_load's job, which also serves the samples and the quality score and writes
``cells.json`` over every block. This one writes ``block-<b>.json``: the index of its own cells.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bakeoff.config.stageargs import StageArgs
from bakeoff.engines.session import stop_on_signals
from bakeoff.errors import BakeoffError
from bakeoff.hardware.doctor import ecc_gate
from bakeoff.models.artifacts import atomic_write_text
from bakeoff.serving.job import ServeJob
from bakeoff.serving.steps import Cells, serve
from bakeoff.serving.variant import prepare


def run(job: ServeJob, out: Path) -> dict[str, Any]:
    """Run the pending cells of ``job.block``; returns the block's index, written to ``out``."""
    if job.block is None:
        raise BakeoffError("serve-block needs the job's block (its spec has none)")
    with stop_on_signals(job.launcher_pid):
        p = prepare(job)
        if job.block >= p.load.repeats - 1:
            raise BakeoffError(f"block {job.block} is {job.engine_name}-{job.fmt}'s last of {p.load.repeats}: "
                               "serve-load runs it")
        serve(p, [Cells(p)])
    index = {"variant": p.base, "block": job.block, "config_hash": job.config_hash,
             "cells": [json.loads((job.out_dir / f"{c.name}.json").read_text()) for c in p.mine]}
    atomic_write_text(out, json.dumps(index, indent=2, default=str) + "\n")
    return index


def run_stage(a: StageArgs) -> None:
    """``bakeoff stage serve-block``: the job from the rule's spec, after the ECC gate."""
    job = ServeJob.from_stage_args(a)
    ecc_gate(job.hardware, job.doctor)
    run(job, out=Path(a.out))
