"""Committed run records are their files: `bakeoff node record` re-derives each one's tables and README numbers.

Every record under runs/ with a node tarball is derived again, into a scratch folder holding only what the
derivation reads beside the tarball (the call logs, and the pipeline's summary.csv / capacity.csv, whose hardware
columns it corrects in place), and every derived file and the README's generated section must equal the
committed ones. The README's hand-written prose stays outside the markers, short, and makes no
verdict the intervals do not show.
"""

from __future__ import annotations

import csv
import html
import json
import re
import shutil
from html.parser import HTMLParser
from pathlib import Path

import pytest

from bakeoff.node.readme import BEGIN, END, parse_call_log, section_of
from bakeoff.node.record import record

from conftest import ROOT, snakemake

RECORDS = sorted(p.parent for p in (ROOT / "runs").glob("*/node-results.tgz"))
H100 = ["h100-seed-2026-12-06", "h100-seed-p1024-2026-12-06"]


def _rederive(run: Path, dest: Path) -> dict[str, Path]:
    dest.mkdir()
    for p in [*run.glob("call*-snakemake.log"), *run.glob("summary.csv"), *run.glob("capacity.csv"),
              *run.glob("client_check.json"), *run.glob("plan.json")]:
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
    rows = list(csv.DictReader((ROOT / "runs/h100-seed-2026-12-06/summary.csv").open()))
    assert len(rows) == 30 and {(r["hardware"], r["gpu_name"], r["gpu_count"]) for r in rows} == {
        ("h100", "NVIDIA H100 80GB HBM3", "1")}


def test_the_call_history_is_the_logs() -> None:
    """Call 1 of the prompt-128 record stopped in llama.cpp's serve_load, after one cell of its block 1."""
    run = ROOT / "runs/h100-seed-2026-12-06"
    call = parse_call_log("call1", (run / "call1-snakemake.log").read_text())
    assert call.rc == 124 and round(call.elapsed_s or 0) == 556
    stopped = [j for j in call.jobs if j.outcome != "finished"]
    assert [(j.rule, j.wildcards.get("format")) for j in stopped] == [("serve_load", "q4_k_m")]
    section = section_of((run / "README.md").read_text()) or ""
    assert "llamacpp-q4_k_m: c1-p128 block 0, c8-p128 block 0, c32-p128 block 0, c1-p128 block 1;" in section
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


class _Tables(HTMLParser):
    """Every table of a page as its header and rows of cell text, and every answer row's attributes and cells."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: list[tuple[list[str], list[list[str]]]] = []
        self.leads: list[tuple[dict[str, str], list[str]]] = []
        self._cell: list[str] | None = None
        self._row: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "table":
            self.tables.append(([], []))
        elif tag == "tr":
            self._row = []
            if ("class", "lead") in attrs:
                self.leads.append(({k: v or "" for k, v in attrs}, self._row))
        elif tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None and self._row is not None:
            self._row.append("".join(self._cell).strip())
            self._cell = None
        elif tag == "tr" and self._row is not None and self.tables:
            head, body = self.tables[-1]
            (body if head else head).extend([self._row] if head else self._row)
            self._row = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)


def _page(path: Path) -> tuple[_Tables, str]:
    """The page's tables, and its text without tags or embedded images (base64 could spell any word)."""
    page = path.read_text()
    parsed = _Tables()
    parsed.feed(page)
    text = html.unescape(re.sub(r"<[^>]+>", " ", re.sub(r"data:image/[a-z]+;base64,[A-Za-z0-9+/=]+", "", page)))
    return parsed, text


def _c1_verdict(parsed: _Tables) -> str:
    c1 = [cells for attrs, cells in parsed.leads if attrs.get("data-prompt") == "128" and attrs.get("data-load") == "c=1"]
    assert len(c1) == 1, c1
    attrs = next(a for a, cells in parsed.leads if cells is c1[0])
    assert {attrs["data-leader"], attrs["data-runner"]} == {"vllm-fp8-online", "llamacpp-q4_k_m"}, attrs
    return c1[0][-1]


def test_the_h100_answer_page_names_the_h100_and_claims_no_verdict_the_blocks_do_not_show() -> None:
    """The record's page, re-made from its tarball (docs/node-route-vllm.md, Back here): every row and capacity names
    the H100; at c=1 (prompt 128) vLLM fp8-online against llama.cpp q4_k_m is no verdict or different, and nothing
    claims sameness without equivalence."""
    parsed, text = _page(ROOT / "runs/h100-seed-2026-12-06/report.html")
    hardware = [row[head.index("hardware")] for head, body in parsed.tables if "hardware" in head for row in body]
    assert len(hardware) == 33 and set(hardware) == {"h100"}  # 30 rows, 3 capacities
    rows = next((head, body) for head, body in parsed.tables if "gpu_name" in head)
    assert {r[rows[0].index("gpu_name")] for r in rows[1]} == {"NVIDIA H100 80GB HBM3"}
    assert re.match(r"(no verdict|different)\b", _c1_verdict(parsed)), _c1_verdict(parsed)
    assert not re.search("within the " + "noise", text, re.I) and not re.search(r"\bt" + r"ie\b", text, re.I)


def test_the_p1024_record_has_no_answer_page() -> None:
    """Its README names no page: the record was never run through the summary and the report."""
    run = ROOT / "runs/h100-seed-p1024-2026-12-06"
    assert not (run / "report.html").exists() and not (run / "summary.csv").exists()


def _entries(run: Path) -> list[str]:
    """The run's `snakemake --config` entries, as its first call's log has them (the overrides entry holds spaces)."""
    log = (run / "call1-snakemake.log").read_text()
    m = re.search(r"--config (experiment=\S+) (overrides=.*)$", log, re.M)
    assert m, "no --config entries in call1-snakemake.log"
    return [m.group(1), m.group(2)]


@pytest.mark.slow
def test_the_back_here_commands_remake_the_h100_page(tmp_path: Path) -> None:
    """docs/node-route-vllm.md's commands back here, on a CPU-only machine and the record's own files: unpack,
    `--touch node`, then the summary and the pages; the run's config entries with hardware=auto and the hash its
    cells were served under. Nothing is served, and the page is the committed one's answer."""
    import tarfile

    from bakeoff.cli import main

    run = ROOT / "runs/h100-seed-2026-12-06"
    work = tmp_path / "work"
    work.mkdir()
    for name in ("Snakefile", "workflow", "conf", "data", "envs"):
        (work / name).symlink_to(ROOT / name)
    assert main(["node", "unpack", str(run / "node-results.tgz"), "--repo", str(work)]) == 0
    with tarfile.open(run / "node-results.tgz") as tar:
        served = {json.load(tar.extractfile(m))["config_hash"] for m in tar.getmembers() if m.name.endswith("/cells.json")}
    assert len(served) == 1
    config = ["--config", *_entries(run), "hardware=auto", f"served_config_hash={served.pop()}"]
    snakemake("--touch", "--cores", "1", "node", *config, cwd=work)
    made = snakemake("--cores", "2", "results/report/index.html", *config, cwd=work).stderr
    assert "rule serve_" not in made and "rule doctor" not in made, made[-3000:]
    parsed, text = _page(work / "results/report/index.html")
    committed, _ = _page(run / "report.html")
    assert _c1_verdict(parsed) == _c1_verdict(committed)
    assert [cells for _, cells in parsed.leads] == [cells for _, cells in committed.leads]
    assert {r["hardware"] for r in csv.DictReader((work / "results/summary.csv").open())} == {"h100"}


def test_the_capacity_record_brackets_fp8_and_judges_each_client_against_vllms_own() -> None:
    """runs/h100-capacity-2026-12-06: an unfinished search is said as its probes' bracket, never as a capacity;
    each bakeoff client is held against `vllm bench serve` (the referee), not against another bakeoff client: at
    c=256 the 4-worker client was the one further from it (-7.3 % output tok/s), from one round."""
    section = section_of((ROOT / "runs" / "h100-capacity-2026-12-06" / "README.md").read_text()) or ""
    assert "vllm-fp8-online: highest pass c=192, lowest fail c=193 (adjacent); not re-checked." in section
    assert "### Capacity\n" not in section  # no capacity.json: no capacity row claimed
    assert "1 round(s) per concurrency" in section
    assert "| 256 | bakeoff:4 | 1 | -7.3 % (-7.3 to -7.3) | +25.7 % (+25.7 to +25.7) | no | 0 of 0 |" in section
    assert "| 256 | bakeoff:1 | 1 | -2.9 % (-2.9 to -2.9) | +3.1 % (+3.1 to +3.1) | no | 1 of 1 |" in section


def test_a_record_says_how_each_capacity_was_judged() -> None:
    """The rule, the start and each probe's size against the confident minimum; a probe whose files name no
    rule or start is said to be from before they were named (point rule, burst start), never guessed silently."""
    from bakeoff.node.readme import judging_lines

    base = {"engine": "vllm", "format": "fp8-online", "slo": "interactive", "prompt_len": 128}
    old = [{**base, "concurrency": 64, "completed": 256, "load_note": "capacity probe (concurrency, SLO x)",
            "started_utc": 1.0}]
    text = "\n".join(judging_lines(old))
    assert "point rule (no file names it" in text and "burst start (no row names it" in text
    assert "c=64: 256 < 299" in text
    new = [{**base, "concurrency": c, "steady_requests": n, "completed": n + c, "load_start": "ramp",
            "load_ramp_s": 6.5, "load_note": "capacity probe (concurrency, SLO interactive, confident rule)",
            "started_utc": float(c)} for c, n in ((256, 320), (320, 299))]
    text = "\n".join(judging_lines(new))
    assert "confident rule;" in text and "no file names it" not in text and "no row names it" not in text
    assert "ramp start (ramp 6.5–6.5 s" in text and "c=256: 320, c=320: 299." in text
    assert "claim held" not in text  # no file of these says
    kept = [{**q, "confident_claim_holds": held, "effective_requests": worth}
            for q, held, worth in zip(new, (False, True), (37.0, 310.0), strict=True)]
    assert "The 95 % claim held for 1 of 2 (requests' independence, bakeoff.loadgen.dependence; effective " \
        "requests 37, 310)." in "\n".join(judging_lines(kept))


def test_a_record_says_where_each_probes_first_tokens_waited_where_its_files_keep_the_servers_timing() -> None:
    """Probe rows (constructed here) with the server's own TTFT and threads get a row each; the client's side is its
    whole-window mean where the probe ramped (the server's window holds the ramp too); rows without them, none."""
    from bakeoff.node.readme import ttft_split_lines

    base = {"engine": "vllm", "format": "fp8-online", "slo": "interactive", "prompt_len": 128}
    assert ttft_split_lines([{**base, "concurrency": 64, "mean_ttft_ms": 90.0}]) == []  # the older records
    probe = {**base, "concurrency": 192, "probe_passed": False, "started_utc": 1.0, "mean_ttft_ms": 400.0,
             "mean_ttft_ms_whole_cell": 350.0, "server_mean_ttft_ms": 120.0, "server_mean_queue_ms": 3.0,
             "server_busiest_thread_cpu_share": 0.97, "server_busiest_thread": "vllm[42]/python3",
             "server_cpu_cores": 2.5, "client_server_core_overlap_share": 0.1}
    lines = ttft_split_lines([probe])
    assert "| vllm-fp8-online | c=192 | no | 350.0 | 120.0 | 3.0 | 230.0 | 0.97 (vllm[42]/python3) | 2.50 | 0.10 |" \
        in lines


def test_a_record_keeps_its_plan_beside_the_minutes_its_logs_show() -> None:
    """``plan.json`` made before the run (``bakeoff node plan --out``) is set beside the call logs' minutes; a
    record without one says so instead of inventing a plan."""
    import datetime as dt

    from bakeoff.node.readme import Call, plan_section

    calls = [Call("call1", dt.datetime(2026, 12, 7), 540.0, 0), Call("call2", dt.datetime(2026, 12, 7), 300.0, 0)]
    plan = {"overrides": ["experiment=x", "hardware=auto"], "total_s": 1500.0, "run_s": 900.0, "fits": True,
            "node_s": 1500, "calls": [{"number": 1, "snakemake_s": 0.0}, {"number": 2, "snakemake_s": 540.0},
                                      {"number": 3, "snakemake_s": 360.0}]}
    text = "\n".join(plan_section(plan, calls))
    assert "| run calls | 2 | 2 |" in text and "| Snakemake in the run calls | 15 min 00 s | 14 min 00 s |" in text
    assert "Logged over planned: 0.93." in text and "fitting 25 min 00 s" in text
    assert "No `plan.json`" in "\n".join(plan_section(None, calls))
