"""``results/metrics.json``: the summary in the shape DVC metrics read (JSON, nested).

Why not the CSV: ``dvc metrics``/``dvc exp show`` read JSON/YAML/TOML only.
Keys are ``<experiment>/<engine>-<format>/c<conc>-p<prompt>[-r<repeat>]`` ->
the headline numbers; quality columns and measured/published ratios are
included whenever the summary has them, so later columns appear without a
change here.
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path
from typing import Any

from bakeoff.layout import row_cell_name, variant_name
from bakeoff.models.artifacts import atomic_write_text
from bakeoff.results.numbers import number

HEADLINE = ["output_throughput", "request_throughput", "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms",
            "decode_tok_s", "decode_efficiency_pct", "ppl", "ppl_rel_delta_vs_fp16", "kl_vs_fp16", "accuracy"]




def metrics(summary: Path) -> dict[str, Any]:
    with open(summary, newline="") as f:
        rows = list(csv.DictReader(f))
    out: dict[str, Any] = {}
    for r in rows:
        cell = row_cell_name(r)
        keys = [k for k in r if k in HEADLINE or k.endswith("_vs_published")]
        vals = {k: v for k in keys if (v := number(r.get(k))) is not None}
        vals["ok"] = int(r.get("status") == "ok")
        out.setdefault(r["experiment"], {}).setdefault(variant_name(r["engine"], r["format"]), {})[cell] = vals
    return out


def write(summary: Path, out: Path) -> None:
    atomic_write_text(Path(out), json.dumps(metrics(summary), indent=1, sort_keys=True) + "\n")


def run_command(a: argparse.Namespace) -> None:
    """``bakeoff dvc-metrics SUMMARY``: results/metrics.json, DVC's metrics file."""
    write(Path(a.summary), Path(a.out))
