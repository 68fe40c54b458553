"""A run whose 16-bit baselines measured nothing fails (after writing its summary), naming them."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from bakeoff.results.baselines import BaselineError, baselines, check

from conftest import Pipeline, bakeoff


def _row(engine: str, fmt: str, bits: float, status: str, reason: str = "", c: int = 1) -> dict[str, str]:
    return {"experiment": "smoke", "engine": engine, "format": fmt, "bits_per_weight": str(bits), "status": status,
            "reason": reason, "concurrency": str(c)}


def _write(path: Path, rows: list[dict[str, str]]) -> Path:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return path


ROWS = [_row("vllm", "fp16", 16, "ok"), _row("vllm", "fp8", 8.3, "unsupported", "stub"),
        _row("llamacpp", "f16", 16.0, "ok"), _row("llamacpp", "q4_k_m", 4.9, "ok")]


def test_each_engines_sixteen_bit_format_is_its_baseline() -> None:
    found = baselines(ROWS)
    assert found["smoke/vllm"]["formats"] == ["fp16"] and found["smoke/vllm"]["ok"] == 1
    assert found["smoke/llamacpp"]["formats"] == ["f16"]
    assert baselines([_row("llamacpp", "q4_k_m", 4.9, "failed")]) == {}  # no 16-bit variant: nothing to hold


def test_a_baseline_without_an_ok_cell_fails_and_names_it(tmp_path: Path) -> None:
    kv = "ValueError: Available memory on node 0 (6.21/9.34 GiB) on kv cache allocation is less than requested"
    rows = [_row("vllm", "fp16", 16, "failed", kv, c) for c in (1, 8)] + ROWS[1:]
    summary = _write(tmp_path / "summary.csv", rows)
    with pytest.raises(BaselineError, match=r"smoke/vllm \(fp16\): 0 of 2 cells ok; failed: ValueError: Available"):
        check(summary, tmp_path / "baselines.json")
    assert not (tmp_path / "baselines.json").exists() and summary.is_file()
    proc = bakeoff("check-baselines", str(summary), "--out", str(tmp_path / "b.json"))
    assert proc.returncode == 2 and "smoke/vllm (fp16)" in proc.stderr and "Traceback" not in proc.stderr


def test_healthy_baselines_are_recorded(tmp_path: Path) -> None:
    found = check(_write(tmp_path / "summary.csv", ROWS), tmp_path / "baselines.json")
    assert json.loads((tmp_path / "baselines.json").read_text()) == found


@pytest.mark.slow
def test_the_pipeline_checked_its_baselines(pipeline: Pipeline) -> None:
    found = json.loads((pipeline.results / "baselines.json").read_text())
    assert {k: v["formats"] for k, v in found.items()} == {"ci/llamacpp": ["f16"], "ci/vllm": ["fp16"]}
    assert all(v["ok"] == v["cells"] > 0 for v in found.values())
