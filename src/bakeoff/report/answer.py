"""The answer a reader wants first, computed from the summary and the capacity table.

Why its own module: the report page shows these numbers, and a test checks the page against the summary
with its own arithmetic; both read them from here, and none is rounded before it is compared.

* **One node per answer.** Every grouping below includes ``node_id``: a variant measured on two nodes gets
  one answer per node, labelled with the node, and no number is a mean across nodes (nodes of one kind
  differ by more than most margins).
* **Leaders at fixed load.** For each experiment, prompt length and concurrency: the variant with the
  highest mean output tok/s over its ok repeats, the runner-up, the margin, and the verdict on the margin
  with its interval (bakeoff.results.spread): "different", "equivalent within +-m %" (m =
  ``answer.equivalence_margin_pct``, recorded in the summary), or "no verdict" with the blocks that would
  settle it; and each block's direction. Paired by block, else Welch; resumed blocks are left out, and the
  verdict says which and why.
* **Leaders under an SLO.** From the capacity searches where they ran: the highest ``capacity_concurrency``
  (equal capacities: the higher rate first). A margin of one concurrency step is within the search's
  resolution. A search that did not converge gives "at least N"; one whose boundary re-check disagreed gives
  no verdict. Where no search ran, the highest fixed concurrency whose p99 TTFT and TPOT met the SLO, said
  as such. Each says which rule judged its probes (``capacity_verdict_rule``: ``point`` or
  ``confident``; RULE_WORDS); capacities made by different rules are not compared.
* **The frontier.** Per experiment and prompt length, each variant's throughput (at capacity under the
  first SLO searched, else at its highest fixed concurrency), quality loss (top-k KL against the 16-bit
  baseline) and J/token; Pareto-optimal where no other variant is at least as good on every measured axis
  and better on one.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bakeoff.config.slo import SLO_PRESETS
from bakeoff.layout import variant_name
from bakeoff.results import spread
from bakeoff.results.numbers import number

Row = Mapping[str, Any]


def _fixed_ok(rows: Sequence[Row]) -> list[Row]:
    return [r for r in rows if r.get("status") == "ok" and not r.get("probe_of")]


def _variant(r: Row) -> str:
    return variant_name(str(r["engine"]), str(r["format"]))


def _node(r: Row) -> str:
    return str(r.get("node_id") or "")


def _true(v: Any) -> bool:
    return str(v) == "True"


# What each capacity verdict rule (bakeoff.loadgen.capacity) lets a reader conclude, in the page's words.
RULE_WORDS = {"point": "point p99: each probe's p99 within the bounds",
              "confident": "confident p99: 95 % sure each probe's true p99 is within the bounds"}


def _rule(r: Row) -> str:
    """The rule that made a capacity row (rows written before the rule was recorded were all ``point``)."""
    return str(r.get("capacity_verdict_rule") or "point")


def _start(r: Row) -> str:
    """How a capacity row's probes started (rows written before the start was recorded all had a burst)."""
    return str(r.get("capacity_start") or "burst")


def _fail(r: Row) -> float | None:
    """The lowest failing concurrency of a row's search; rows written before it was recorded bracketed to
    adjacent users, so a converged one failed at its capacity + 1."""
    fail = number(r.get("concurrency_fail"))
    if fail is None and _true(r.get("concurrency_converged")):
        fail = (number(r.get("capacity_concurrency")) or 0.0) + 1
    return fail


def bracket_words(r: Row) -> str:
    """A capacity as its search found it: the bracket, the rule and the start (``192–200 users, confident,
    ramped``); rows written before the bracket was recorded give their capacity alone."""
    start = "ramped" if _start(r) == "ramp" else "burst start"
    found = r.get("concurrency_bracket") or f"{number(r.get('capacity_concurrency')) or 0:g}"
    return f"{found} users, {_rule(r)}, {start}"


def bracket_verdict(lead: Row, runner: Row) -> str:
    """Whether two searches' brackets tell their capacities apart: the leader passed a load at which the
    runner-up failed, more than one user above the runner-up's pass (different), or not (no verdict within the
    searches' resolution)."""
    value, second = number(lead["capacity_concurrency"]) or 0.0, number(runner["capacity_concurrency"]) or 0.0
    fail = _fail(runner)
    if value == second:
        return "the same capacity"
    if fail is not None and value >= fail and value - second > 1:  # one user apart is one probe's noise
        return f"different: {_variant(lead)} passed {value:g} users, where {_variant(runner)} failed at {fail:g}"
    return ("within the searches' resolution: the brackets overlap "
            f"({_variant(lead)} {lead.get('concurrency_bracket') or value}, "
            f"{_variant(runner)} {runner.get('concurrency_bracket') or second})")


@dataclass(frozen=True)
class Lead:
    experiment: str
    prompt_len: int
    node: str  # the node_id every number of this answer was measured on
    load: str  # "c=8", or an SLO's name
    leader: str
    value: float
    runner_up: str  # "" when only one variant measured
    runner_value: float
    verdict: str  # in words: the verdict with its interval and the blocks' directions, or the capacity's
    at_least: tuple[bool, bool] = (False, False)  # leader's, runner-up's value is a lower bound (search unconverged)
    # Fixed load only: the leader against the runner-up (bakeoff.results.spread), and the verdict's kind.
    paired: spread.Paired | None = None
    kind: str = ""  # spread.DIFFERENT, EQUIVALENT or NO_VERDICT; "" under an SLO or for an only variant
    margin: float = math.nan  # the equivalence margin (%) it was judged with
    rule: str = ""  # under an SLO: the capacity verdict rule that made the values (RULE_WORDS); "" at fixed load
    # Under an SLO: each search's capacity as it found it, "192–200 users, confident, ramped" (bracket_words).
    brackets: tuple[str, str] = ("", "")

    @property
    def margin_pct(self) -> float:
        return 100.0 * (self.value - self.runner_value) / self.runner_value if self.runner_value else math.nan


def fixed_leaders(rows: Sequence[Row], metric: str = "output_throughput") -> list[Lead]:
    resumed = spread.resumed_blocks(rows)
    by_cell: dict[tuple[str, int, str, int], dict[str, list[Row]]] = defaultdict(lambda: defaultdict(list))
    for r in _fixed_ok(rows):
        if number(r.get(metric)) is not None:
            key = (str(r["experiment"]), int(r["prompt_len"]), _node(r), int(r["concurrency"]))
            by_cell[key][_variant(r)].append(r)
    out = []
    for (exp, p, node, c), variants in sorted(by_cell.items()):
        means = sorted(((statistics.fmean(number(r[metric]) for r in g), v) for v, g in variants.items()), reverse=True)
        (top, lead), rest = means[0], means[1:]
        if not rest:
            out.append(Lead(exp, p, node, f"c={c}", lead, top, "", math.nan,
                            "only variant" + _client_note(variants, (lead,))))
            continue
        second, runner = rest[0]
        margin = spread.margin_of(variants[lead][0])
        found = spread.pair(variants[runner], variants[lead], metric, resumed)
        if found is None:
            kind, verdict = spread.NO_VERDICT, "no verdict: measured on different nodes"
        else:
            v = found.verdict(margin)
            kind, verdict = v.kind, v.words(found.diff)
            if dirs := spread.directions(found.diff, runner, lead):
                verdict += f"; {dirs}"
            if found.left_out and not v.why:
                verdict += f"; left out as resumed: {found.why_left_out}"
        out.append(Lead(exp, p, node, f"c={c}", lead, top, runner, second,
                        verdict + _client_note(variants, (lead, runner)), paired=found, kind=kind, margin=margin))
    return out


def _client_note(variants: Mapping[str, Sequence[Row]], names: Sequence[str]) -> str:
    """Where the load client saturated in a compared variant's cells: its numbers are partly the client's."""
    hit = [f"{v} ({n} of {len(variants[v])})" for v in names
           if (n := sum(str(r.get("client_saturated")) == "True" for r in variants[v]))]
    return f"; client saturated in the cells of {', '.join(hit)}: the client may be the ceiling" if hit else ""


def slo_leaders(rows: Sequence[Row], capacity: Sequence[Row]) -> list[Lead]:
    """Leaders by capacity where a search ran; else by the highest fixed concurrency meeting each preset."""
    out = []
    searched: dict[tuple[str, int, str, str], list[Row]] = defaultdict(list)
    for r in capacity:
        if number(r.get("capacity_concurrency")) is not None:
            searched[(str(r["experiment"]), int(r["prompt_len"]), _node(r), str(r["slo"]))].append(r)
    for (exp, p, node, slo), group in sorted(searched.items()):
        ranked = sorted(group, key=lambda r: (number(r["capacity_concurrency"]), number(r.get("capacity_rate")) or 0.0),
                        reverse=True)
        lead = ranked[0]
        value = number(lead["capacity_concurrency"]) or 0.0
        if len(ranked) == 1:
            note = f"; client saturated in probes {lead['client_saturated_probes']}" if lead.get(
                "client_saturated_probes") else ""
            out.append(Lead(exp, p, node, slo, _variant(lead), value, "", math.nan, "only variant" + note,
                            (not _true(lead.get("concurrency_converged")), False), rule=_rule(lead),
                            brackets=(bracket_words(lead), "")))
            continue
        runner = ranked[1]
        second = number(runner["capacity_concurrency"]) or 0.0
        verdict = bracket_verdict(lead, runner)
        if value == second and str(lead.get("concurrency_at_limit")) == "True":
            verdict = "the same at the search's maximum concurrency: both serve at least this many"
        open_ended = [f"{_variant(r)}: {r.get('concurrency_limit') or 'its probe budget'}" for r in (lead, runner)
                      if not _true(r.get("concurrency_converged"))]
        if open_ended:
            verdict = (f"no verdict: a search stopped at a limit before finding a failing load ({'; '.join(open_ended)}); "
                       f"its capacity is a lower bound")
        uncertain = [f"{_variant(r)}: {r.get('concurrency_recheck')}" for r in (lead, runner)
                     if _true(r.get("concurrency_uncertain"))]
        if uncertain:
            verdict = f"no verdict: a boundary re-check disagreed ({'; '.join(uncertain)})"
        saturated = [f"{_variant(r)} ({r['client_saturated_probes']})" for r in (lead, runner)
                     if r.get("client_saturated_probes")]
        if _rule(lead) != _rule(runner):
            verdict = (f"no verdict: capacities made by different rules ({_variant(lead)}: {_rule(lead)}, "
                       f"{_variant(runner)}: {_rule(runner)})")
        elif _start(lead) != _start(runner):
            verdict = (f"no verdict: capacities made by different starts ({_variant(lead)}: {_start(lead)}, "
                       f"{_variant(runner)}: {_start(runner)})")
        if saturated:
            verdict += f"; client saturated in probes of {', '.join(saturated)}"
        rule = _rule(lead) if _rule(lead) == _rule(runner) else f"{_rule(lead)} / {_rule(runner)}"
        out.append(Lead(exp, p, node, slo, _variant(lead), value, _variant(runner), second, verdict,
                        (not _true(lead.get("concurrency_converged")), not _true(runner.get("concurrency_converged"))),
                        rule=rule, brackets=(bracket_words(lead), bracket_words(runner))))
    if searched:
        return out
    # No search: what the fixed cells say, per preset.
    met: dict[tuple[str, int, str, str], dict[str, dict[int, bool]]] = defaultdict(lambda: defaultdict(dict))
    for r in _fixed_ok(rows):
        t, o = number(r.get("p99_ttft_ms")), number(r.get("p99_tpot_ms"))
        for slo in SLO_PRESETS.values():
            cells = met[(str(r["experiment"]), int(r["prompt_len"]), _node(r), slo.name)][_variant(r)]
            ok = t is not None and o is not None and t <= slo.ttft_ms and o <= slo.tpot_ms
            cells[int(r["concurrency"])] = cells.get(int(r["concurrency"]), True) and ok
    for (exp, p, node, slo), by_variant in sorted(met.items()):
        ranked = sorted(((max([c for c, ok in cs.items() if ok], default=0), v) for v, cs in by_variant.items()),
                        reverse=True)
        (c1, v1), rest = ranked[0], ranked[1:]
        c2, v2 = rest[0] if rest else (math.nan, "")
        note = "no search ran: the highest fixed concurrency meeting the SLO in every repeat"
        highest = max(c for cs in by_variant.values() for c in cs)
        if c1 == c2:
            note += (f"; the same at the highest concurrency tested ({highest}): both serve at least this many"
                     if c1 == highest else "; the same capacity")
        out.append(Lead(exp, p, node, slo, v1, float(c1), v2, float(c2), note))
    return out


@dataclass(frozen=True)
class FrontierPoint:
    experiment: str
    prompt_len: int
    node: str
    variant: str
    throughput: float
    throughput_at: str  # "capacity under <slo>", "at least: ..." where the search did not converge, or "c=<max>"
    kl: float | None
    joules_per_token: float | None
    pareto: bool = False


def frontier(rows: Sequence[Row], capacity: Sequence[Row]) -> list[FrontierPoint]:
    kl: dict[tuple[str, str], float | None] = {}
    for r in rows:
        kl.setdefault((str(r["experiment"]), _variant(r)), number(r.get("kl_vs_fp16")))
    cap: dict[tuple[str, int, str, str], Row] = {}
    first_slo: dict[str, str] = {}
    for r in capacity:
        first_slo.setdefault(str(r["experiment"]), str(r["slo"]))
        if str(r["slo"]) == first_slo[str(r["experiment"])]:
            cap[(str(r["experiment"]), int(r["prompt_len"]), _node(r), _variant(r))] = r
    top_c: dict[tuple[str, int, str, str], list[Row]] = defaultdict(list)
    for r in _fixed_ok(rows):
        key = (str(r["experiment"]), int(r["prompt_len"]), _node(r), _variant(r))
        if not top_c[key] or int(r["concurrency"]) > int(top_c[key][0]["concurrency"]):
            top_c[key] = [r]
        elif int(r["concurrency"]) == int(top_c[key][0]["concurrency"]):
            top_c[key].append(r)
    points = []
    for key in sorted(set(top_c) | set(cap)):
        exp, p, node, v = key
        c = cap.get(key)
        if c is not None:  # a capacity of 0 serves nothing within the SLO: throughput 0, not another cell's
            tput, at = number(c.get("output_throughput_at_capacity")) or 0.0, f"capacity under {c['slo']}"
            if not _true(c.get("concurrency_converged")):
                at = (f"at least: c={c.get('capacity_concurrency')} passed under {c['slo']}; the search stopped "
                      f"before converging, so the capacity and its throughput may be higher")
            jpt = number(c.get("joules_per_output_token_at_capacity"))
        elif top_c.get(key):
            g = top_c[key]
            tput = statistics.fmean(number(r["output_throughput"]) for r in g)
            at = f"c={g[0]['concurrency']}"
            j = [x for r in g if (x := number(r.get("joules_per_output_token"))) is not None]
            jpt = statistics.fmean(j) if j else None
        else:
            continue
        points.append(FrontierPoint(exp, p, node, v, float(tput), at, kl.get((exp, v)), jpt))
    return _mark_pareto(points)


def _mark_pareto(points: list[FrontierPoint]) -> list[FrontierPoint]:
    """Pareto-optimal within (experiment, prompt length, node) over the axes every point there has."""
    out = []
    by = defaultdict(list)
    for pt in points:
        by[(pt.experiment, pt.prompt_len, pt.node)].append(pt)
    for group in by.values():
        use_kl = all(pt.kl is not None for pt in group)
        use_j = all(pt.joules_per_token is not None for pt in group)

        vecs = {id(pt): [pt.throughput, *([-pt.kl] if use_kl else []),  # larger is better on every axis
                         *([-pt.joules_per_token] if use_j else [])] for pt in group}  # type: ignore[operator]
        for pt in group:
            a = vecs[id(pt)]
            dominated = any(all(x >= y for x, y in zip(vecs[id(o)], a, strict=True)) and vecs[id(o)] != a
                            for o in group if o is not pt)
            out.append(FrontierPoint(**{**pt.__dict__, "pareto": not dominated}))
    return out


# results/answer.csv: one row per answer (bakeoff.results.columns registers each column).
ANSWER_COLUMNS = ["experiment", "prompt_len", "node_id", "load", "leader", "leader_value", "leader_at_least",
                  "runner_up", "runner_up_value", "runner_up_at_least", "margin_pct", "metric", "pairing", "blocks",
                  "diff_pct", "ci95_lo_pct", "ci95_hi_pct", "ci90_lo_pct", "ci90_hi_pct", "p",
                  "equivalence_margin_pct", "verdict", "blocks_needed", "leader_faster_blocks",
                  "runner_up_faster_blocks", "blocks_left_out", "verdict_words"]


def _csv_num(v: float | int | None) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    return f"{v:.6g}" if isinstance(v, float) else str(v)


def answer_rows(rows: Sequence[Row], capacity: Sequence[Row], metric: str = "output_throughput") -> list[dict[str, str]]:
    """The answer as a table: every fixed-load and SLO leader, with the fixed-load verdict's numbers.

    A fixed-load row's difference is the leader against the runner-up (``diff_pct``, its 95 % and 90 %
    intervals, in percent of the runner-up); an SLO row compares capacities, so only ``verdict_words`` says how.
    """
    out = []
    for x in [*fixed_leaders(rows, metric), *slo_leaders(rows, capacity)]:
        r = {c: "" for c in ANSWER_COLUMNS}
        r.update({"experiment": x.experiment, "prompt_len": str(x.prompt_len), "node_id": x.node, "load": x.load,
                  "leader": x.leader, "leader_value": _csv_num(x.value), "leader_at_least": str(x.at_least[0]),
                  "runner_up": x.runner_up, "runner_up_value": _csv_num(x.runner_value),
                  "runner_up_at_least": str(x.at_least[1]) if x.runner_up else "",
                  "margin_pct": _csv_num(x.margin_pct), "verdict": x.kind, "verdict_words": x.verdict})
        if x.load.startswith("c="):
            r["metric"] = metric
        if x.paired is not None:
            d = x.paired.diff
            v = x.paired.verdict(x.margin)
            r.update({"pairing": d.pairing, "blocks": str(d.n) if d.pairing == "blocks" else "",
                      "diff_pct": _csv_num(d.rel_pct), "ci95_lo_pct": _csv_num(d.ci95[0]),
                      "ci95_hi_pct": _csv_num(d.ci95[1]), "ci90_lo_pct": _csv_num(d.ci90[0]),
                      "ci90_hi_pct": _csv_num(d.ci90[1]), "p": _csv_num(d.p), "equivalence_margin_pct": _csv_num(x.margin),
                      "blocks_needed": _csv_num(v.needed),
                      "leader_faster_blocks": str(d.b_faster) if d.pairing == "blocks" else "",
                      "runner_up_faster_blocks": str(d.a_faster) if d.pairing == "blocks" else "",
                      "blocks_left_out": x.paired.why_left_out})
        out.append(r)
    return out
