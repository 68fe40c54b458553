"""The planner's rates: a TPOT, a TTFT, a server start or a job's overhead for any variant, concurrency and
prompt length, each with where it came from (bakeoff.node.plan's docstring says how they are chosen).
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from bakeoff.composition.walltime import QUALITY_MIN
from bakeoff.config.schema import Config
from bakeoff.layout import MODEL_SOURCE
from bakeoff.models.facts import ModelFacts, model_facts
from bakeoff.models.weights import GIB
from bakeoff.node.observed import Obs, PlanError, Record
from bakeoff.results.roofline import decode_ceiling

DEFAULT_CALL_GAP_S = 20.0  # where no record has two calls: the records' gaps were 18-28 s


DEFAULT_JOB_OVERHEAD_S = 20.0  # a serving job's own time beyond its server's start: the records' 15-26 s


DEFAULT_JOB_S = 30.0  # a model rule no record ran: an assumption, said so


FAIL_SHARE = 1.0  # where no record has a failing probe: a failing probe runs all its requests


# Bits a weight by format, for a model no record served (its n_params from bakeoff.models.facts).
BITS = {"F16": 16.0, "BF16": 16.0, "Q8_0": 8.5, "Q4_K_M": 4.84, "Q4_0": 4.5, "fp16": 16.0, "fp8": 8.3,
        "fp8_online": 8.3, "fp8_dequant": 16.0}


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
    repo: Path = Path(".")  # where models/<model>/source/ is looked for (bakeoff.models.facts)
    quality_s: float | None = None  # an evaluation's seconds, set: the plan without quality (make_plan)

    def __post_init__(self) -> None:
        self.gpu = self.cfg.hardware.gpu_model or ""
        self.bandwidth = float(self.cfg.hardware.mem_bandwidth_gbs or 0.0)
        self.model = self.cfg.model.name
        models_dir = self.repo / Path(MODEL_SOURCE).parts[0]
        self.facts: ModelFacts | None = model_facts(self.cfg.model, models_dir)
        self.kv_bytes = self.facts.kv_bytes_per_token if self.facts else None
        self.n_params = self.facts.n_params if self.facts else None
        self.obs = [o for r in self.records for o in r.obs if o.model == self.model]

    def same(self, gpu: str) -> bool:
        return bool(self.gpu) and gpu == self.gpu

    def names(self, recs: Iterable[str]) -> str:
        return ", ".join(sorted(set(recs)))

    # ----- weights
    def weight_bytes(self, fmt: str) -> Rate | None:
        """The format's weight bytes: as the records served it, else the model's parameters at its bits a weight."""
        served = [float(o.weight_bytes) for o in self.obs if o.fmt == fmt and o.weight_bytes]
        if served:
            return Rate(_mean(served), "records")
        q = self.cfg.formats.get(fmt)
        bits = BITS.get(str(q.gguf_type).upper() if q and q.gguf_type else "") or (BITS.get(q.method) if q else None)
        if self.n_params and bits:
            assert self.facts is not None
            return Rate(self.n_params * bits / 8.0, f"{bits:g} bits a weight x {self.n_params:,.0f} parameters "
                                                    f"({self.facts.source})")
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
                why = ("the hardware config states no mem_bandwidth_gbs" if not self.bandwidth else
                       f"the format's weight bytes are unknown: {self.cfg.model.name} states no shape and has no "
                       f"fetched source here (make it first: snakemake "
                       f"{MODEL_SOURCE.format(model=self.cfg.model.name)})" if self.facts is None else
                       f"no bits a weight are known for format {fmt!r}")
                raise PlanError(f"no rate for {engine}-{fmt} at prompt {prompt}: no record measured it, and the "
                                f"roofline cannot be drawn: {why}")
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
        if key[0] in ("build", "binding", "model"):
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

    @property
    def quality_measured(self) -> bool:
        return any(r.quality_s for r in self.records if self.same(r.gpu))

    def quality(self) -> Rate:
        if self.quality_s is not None:
            return Rate(self.quality_s, "set by the caller")
        got = [(r.name, s) for r in self.records if self.same(r.gpu) for s in r.quality_s]
        if got:
            return Rate(_mean([s for _, s in got]), f"quality.json eval_s, records {self.names(n for n, _ in got)}")
        return Rate(QUALITY_MIN * 60.0, "no record scored quality on this GPU: bakeoff.composition.walltime's bound")
