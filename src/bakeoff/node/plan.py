"""``bakeoff node plan``: the GPU-node minutes an experiment will take, before any GPU is used.

Why: a comparison must come from one node, and a node is held for at most 30 minutes, in calls of at most 10
(docs/development.md, "A remote GPU node"). Every GPU item of issue 45's round was stopped by GPU time; a plan
made before the run says whether the run fits one node, and what to cut where it does not.

**What the plan counts** (each term, and why it is there):

* **prepare call** -- the node's start and ``node.sh --prepare``, which returns at once: 1.5 minutes
  (``PREPARE_CALL_S``; docs/development.md measured 1 to 2 on an H100, 2026-12-06; no record file holds it).
* **vLLM parts transfer calls** -- one call a part where vLLM is carried (docs/node-route-vllm.md), each under a
  minute, the last with the 31 s install (``PART_CALL_S``, ``INSTALL_S``; the same page); the part count is
  ``build/node-vllm/manifest.json``'s where it is packed here.
* **background: models and the llama.cpp CUDA build** -- what ``--prepare`` starts (``bundle.PREPARE_RULES``):
  the model rules and the build, one after the other, from the records' benchmark files
  (``logs/bench/**.tsv`` in each ``node-results.tgz``). They run beside the part calls; the first run call
  waits for what is left of them (``wait``), inside its own 9 minutes.
* **server starts** -- a serving job's time beyond its cells and probes: the engine's start (``startup_s`` of
  the cells it served) and the job's own overhead (the Python process, the tokenizer, the stop: the job's
  logged time less its cells, probes and start, over the records' finished jobs). A vLLM format's first start on
  a node compiles its CUDA graphs and is slower than the later ones (the compile cache): the two are rated
  apart. A job cut off by a call's limit starts its server again in the next call (a later start).
* **fixed cells** -- ``requests / c`` waves of one request's end-to-end latency (TTFT + output_len x TPOT at
  that c), after one wave of warm-up requests at their own concurrency (the first cell of a server warms every
  llama.cpp slot); a ramped start (``load.start: ramp``) sends ``c`` more (bakeoff.loadgen.cellload.ramp_extra).
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
  variant) and says so. Synthetic weights are never scored (0).
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
roofline alone, a lower bound. The roofline of one decode step at c is the weights' bytes over the bandwidth
(bakeoff.results.roofline.decode_ceiling, the hardware config's ``mem_bandwidth_gbs``) plus the KV cache the c
sequences read (at the prompt plus half the output), and at least c tokens' FLOPs at the peak. Why the sum and
not a ratio: llama.cpp's step is mostly not weight reading (0.28 of the roofline for q4_k_m), and its TPOT is
about the same on an H100 and an H200, which a bandwidth ratio would move by 42 %. A TTFT is carried over as
measured (same variant, then another GPU, then another format), else the roofline's prefill of c prompts.
Between measured concurrencies rates are interpolated linearly, beyond them extrapolated from the nearest two.

**What it cannot know.** A probe's verdict is predicted from the records' p99s, all measured with a burst start:
a ramped start has lower TTFTs, so under a ramp the predicted capacity (and with it where the probes fall) may
be low. A search's probe count is the one its own code takes against those predictions; the budget line bounds
it. The prepare and part calls' minutes are docs/development.md's, not any record's. Nodes differ: the records'
first vLLM start took 97 to 146 s on three H100s.

**Checked against the records** (``check_record``, ``record_section``): a record's config is re-planned from its
call logs' ``--config`` entries, ``hardware=auto`` as its ``hardware.json`` resolves it, and what its capacity
search ran with where today's defaults differ (``as_run``), with rates from the other records only; each job
of its call logs is set beside the plan's seconds for the work that job did. tests/test_node_plan.py holds the
plan within 25 % of every record that can be re-planned.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import shlex
import tarfile
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bakeoff.composition.compose import find_conf_dir, load_config
from bakeoff.composition.walltime import QUALITY_MIN
from bakeoff.config.schema import Config, LoadCfg
from bakeoff.config.slo import SLO_PRESETS, Slo
from bakeoff.engines import get_engine
from bakeoff.errors import BakeoffError
from bakeoff.layout import NODE_VLLM_DIR, NODE_VLLM_SITE, cell_name, is_cell_stem
from bakeoff.loadgen.blocks import schedule
from bakeoff.loadgen.capacity import Verdict, bracket_from_cells, probe_requests, probes_needed, search_concurrency
from bakeoff.loadgen.cells import requests_for, warmup_for
from bakeoff.models.weights import GIB
from bakeoff.node.readme import Call, read_calls
from bakeoff.results.roofline import decode_ceiling

CALL_S = 540  # Snakemake's time in one run call: node.sh's BAKEOFF_NODE_TIMEOUT_S default
NODE_S = 25 * 60  # what a plan must fit: a node is held for at most 30 minutes; 5 are left for what goes wrong
PREPARE_CALL_S = 90  # the node's start and the --prepare call: 1 to 2 minutes (docs/development.md, H100)
PART_CALL_S = 60  # one part's transfer call: under a minute (docs/development.md)
INSTALL_S = 31  # the last part's call installs vLLM (docs/development.md)
PREPARE_GIVES_UP_S = 90  # node.sh stops waiting for the background prepare with this much of its budget left
DEFAULT_PARTS = 6  # runs/h100-seed-p1024-2026-12-06 carried vLLM 0.24.0 in six parts
DEFAULT_CALL_GAP_S = 20.0  # where no record has two calls: the records' gaps were 18-28 s
DEFAULT_JOB_OVERHEAD_S = 20.0  # a serving job's own time beyond its server's start: the records' 15-26 s
DEFAULT_BUILD_S = 390.0  # issue 45: llama.cpp's CUDA build takes about 6.5 minutes of a node's CPUs
DEFAULT_JOB_S = 30.0  # a model rule no record ran: an assumption, said so
FAIL_SHARE = 1.0  # where no record has a failing probe: a failing probe runs all its requests
CARRIED = ".gpucarry"  # the bundle folder the node route carries (docs/node-route-vllm.md)

# The plan's terms, in the order it prints them.
TERMS = {
    "prepare": "prepare call (the node's start, node.sh --prepare)",
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
# Bits a weight by format, for a model no record served (its n_params from its shape).
BITS = {"F16": 16.0, "BF16": 16.0, "Q8_0": 8.5, "Q4_K_M": 4.84, "Q4_0": 4.5, "fp16": 16.0, "fp8": 8.3,
        "fp8_online": 8.3, "fp8_dequant": 16.0}
CHECK_RULES = ("gpu_check", "kernel_bench", "ecc_recheck", "node")


class PlanError(BakeoffError):
    """The plan cannot be made (a rate no record and no roofline gives)."""


# --------------------------------------------------------------------------- what the records measured
@dataclass(frozen=True)
class Obs:
    """One cell or probe a record measured."""

    record: str
    gpu: str
    bandwidth_gbs: float | None
    model: str
    engine: str
    plugin: str
    fmt: str
    name: str
    prompt: int
    c: int
    started: float
    seconds: float
    probe: bool
    values: Mapping[str, float]  # median/p99 TTFT/TPOT ms where measured
    startup_s: float | None
    weight_bytes: float | None
    fail_share: float | None  # a failing probe: the share of its requests it ran before it stopped


@dataclass(frozen=True)
class StartObs:
    """One serving job's start: the engine's own start and, for a finished job, the job's other time."""

    record: str
    gpu: str
    plugin: str
    first: bool  # the first start of this variant on the node (vLLM compiles its graphs)
    startup_s: float
    other_s: float | None


@dataclass
class Record:
    """What planning reads from one record folder (runs/<name>/)."""

    name: str
    folder: Path
    gpu: str
    bandwidth_gbs: float | None
    obs: list[Obs]
    calls: list[Call]
    bench: dict[tuple[str, ...], float]  # ("build",), ("model", model, format) -> seconds
    kv_tokens: dict[tuple[str, str], list[int]]  # (engine, format) -> vLLM's KV cache sizes
    quality_s: list[float]
    starts: list[StartObs] = field(default_factory=list)


def _plugin(rec: Mapping[str, Any]) -> str:
    """The engine plugin of a cell: its version names llama.cpp's builds; an engine entry's name starts with its
    plugin's (``llamacpp_cacheram``)."""
    if str(rec.get("engine_version", "")).startswith("llama.cpp") or str(rec.get("engine", "")).startswith("llamacpp"):
        return "llamacpp"
    return str(rec.get("engine", ""))


def _obs(name: str, gpu: str, bw: float | None, rec: Mapping[str, Any]) -> Obs | None:
    if not rec.get("started_utc") or not rec.get("ended_utc") or not rec.get("concurrency"):
        return None
    cell = str(rec.get("cell") or cell_name(rec["concurrency"], rec["prompt_len"], rec.get("repeat")))
    values = {k: float(rec[k]) for k in ("median_tpot_ms", "p99_tpot_ms", "median_ttft_ms", "p99_ttft_ms")
              if isinstance(rec.get(k), (int, float)) and rec[k] > 0 and (rec.get("completed") or 0) > 0}
    failed = rec.get("probe_passed") is False and rec.get("requests")
    return Obs(name, gpu, bw, str(rec.get("model", "")), str(rec["engine"]), _plugin(rec), str(rec["format"]), cell,
               int(rec["prompt_len"]), int(rec["concurrency"]), float(rec["started_utc"]),
               float(rec["ended_utc"]) - float(rec["started_utc"]), cell.startswith("cap-"), values,
               rec.get("startup_s"), rec.get("weight_bytes"),
               float(rec.get("completed") or 0) / float(rec["requests"]) if failed else None)


def _bench_key(path: str) -> tuple[str, ...] | None:
    """A benchmark file's job: the llama.cpp build, or a model's format (``source``: the model itself)."""
    if re.search(r"logs/bench/build/llamacpp/[^/]+\.tsv$", path):
        return ("build",)
    if m := re.search(r"logs/bench/models/([^/]+)/([^/]+)\.tsv$", path):
        return ("model", m.group(1), m.group(2))
    return None


def _read_tarball(tgz: Path, name: str, gpu: str, bw: float | None) -> tuple[list[Obs], dict, dict, list[float]]:
    obs: list[Obs] = []
    bench: dict[tuple[str, ...], float] = {}
    logs: dict[str, str] = {}
    quality: list[float] = []
    with tarfile.open(tgz) as tar:
        for m in tar.getmembers():
            if not m.isfile() or "/kept/" in m.name:
                continue
            stem = Path(m.name).stem
            if m.name.startswith("results/raw/") and m.name.endswith(".json") and is_cell_stem(stem):
                if (o := _obs(name, gpu, bw, json.load(tar.extractfile(m)))) is not None:  # type: ignore[arg-type]
                    obs.append(o)
            elif m.name.endswith("/quality.json"):
                q = json.load(tar.extractfile(m))  # type: ignore[arg-type]
                if q.get("status") == "ok" and q.get("eval_s"):
                    quality.append(float(q["eval_s"]))
            elif m.name.endswith("/server.log"):
                logs[str(Path(m.name).parent)] = tar.extractfile(m).read().decode(errors="replace")  # type: ignore[union-attr]
            elif (key := _bench_key(m.name)) is not None:
                rows = tar.extractfile(m).read().decode().splitlines()  # type: ignore[union-attr]
                if len(rows) > 1:
                    bench[key] = float(rows[1].split("\t")[0])
    kv: dict[tuple[str, str], list[int]] = defaultdict(list)
    variants = {(o.engine, o.fmt) for o in obs}
    for folder, text in logs.items():
        sizes = [int(s.replace(",", "")) for s in re.findall(r"KV cache size: ([\d,]+) tokens", text)]
        key = next(((e, f) for (e, f) in variants if folder.endswith(f"/{e}-{f}")), None)
        if sizes and key is not None:
            kv[key] += sizes
    return obs, bench, dict(kv), quality


def load_record(folder: Path) -> Record | None:
    """The record in ``folder``, or None where it has no node tarball (a probe's notes, not a run)."""
    tgz = folder / "node-results.tgz"
    if not tgz.is_file():
        return None
    hw = json.loads((folder / "hardware.json").read_text()) if (folder / "hardware.json").is_file() else {}
    gpus = hw.get("gpus") or []
    gpu = str(gpus[0].get("name", "")) if gpus else ""
    bw = (gpus[0].get("mem_bandwidth_gbs") if gpus else None) or (hw.get("hardware_config") or {}).get("mem_bandwidth_gbs")
    obs, bench, kv, quality = _read_tarball(tgz, folder.name, gpu, bw)
    rec = Record(folder.name, folder, gpu, bw, obs, read_calls(folder), bench, kv, quality)
    rec.starts = _starts(rec)
    return rec


def _window(job_start: float, job_end: float, o: Obs) -> bool:
    return job_start - 1 <= o.started <= job_end + 1  # the logs' stamps are whole seconds


def _starts(rec: Record) -> list[StartObs]:
    """Each serving job's start, in the record's call order: the first of a variant on the node or a later one."""
    seen: set[tuple[str, str]] = set()
    out: list[StartObs] = []
    for call in rec.calls:
        for job in call.jobs:
            if not job.rule.startswith("serve_"):
                continue
            key = (job.wildcards.get("engine", ""), job.wildcards.get("format", ""))
            s, e = job.started.timestamp(), (job.ended or call.ended).timestamp()
            inside = [o for o in rec.obs if (o.engine, o.fmt) == key and _window(s, e, o)]
            ups = [float(o.startup_s) for o in inside if o.startup_s is not None]
            if not inside or not ups:
                continue  # nothing measured: its cells were kept, or it stopped before its first
            busy = sum(o.seconds for o in inside)
            other = e - s - busy - max(ups) if job.outcome == "finished" else None
            out.append(StartObs(rec.name, rec.gpu, inside[0].plugin, key not in seen, max(ups), other))
            seen.add(key)
    return out


def load_records(runs: Path, exclude: Iterable[str] = ()) -> list[Record]:
    """Every record under ``runs`` with a node tarball, but those named in ``exclude``."""
    skip = set(exclude)
    out = []
    for folder in sorted(p for p in runs.iterdir() if p.is_dir() and p.name not in skip):
        if (rec := load_record(folder)) is not None:
            out.append(rec)
    return out


# --------------------------------------------------------------------------- rates
@dataclass(frozen=True)
class Rate:
    value: float
    source: str


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs)


def _interp(points: Sequence[tuple[float, float]], x: float) -> float:
    """Piecewise linear through ``points`` (sorted by x); beyond them, the nearest two's line; one point: flat."""
    if len(points) == 1:
        return points[0][1]
    i = 1
    while i < len(points) - 1 and points[i][0] < x:
        i += 1
    (x0, y0), (x1, y1) = points[i - 1], points[i]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


def _short(gpu: str) -> str:
    return re.sub(r"^NVIDIA\s+", "", gpu).split()[0] if gpu else "unknown GPU"


@dataclass
class Rates:
    """The rates of one planned config: its GPU model, model and formats, from the records (module docstring)."""

    cfg: Config
    records: list[Record]

    def __post_init__(self) -> None:
        self.gpu = self.cfg.hardware.gpu_model or ""
        self.bandwidth = float(self.cfg.hardware.mem_bandwidth_gbs or 0.0)
        self.model = self.cfg.model.name
        self.kv_bytes = kv_bytes_per_token(self.cfg)
        self.n_params = self._n_params()
        self.obs = [o for r in self.records for o in r.obs if o.model == self.model]

    def same(self, gpu: str) -> bool:
        return bool(self.gpu) and gpu == self.gpu

    def names(self, recs: Iterable[str]) -> str:
        return ", ".join(sorted(set(recs)))

    # ----- weights
    def _n_params(self) -> float | None:
        """The model's parameters from its shape (embeddings, attention, MLP); None where it states none."""
        shape = self.cfg.model.synthetic
        if shape is not None:
            kv_dim = shape.n_embd // shape.n_head * shape.n_head_kv
            layer = 2 * shape.n_embd * shape.n_embd + 2 * shape.n_embd * kv_dim + 3 * shape.n_embd * shape.n_ff
            return float(2 * shape.n_vocab * shape.n_embd + shape.n_layer * layer)
        return None

    def weight_bytes(self, fmt: str) -> Rate | None:
        """The format's weight bytes: as the records served it, else the model's parameters at its bits a weight."""
        served = [float(o.weight_bytes) for o in self.obs if o.fmt == fmt and o.weight_bytes]
        if served:
            return Rate(_mean(served), "records")
        q = self.cfg.formats.get(fmt)
        bits = BITS.get(str(q.gguf_type).upper() if q and q.gguf_type else "") or (BITS.get(q.method) if q else None)
        if self.n_params and bits:
            return Rate(self.n_params * bits / 8.0, f"{bits:g} bits a weight")
        return None

    # ----- the roofline
    def roof_tpot_ms(self, bw: float | None, weight: float | None, c: int, prompt: int) -> float | None:
        """One decode step's roofline at c (module docstring), in ms; None without bandwidth or weight bytes."""
        if not bw or not weight:
            return None
        step = 1.0 / decode_ceiling(bw, weight)
        if self.kv_bytes:
            step += c * self.kv_bytes * (prompt + self.cfg.load.output_len / 2) / (bw * 1e9)
        peak = self.cfg.hardware.peak_tflops_fp16
        if peak and self.n_params:
            step = max(step, c * 2.0 * self.n_params / (peak * 1e12))
        return 1000.0 * step

    def roof_ttft_ms(self, c: int, prompt: int) -> float:
        peak = self.cfg.hardware.peak_tflops_fp16
        return 1000.0 * c * prompt * 2.0 * self.n_params / (peak * 1e12) if peak and self.n_params else 0.0

    # ----- TPOT and TTFT at a concurrency
    def _groups(self, engine: str, plugin: str, fmt: str, prompt: int) -> list[tuple[str, list[Obs]]]:
        """The records' measurements of this prompt length, nearest first (module docstring: Rates)."""
        mine = [o for o in self.obs if o.prompt == prompt and o.plugin == plugin]
        tiers: list[Callable[[Obs], bool]] = [
            lambda o: self.same(o.gpu) and o.engine == engine and o.fmt == fmt,  # this variant
            lambda o: self.same(o.gpu) and o.fmt == fmt,  # this format on another engine entry of the plugin
            lambda o: o.engine == engine and o.fmt == fmt,  # this variant on another GPU
            lambda o: o.fmt == fmt,
            lambda o: self.same(o.gpu),  # another format
            lambda o: True,
        ]
        out = []
        for keep in tiers:
            by: dict[tuple[str, str, str], list[Obs]] = defaultdict(list)
            for o in mine:
                if keep(o):
                    by[(o.gpu, o.engine, o.fmt)].append(o)
            if by:
                (g, e, f), group = max(by.items(), key=lambda kv: (len({o.c for o in kv[1]}), len(kv[1])))
                label = "this variant" if (e, f) == (engine, fmt) else f"{e}-{f}"
                out.append((label if self.same(g) else f"{label} on {_short(g)}", group))
        return out

    def metric(self, what: str, engine: str, plugin: str, fmt: str, prompt: int, c: int) -> Rate:
        """``median_tpot_ms``, ``p99_tpot_ms``, ``median_ttft_ms`` or ``p99_ttft_ms`` at c (module docstring)."""
        tpot = what.endswith("tpot_ms")
        weight = self.weight_bytes(fmt)
        for label, group in self._groups(engine, plugin, fmt, prompt):
            pts: dict[int, list[float]] = defaultdict(list)
            for o in group:
                if what not in o.values:
                    continue
                if tpot:
                    roof = self.roof_tpot_ms(o.bandwidth_gbs, o.weight_bytes, o.c, prompt)
                    if roof is None or weight is None:
                        continue
                    pts[o.c].append(o.values[what] - roof)
                else:
                    pts[o.c].append(o.values[what])
            if not pts:
                continue
            points = sorted((float(k), _mean(v)) for k, v in pts.items())
            cs = sorted(pts)
            where = (f"{_short(group[0].gpu)} records ({self.names(o.record for o in group)}): {label}, "
                     f"p{prompt} at c={cs[0]}" + (f"–{cs[-1]}" if len(cs) > 1 else ""))
            if not tpot:
                return Rate(max(_interp(points, c), 0.0), where)
            roof_here = self.roof_tpot_ms(self.bandwidth, weight.value if weight else None, c, prompt)
            assert roof_here is not None
            return Rate(roof_here + max(_interp(points, c), 0.0), where + " (its time beyond its roofline)")
        if tpot:
            roof_here = self.roof_tpot_ms(self.bandwidth, weight.value if weight else None, c, prompt)
            if roof_here is None:
                raise PlanError(f"no rate for {engine}-{fmt} at prompt {prompt}: no record measured it, and the "
                                f"roofline needs the hardware's mem_bandwidth_gbs and the format's weight bytes")
            return Rate(roof_here, "roofline alone (a lower bound)")
        return Rate(self.roof_ttft_ms(c, prompt), "roofline prefill alone (a lower bound)")

    def e2el_s(self, engine: str, plugin: str, fmt: str, prompt: int, c: int) -> float:
        """One request's end-to-end seconds at concurrency c: TTFT + output_len x TPOT."""
        ttft = self.metric("median_ttft_ms", engine, plugin, fmt, prompt, c).value
        tpot = self.metric("median_tpot_ms", engine, plugin, fmt, prompt, c).value
        return (ttft + self.cfg.load.output_len * tpot) / 1000.0

    # ----- starts and jobs
    def start(self, plugin: str, first: bool) -> Rate:
        """A serving job's start (module docstring: server starts)."""
        starts = [s for r in self.records for s in r.starts if s.plugin == plugin]
        up: Rate | None = None
        for where, keep in (("", lambda s: self.same(s.gpu) and s.first == first),
                            (" (any start)", lambda s: self.same(s.gpu)),
                            (" on another GPU", lambda s: s.first == first),
                            (" on another GPU (any start)", lambda s: True)):
            chosen = [s for s in starts if keep(s)]
            if chosen:
                gpus = _short(chosen[0].gpu) if where.startswith(" on") else _short(self.gpu)
                up = Rate(_mean([s.startup_s for s in chosen]), f"{plugin} {'first' if first else 'later'} start"
                          f"{where}, {gpus} records ({self.names(s.record for s in chosen)})")
                break
        other = [s.other_s for s in starts if s.other_s is not None]
        rest = _mean(other) if other else DEFAULT_JOB_OVERHEAD_S
        if up is None:
            return Rate(60.0 + rest, f"{plugin}: no record started it (assumed 60 s)")
        return Rate(up.value + rest, up.source + f" + {rest:.0f} s job overhead")

    def job(self, key: tuple[str, ...], default: float = DEFAULT_JOB_S) -> Rate:
        """A non-serving job's seconds: benchmark files (build, models), else call logs (checks)."""
        for where, recs in (("", [r for r in self.records if self.same(r.gpu)]), (" (other GPUs)", self.records)):
            got = [(r.name, s) for r in recs for s in self._job_times(r, key)]
            if got:
                return Rate(_mean([s for _, s in got]), f"records{where}: {self.names(n for n, _ in got)}")
        return Rate(default, "no record (assumed)")

    @staticmethod
    def _job_times(r: Record, key: tuple[str, ...]) -> list[float]:
        if key in r.bench:
            return [r.bench[key]]
        if key[0] in ("build", "model"):
            return []
        rule, fmt = key[0], key[1] if len(key) > 1 else None
        return [(j.ended - j.started).total_seconds() for c in r.calls for j in c.jobs
                if j.rule == rule and j.outcome == "finished" and j.ended is not None
                and (fmt is None or j.wildcards.get("format") == fmt)]

    def call_gap(self) -> Rate:
        gaps = [(b.started - a.ended).total_seconds() for r in self.records
                for a, b in zip(r.calls, r.calls[1:], strict=False) if a.elapsed_s is not None]
        gaps = [g for g in gaps if 0 <= g < 120]
        if gaps:
            names = self.names(r.name for r in self.records if len(r.calls) > 1)
            return Rate(_mean(gaps), f"gaps between calls, records {names}")
        return Rate(DEFAULT_CALL_GAP_S, "no record with two calls (assumed)")

    def fail_share(self) -> Rate:
        failing = [o for o in self.obs if o.fail_share is not None]
        if failing:
            return Rate(_mean([o.fail_share or 0.0 for o in failing]),
                        f"failing probes of records {self.names(o.record for o in failing)}")
        return Rate(FAIL_SHARE, "no record has a failing probe")

    def kv_tokens(self, engine: str, fmt: str, weight: float | None) -> Rate | None:
        """vLLM's KV cache in tokens: its server logs on this GPU model, else GPU memory x utilisation less the
        weights, over the KV bytes a token."""
        sizes = [s for r in self.records if self.same(r.gpu) for s in r.kv_tokens.get((engine, fmt), [])]
        if sizes:
            return Rate(_mean(sizes), "server logs")
        hw = self.cfg.hardware
        util = float(self.cfg.engines[engine].settings.get("gpu_memory_utilization") or 0.9)
        if hw.gpu_memory_gib and weight and self.kv_bytes:
            return Rate((hw.gpu_memory_gib * GIB * max(1, hw.gpus) * util - weight) / self.kv_bytes, "GPU memory")
        return None

    def quality(self) -> Rate:
        got = [(r.name, s) for r in self.records if self.same(r.gpu) for s in r.quality_s]
        if got:
            return Rate(_mean([s for _, s in got]), f"quality.json eval_s, records {self.names(n for n, _ in got)}")
        return Rate(QUALITY_MIN * 60.0, "no record scored quality on this GPU: bakeoff.composition.walltime's bound")


def kv_bytes_per_token(cfg: Config) -> float | None:
    """KV cache bytes one token takes (f16 keys and values) from the model's shape; None where it has none."""
    s = cfg.model.synthetic
    if s is None:
        return None
    return float(s.n_layer * s.n_head_kv * (s.n_embd // s.n_head) * 2 * 2)


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


def background_jobs(rates: Rates) -> list[Job]:
    """What ``node.sh --prepare`` runs in the background: the model rules and the llama.cpp build."""
    cfg = rates.cfg
    out = []
    src = rates.job(("model", cfg.model.name, "source"))
    out.append(Job("fetch_model", "the model's source", [Item("models", "fetch_model", src.value, src.source)]))
    for fmt in cfg.needed_formats():
        rule = MODEL_RULES.get(cfg.formats[fmt].method, cfg.formats[fmt].method)
        r = rates.job(("model", cfg.model.name, fmt))
        out.append(Job(rule, f"{rule} {fmt}", [Item("models", f"{rule} {fmt}", r.value, r.source)], fmt=fmt))
    if cfg.toolchain is not None and _llamacpp_formats(cfg):
        b = rates.job(("build",), DEFAULT_BUILD_S)
        out.append(Job("build_llamacpp", "llama.cpp CUDA build", [Item("build", "build_llamacpp", b.value, b.source)]))
    return out


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
            unfit.append(f"{job.label}: {item.label} ({_m(item.seconds)} min) does not fit a call's "
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
            if " --part " in c.command:
                out["parts"] += c.seconds
                continue
            out["wait"] += c.wait_s
            out["lost"] += c.lost_s
            for _, i in c.items:
                out[i.term] += i.seconds
            out["overhead"] += c.seconds - c.wait_s - c.snakemake_s - c.lost_s
        return out

    def worst_extra_s(self) -> float:
        """The minutes every search would add if it took its whole budget (probes_needed + 2), at its mean probe."""
        return sum((s.budget - len(s.probes)) * s.seconds / len(s.probes) for s in self.searches if s.probes)


def make_plan(overrides: Sequence[str], *, runs: Path | None = None, exclude: Iterable[str] = (),
              records: list[Record] | None = None, repo: Path | None = None, conf_dir: Path | None = None,
              facts: Mapping[str, Any] | None = None) -> Plan:
    """The plan for the config these Hydra overrides compose, with rates from the records under ``runs``
    (``exclude``: records left out, e.g. the one the plan is checked against)."""
    conf = conf_dir or find_conf_dir()
    repo = repo or conf.parent
    cfg = load_config(list(overrides), conf, facts)
    if records is None:
        records = load_records(runs or repo / "runs", exclude)
    else:
        records = [r for r in records if r.name not in set(exclude)]
    rates = Rates(cfg, records)
    background = background_jobs(rates)
    serving, searches = serve_jobs(rates)
    jobs = [*check_jobs(rates, "first"), *serving, *check_jobs(rates, "last")]
    entries = _entries(overrides)
    calls = [NodeCall(1, f"bash {CARRIED}/node.sh --prepare {entries}", PREPARE_CALL_S,
                      ["start the models and the llama.cpp build in the background"])]
    parts = vllm_parts(cfg, repo)
    for k in range(1, (parts[0] if parts else 0) + 1):
        last = parts is not None and k == parts[0]
        calls.append(NodeCall(k + 1, f"bash {NODE_VLLM_DIR}/node.sh --part {NODE_VLLM_DIR}/part-{k:02d}",
                              PART_CALL_S + (INSTALL_S if last else 0), [f"vLLM part {k}" + (", install" if last else "")]))
    elapsed = sum(c.seconds for c in calls)
    wait = max(0.0, PREPARE_CALL_S + sum(j.seconds for j in background) - elapsed)
    while wait > CALL_S - PREPARE_GIVES_UP_S:  # node.sh: "the background prepare is still running: call again"
        spent = CALL_S - PREPARE_GIVES_UP_S
        calls.append(NodeCall(len(calls) + 1, f"bash {CARRIED}/node.sh {entries}", spent, wait_s=spent))
        wait -= spent
    packing = pack(jobs, CALL_S - wait, entries, len(calls) + 1, wait)
    gap = rates.call_gap().value
    for c in packing.calls:
        c.seconds = c.wait_s + c.snakemake_s + c.lost_s + gap
    return Plan(list(overrides), cfg, rates, background, jobs, searches, [*calls, *packing.calls], packing.unfit, parts)


# --------------------------------------------------------------------------- printing
def _m(seconds: float) -> str:
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
            out.append(f"  {label + n:<52} {_m(terms[key]):>6}")
    out.append(f"  {'total':<52} {_m(plan.total_s):>6}")
    bg = ", ".join(f"{j.label} {_m(j.seconds)}" for j in plan.background)
    out += ["", f"Background (node.sh --prepare, beside the part calls): {_m(plan.background_s)} min: {bg}"]
    verdict = "yes" if plan.fits else "no"
    out.append(f"Fits {NODE_S // 60} minutes on one node: {verdict} ({_m(plan.total_s)} min in {len(plan.calls)} calls)")
    if plan.searches:
        worst = plan.total_s + plan.worst_extra_s()
        out.append(f"If every capacity search took its whole budget (probes_needed + 2 re-checks): {_m(worst)} min "
                   f"(fits: {'yes' if worst <= NODE_S and not plan.unfit else 'no'})")
    for u in plan.unfit:
        out.append(f"Does not fit: {u}")
    out += ["", f"Calls (a run call gives Snakemake at most {CALL_S // 60} minutes)"]
    for c in plan.calls:
        inner = f" (Snakemake {_m(c.snakemake_s + c.lost_s)})" if c.snakemake_s or c.lost_s else ""
        out.append(f"  {c.number:>2}  {_m(c.seconds):>4} min{inner}  {c.command}")
        out.append(f"               {_describe(c)}")
    if plan.parts:
        out.append(f"  vLLM parts: {plan.parts[0]}, from {plan.parts[1]}")
    out += ["", "Rates (median TPOT ms at each concurrency; what each came from)"]
    out += _rate_lines(plan)
    return "\n".join(out)


def _describe(c: NodeCall) -> str:
    """What one call does, job by job: ``vllm-fp16 block 0: start 2.8, 3 cells 1.0``; its wait and its loss."""
    if c.does:
        return "; ".join(c.does)
    parts = [f"waits {_m(c.wait_s)} min for the background prepare"] if c.wait_s else []
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
            secs = _m(sum(i.seconds for i in group))
            if term == "probes":
                what += [f"{i.label} {_m(i.seconds)}" for i in group]
            elif term == "cells":
                what.append(f"{len(group)} cell{'s' if len(group) > 1 else ''} {secs}")
            elif term == "start":
                what.append(f"start {secs}")
            elif label != group[0].label:
                what.append(f"{term} {secs}")
        parts.append(label + (f": {', '.join(what)}" if what else ""))
    if c.cut:
        parts.append(f"stopped at its limit in {c.cut} ({_m(c.lost_s)} lost)")
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


# --------------------------------------------------------------------------- a record's plan beside its logs
def record_overrides(folder: Path) -> list[str]:
    """The Hydra overrides a record ran with: its call logs' ``--config`` entries, the same in every call."""
    calls = sorted(folder.glob("call*-snakemake.log")) + sorted(folder.glob("logs/call*-snakemake.log"))
    if not calls:
        raise PlanError(f"{folder.name}: no call<N>-snakemake.log")
    seen = set()
    for p in calls:
        m = re.search(r"--config (.*)$", p.read_text(errors="replace"), re.M)
        if m is None:
            raise PlanError(f"{p.name}: no --config entries")
        seen.add(m.group(1).strip())
    if len(seen) > 1:
        raise PlanError(f"{folder.name}: its calls ran {len(seen)} different configs (the call logs' --config entries "
                        f"differ), so no one config's plan describes it")
    out: list[str] = []
    for token in seen.pop().split():
        key = token.partition("=")[0]
        if out and out[-1].startswith("overrides=") and not re.fullmatch(r"[A-Za-z_]\w*", key):
            out[-1] += " " + token
        else:
            out.append(token)
    hydra: list[str] = []
    for entry in out:
        key, _, value = entry.partition("=")
        hydra += shlex.split(value) if key == "overrides" else [] if key == "hardware" else [entry]
    return [*hydra, "hardware=auto"]


def as_run(folder: Path) -> list[tuple[str, str]]:
    """Overrides that restore what a record's capacity search ran with where today's defaults differ, each with
    why: its rows name the rule, start and resolution, or else predate them (the point rule, a burst start and a
    bisection to adjacent loads were then the only ones); a search at its own maximum shows that maximum."""
    rows: list[Mapping[str, Any]] = []
    notes: list[str] = []
    with tarfile.open(folder / "node-results.tgz") as tar:
        for m in tar.getmembers():
            if m.name.endswith("/capacity.json") and "/kept/" not in m.name:
                rows += json.load(tar.extractfile(m)).get("capacity", [])  # type: ignore[arg-type]
            elif "/cap-" in m.name and m.name.endswith(".json") and "/kept/" not in m.name:
                notes.append(str(json.load(tar.extractfile(m)).get("load_note", "")))  # type: ignore[arg-type]
    if not rows and not notes:
        return []
    rule = next((r["capacity_verdict_rule"] for r in rows if r.get("capacity_verdict_rule")), None)
    named = next((m.group(1) for n in notes if (m := re.search(r"\b(point|confident) rule\b", n))), None)
    out = [(f"++load.capacity.verdict={rule or named or 'point'}",
            "its rows name the rule" if rule else "its probes' notes name the rule" if named else
            "no file names the rule: the probes predate the confident one")]
    start = next((r["capacity_start"] for r in rows if r.get("capacity_start")), None)
    out.append((f"++load.capacity.start={start or 'burst'}", "its rows name the start" if start else
                "no row names a start: every probe then began in a burst"))
    res = next((r["concurrency_resolution"] for r in rows if r.get("concurrency_resolution") not in (None, "")), None)
    out.append((f"++load.capacity.resolution={res if res else 1e-9}", "its rows name the resolution" if res else
                "no row names a resolution: the search then bisected to adjacent loads"))
    tops = [int(r["capacity_concurrency"]) for r in rows
            if r.get("concurrency_at_limit") and r.get("concurrency_limit", "") in ("", "search maximum")]
    if tops:
        out.append((f"++load.capacity.max_concurrency={max(tops)}", "a search stopped at its own maximum"))
    return out


@dataclass
class JobCheck:
    """One job of a record's logs: its planned seconds (for the work it did) beside its logged seconds."""

    call: int
    label: str
    outcome: str
    logged_s: float
    planned_s: float | None
    note: str = ""


@dataclass
class RecordCheck:
    name: str
    overrides: list[str]
    as_run: list[tuple[str, str]]
    plan: Plan
    jobs: list[JobCheck]
    logged_total_s: float

    @property
    def compared(self) -> list[JobCheck]:
        """The jobs with a plan for the work they did (module docstring of the test: what is compared)."""
        return [j for j in self.jobs if j.planned_s is not None]

    @property
    def planned_s(self) -> float:
        return sum(j.planned_s or 0.0 for j in self.compared)

    @property
    def logged_s(self) -> float:
        return sum(j.logged_s for j in self.compared)

    @property
    def error(self) -> float:
        """The plan's relative error over the compared jobs: planned / logged - 1."""
        return self.planned_s / self.logged_s - 1.0


def _serve_planned(plan: Plan, rec: Record, job: Any, call: Call, first: bool) -> tuple[float | None, float, str]:
    """A logged serving job's planned seconds for the work it did, and its logged seconds for that work.

    A finished job: its start, the cells it measured (the plan's seconds for each), the plan's searches where it
    probed, and the plan's quality, against the job's logged time. A job stopped by a call's limit: its start,
    its cells and each probe it finished (the plan's seconds for a probe at that c), against its time up to the
    end of its last cell or probe; what it ran after that was lost at the limit, which the plan has as such.
    """
    e, f = job.wildcards.get("engine", ""), job.wildcards.get("format", "")
    s, end = job.started.timestamp(), (job.ended or call.ended).timestamp()
    inside = [o for o in rec.obs if (o.engine, o.fmt) == (e, f) and _window(s, end, o)]
    logged = max(o.started + o.seconds for o in inside) - s if inside and job.outcome != "finished" else end - s
    mine = [j for j in plan.jobs if j.engine == e and j.fmt == f]
    block = int(job.wildcards["block"]) if "block" in job.wildcards else max((j.block or 0 for j in mine), default=0)
    planned = next((j for j in mine if j.block == block), None)
    if planned is None:
        return None, logged, "not in the plan's config"
    if not inside:
        return None, logged, "nothing measured before its limit: lost"
    cells = {i.label: i.seconds for i in planned.items if i.term == "cells"}
    names = [o.name for o in inside if not o.probe]
    if missing := [n for n in names if n not in cells]:
        return None, logged, f"cells {', '.join(missing)} not in the plan's config"
    total = plan.rates.start(plan.cfg.engines[e].plugin, first).value + sum(cells[n] for n in names)
    probes = [o for o in inside if o.probe]
    if job.outcome == "finished":
        total += sum(i.seconds for i in planned.items if i.term in ("probes", "quality"))
    else:
        load = plan.cfg.load.for_variant(plan.cfg.engines[e].load, f)[0]
        for o in probes:
            slo = re.match(r"cap-([a-z0-9_]+)-c", o.name)
            total += probe_s(plan.rates, e, f, load, SLO_PRESETS[slo.group(1) if slo else "server"], o.prompt, o.c)[1]
    note = f"{len(names)} cells, {len(probes)} probes" + ("" if job.outcome == "finished" else ", to its last")
    return total, logged, note


def _other_planned(plan: Plan, job: Any) -> float | None:
    rates, rule, fmt = plan.rates, job.rule, job.wildcards.get("format")
    if rule == "build_llamacpp":
        return rates.job(("build",), DEFAULT_BUILD_S).value
    if rule == "fetch_model":
        return rates.job(("model", plan.cfg.model.name, "source")).value
    if rule in MODEL_RULES.values() and fmt:
        return rates.job(("model", plan.cfg.model.name, fmt)).value
    if rule in CHECK_RULES:
        return rates.job((rule, fmt) if fmt else (rule,), 5.0).value
    return None


def check_record(folder: Path, *, runs: Path | None = None, records: list[Record] | None = None,
                 repo: Path | None = None) -> RecordCheck:
    """The plan of a record's config, rates from the other records only, beside each job its logs show."""
    overrides = record_overrides(folder)
    extra = as_run(folder)
    facts = json.loads((folder / "hardware.json").read_text())
    plan = make_plan([*overrides, *(o for o, _ in extra)], runs=runs or folder.parent, exclude=[folder.name],
                     records=records, repo=repo, facts=facts)
    rec = load_record(folder)
    assert rec is not None
    seen: set[tuple[str, str]] = set()
    rows: list[JobCheck] = []
    for n, call in enumerate(rec.calls, 1):
        for job in call.jobs:
            logged = ((job.ended or call.ended) - job.started).total_seconds()
            if job.rule.startswith("serve_"):
                key = (job.wildcards.get("engine", ""), job.wildcards.get("format", ""))
                planned, logged, note = _serve_planned(plan, rec, job, call, key not in seen)
                if planned is not None:
                    seen.add(key)
            elif job.outcome == "finished":
                planned, note = _other_planned(plan, job), ""
            else:
                planned, note = None, "stopped at the limit: lost"
            rows.append(JobCheck(n, job.label(), job.outcome, logged, planned, note))
    total = sum(c.elapsed_s if c.elapsed_s is not None else (c.ended - c.started).total_seconds() for c in rec.calls)
    return RecordCheck(folder.name, overrides, extra, plan, rows, total)


def record_section(folder: Path, *, runs: Path | None = None) -> str:
    """A record's plan beside the minutes it took, as a Markdown section for its README (generated)."""
    chk = check_record(folder, runs=runs)
    plan = chk.plan
    extra = "; ".join(f"`{o}` ({why})" for o, why in chk.as_run)
    out = ["### Plan and minutes", "",
           f"`bakeoff node plan {' '.join(chk.overrides + [o for o, _ in chk.as_run])}`: the call logs' config entries, "
           "`hardware=auto` as this folder's `hardware.json` resolves it"
           + (f", and what the capacity search ran with where today's defaults differ: {extra}" if extra else "")
           + ". Rates from the other records only (this one left out). Each job of the call logs beside the plan's "
           "seconds for the work it did there: a finished job's start, the cells it measured, its searches as the "
           "plan runs them; a job stopped at a call's limit, its start, cells and probes up to its last one.", "",
           "| call | job | outcome | planned | logged | what |", "|---|---|---|---|---|---|"]
    for j in chk.jobs:
        planned = f"{j.planned_s:.0f} s" if j.planned_s is not None else "not compared"
        out.append(f"| {j.call} | {j.label} | {j.outcome} | {planned} | {j.logged_s:.0f} s | {j.note} |")
    n = len(read_calls(folder))
    out += ["", f"Jobs compared: planned {_m(chk.planned_s)} min, logged {_m(chk.logged_s)} min "
            f"({100 * chk.error:+.0f} %). The whole config's plan: {_m(plan.total_s)} min on the node in "
            f"{len(plan.calls)} calls, {_m(plan.run_s)} of them Snakemake's in the run calls (fits {NODE_S // 60} "
            f"minutes: {'yes' if plan.fits else 'no'}); the call logs: {_m(chk.logged_total_s)} min of Snakemake in "
            f"{n} call{'s' if n != 1 else ''}.", ""]
    return "\n".join(out)


def plan_command(a: argparse.Namespace) -> None:
    """``bakeoff node plan [overrides]`` (or ``--record runs/<name>``): the plan, printed."""
    repo = Path(a.repo)
    if getattr(a, "record", None):
        print(record_section(Path(a.record), runs=repo / "runs"))
        return
    overrides = [o for o in [a.tarball, *(a.overrides or [])] if o]
    if not overrides:
        raise BakeoffError("node plan needs the experiment's overrides, e.g. experiment=h100_capacity hardware=h100")
    conf = repo / "conf" if (repo / "conf" / "config.yaml").is_file() else None
    print(render(make_plan(overrides, repo=repo.resolve(), conf_dir=conf)))
