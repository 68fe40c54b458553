"""The Snakemake report renders with the summary, plots, hardware and versions; plots survive missing data."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from bakeoff.report.plots import QUALITY, quality_vs_speed, read_summary, render_all

from conftest import Pipeline

pytestmark = pytest.mark.slow  # every test reads the pipeline's outputs


def test_snakemake_report_renders(pipeline: Pipeline, tmp_path: Path) -> None:
    out = tmp_path / "report.html"
    pipeline.snakemake("--cores", "1", "--report", str(out), "--config", f"experiment={pipeline.experiment}")
    html = out.read_text(errors="replace")
    for name in ("throughput_vs_concurrency.png", "ttft.png", "tpot.png", "quality_vs_speed.png", "roofline.png",
                 "summary.html", "environment.html"):
        assert name in html, name
    env = (pipeline.results / "report" / "environment.html").read_text()
    for key in ("llamacpp_commit", "lm_eval", "torch", "cuda_driver", "git_sha", "model_sha256", "mem_bandwidth_gbs"):
        assert key in env, key
    table = (pipeline.results / "report" / "summary.html").read_text()
    assert table.count("<tr") == len(read_summary(pipeline.summary_path)) + 1


def test_plots_render_without_quality_columns_and_use_them_when_present(pipeline: Pipeline, tmp_path: Path) -> None:
    rows = read_summary(pipeline.summary_path)
    for col in QUALITY:
        for r in rows:
            r.pop(col, None)
    assert quality_vs_speed(rows, tmp_path / "none.png") == 0
    assert (tmp_path / "none.png").stat().st_size > 0
    with_q = [{**r, "ppl": str(10 + i)} for i, r in enumerate(rows)]
    variants = {(r["experiment"], r["engine"], r["format"]) for r in rows if r["status"] == "ok" and r["concurrency"] == "1"}
    assert quality_vs_speed(with_q, tmp_path / "q.png") == len(variants) > 0


def test_render_all_writes_every_plot_from_a_summary_copy(pipeline: Pipeline, tmp_path: Path) -> None:
    src = pipeline.summary_path
    summary = tmp_path / "summary.csv"
    with open(src, newline="") as f, open(summary, "w", newline="") as g:
        rows = list(csv.DictReader(f))
        w = csv.DictWriter(g, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    indexes = sorted((pipeline.results / "raw").glob("*/*/*/cells.json"))
    paths = render_all(summary, indexes, tmp_path / "plots")
    assert sorted(p.name for p in paths) == sorted(p.name for p in (tmp_path / "plots").iterdir())
    assert len(paths) == 5
    assert all(p.stat().st_size > 5000 for p in paths)
