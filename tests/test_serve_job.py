"""The serving job the stage runs is the one the config describes: spec file -> ``ServeJob.from_spec``.

The Snakefile writes each variant's config slice to a spec file; the stage rebuilds a typed job from it.
A field dropped or renamed on either side would silently fall back to a default, so this reads the specs
a dry run of the ``blog_v100`` experiment names (GPU hardware, SLOs, the open-loop engine, per-format request
counts) and compares every job with the composed config.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from bakeoff.composition.compose import load_config
from bakeoff.serving.job import ServeJob

from conftest import ROOT, snakemake

SERVE = re.compile(r"bakeoff stage serve-(?:load|block) --spec '?@([^ ']+)'? --format (\S+)")


def test_every_variants_job_is_its_configs_slice() -> None:
    plan = snakemake("-n", "-p", "--cores", "1", "results/summary.csv", "--config", "experiment=blog_v100").stdout
    jobs = SERVE.findall(plan)
    cfg = load_config(["experiment=blog_v100"])
    # one job per variant and block (load.repeats blocks, bakeoff.loadgen.blocks)
    assert len(jobs) == len(cfg.variants()) * cfg.load.repeats
    seen = set()
    slots = set()
    for spec_file, fmt in jobs:
        job = ServeJob.from_spec(json.loads((ROOT / spec_file).read_text()), fmt=fmt, model_dir=Path("m"),
                                 tokenizer_dir=Path("t"), out_dir=Path("o"))
        seen.add((job.engine_name, job.fmt))
        slots.add((job.engine_name, job.fmt, job.block))
        assert job.block is not None and job.order is not None
        engine = cfg.engines[job.engine_name]
        assert job.engine_cfg == engine and job.hardware == cfg.hardware and job.doctor == cfg.doctor
        assert job.eval_cfg == cfg.eval and job.experiment == "blog_v100" and job.model == cfg.model.name
        assert job.load == cfg.load  # an engine's own load overrides travel in engine_cfg.load
        assert job.slos_ms == (cfg.load.slo_ms.as_dict() or None) and job.synthetic is False
    assert seen == set(cfg.variants())
    assert slots == {(e, f, b) for e, f in cfg.variants() for b in range(cfg.load.repeats)}
