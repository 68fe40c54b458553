"""Quality columns of the summary: each variant against its fp16 reference.

The reference of a variant is the 16-bit variant *of the same engine*
(vLLM ``fp16``, llama.cpp ``f16``: the highest bits per weight, at least 15.5),
so ``ppl_rel_delta_vs_fp16`` and ``kl_vs_fp16`` isolate the format's effect from
the engine's; the engine effect is the difference between the engines' own
16-bit rows. Both are computed on the same text: the perplexity task's
documents, and the KL reference tokens (see bakeoff.quality.evaluate).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bakeoff.layout import QUALITY_FILE, TOPK_FILE
from bakeoff.quality.topk import mean_kl

QUALITY_COLUMNS = ["quality_status", "quality_reason", "ppl", "bits_per_byte", "ppl_task", "ppl_n", "accuracy",
                   "accuracy_task", "accuracy_n", "ppl_rel_delta_vs_fp16", "kl_vs_fp16", "quality_ref", "quality_route"]
MIN_REF_BITS = 15.5


def _load(variant_dir: Path) -> dict[str, Any]:
    p = variant_dir / QUALITY_FILE
    return json.loads(p.read_text()) if p.exists() else {"status": "missing", "reason": f"no {p}"}


def _first(tasks: dict[str, dict], metric: str) -> tuple[str, dict] | None:
    for name, row in tasks.items():
        if metric in row:
            return name, row
    return None


def _topk(variant_dir: Path) -> list[dict] | None:
    p = variant_dir / TOPK_FILE
    return json.loads(p.read_text())["positions"] if p.exists() else None


def quality_columns(variants: list[tuple[Path, dict[str, Any]]]) -> dict[Path, dict[str, Any]]:
    """``variants``: (result dir, cells.json "variant" block). Returns columns per result dir."""
    cols: dict[Path, dict[str, Any]] = {}
    for d, _v in variants:
        q = _load(d)
        row: dict[str, Any] = {"quality_status": q.get("status"), "quality_reason": q.get("reason", ""),
                               "quality_route": q.get("route", "")}
        tasks = q.get("tasks", {}) if q.get("status") == "ok" else {}
        if ppl := _first(tasks, "word_perplexity"):
            row.update(ppl=ppl[1]["word_perplexity"], bits_per_byte=ppl[1].get("bits_per_byte"), ppl_task=ppl[0],
                       ppl_n=ppl[1]["n"])
        if acc := _first(tasks, "acc"):
            # Length-normalized accuracy where the task has it (choices differ in length), as lm-eval reports
            # for hellaswag/arc; the task column names the metric used.
            metric = "acc_norm" if "acc_norm" in acc[1] else "acc"
            row.update(accuracy=acc[1][metric], accuracy_task=f"{acc[0]}/{metric}", accuracy_n=acc[1]["n"])
        cols[d] = row
    by_engine: dict[str, list[tuple[Path, dict]]] = {}
    for d, v in variants:
        by_engine.setdefault(v["engine"], []).append((d, v))
    for members in by_engine.values():
        refs = [(d, v) for d, v in members if (v.get("bits_per_weight") or 0) >= MIN_REF_BITS
                and cols[d].get("ppl") is not None]
        if not refs:
            continue
        ref_dir, ref_v = max(refs, key=lambda dv: dv[1]["bits_per_weight"])
        ref_cols, ref_topk = cols[ref_dir], _topk(ref_dir)
        for d, _v in members:
            row = cols[d]
            row["quality_ref"] = f"{ref_v['engine']}-{ref_v['format']}"
            if row.get("ppl") is not None and row.get("ppl_task") == ref_cols.get("ppl_task"):
                row["ppl_rel_delta_vs_fp16"] = row["ppl"] / ref_cols["ppl"] - 1.0
            var_topk = _topk(d)
            if ref_topk and var_topk and row.get("quality_status") == "ok":
                row["kl_vs_fp16"] = mean_kl(ref_topk, var_topk)
    return cols
