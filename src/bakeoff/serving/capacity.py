"""One variant's capacity under each configured SLO, searched on the server its cells just used.

Why here: a probe is a load cell like any other (same client, metrics, telemetry, files), so it is measured
by bakeoff.stages.serve_load's ``measure``; this module only runs bakeoff.loadgen.capacity's searches with
it and writes what they found. Every probe is kept as a cell row (``probe_of``: concurrency or rate, with
``slo`` and its verdict); the searches' results go into the variant's index under ``capacity``.
"""

from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bakeoff.config.schema import EngineCfg, LoadCfg, default_verdict
from bakeoff.config.slo import SLO_PRESETS, Slo
from bakeoff.engines import get_engine
from bakeoff.engines.session import Session
from bakeoff.layout import CAPACITY_FILE, probe_name
from bakeoff.loadgen.capacity import (
    RATE_PROBES,
    EarlyStop,
    Rule,
    Search,
    Verdict,
    bracket_from_cells,
    judge,
    probe_requests,
    search_concurrency,
    search_rate,
)
from bakeoff.loadgen.cells import Cell, stable_seed
from bakeoff.loadgen.metrics import PEAK_IN_FLIGHT
from bakeoff.models.artifacts import atomic_write_text, read_kept, restore_kept, write_kept
from bakeoff.serving.job import ServeJob
from bakeoff.serving.measure import measure

# What a capacity row reads from the probe at capacity.
AT_CAPACITY = ("output_throughput", "request_goodput", "joules_per_output_token", "p99_ttft_ms", "p99_tpot_ms",
               "p99_ttft_ms_whole_cell", "steady_requests", "load_ramp_s",
               "over_ttft_share", "over_ttft_share_ub95", "over_tpot_share", "over_tpot_share_ub95",
               "effective_requests", "confident_claim_holds",
               "client_cpu_s", "client_cpu_share", "client_workers", "client_saturated")


def capacity_hash(spec_hash: str, load: LoadCfg) -> str:
    """What a variant's capacity results depend on: its cells' settings and the search's."""
    blob = json.dumps([spec_hash, load.capacity.model_dump(mode="json"), load.output_len], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def sized_engine(job: ServeJob, load: LoadCfg) -> tuple[EngineCfg, str]:
    """The job's engine config sized for the capacity search by its engine (llama.cpp's slots: at least
    ``max_concurrency``, each holding the longest prompt the server will see plus the output), and what set the
    size. Other engines, and fixed mode: unchanged."""
    if load.mode != "capacity":
        return job.engine_cfg, ""
    slot_tokens = max([*load.prompt_len, *(load.capacity.prompt_len or [])]) + load.output_len + 1
    sized = get_engine(job.engine_cfg.plugin).sized_for_capacity(
        job.engine_cfg.settings, load.capacity.max_concurrency, slot_tokens, job.model_dir, job.hardware)
    if sized is None:
        return job.engine_cfg, ""
    settings, why = sized
    return job.engine_cfg.model_copy(update={"settings": settings}), why


def reused(out_dir: Path, digest: str) -> dict[str, Any] | None:
    """The kept results (and their probes' records) of a search made with these settings, put back in place."""
    kept = read_kept(out_dir / CAPACITY_FILE)
    if kept is None or kept.get("capacity_hash") != digest:
        return None
    restore_kept(out_dir / CAPACITY_FILE)
    return kept


def probe_seed(name: str, n: int) -> int:
    """The seed of a probe's prompts and arrivals: the same search sends the same requests in every process."""
    return stable_seed(name, n)


def verdict_rule(job: ServeJob, load: LoadCfg) -> Rule:
    """The rule that judges this job's probes: ``load.capacity.verdict``, else the hardware's default (a job built
    from a validated config always has it set)."""
    return load.capacity.verdict or default_verdict(job.hardware.backend)


def fixed_verdicts(cells: list[dict[str, Any]], slo: Slo, prompt_len: int, rule: Rule = "point") -> dict[int, bool]:
    """Whether each fixed concurrency met ``slo`` at ``prompt_len`` in every repeat (cells that ran only).

    Under ``confident`` a fixed cell gives only fails: a p99 over a bound fails that rule too, but a pass would
    need the share over the preset's bounds (a fixed cell counts it against ``load.slo_ms``) and, usually,
    more requests than a fixed cell sends; such a cell seeds nothing.
    """
    met: dict[int, bool] = {}
    for rec in cells:
        if rec.get("probe_of") or rec.get("prompt_len") != prompt_len or rec.get("status") not in ("ok", "degraded"):
            continue
        c = int(rec["concurrency"])
        passed = judge(rec, slo).passed
        if passed and rule == "confident":
            continue
        met[c] = met.get(c, True) and passed
    return met


@dataclass
class Prober:
    """Probes on one variant's running server, measured as cells and judged under one rule, kept as they ran.

    Why an object: every probe of every search shares the server, the load, the rule and the list of probe
    records; a search asks it for one verdict at a time (``concurrency`` or ``rate``), and the probe at a load
    is kept for the row (``at``) while a boundary re-check writes a second file beside it.
    """

    job: ServeJob
    session: Session
    base: dict[str, Any]
    load: LoadCfg
    tokenizer: Any
    rule: Rule
    slots: int  # the server's fixed slots, each of which serves a warm-up once per server start
    probes: list[dict[str, Any]] = field(default_factory=list)

    def up(self) -> bool:
        """The server is running, started again where it died."""
        if self.session.engine is not None and self.session.engine.alive():
            return True
        self.session.stop()
        return self.session.start()[0] == "ok"

    def requests(self, c: int) -> int:
        cap = self.load.capacity
        return probe_requests(c, cap.min_requests, cap.waves, self.rule)

    def warm(self, c: int) -> int:
        return max(c, self.job.slots_to_warm(self.session.starts, self.slots) or 0)

    def probe(self, slo: Slo, kind: str, value: float, prompt_len: int, n: int, warm: int,
              again: bool = False) -> tuple[Verdict, dict]:
        """One probe: a cell of ``n`` requests at this load, its verdict, its file."""
        if not self.up():
            return Verdict(False, ("server down",)), {}
        job, rule = self.job, self.rule
        name = probe_name(slo.name, kind, value, prompt_len, recheck=again)
        concurrency = int(value) if kind == "concurrency" else n  # open loop: no cap on requests in flight
        cell = Cell(concurrency, prompt_len, job.block or 0, label=name)
        assert self.session.engine is not None
        rec = measure(job, self.session, self.base, self.load, self.tokenizer, self.session.engine.versions(), cell,
                      n=n, n_warm=warm, seed=probe_seed(name, n), request_rate=None if kind == "concurrency" else value,
                      notes=[f"capacity probe ({kind}, SLO {slo.name}: p99 TTFT <= {slo.ttft_ms:g} ms, p99 TPOT <= "
                             f"{slo.tpot_ms:g} ms, {rule} rule); warm-up {warm} requests"],
                      stop_when=EarlyStop(n, slo, rule), slos_ms=slo.bounds(),
                      extra={"probe_of": kind, "slo": slo.name, "cell": name})
        verdict = judge(rec, slo, bool(rec.get("stopped_early")), rule)
        rec.update(probe_passed=verdict.passed, probe_exceeded="+".join(verdict.exceeded), probe_recheck=again)
        if kind == "rate":  # open loop: its concurrency is what the arrivals made, not a setting
            rec["concurrency"] = rec.get(PEAK_IN_FLIGHT)
        atomic_write_text(job.out_dir / f"{name}.json", json.dumps(rec, indent=2, default=str) + "\n")
        self.probes.append(rec)
        print(f"capacity {slo.name} p{prompt_len} {kind}={value:g}: {'pass' if verdict.passed else 'fail'} "
              f"{verdict.exceeded or ''}", file=sys.stderr, flush=True)
        return verdict, rec


@dataclass
class ConcurrencyProbes:
    """The concurrency search's ``probe(c)`` for one SLO and prompt length: each load's first probe kept in
    ``at`` (the row reads the one at capacity); a load probed again (the boundary re-check) gets a second file."""

    prober: Prober
    slo: Slo
    prompt_len: int
    at: dict[float | str, dict] = field(default_factory=dict)

    def __call__(self, c: int) -> Verdict:
        again = c in self.at
        verdict, rec = self.prober.probe(self.slo, "concurrency", c, self.prompt_len, self.prober.requests(c),
                                         self.prober.warm(c), again)
        if not again:
            self.at[c] = rec
        return verdict


@dataclass
class RateProbes:
    """The rate search's ``probe(rate)``: open-loop probes sized by the concurrency capacity ``c``."""

    prober: Prober
    slo: Slo
    prompt_len: int
    c: int
    at: dict[float, dict] = field(default_factory=dict)

    def __call__(self, rate: float) -> Verdict:
        verdict, rec = self.prober.probe(self.slo, "rate", rate, self.prompt_len, self.prober.requests(self.c),
                                         self.prober.warm(self.c))
        self.at[rate] = rec
        return verdict


def run(job: ServeJob, session: Session, base: dict[str, Any], load: LoadCfg, tokenizer: Any,
        fixed: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Search every (SLO, prompt length) of ``load.capacity``; returns ``{"capacity": rows, "probes": records}``.

    ``fixed``: the variant's fixed cell records, whose verdicts seed each concurrency search's bracket.
    """
    cap = load.capacity
    rule = verdict_rule(job, load)
    prober = Prober(job, session, base, load, tokenizer, rule,
                    slots=get_engine(job.engine_cfg.plugin).slots(job.engine_cfg.settings) or 0)
    rows = [search_one(prober, slo, p, fixed or []) for slo in (SLO_PRESETS[s] for s in cap.slo)
            for p in cap.prompt_len or load.prompt_len]
    return {"capacity": rows, "probes": prober.probes}


def search_one(prober: Prober, slo: Slo, p: int, fixed: list[dict[str, Any]]) -> dict[str, Any]:
    """One SLO's capacity at one prompt length: the concurrency search, then (where asked) the rate search."""
    load, base, cap, rule = prober.load, prober.base, prober.load.capacity, prober.rule
    by_concurrency = ConcurrencyProbes(prober, slo, p)
    known_pass, known_fail = bracket_from_cells(fixed_verdicts(fixed, slo, p, rule))
    maximum, limit = search_limit(prober.session, cap.max_concurrency, p + load.output_len,
                                  str(base.get("parallel_set_by", "")))
    closed = search_concurrency(by_concurrency, cap.start_concurrency, maximum, cap.max_probes,
                                known_pass=known_pass, known_fail=known_fail, limit=limit, resolution=cap.resolution)
    c_star = int(closed.capacity)
    at = by_concurrency.at
    best = at.get(c_star, {})
    row = {**{k: base[k] for k in ("experiment", "model", "engine", "format", "hardware", "output_len")},
           "node_id": best.get("node_id"), "prompt_len": p, "slo": slo.name, "slo_ttft_ms": slo.ttft_ms,
           "slo_tpot_ms": slo.tpot_ms, "capacity_verdict_rule": rule, "capacity_start": cap.start,
           "concurrency_resolution": cap.resolution, **_search_columns(closed, "concurrency"),
           **{f"{k}_at_capacity": best.get(k) for k in AT_CAPACITY}}
    # Sessions are a closed loop (bakeoff.loadgen.sessions): they have no arrival rate to search.
    if cap.rate and c_star > 0 and best.get("request_throughput") and load.workload.kind != "multiturn":
        by_rate = RateProbes(prober, slo, p, c_star)
        opened = search_rate(by_rate, float(best["request_throughput"]), cap.max_probes or RATE_PROBES,
                             cap.rate_resolution)
        row.update(_search_columns(opened, "rate"))
        row["output_throughput_at_capacity_rate"] = by_rate.at.get(opened.capacity, {}).get("output_throughput")
        at.update({f"r{r:g}": rec for r, rec in by_rate.at.items()})
    # A probe whose client saturated measured the client as much as the server: named, never hidden.
    row["client_saturated_probes"] = " ".join(str(rec.get("cell")) for rec in at.values() if rec.get("client_saturated"))
    return row


def search_limit(session: Session, maximum: int, tokens_per_request: int, set_by: str = "") -> tuple[int, str]:
    """The highest concurrency the search may probe, and its name: the server's own limit where that is lower
    than the search's ``maximum`` (``load.capacity.max_concurrency``), else the search's. ``set_by``: what set
    the server's limit where bakeoff sized it (the row's ``parallel_set_by``), so that an experiment's setting
    is never read as the engine's limit."""
    assert session.engine is not None
    n, name = session.engine.concurrency_limit(tokens_per_request)
    if n is not None and n <= maximum:
        return n, f"{name} (set by the {set_by})" if set_by else name
    return maximum, "search maximum"


def _search_columns(s: Search, kind: str) -> dict[str, Any]:
    value: float | int = int(s.capacity) if kind == "concurrency" else round(s.capacity, 4)
    cols = {f"capacity_{kind}": value, f"{kind}_converged": s.converged, f"{kind}_at_limit": s.at_limit,
            f"{kind}_limit": s.limit if s.at_limit else "",
            f"{kind}_probes": len(s.probes), f"binding_{kind}": s.binding}
    if kind == "concurrency":
        cols.update(concurrency_fail=int(s.fail) if s.fail is not None else "", concurrency_bracket=s.bracket)
        cols.update(concurrency_seeded=json.dumps(s.seeded) if s.seeded else "",
                    concurrency_uncertain=s.uncertain, concurrency_recheck=s.recheck_note)
    return cols


def write(out_dir: Path, digest: str, result: dict[str, Any]) -> None:
    write_kept(out_dir / CAPACITY_FILE, json.dumps({"capacity_hash": digest, **result}, indent=2, default=str) + "\n")
