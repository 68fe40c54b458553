"""A committed record's plan beside the minutes its call logs show (``bakeoff node plan --record``).

Why: a plan is only worth its rates. Each record is re-planned from its own config, with rates from the other
records only (never its own), and each job of its call logs is set beside the plan's seconds for the work that
job did; tests/test_node_plan.py holds the plan within 25 % of every record that can be re-planned.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import tarfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bakeoff.config.slo import SLO_PRESETS
from bakeoff.errors import BakeoffError
from bakeoff.node.observed import PlanError, Record, in_window, load_record
from bakeoff.node.plan import (
    DEFAULT_BUILD_S,
    DEFAULT_PARTS,
    DEFAULT_QUALITY_PARTS,
    MODEL_RULES,
    NODE_S,
    Plan,
    make_plan,
    minutes,
    probe_s,
    render,
)
from bakeoff.node.readme import Call, read_calls

CHECK_RULES = ("gpu_check", "kernel_bench", "ecc_recheck", "node")


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
    inside = [o for o in rec.obs if (o.engine, o.fmt) == (e, f) and in_window(s, end, o)]
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
    # A record is planned with the default part count, never with what this checkout happens to have packed:
    # the check must give the same answer in every clone.
    plan = make_plan([*overrides, *(o for o, _ in extra)], runs=runs or folder.parent, exclude=[folder.name],
                     records=records, repo=repo, facts=facts,
                     parts=(DEFAULT_PARTS, "the default (the records' part counts are in no file of theirs)"),
                     quality=(DEFAULT_QUALITY_PARTS, "the default (no record has carried the quality payload)"))
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
    out += ["", f"Jobs compared: planned {minutes(chk.planned_s)} min, logged {minutes(chk.logged_s)} min "
            f"({100 * chk.error:+.0f} %). The whole config's plan: {minutes(plan.total_s)} min on the node in "
            f"{len(plan.calls)} calls, {minutes(plan.run_s)} of them Snakemake's in the run calls (fits {NODE_S // 60} "
            f"minutes: {'yes' if plan.fits else 'no'}); the call logs: {minutes(chk.logged_total_s)} min of Snakemake in "
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
    plan = make_plan(overrides, repo=repo.resolve(), conf_dir=conf, use_carried_build=True)
    print(render(plan))
    if a.out:  # kept in the record's folder, made before the run: its README sets it beside the logs
        Path(a.out).write_text(json.dumps(plan.as_json(), indent=2) + "\n")
