"""What every serving job sets up before its first server start: the checked load, the tokenizer, the session,
the cell records' common fields and the variant's cells.

Why its own module: the last block's job (bakeoff.stages.serve_load) and an earlier block's
(bakeoff.stages.serve_block) set up the same way, and every step of bakeoff.serving.steps reads what this
builds; nothing here starts a server.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from bakeoff.config.schema import LoadCfg
from bakeoff.engines import ServerSpec, get_engine
from bakeoff.engines.session import Session
from bakeoff.layout import SERVER_LOG, variant_name
from bakeoff.loadgen.cells import Cell, cell_spec_hash, cells_of, check_load_before_start
from bakeoff.models.manifest import verify
from bakeoff.serving import capacity
from bakeoff.serving.job import ServeJob


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
    job: ServeJob  # the job, its llama.cpp slots sized for a capacity search (capacity.sized_engine)

    @property
    def variant(self) -> str:
        return variant_name(self.job.engine_name, self.job.fmt)

    @property
    def last_block(self) -> bool:
        """This job runs the variant's last block (or every block): the one that also searches and scores."""
        return self.job.block is None or self.job.block == self.load.repeats - 1


def prepare(job: ServeJob) -> Prepared:
    """Check the load and the inputs, and build the cell records' common fields."""
    from transformers import AutoTokenizer

    engine_cfg, out_dir, fmt = job.engine_cfg, job.out_dir, job.fmt
    load, load_note = job.load.for_variant(engine_cfg.load, fmt)
    check_load_before_start(load, get_engine(engine_cfg.plugin).request_context(engine_cfg.settings))
    manifest = verify(job.model_dir)
    verify(job.tokenizer_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(job.tokenizer_dir)
    variant = variant_name(job.engine_name, fmt)
    engine_cfg, parallel_set_by = capacity.sized_engine(job, load)
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
    return Prepared(load, manifest, tokenizer, spec, Session(spec, engine_cfg.plugin), base, cells, mine,
                    replace(job, engine_cfg=engine_cfg))
