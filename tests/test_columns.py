"""The data dictionary (bakeoff.results.columns) against the columns the code really writes.

The summary here is written by the pipeline's own ``bakeoff summary`` from cells whose metrics come from
``summarize`` on synthetic requests, with every optional input (sweep points, published numbers, kernel
results), so every column family is present; a column added anywhere on that path shows up in the header.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from bakeoff.cli import main
from bakeoff.composition.compose import find_conf_dir
from bakeoff.composition.sweep import points_from_snakemake, points_json
from bakeoff.layout import COLUMNS_DOC, variant_name
from bakeoff.loadgen.health import cell_health
from bakeoff.loadgen.metrics import RequestRecord, summarize
from bakeoff.report.index import index_html
from bakeoff.results import column_docs, columns
from bakeoff.results.published import DEFAULT_PATH

from conftest import ROOT

VARIANTS = [("llamacpp", "f16", 16.0), ("llamacpp", "q4_k_m", 4.9), ("vllm", "fp16", 16.0)]


def _cell(engine: str, fmt: str, bits: float) -> dict:
    """One cell record as serve_load writes it: ids, the real metrics of 8 synthetic requests, the client's."""
    records = [RequestRecord(index=i, prompt_len=32, output_len=8, start=0.01 * i, success=True, ttft=0.05 + 0.001 * i,
                             e2el=0.2 + 0.002 * i, itl=[0.02] * 7, prompt_tokens=32, output_tokens=8) for i in range(8)]
    worker = {"worker": 0, "requests": 8, "cpu_s": 0.05, "cpu_share": 0.1, "loop_lag_p99_ms": 2.0,
              "schedule_delay_p50_ms": 0.1, "schedule_delay_p99_ms": 0.5, "retried": 0}
    client = {**cell_health([worker]), "client_cpu_s_per_1k_tokens": 1.0, "stopped_early": False,
              "client_rerun": False}
    return {"experiment": "smoke", "model": "smollm2-135m", "engine": engine, "format": fmt, "hardware": "cpu",
            "concurrency": 4, "prompt_len": 32, "output_len": 8, "repeat": 0, "requests": 8, "status": "ok",
            "reason": "", "weight_bytes": 1e8, "bits_per_weight": bits, "n_params": 1.35e8, "engine_settings": {},
            **summarize(records, 0.5, {"ttft": 2000, "tpot": 200}, concurrency=4), **client}


def _capacity_row(engine: str, fmt: str) -> dict:
    return {"experiment": "smoke", "model": "smollm2-135m", "engine": engine, "format": fmt, "hardware": "cpu",
            "prompt_len": 32, "output_len": 8, "slo": "cpu", "capacity_concurrency": 4}


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[str], list[str], list[str]]:
    """The headers of results/summary.csv and results/capacity.csv as ``bakeoff summary`` writes them, and of
    results/report/answer.csv as the report's index page writes it from those two."""
    tmp = tmp_path_factory.mktemp("summary")
    indexes = []
    for engine, fmt, bits in VARIANTS:
        d = tmp / variant_name(engine, fmt)
        d.mkdir()
        index = {"variant": {"engine": engine, "format": fmt, "bits_per_weight": bits},
                 "cells": [_cell(engine, fmt, bits)], "capacity": [_capacity_row(engine, fmt)]}
        (d / "cells.json").write_text(json.dumps(index, default=str))
        tasks = {"pydoc_ppl": {"word_perplexity": 20.0 + bits, "bits_per_byte": 1.0, "n": 1},
                 "pydoc_mc": {"acc": 0.5, "n": 12}}
        (d / "quality.json").write_text(json.dumps({"status": "ok", "tasks": tasks}))
        indexes.append(str(d / "cells.json"))
    kernel = tmp / "kernel.json"
    kernel.write_text(json.dumps({"model": "smollm2-135m", "format": "f16", "flash_attn": "auto",
                                  "tg_tok_s": 100.0, "pp_tok_s": 500.0}))
    conf = find_conf_dir(ROOT)
    points = tmp / "config.json"
    points.write_text(points_json(points_from_snakemake({}, conf_dir=conf), conf_dir=conf))
    summary, capacity = tmp / "summary.csv", tmp / "capacity.csv"
    assert main(["summary", *indexes, "--config-hash", "0123456789abcdef", "--points", str(points),
                 "--published", str(DEFAULT_PATH), "--kernel", str(kernel), "--out", str(summary),
                 "--capacity-out", str(capacity)]) == 0
    with open(summary, newline="") as f, open(capacity, newline="") as g:
        rows, caps = list(csv.DictReader(f)), list(csv.DictReader(g))
    assert len(rows) == len(caps) == len(VARIANTS)
    assert {r["schema_version"] for r in rows + caps} == {str(columns.SCHEMA_VERSION)}
    answer = tmp / "answer.csv"
    index_html(summary, capacity, [], tmp / "index.html", answer)
    with open(answer, newline="") as f:
        answer_header = next(csv.reader(f))
    return list(rows[0]), list(caps[0]), answer_header


def test_every_written_summary_column_is_registered(written: tuple[list[str], list[str], list[str]]) -> None:
    header = written[0]
    assert [c for c in header if columns.SUMMARY.get(c) is None] == []


def test_every_registered_summary_column_is_written(written: tuple[list[str], list[str], list[str]]) -> None:
    header = written[0]
    assert [c for c in columns.SUMMARY.names() if c not in header] == []


def test_the_capacity_table_is_registered_both_ways(written: tuple[list[str], list[str], list[str]]) -> None:
    header = written[1]
    assert sorted(header) == sorted(columns.CAPACITY.names())


def test_the_answer_table_is_registered_both_ways(written: tuple[list[str], list[str], list[str]]) -> None:
    header = written[2]
    assert sorted(header) == sorted(columns.ANSWER.names())


def test_each_column_is_registered_once_with_a_definition_and_a_writer_that_exists() -> None:
    import importlib.util

    for table in columns.TABLES:
        names = table.names()
        assert len(names) == len(set(names)), [n for n in names if names.count(n) > 1]
        for c in table.columns():
            assert c.definition.strip() and c.definition.endswith("."), c
            assert all(importlib.util.find_spec(w) is not None for w in c.writer.split(", ")), c


def test_names_follow_their_unit_conventions() -> None:
    """The suffixes docs/columns.md promises: `_share` a fraction, `_pct` a percentage, `_ms` milliseconds."""
    for c in columns.SUMMARY.columns():
        if c.name.endswith("_share"):
            assert c.unit == columns.FRACTION, c
        if c.name.endswith("_pct"):
            assert c.unit == columns.PCT, c
        if c.name.endswith("_ms") or c.name.endswith(("_ms_ci_lo", "_ms_ci_hi")):
            assert c.unit == columns.MS, c
        if c.name.endswith("_tok_s"):
            assert c.unit == columns.TOK_S, c


def test_docs_columns_md_is_what_the_registry_renders() -> None:
    committed = (ROOT / COLUMNS_DOC).read_text()
    assert committed == column_docs.render(), f"regenerate it: bakeoff columns --write {COLUMNS_DOC}"


def test_the_page_lists_every_column_with_its_unit_and_writer() -> None:
    page = column_docs.render()
    for table in columns.TABLES:
        assert f"## {table.path}" in page
    for c in columns.SUMMARY.columns():
        assert f"| `{c.name}` | {column_docs._cell(c.unit)} |" in page and f"| {column_docs.writers(c)} |" in page


def test_the_cli_writes_the_page(tmp_path: Path) -> None:
    out = tmp_path / "docs" / "columns.md"
    assert main(["columns", "--write", str(out)]) == 0
    assert out.read_text() == column_docs.render()
