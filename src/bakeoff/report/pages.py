"""HTML pages for ``snakemake --report``: the summary table, and hardware + versions.

Why pages and not only the CSV: the report is what a reader opens; the
summary must be readable there (sortable by eye, failures visible), and the
hardware and pinned versions must sit next to the numbers they qualify.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from bakeoff.layout import variant_name
from bakeoff.models.artifacts import atomic_write_text
from bakeoff.report.plots import read_summary
from bakeoff.results import spread

STYLE = """<style>body{font-family:sans-serif;font-size:13px}table{border-collapse:collapse}
td,th{border:1px solid #ccc;padding:2px 6px;text-align:right;white-space:nowrap}th{background:#eee;position:sticky;top:0}
tr.bad td{color:#a00}td.l{text-align:left}</style>"""

# Columns shown first in the table (the rest follow, in summary order).
LEAD = ["experiment", "engine", "format", "concurrency", "prompt_len", "status", "output_throughput",
        "median_ttft_ms", "median_tpot_ms", "repeats_ok", "output_throughput_cv_pct", "output_throughput_vs_ref_pct",
        "output_throughput_vs_ref_verdict", "client_saturated", "decode_tok_s", "decode_efficiency_pct", "ppl",
        "accuracy", "output_throughput_vs_published", "sweep", "reason"]


def _cell(v: str) -> str:
    try:
        f = float(v)
        return f"{f:.4g}" if abs(f) < 1e6 else f"{f:.4e}"
    except ValueError:
        return html.escape(v)


def summary_html(summary: Path, out: Path) -> None:
    rows = read_summary(summary)
    cols = list(rows[0].keys()) if rows else []
    ordered = [c for c in LEAD if c in cols] + [c for c in cols if c not in LEAD]
    head = "".join(f"<th>{html.escape(c)}</th>" for c in ordered)
    body = []
    for r in rows:
        cls = "" if r.get("status") == "ok" else " class='bad'"
        tds = "".join(
            f"<td class='l'>{html.escape(r[c])}</td>" if c in ("engine_settings", "reason", "sweep", "overrides") else
            f"<td>{_cell(r[c])}</td>" for c in ordered)
        body.append(f"<tr{cls}>{tds}</tr>")
    n_ok = sum(r.get("status") == "ok" for r in rows)
    atomic_write_text(out, f"<html><head><meta charset='utf-8'>{STYLE}</head><body>"
                           f"<h2>Summary: {len(rows)} cells, {n_ok} ok</h2>"
                           f"{differences_html(rows)}{status_disagreements_html(rows)}"
                           f"<table><tr>{head}</tr>{''.join(body)}</table></body></html>\n")


def _list(title: str, lines: list[str]) -> str:
    items = "".join(f"<li>{html.escape(x)}</li>" for x in lines) or "<li>none</li>"
    return f"<h4>{html.escape(title)} ({len(lines)})</h4><ul>{items}</ul>"


def differences_html(rows: list[dict[str, str]]) -> str:
    """Each variant against its engine's 16-bit variant (and the engines' 16-bit variants against each other).

    Each difference gets its verdict (bakeoff.results.spread): different (the 95 % interval excludes 0),
    equivalent within the row's margin (the 90 % interval inside it), or no verdict with the blocks that would
    settle it; paired by block where both ran the same blocks on one node, else Welch's t-test. Resumed blocks
    are left out and named. Only rows of one node are compared; how far the same cell moved between nodes is
    listed apart.
    """
    margins = {str(r.get("experiment")): spread.margin_of(r) for r in rows}
    by_kind: dict[str, list[str]] = {spread.DIFFERENT: [], spread.EQUIVALENT: [], spread.NO_VERDICT: []}
    for c in spread.comparisons(rows):
        m = margins.get(c.key[spread.CELL_KEY.index("experiment")], spread.DEFAULT_MARGIN_PCT)
        by_kind[c.verdict(m).kind].append(c.line(m))
    nodes = [f"{n.cell} {n.variant}: {n.metric} " + ", ".join(f"{k}: {v:.1f}" for k, v in n.node_means.items())
             + f" (range {n.range_pct:.1f}% of the median)" for n in spread.node_spread(rows)]
    shown = sorted({f"{m:g}" for m in margins.values()}) or [f"{spread.DEFAULT_MARGIN_PCT:g}"]
    return (f"<h3>Differences and their verdicts (within one node; paired by block, else Welch's t-test; "
            f"equivalence margin &plusmn;{'/'.join(shown)}%)</h3>"
            f"{_list('Different (the 95% interval excludes 0)', by_kind[spread.DIFFERENT])}"
            f"{_list('Equivalent (the 90% interval lies inside the margin)', by_kind[spread.EQUIVALENT])}"
            f"{_list('No verdict (and what would settle it)', by_kind[spread.NO_VERDICT])}"
            f"{_list('The same cell on different nodes (never compared)', nodes)}")


def status_disagreements_html(rows: list[dict[str, str]]) -> str:
    """Variants whose measured status contradicts the doctor's prediction.

    Predicted ``unsupported`` but it ran (ok/degraded), or predicted ``supported`` but the engine refused it
    (``unsupported``). A ``failed`` cell says nothing about capability, so it is no disagreement.
    """
    seen: dict[tuple[str, str, str], tuple[str, str, str]] = {}
    for r in rows:
        predicted, status = r.get("predicted_status", ""), r.get("status", "")
        ran = status in ("ok", "degraded")
        if (predicted == "unsupported" and ran) or (predicted == "supported" and status == "unsupported"):
            seen.setdefault((r.get("experiment", ""), r.get("engine", ""), r.get("format", "")),
                            (predicted, status, r.get("reason") or r.get("predicted_reason", "")))
    lines = [f"{e} {variant_name(g, f)}: predicted {p}, measured {s}: {why[:300]}"
             for (e, g, f), (p, s, why) in sorted(seen.items())]
    return _list("Predicted vs measured status: disagreements", lines)


def _kv_table(title: str, data: dict[str, Any]) -> str:
    def show(v: Any) -> str:
        return html.escape(json.dumps(v) if isinstance(v, (dict, list)) else str(v))

    rows = "".join(f"<tr><td class='l'>{show(k)}</td><td class='l'>{show(v)}</td></tr>" for k, v in data.items())
    return f"<h3>{html.escape(title)}</h3><table>{rows}</table>"


def environment_html(versions_json: Path, config_json: Path, out: Path, hardware_json: Path | None = None) -> None:
    """Hardware (configured, and detected when ``results/hardware.json`` exists) and pinned versions."""
    versions = json.loads(Path(versions_json).read_text())
    points = json.loads(Path(config_json).read_text())
    parts = [_kv_table("Pinned versions", versions)]
    for name, p in points.items():
        parts.append(_kv_table(f"Hardware (configured) -- {name}", p["config"]["hardware"]))
    if hardware_json and Path(hardware_json).is_file():
        parts.append(_kv_table("Hardware (detected, results/hardware.json)", json.loads(Path(hardware_json).read_text())))
    else:
        parts.append("<p>results/hardware.json not present (run the doctor stage to record the detected hardware).</p>")
    for name, p in points.items():
        parts.append(_kv_table(f"Sweep point {name}: axes", {"sweep": p.get("sweep", ""), "overrides": p.get("overrides", ""),
                                                             "config_hash": p.get("config_hash", "")}))
    atomic_write_text(out, f"<html><head><meta charset='utf-8'>{STYLE}</head><body>{''.join(parts)}</body></html>\n")
