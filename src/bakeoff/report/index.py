"""``results/report/index.html``: the page a person opens first, self-contained and offline.

Why one file: it is mailed, attached and opened from disk; every plot is embedded (base64 PNG) and the
table's sorting and filtering is a few lines of inline script, so nothing is fetched. Its order follows
the reader's question: the answer (bakeoff.report.answer), then the frontier and the capacities, then the
published numbers beside ours, then the plots, then every row.
"""

from __future__ import annotations

import argparse
import base64
import csv
import html
import io
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from bakeoff.models.artifacts import atomic_write_text
from bakeoff.report import answer
from bakeoff.report.pages import LEAD, STYLE, _cell, environment_html, summary_html
from bakeoff.report.plots import frontier_figure, read_summary

SCRIPT = """<script>
for (const t of document.querySelectorAll('table.sortable')) {
  const body = t.tBodies[0], input = document.getElementById(t.dataset.filter);
  t.tHead.querySelectorAll('th').forEach((th, i) => th.addEventListener('click', () => {
    const asc = th.dataset.dir !== 'asc'; th.dataset.dir = asc ? 'asc' : 'desc';
    const key = r => { const x = r.cells[i].textContent, n = parseFloat(x); return isNaN(n) ? x : n; };
    [...body.rows].sort((a, b) => { const x = key(a), y = key(b); return (x > y) - (x < y); })
      .forEach(r => body.appendChild(r));
    if (!asc) [...body.rows].reverse().forEach(r => body.appendChild(r));
  }));
  if (input) input.addEventListener('input', () => {
    const q = input.value.toLowerCase();
    for (const r of body.rows) r.style.display = r.textContent.toLowerCase().includes(q) ? '' : 'none';
  });
}
</script>"""
PUBLISHED = ["experiment", "engine", "format", "concurrency", "prompt_len", "output_throughput",
             "published_output_throughput", "output_throughput_vs_published", "published_refs", "published_compared_as"]


CAPACITY_ORDER = ["experiment", "node_id", "prompt_len", "slo", "engine", "format"]
OPEN_END = "open (too few requests)"


def open_ends(row: Mapping[str, Any]) -> dict[str, Any]:
    """A row for display: an interval end that has no value beside one that has is shown as open, not blank."""
    out = dict(row)
    for k, v in row.items():
        for end, other in (("_ci_hi", "_ci_lo"), ("_ci_lo", "_ci_hi")):
            if k.endswith(end) and v in ("", None) and row.get(k[: -len(end)] + other) not in ("", None):
                out[k] = OPEN_END
    return out


def _num(v: float | None, digits: int = 4) -> str:
    return "" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.{digits}g}"


def _table(columns: Sequence[str], rows: Iterable[Mapping[str, Any]], cls: str = "", attrs: str = "") -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{_cell(str(r.get(c, '')))}</td>" for c in columns) + "</tr>" for r in rows)
    return f"<table class='{cls}' {attrs}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _found(words: str) -> str:
    """A capacity's bracket, rule and start under its value (bakeoff.report.answer.bracket_words)."""
    return f"<br><small>{html.escape(words)}</small>" if words else ""


def _lead_rows(leads: Sequence[answer.Lead], what: str) -> str:
    rows = []
    for x in leads:
        data = (f"data-experiment='{html.escape(x.experiment)}' data-prompt='{x.prompt_len}' "
                f"data-node='{html.escape(x.node)}' data-load='{html.escape(x.load)}' "
                f"data-leader='{html.escape(x.leader)}' data-value='{x.value!r}' "
                f"data-runner='{html.escape(x.runner_up)}' data-rule='{html.escape(x.rule)}'")
        rule = f"<br><small>{html.escape(x.rule)} rule</small>" if x.rule else ""
        rows.append(f"<tr class='lead' {data}><td>{html.escape(x.load)}{rule}</td><td><b>{html.escape(x.leader)}</b></td>"
                    f"<td>{'at least ' if x.at_least[0] else ''}{_num(x.value)}{_found(x.brackets[0])}</td>"
                    f"<td>{html.escape(x.runner_up) or '&mdash;'}</td>"
                    f"<td>{'at least ' if x.at_least[1] else ''}{_num(x.runner_value)}{_found(x.brackets[1])}</td>"
                    f"<td>{_num(x.margin_pct, 3)}{'%' if x.runner_up else ''}</td>"
                    f"<td class='l'>{html.escape(x.verdict)}</td></tr>")
    head = (f"<tr><th>load</th><th>leader</th><th>{what}</th><th>runner-up</th><th>{what}</th><th>margin</th>"
            f"<th>verdict</th></tr>")
    return f"<table class='answer'><thead>{head}</thead><tbody>{''.join(rows)}</tbody></table>"


def _workloads(rows: Sequence[Mapping[str, Any]]) -> dict[str, tuple[str, str]]:
    """Each experiment's workload (``load.workload``) and what its first row says it replayed; rows from before
    workloads existed are ``fixed``."""
    out: dict[str, tuple[str, str]] = {}
    for r in rows:
        if r.get("experiment") not in out and r.get("status") == "ok":
            out[str(r["experiment"])] = (str(r.get("workload") or "fixed"), str(r.get("workload_detail") or ""))
    return out


def answer_html(rows: Sequence[Mapping[str, Any]], capacity: Sequence[Mapping[str, Any]]) -> str:
    fixed, slo = answer.fixed_leaders(rows), answer.slo_leaders(rows, capacity)
    parts = ["<section id='answer'><h2>The answer</h2>",
             "<p>Leaders by mean output tokens/s over the ok repeats (fixed load), and by the highest concurrency "
             "within each latency SLO (p99 TTFT and p99 TPOT). At fixed load the leader is compared with the "
             "runner-up, paired by block where both ran the same blocks: <b>different</b> where the 95% interval "
             "of the difference excludes 0; <b>equivalent within &plusmn;m%</b> only where the 90% interval lies "
             "inside &plusmn;m (answer.equivalence_margin_pct); otherwise <b>no verdict</b>, with the blocks "
             "that would settle it. An interval that holds 0 shows no difference, and no sameness either. A "
             "block whose cells came from more than one server start (a resumed block) is left out, and the "
             "verdict says so. With one repeat a side there is no verdict. Each answer comes from one node: "
             "rows from different nodes are never averaged. Under an SLO, each load names the rule that judged its "
             "capacity's probes: "
             + "; ".join(f"<i>{html.escape(k)}</i>, {html.escape(v)}" for k, v in answer.RULE_WORDS.items())
             + " (the 95 % upper bound on the share of requests over each bound at most 1 %).</p>"]
    workloads = _workloads(rows)
    for exp, node, p in sorted({(x.experiment, x.node, x.prompt_len) for x in [*fixed, *slo]}):
        here = (exp, node, p)
        kind, detail = workloads.get(exp, ("fixed", ""))
        parts.append(f"<h3 class='answer-head' data-node='{html.escape(node)}' data-workload='{html.escape(kind)}'>"
                     f"{html.escape(exp)}: workload {html.escape(kind)}, prompt {p} tokens, "
                     f"node {html.escape(node) or 'unknown'}</h3>")
        if detail:
            parts.append(f"<p class='workload'>Replayed: {html.escape(detail)}</p>")
        parts.append("<h4>At fixed concurrency (output tokens/s)</h4>")
        parts.append(_lead_rows([x for x in fixed if (x.experiment, x.node, x.prompt_len) == here], "tok/s"))
        parts.append("<h4>Under an SLO (the most concurrent users)</h4>")
        parts.append(_lead_rows([x for x in slo if (x.experiment, x.node, x.prompt_len) == here], "users"))
    return "".join(parts) + "</section>"


def _png(fig: Any) -> str:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return f"<img alt='' src='data:image/png;base64,{base64.b64encode(buf.getvalue()).decode()}'>"


def frontier_html(rows: Sequence[Mapping[str, Any]], capacity: Sequence[Mapping[str, Any]]) -> str:
    points = answer.frontier(rows, capacity)
    table = _table(["experiment", "prompt_len", "node", "variant", "throughput", "throughput_at", "kl", "joules_per_token",
                    "pareto"], [{**p.__dict__, "throughput": _num(p.throughput), "kl": _num(p.kl),
                                 "joules_per_token": _num(p.joules_per_token) or "not measured",
                                 "pareto": "yes" if p.pareto else ""} for p in points], attrs="id='frontier-table'")
    return ("<section id='frontier'><h2>Is the quantization worth it? Throughput, quality loss, energy</h2>"
            "<p>Pareto-optimal: no other variant is at least as good on every measured axis and better on one. "
            "Quality loss is the top-k KL divergence against the same model's 16-bit variant (lower is better); "
            "J/token is measured on GPUs only.</p>"
            f"{_png(frontier_figure(points))}{table}</section>")


STARTS_KEY = ("experiment", "node_id", "engine", "format", "prompt_len", "concurrency")
STARTS_COLUMNS = ["experiment", "engine", "format", "prompt_len", "concurrency", "burst_cell", "burst_p99_ttft_ms",
                  "ramp_cell", "ramp_p99_ttft_ms", "ramp_p99_ttft_ms_whole_cell", "ramp_s"]


def start_pairs(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """A burst's p99 TTFT beside the steady span's, for every load (variant, prompt, concurrency, node) that ran
    both ways: what the start alone moved. Rows from before rows named their start were bursts."""
    by: dict[tuple[str, ...], dict[str, Mapping[str, Any]]] = {}
    for r in rows:
        if r.get("status") not in ("ok", "degraded") or r.get("probe_of") == "rate":
            continue
        by.setdefault(tuple(str(r.get(k, "")) for k in STARTS_KEY), {})[str(r.get("load_start") or "burst")] = r
    out = []
    for key, starts in sorted(by.items()):
        if {"burst", "ramp"} <= set(starts):
            b, m = starts["burst"], starts["ramp"]
            out.append({**dict(zip(STARTS_KEY, key, strict=True)), "burst_cell": b.get("cell") or "",
                        "burst_p99_ttft_ms": b.get("p99_ttft_ms"), "ramp_cell": m.get("cell") or "",
                        "ramp_p99_ttft_ms": m.get("p99_ttft_ms"),
                        "ramp_p99_ttft_ms_whole_cell": m.get("p99_ttft_ms_whole_cell"), "ramp_s": m.get("load_ramp_s")})
    return out


def index_html(summary: Path, capacity_csv: Path | None, plots: Sequence[Path], out: Path,
               answer_csv: Path | None = None) -> None:
    """The page; and the answer as a table (``answer_csv``, results/answer.csv), where given."""
    rows = read_summary(summary)
    capacity = read_summary(capacity_csv) if capacity_csv and capacity_csv.exists() else []
    if answer_csv is not None:
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=answer.ANSWER_COLUMNS, extrasaction="raise")
        w.writeheader()
        w.writerows(answer.answer_rows(rows, capacity))
        atomic_write_text(answer_csv, buf.getvalue())
    capacity = sorted(capacity, key=lambda r: tuple(str(r.get(k, "")) for k in CAPACITY_ORDER))  # by node, then cell
    cap_cols = ([c for c in CAPACITY_ORDER if c in capacity[0]] + [c for c in capacity[0] if c not in CAPACITY_ORDER]
                if capacity else [])
    published = [r for r in rows if r.get("published_refs")]
    cols = list(rows[0]) if rows else []
    ordered = [c for c in LEAD if c in cols] + [c for c in cols if c not in LEAD]
    experiments = sorted({r["experiment"] for r in rows})
    n_ok = sum(r.get("status") == "ok" for r in rows)
    images = "".join(f"<figure><img alt='{html.escape(p.stem)}' src='data:image/png;base64,"
                     f"{base64.b64encode(p.read_bytes()).decode()}'><figcaption>{html.escape(p.stem)}</figcaption>"
                     f"</figure>" for p in plots if p.exists())
    page = (f"<!doctype html><html><head><meta charset='utf-8'><title>bakeoff: {html.escape(', '.join(experiments))}"
            f"</title>{STYLE}<style>section{{margin-bottom:2em}}table.answer td,table.answer th{{text-align:left}}"
            f"img{{max-width:100%}}</style></head><body>"
            f"<h1>bakeoff: {html.escape(', '.join(experiments))}</h1>"
            f"<p>{len(rows)} rows, {n_ok} ok; {len(capacity)} capacity results. Every number below is in "
            f"results/summary.csv and results/capacity.csv.</p>"
            f"{answer_html(rows, capacity)}{frontier_html(rows, capacity)}"
            f"<section id='capacity'><h2>Capacity under each SLO</h2>"
            + (_table(cap_cols, capacity, "sortable") if capacity else
               "<p>No capacity search ran (set <code>load.mode=capacity</code>).</p>")
            + ("<h3>One load, two starts</h3><p>p99 TTFT where the same load ran as a burst (every user at once) "
               "and on a ramp (the steady span after it, and the whole cell with the ramp).</p>"
               + _table(STARTS_COLUMNS, pairs, "sortable") if (pairs := start_pairs(rows)) else "")
            + "</section><section id='published'><h2>Published numbers beside ours</h2>"
            + (_table(PUBLISHED, published, "sortable") if published else
               "<p>No row matches a published number (data/published_numbers.yaml).</p>")
            + f"</section><section id='plots'><h2>Plots</h2>{images}</section>"
            f"<section id='table'><h2>Every row</h2><input id='filter' placeholder='filter rows'>"
            f"{_table(ordered, [open_ends(r) for r in rows], 'sortable', 'data-filter=filter')}</section>{SCRIPT}"
            f"</body></html>\n")
    atomic_write_text(out, page)


def run_command(a: argparse.Namespace) -> None:
    """``bakeoff pages``: the summary and environment pages, and the report's index page where asked."""
    summary_html(Path(a.summary), Path(a.summary_html))
    environment_html(Path(a.versions), Path(a.config), Path(a.environment_html),
                     Path(a.hardware_json) if a.hardware_json else None)
    if a.index_html:
        index_html(Path(a.summary), Path(a.capacity) if a.capacity else None, [Path(p) for p in a.plots],
                   Path(a.index_html), Path(a.answer_csv) if a.answer_csv else None)
