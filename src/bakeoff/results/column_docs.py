"""``docs/columns.md``: the data dictionary (bakeoff.results.columns) as one Markdown page.

Why generated: a hand-kept page drifts from the columns the code writes; this one is rewritten by
``bakeoff columns --write docs/columns.md`` and a test fails while the committed page differs from what
the registry renders.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bakeoff.layout import COLUMNS_DOC
from bakeoff.models.artifacts import atomic_write_text
from bakeoff.results.columns import SCHEMA_VERSION, TABLES, Column, Family, Table

# How a name reads, suffix by suffix: the conventions the families below follow.
SUFFIXES = [
    ("`_ms`, `_s`", "milliseconds, seconds"),
    ("`_bytes`, `_gbs`", "bytes, GB/s (10^9 bytes a second)"),
    ("`_tok_s`", "tokens a second (vLLM's own throughput names carry no unit: see the vllm family)"),
    ("`_w`, `_j`, `_mhz`, `_c`", "watts, joules, MHz, degrees Celsius"),
    ("`_share`", "a fraction, 0 to 1"),
    ("`_pct`", "a percentage, 0 to 100 (`_vs_ref_pct`: a relative difference in percent)"),
    ("`_ci_lo`, `_ci_hi`", "the two bounds of a 95 % interval of one cell's statistic"),
    ("`_ci95`", "the half-width of a 95 % interval across repeats: the interval is the mean ± it"),
    ("`_vs_published`, `_over_`", "a ratio, measured over the reference (1 = equal)"),
    ("`_rel_delta`, `_abs_delta`", "variant / reference - 1 (a fraction); variant - reference (own unit)"),
    ("`peak_`, `_peak_`", "the highest value over the measured window"),
    ("`_n`, `_probes`, `_requests`", "counts"),
]


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def writers(c: Column) -> str:
    """The column's writer modules, each as code."""
    return ", ".join(f"`{w}`" for w in c.writer.split(", "))


def _family(f: Family) -> list[str]:
    lines = [f"### {f.name}", "", f.convention, "", "| column | unit | definition | written by |",
             "|---|---|---|---|"]
    lines += [f"| `{c.name}` | {_cell(c.unit)} | {_cell(c.definition)} | {writers(c)} |" for c in f.columns]
    return [*lines, ""]


def _table(t: Table) -> list[str]:
    lines = [f"## {t.path}", "", f"{t.about} {len(t.columns())} columns, by family.", ""]
    for f in t.families:
        lines += _family(f)
    return lines


def render(tables: tuple[Table, ...] = TABLES) -> str:
    """The whole page."""
    lines = [
        "# Columns of the results tables",
        "",
        f"Generated from `src/bakeoff/results/columns.py` by `bakeoff columns --write {COLUMNS_DOC}`; edit the "
        "registry, not this page. Every row of both tables carries `schema_version`, now "
        f"{SCHEMA_VERSION}: it is raised when a column is renamed or removed or changes unit or meaning.",
        "",
        "Empty cells mean \"not measured here\" (a CPU run has no GPU telemetry; a single repeat has no "
        "spread). vLLM's own names (`output_throughput`, `p99_tpot_ms`, ...) are kept as `vllm bench serve` "
        "prints them, so its numbers and ours compare directly.",
        "",
        "How a name reads:",
        "",
        "| in a name | means |",
        "|---|---|",
        *[f"| {a} | {b} |" for a, b in SUFFIXES],
        "",
    ]
    for t in tables:
        lines += _table(t)
    return "\n".join(lines).rstrip("\n") + "\n"


def run_command(a: argparse.Namespace) -> None:
    """``bakeoff columns [--write PATH]``: the data dictionary as Markdown, printed or written."""
    if a.write:
        Path(a.write).parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(Path(a.write), render())
    else:
        sys.stdout.write(render())
