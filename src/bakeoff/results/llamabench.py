"""llama-bench results beside llama.cpp's CUDA scoreboard (data/published_numbers.yaml).

Why: the scoreboard (ggml-org/llama.cpp discussion #15013) is the one public
table of llama.cpp GPU speed with a fixed model (Llama-2-7B Q4_0, 3.56 GiB)
and fixed commands (``llama-bench -ngl 99 -fa 0,1``, pp512 and tg128). A run
of the same shape on another GPU is comparable row by row; the ratio to each
scoreboard GPU, next to the ratio of their memory bandwidths, says whether the
measurement is plausible (decode, tg128, is bandwidth-bound).

Reads llama-bench's own ``-o json`` output (one record per test).
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
from pathlib import Path
from typing import Any

from bakeoff.errors import BakeoffError
from bakeoff.results import published

# Datasheet HBM bandwidth, GB/s, of the scoreboard's GPUs and ours (for the plausibility column).
BANDWIDTH_GBS = {"v100": 900.0, "a100": 2039.0, "h100": 3350.0, "rtx4090": 1008.0, "h200": 4800.0}
COLUMNS = ["hardware", "test", "flash_attn", "measured_tok_s", "measured_stddev", "reference_hardware",
           "published_tok_s", "measured_vs_published", "bandwidth_ratio", "model_size_bytes", "n_params", "source"]


def parse(bench_json: Path) -> list[dict[str, Any]]:
    """llama-bench records -> {test: pp512|tg128, flash_attn, tok_s, stddev, model_size, n_params}."""
    return parse_records(json.loads(Path(bench_json).read_text()))


def warm_rate(record: dict[str, Any]) -> tuple[float, float, int]:
    """(mean, sample stddev, repetitions dropped) of one test's tokens/s, its first repetition left out.

    The pinned llama-bench's first repetition runs cold: on the H200, f16 pp512 read 14215 tok/s, then
    24087, 23931, 24032, 23755 (runs/h200-llamacpp-blocks-2026-12-04). With three or more samples the
    first is dropped; with fewer, llama-bench's own mean and stddev are kept.
    """
    samples = [float(x) for x in record.get("samples_ts") or []]
    if len(samples) < 3:
        return float(record["avg_ts"]), float(record["stddev_ts"]), 0
    warm = samples[1:]
    return statistics.fmean(warm), statistics.stdev(warm), 1


def parse_records(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for r in records:
        test = f"pp{r['n_prompt']}" if r["n_gen"] == 0 else f"tg{r['n_gen']}"
        tok_s, stddev, dropped = warm_rate(r)
        out.append({"test": test, "flash_attn": int(bool(r.get("flash_attn"))), "tok_s": tok_s,
                    "stddev": stddev, "cold_repetitions_dropped": dropped, "model_size": int(r["model_size"]),
                    "n_params": int(r["model_n_params"]), "gpu": r.get("gpu_info", "")})
    return out


def compare(bench_json: Path, hardware: str, pub: published.Published | None = None) -> list[dict[str, Any]]:
    """One row per (measured test, scoreboard GPU with the same test and flash-attention setting)."""
    pub = pub or published.load()
    rows = []
    for m in parse(bench_json):
        metric = f"{m['test']}_tok_s"
        for p in pub.rows:
            if (p.kind != "measurement" or p.metric != metric or p.match.get("engine") != "llama-bench"
                    or int(p.match.get("engine_settings.flash_attn", -1)) != m["flash_attn"]):
                continue
            ref = str(p.match["hardware"])
            bw, ref_bw = BANDWIDTH_GBS.get(hardware), BANDWIDTH_GBS.get(ref)
            rows.append({
                "hardware": hardware, "test": m["test"], "flash_attn": m["flash_attn"],
                "measured_tok_s": round(m["tok_s"], 2), "measured_stddev": round(m["stddev"], 2),
                "reference_hardware": ref, "published_tok_s": p.value,
                "measured_vs_published": round(m["tok_s"] / float(p.value), 3),
                "bandwidth_ratio": round(bw / ref_bw, 3) if bw and ref_bw else "",
                "model_size_bytes": m["model_size"], "n_params": m["n_params"], "source": p.id})
    return rows


def write_csv(rows: list[dict[str, Any]], out: Path) -> None:
    with open(out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        w.writerows(rows)


def compare_command(a: argparse.Namespace) -> None:
    """``bakeoff llama-bench-compare``: llama-bench's JSON beside the CUDA scoreboard's rows."""
    rows = compare(Path(a.bench_json), a.hardware)
    if not rows:
        raise BakeoffError(f"{a.bench_json}: no test matches a scoreboard row (pp512/tg128, -fa 0 or 1)")
    write_csv(rows, Path(a.out))
    for r in rows:
        print("  ".join(str(r[c]) for c in COLUMNS[:9]))
