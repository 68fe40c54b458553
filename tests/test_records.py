"""Committed run records are their files: `bakeoff node record` re-derives each one's tables and README numbers.

Every record under runs/ with a node tarball is derived again, into a scratch folder holding only what the
derivation reads beside the tarball (the call logs, and the pipeline's summary.csv / capacity.csv, whose hardware
columns it corrects in place), and every derived file and the README's generated section must equal the
committed ones. The README's hand-written prose stays outside the markers, short, and makes no
verdict the intervals do not show.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from bakeoff.stages.node import record
from bakeoff.stages.node_readme import BEGIN, END, parse_call_log, section_of

from conftest import ROOT

RECORDS = sorted(p.parent for p in (ROOT / "runs").glob("*/node-results.tgz"))
H100 = ["h100-seed-2026-12-06", "h100-seed-p1024-2026-12-06"]


def _rederive(run: Path, dest: Path) -> dict[str, Path]:
    dest.mkdir()
    for p in [*run.glob("call*-snakemake.log"), *run.glob("summary.csv"), *run.glob("capacity.csv")]:
        shutil.copy2(p, dest / p.name)
    if (run / "logs").is_dir():
        shutil.copytree(run / "logs", dest / "logs")
    shutil.copy2(run / "README.md", dest / "README.md")
    return record(run / "node-results.tgz", dest)


def test_both_h100_records_are_among_those_rederived() -> None:
    names = [r.name for r in RECORDS]
    assert set(H100) <= set(names)
    for name in H100:
        assert section_of((ROOT / "runs" / name / "README.md").read_text()) is not None, name


@pytest.mark.parametrize("run", RECORDS, ids=[r.name for r in RECORDS])
def test_a_record_is_what_its_files_derive(run: Path, tmp_path: Path) -> None:
    paths = _rederive(run, tmp_path / run.name)
    for name in ("cells.csv", "kernel.csv", "table.md", "server-log-ends.txt", "hardware.json", "summary.csv",
                 "capacity.csv"):
        if (run / name).exists():
            assert (tmp_path / run.name / name).read_text() == (run / name).read_text(), (run.name, name)
    committed = section_of((run / "README.md").read_text())
    if committed is not None:
        assert section_of(paths["README.md"].read_text()) == committed, run.name


def test_the_h100_records_name_the_h100_and_keep_the_config_they_ran_with() -> None:
    for name in H100:
        run = ROOT / "runs" / name
        hw = json.loads((run / "hardware.json").read_text())
        assert hw["hardware_config"]["name"] == "h100" and hw["hardware_config_as_run"]["name"] == "h200"
        cells = (run / "cells.csv").read_text().splitlines()
        assert cells[0].startswith("hardware,gpu_name,gpu_count,gpu_memory_bytes,")
        assert all(line.startswith("h100,NVIDIA H100 80GB HBM3,1,85520809984,") for line in cells[1:]), name
    summary = (ROOT / "runs/h100-seed-2026-12-06/summary.csv").read_text()
    assert ",h200," not in summary and summary.count(",h100,NVIDIA H100 80GB HBM3,1,") == 30


def test_the_call_history_is_the_logs() -> None:
    """Call 1 of the prompt-128 record stopped in llama.cpp's serve_load, after one cell of its block 1."""
    run = ROOT / "runs/h100-seed-2026-12-06"
    call = parse_call_log("call1", (run / "call1-snakemake.log").read_text())
    assert call.rc == 124 and round(call.elapsed_s or 0) == 556
    stopped = [j for j in call.jobs if j.outcome != "finished"]
    assert [(j.rule, j.wildcards.get("format")) for j in stopped] == [("serve_load", "q4_k_m")]
    section = section_of((run / "README.md").read_text()) or ""
    assert "llamacpp-q4_k_m: c1/p128 block 0, c8/p128 block 0, c32/p128 block 0, c1/p128 block 1;" in section
    assert "more than one server start: llamacpp-q4_k_m block 1 (calls 1, 2)." in section
    # the interval: fp8-online against q4_k_m at c=1 spans 0
    assert "vllm-fp8-online against llamacpp-q4_k_m | 2 | −2.6 % (−13.4 % to +8.3 %) | 0 of 2" in section


@pytest.mark.parametrize("name", H100)
def test_the_prose_claims_no_verdict_and_no_number_without_a_file(name: str) -> None:
    text = (ROOT / "runs" / name / "README.md").read_text()
    prose = text[: text.index(BEGIN)] + text[text.index(END) + len(END):]
    banned = ["\\b" + "t" + "ie" + "\\b", "within the " + "noise"]  # spelt apart: no source line may claim them
    for claim in (*banned, r"client saturated", r"GPU minutes", r"device minutes",
                  r"waited \d+ minutes", r"ran both blocks"):
        assert not re.search(claim, prose, re.I), (name, claim)
    assert len(prose.split()) < 700  # short: the numbers are in the generated section
