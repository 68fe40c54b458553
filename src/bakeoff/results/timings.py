"""Where a pipeline run spent its time: the rules' ``benchmark:`` files as one table.

Snakemake writes one TSV per job under ``logs/bench/`` (wall seconds, peak RSS,
CPU time). Summed by rule, they answer "what does ``make run`` wait for",
which is where docs/development.md's Timings come from.
"""

from __future__ import annotations

import argparse
import csv
from collections import defaultdict
from pathlib import Path

# The first path component under logs/bench/ that names each rule's outputs (the Snakefile's grammar).
RULE_OF = {"build/llamacpp": "build_llamacpp", "build/llamacpp-python": "build_llamacpp_python",
           "models": "model preparation", "results/raw": "serve_load", "results/plots": "plots",
           "results/mlflow": "track", "results/kernel": "kernel_bench"}


def _rule(rel: Path) -> str:
    parts = rel.with_suffix("").parts
    for n in (2, 1):
        key = "/".join(parts[:n])
        if key in RULE_OF:
            return RULE_OF[key]
    return "/".join(parts[:-1]) or rel.stem


def table(bench_dir: Path) -> list[tuple[str, int, float, float]]:
    """(rule, jobs, wall seconds, CPU seconds) per rule, longest first."""
    wall: dict[str, float] = defaultdict(float)
    cpu: dict[str, float] = defaultdict(float)
    jobs: dict[str, int] = defaultdict(int)
    for tsv in sorted(Path(bench_dir).rglob("*.tsv")):
        with open(tsv, newline="") as f:
            rows = list(csv.DictReader(f, delimiter="\t"))
        if not rows:
            continue
        rule = _rule(tsv.relative_to(bench_dir))
        jobs[rule] += 1
        wall[rule] += float(rows[-1]["s"])
        cpu[rule] += float(rows[-1].get("cpu_time") or 0)
    return sorted(((r, jobs[r], wall[r], cpu[r]) for r in wall), key=lambda t: -t[2])


def markdown(bench_dir: Path) -> str:
    rows = table(bench_dir)
    total = sum(r[2] for r in rows) or 1.0
    lines = ["| step | jobs | wall (min) | share | CPU (min) |", "|---|---|---|---|---|"]
    lines += [f"| {r} | {n} | {w / 60:.1f} | {100 * w / total:.0f}% | {c / 60:.1f} |" for r, n, w, c in rows]
    lines.append(f"| **all benchmarked jobs** | {sum(r[1] for r in rows)} | {total / 60:.1f} | | |")
    return "\n".join(lines)


def run_command(a: argparse.Namespace) -> None:
    """``bakeoff timings [DIR]``: where a run spent its time, by rule (Markdown)."""
    print(markdown(Path(a.bench_dir)))
