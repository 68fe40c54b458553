"""The wall time a cluster is asked for, per serving job: from the job's own cells, never one figure for all.

Why per job: on Slurm an experiment's serving jobs are one group job (one node for the whole comparison), and
Snakemake asks for the sum of its chained jobs' ``runtime`` (``GroupResources.basic_layered``: runtime adds
across the group's layers, memory and CPUs take the largest). A fixed 480 minutes a job made ``blog_v100``'s
21 serving jobs ask for 168 hours. Sized by what each job serves, the group asks for the jobs' own times.

The budget of one job, in minutes: a server start, a share per load cell, quality scoring on the variant's last
block (``serve_load``), and the capacity searches where ``load.mode`` is capacity. The shares are bounds for a
7B model on one data-centre GPU, with margin: on an H100, one vLLM block (start-up, then c=1 and c=8 cells at
prompt 1024) took about 3 minutes and a llama.cpp block 2 min 24 s (runs/h100-seed-p1024-2026-12-06); a cell of
100 requests of 256 tokens at c=1 is about 5 minutes at 90 tokens/s. Slurm cancels a group past its time limit,
and the rerun redoes the jobs without outputs; on a slower box, give the serving rules a ``runtime`` with
``--set-resources`` (every job of the rule then asks for that).
"""

from __future__ import annotations

import math

from bakeoff.config.schema import Config

START_MIN = 15  # engine start-up (vLLM: model load, CUDA graphs; its startup_timeout_s is 10 min) and warm-up
CELL_MIN = 6  # one load cell: up to 100 requests of 256 tokens at c=1 with margin; higher concurrency is quicker
QUALITY_MIN = 30  # lm-eval perplexity and tasks, top-k logprobs for KL, samples: the variant's last block only
PROBE_MIN = CELL_MIN  # one capacity probe: at least min_requests requests, like a cell
CONCURRENCY_PROBES = 14  # the concurrency search's most probes up to max_concurrency 64 (bakeoff.loadgen.capacity)
RATE_PROBES = 8  # the rate search's default cap


def serve_minutes(cfg: Config, engine: str, fmt: str, *, last_block: bool) -> int:
    """Minutes one serving job of ``engine``-``fmt`` may take: its cells (and, on its last block, quality and
    capacity searches), as the module's docstring sizes them."""
    load, _ = cfg.load.for_variant(cfg.engines[engine].load, fmt)
    minutes = START_MIN + CELL_MIN * len(load.concurrency) * len(load.prompt_len)
    if last_block:
        minutes += QUALITY_MIN if cfg.eval.tasks else 0
        if load.mode == "capacity":
            cap = load.capacity
            prompts = len(cap.prompt_len or load.prompt_len)
            concurrency = cap.max_probes or max(CONCURRENCY_PROBES, math.ceil(math.log2(cap.max_concurrency)) * 2 + 2)
            rate = (cap.max_probes or RATE_PROBES) if cap.rate else 0
            minutes += PROBE_MIN * len(cap.slo) * prompts * (concurrency + rate)
    return minutes
