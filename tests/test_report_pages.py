"""The summary page lists where the doctor's prediction and the measured status disagree (rows written here)."""

from __future__ import annotations

from pathlib import Path

from bakeoff.report.pages import summary_html
from bakeoff.stages.summary import write_csv

COLS = ["experiment", "engine", "format", "concurrency", "prompt_len", "status", "reason", "predicted_status",
        "predicted_reason"]


def test_page_lists_predicted_vs_measured_status_disagreements_only(tmp_path: Path) -> None:
    rows = [
        {"engine": "vllm", "format": "fp8", "status": "unsupported", "reason": "static_scaled_fp8_quant stub",
         "predicted_status": "unsupported", "predicted_reason": "no FP8 on CPU"},       # agrees
        {"engine": "vllm", "format": "fp8-dynamic", "status": "ok", "reason": "",
         "predicted_status": "unsupported", "predicted_reason": "cc 7.0 has no FP8 path"},  # ran anyway
        {"engine": "llamacpp", "format": "q4_k_m", "status": "unsupported", "reason": "unknown quant type",
         "predicted_status": "supported", "predicted_reason": ""},                      # refused unexpectedly
        {"engine": "llamacpp", "format": "f16", "status": "failed", "reason": "server exited with code 1: bad flag",
         "predicted_status": "supported", "predicted_reason": ""},                      # a failure: no claim
    ]
    rows = [{"experiment": "t", "concurrency": "1", "prompt_len": "32", **r} for r in rows]
    write_csv(tmp_path / "summary.csv", rows, COLS)
    summary_html(tmp_path / "summary.csv", tmp_path / "summary.html")
    page = (tmp_path / "summary.html").read_text()
    section = page.split("Predicted vs measured status: disagreements (2)")[1].split("</ul>")[0]
    assert "t vllm-fp8-dynamic: predicted unsupported, measured ok" in section
    assert "t llamacpp-q4_k_m: predicted supported, measured unsupported: unknown quant type" in section
    assert "vllm-fp8:" not in section and "llamacpp-f16" not in section
