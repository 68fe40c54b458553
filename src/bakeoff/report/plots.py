"""Plots from ``results/summary.csv`` and the per-request JSONL.

Why PNG files written by one stage: the same images go into the Snakemake
report and into MLflow, so they are made once. Every plot renders even when
its data is missing (quality columns before the quality stage exists, a
variant with no successful cell): it then says what is missing instead of
failing the pipeline.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # headless: never needs a display
import matplotlib.pyplot as plt  # noqa: E402

from bakeoff.layout import row_cell_name, row_variant_key, variant_name, variant_of  # noqa: E402
from bakeoff.loadgen.metrics import RequestRecord  # noqa: E402
from bakeoff.models.artifacts import staged_dir  # noqa: E402
from bakeoff.results.numbers import number as num  # noqa: E402

PLOTS = ["throughput_vs_concurrency.png", "ttft.png", "tpot.png", "quality_vs_speed.png", "roofline.png"]
QUALITY = ["ppl", "accuracy", "ppl_rel_delta_vs_fp16", "kl_vs_fp16"]


def read_summary(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def variant(r: dict[str, str]) -> str:
    label = variant_name(r["engine"], r["format"])
    if r.get("sweep"):
        label += f" [{r['sweep']}]"
    elif r.get("experiment") and "." in r["experiment"]:
        label += f" [{r['experiment'].split('.', 1)[1]}]"
    return label


def _empty(ax: Any, msg: str) -> None:
    ax.text(0.5, 0.5, msg, ha="center", va="center", wrap=True, transform=ax.transAxes, fontsize=10, color="0.4")
    ax.set_xticks([])
    ax.set_yticks([])


def _ok(rows: Iterable[dict[str, str]]) -> list[dict[str, str]]:
    """The fixed cells that succeeded (capacity probes are shown by the report's capacity table)."""
    return [r for r in rows if r.get("status") == "ok" and not r.get("probe_of")]


def _lines_vs_concurrency(ax: Any, series: dict[str, list[tuple[int, float]]], ylabel: str, legend_size: int) -> None:
    """One line per named series over concurrency (log2 axis); the axes and legend every such plot shares."""
    for name, pts in sorted(series.items()):
        pts.sort()
        ax.plot([c for c, _ in pts], [y for _, y in pts], marker="o", label=name)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("concurrency")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=legend_size)


def _save(fig: Any, out: Path) -> None:
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def throughput_figure(rows: list[dict[str, str]]) -> Any:
    """Output tok/s against concurrency, one panel per prompt length: the median of a cell's repeats, with
    bars from their lowest to their highest (no bar with one repeat)."""
    prompts = sorted({int(r["prompt_len"]) for r in rows if r.get("prompt_len")}) or [0]
    fig, axes = plt.subplots(1, len(prompts), figsize=(6 * len(prompts), 4.5), squeeze=False)
    for ax, p in zip(axes[0], prompts, strict=True):
        cells: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
        for r in _ok(rows):
            if int(r["prompt_len"]) == p and (y := num(r.get("output_throughput"))) is not None:
                cells[variant(r)][int(r["concurrency"])].append(y)
        if not cells:
            _empty(ax, f"no successful cells at prompt {p}")
            continue
        for name, by_c in sorted(cells.items()):
            cs = sorted(by_c)
            mid = [statistics.median(by_c[c]) for c in cs]
            err = [[m - min(by_c[c]) for c, m in zip(cs, mid, strict=True)],
                   [max(by_c[c]) - m for c, m in zip(cs, mid, strict=True)]]
            ax.errorbar(cs, mid, yerr=err, marker="o", capsize=3, label=name)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrency")
        ax.set_ylabel("output tokens/s (aggregate; median, bars: repeats' range)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        ax.set_title(f"prompt {p} tokens")
    fig.suptitle("Output throughput vs concurrency, per variant")
    return fig


def throughput_vs_concurrency(rows: list[dict[str, str]], out: Path) -> None:
    _save(throughput_figure(rows), out)


def request_latencies(jsonl: Path) -> tuple[list[float], list[float]]:
    """TTFT and TPOT (ms) of the successful requests in one cell's JSONL (TPOT as the metrics define it)."""
    ttft, tpot = [], []
    with open(jsonl) as f:
        for line in f:
            rec = RequestRecord.from_json(json.loads(line))
            if not rec.success:
                continue
            ttft.append(1000 * rec.ttft)
            if (t := rec.tpot) is not None:
                tpot.append(1000 * t)
    return ttft, tpot


def latency_distributions(rows: list[dict[str, str]], cell_dirs: dict[str, Path], out_ttft: Path, out_tpot: Path) -> None:
    """Box plots per variant and concurrency, all prompt lengths pooled."""
    data: dict[str, dict[tuple[str, int], list[float]]] = {"ttft": defaultdict(list), "tpot": defaultdict(list)}
    for r in _ok(rows):
        d = cell_dirs.get(row_variant_key(r))
        if d is None:
            continue
        jsonl = d / f"{row_cell_name(r)}.jsonl"
        if not jsonl.is_file():
            continue
        ttft, tpot = request_latencies(jsonl)
        key = (variant(r), int(r["concurrency"]))
        data["ttft"][key] += ttft
        data["tpot"][key] += tpot
    for metric, out in (("ttft", out_ttft), ("tpot", out_tpot)):
        series = data[metric]
        fig, ax = plt.subplots(figsize=(max(6, 0.5 * len(series) + 2), 4.5))
        if not series:
            _empty(ax, f"no per-request records with {metric.upper()}")
        else:
            keys = sorted(series, key=lambda k: (k[0], k[1]))
            ax.boxplot([series[k] for k in keys], showfliers=True)
            ax.set_xticks(range(1, len(keys) + 1), [f"{v}\nc={c}" for v, c in keys], rotation=90, fontsize=7)
            ax.set_yscale("log")
            ax.set_ylabel(f"{metric.upper()} per request, ms")
            ax.grid(alpha=0.3, axis="y")
        ax.set_title(f"{metric.upper()} distribution per variant and concurrency (all prompt lengths)")
        _save(fig, out)


def quality_vs_speed(rows: list[dict[str, str]], out: Path) -> int:
    """Quality (first quality column present) vs single-stream decode speed (c=1), one point per variant.

    Returns the number of variants plotted (0: the figure says what is missing).
    """
    pts: dict[str, tuple[float, float]] = {}
    metric = next((m for m in QUALITY if any(num(r.get(m)) is not None for r in rows)), None)
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    if metric is None:
        _empty(ax, "no quality columns in the summary yet\n(" + ", ".join(QUALITY) + ")")
    else:
        for r in _ok(rows):
            q, s = num(r.get(metric)), num(r.get("decode_tok_s")) or num(r.get("output_throughput"))
            if q is not None and s is not None and r.get("concurrency") == "1":
                pts.setdefault(variant(r), (s, q))
        if not pts:
            _empty(ax, f"no variant has both {metric} and a c=1 speed")
        for name, (s, q) in sorted(pts.items()):
            ax.scatter([s], [q])
            ax.annotate(name, (s, q), fontsize=8, xytext=(4, 4), textcoords="offset points")
        ax.set_xlabel("single-stream decode, tokens/s (c=1)")
        ax.set_ylabel(metric)
        ax.grid(alpha=0.3)
    ax.set_title("Quality vs speed")
    _save(fig, out)
    return len(pts)


def roofline_plot(rows: list[dict[str, str]], out: Path) -> None:
    """Decode efficiency (% of the bandwidth ceiling) vs concurrency per variant."""
    series: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for r in _ok(rows):
        if (e := num(r.get("decode_efficiency_pct"))) is not None:
            series[f"{variant(r)} p{r['prompt_len']}"].append((int(r["concurrency"]), e))
    fig, ax = plt.subplots(figsize=(7, 4.5))
    if not series:
        _empty(ax, "no roofline data (hardware.mem_bandwidth_gbs or weight_bytes missing)")
    else:
        _lines_vs_concurrency(ax, series, "per-sequence decode, % of B/W ceiling", legend_size=7)
    ax.set_title("Decode roofline efficiency")
    _save(fig, out)


def frontier_figure(points: Sequence[Any]) -> Any:
    """Throughput against quality loss (KL vs 16-bit), one panel per (experiment, prompt length); Pareto-optimal
    variants filled and named in bold. ``points``: bakeoff.report.answer.FrontierPoint."""
    keys = sorted({(p.experiment, p.prompt_len, p.node) for p in points}) or [("", 0, "")]
    fig, axes = plt.subplots(1, len(keys), figsize=(5.5 * len(keys), 4.2), squeeze=False)
    for ax, key in zip(axes[0], keys, strict=True):
        group = [p for p in points if (p.experiment, p.prompt_len, p.node) == key]
        # x: quality loss where every variant has it, else energy per token, else nothing to plot against
        axis = next(((name, label) for name, label in (
            ("kl", "quality loss: top-k KL vs 16-bit (lower is better)"),
            ("joules_per_token", "J per output token (lower is better)")) if group and all(
                getattr(p, name) is not None for p in group)), None)
        if axis is None:
            _empty(ax, "no quality loss (kl_vs_fp16) or energy measured for every variant")
            continue
        known = group
        for p in known:
            x = getattr(p, axis[0])
            ax.scatter([x], [p.throughput], s=60, marker="o", facecolors="C3" if p.pareto else "none",
                       edgecolors="C3" if p.pareto else "C0")
            ax.annotate(p.variant, (x, p.throughput), fontsize=8, xytext=(4, 4), textcoords="offset points",
                        fontweight="bold" if p.pareto else "normal")
        ax.set_xlabel(axis[1])
        ax.set_ylabel(f"output tokens/s ({known[0].throughput_at})" if len({p.throughput_at for p in known}) == 1
                      else "output tokens/s (at capacity, else highest concurrency)")
        ax.set_title(f"{key[0]}, prompt {key[1]}, node {key[2] or 'unknown'}: filled = Pareto-optimal")
        ax.grid(alpha=0.3)
    return fig


def render_all(summary: Path, cell_indexes: list[Path], out_dir: Path) -> list[Path]:
    """Write every plot into ``out_dir`` (atomically: all or none)."""
    rows = read_summary(summary)
    cell_dirs = {variant_of(Path(idx)).key: Path(idx).parent for idx in cell_indexes}
    with staged_dir(out_dir) as tmp:
        throughput_vs_concurrency(rows, tmp / PLOTS[0])
        latency_distributions(rows, cell_dirs, tmp / PLOTS[1], tmp / PLOTS[2])
        quality_vs_speed(rows, tmp / PLOTS[3])
        roofline_plot(rows, tmp / PLOTS[4])
    return [out_dir / p for p in PLOTS]


def run_command(a: argparse.Namespace) -> None:
    """``bakeoff plots``: the report's PNG plots from the summary and the per-request records."""
    for p in render_all(Path(a.summary), [Path(p) for p in a.indexes], Path(a.out)):
        print(p)
