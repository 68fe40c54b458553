"""Published numbers as data: complete against the reference, sourced, and compared as measured/published."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bakeoff import published
from bakeoff.config import load_config
from bakeoff.errors import ConfigError

from conftest import ROOT

REFERENCE = Path("/work/shared/reference/published_numbers.md")
if not REFERENCE.is_file():
    REFERENCE = ROOT.parent / "shared" / "reference" / "published_numbers.md"

PUB = published.load()


def _by_id(i: str) -> published.Row:
    return next(r for r in PUB.rows if r.id == i)


def test_every_row_cites_a_known_source() -> None:
    assert len(PUB.rows) > 60
    for r in PUB.rows:
        assert r.source in PUB.sources, r.id


@pytest.mark.skipif(not REFERENCE.is_file(), reason="shared reference not on this machine")
def test_scoreboard_and_seed_tables_are_all_in_the_data() -> None:
    """Every number of the reference's scoreboard and seed tables is a row value (transcription check)."""
    text = REFERENCE.read_text()
    board = text.split("## llama.cpp CUDA scoreboard", 1)[1].split("##", 1)[0]
    values = {r.value for r in PUB.measurements() if r.value is not None}
    nums = [float(x) for line in board.splitlines() if line.startswith("| ") and "GPU" not in line
            for x in re.findall(r"\d+\.\d+", line)]
    assert len(nums) == 16
    assert set(nums) <= values, sorted(set(nums) - values)
    seed = text.split("**Published throughput**", 1)[1].split("- **Single", 1)[0]
    seed_nums = [float(x) for x in re.findall(r"~(\d+)", seed)]
    assert seed_nums == [40, 110, 170, 55, 80, 120]
    got = [_by_id(f"seed.tput.{v}.c{c}").value for v in ("vllm_fp8", "llamacpp_q4km") for c in (1, 8, 32)]
    assert got == seed_nums


def test_blog_v100_is_exactly_the_seed_settings() -> None:
    cfg = load_config(["experiment=blog_v100"]).model_dump(mode="json")
    assert published.check_settings(cfg, PUB, "seed") == []
    assert published.check_settings(cfg, PUB, "nvidia_datasheets") == []
    # the check can fail: the smoke experiment differs from the seed in many places
    smoke = published.check_settings(load_config([]).model_dump(mode="json"), PUB, "seed")
    assert any("tensor_parallel_size" in p for p in smoke) and any("load.output_len" in p for p in smoke)
    # and a single changed seed setting is caught, naming the key
    off = load_config(["experiment=blog_v100", "engines.llamacpp.settings.parallel=2"]).model_dump(mode="json")
    assert published.check_settings(off, PUB, "seed") == [
        "seed.setting.llamacpp_flags: engines.llamacpp.settings.parallel = 2, published 4 (§2.3 llama-server)"]


def _blog_row(engine: str, fmt: str, c: int, **kw: object) -> dict:
    return {"experiment": "blog_v100", "model": "deepseek-r1-distill-qwen-7b", "hardware": "v100x2", "engine": engine,
            "format": fmt, "concurrency": str(c), "prompt_len": "128", "output_len": "256", "status": "ok",
            "engine_settings": '{"parallel": 4}', **{k: str(v) for k, v in kw.items()}}


def test_published_comparison_computes_ratios() -> None:
    rows = [
        _blog_row("vllm", "fp16", 1, output_throughput=50, weight_bytes=15.4e9, ppl=10.0),
        _blog_row("vllm", "fp8", 8, output_throughput=88, weight_bytes=8.25e9, ppl=10.1),
        _blog_row("llamacpp", "q4_k_m", 1, output_throughput=66, decode_tok_s=63, weight_bytes=4.7e9, ppl=10.65),
        {**_blog_row("llamacpp", "q4_k_m", 1, output_throughput=66), "hardware": "cpu"},  # another machine
    ]
    cols = published.compare(rows, PUB)
    assert {"output_throughput_vs_published", "weight_bytes_vs_published", "ppl_abs_delta_vs_fp16",
            "ppl_abs_delta_vs_fp16_vs_published", "published_refs"} <= set(cols)
    fp16, fp8, q4, other = rows
    assert fp8["output_throughput_vs_published"] == pytest.approx(88 / 110)
    assert fp8["weight_bytes_vs_published"] == pytest.approx(1.1)
    assert fp16["weight_bytes_vs_published"] == pytest.approx(1.1)
    assert fp16["output_throughput_vs_published"] == ""  # the seed published no fp16 throughput
    assert q4["output_throughput_vs_published"] == pytest.approx(66 / 55)
    assert q4["decode_tok_s_vs_published"] == pytest.approx(63 / 52.5)  # the range 45-60 compares to its midpoint
    assert fp8["ppl_abs_delta_vs_fp16"] == pytest.approx(0.1)
    assert fp8["ppl_abs_delta_vs_fp16_vs_published"] == pytest.approx(1.0)  # 0.1 vs the midpoint of 0-0.2
    assert q4["ppl_abs_delta_vs_fp16_vs_published"] == pytest.approx(0.65 / 0.65)
    assert "seed.tput.llamacpp_q4km.c1" in q4["published_refs"].split()
    # another machine: no throughput comparison, but weight size and perplexity do not depend on the machine
    assert other["output_throughput_vs_published"] == ""
    assert other["published_refs"].split() == ["seed.weights.7b.q4_k_m", "seed.ppl.q4_k_m"]


def test_engine_settings_match_selects_the_parallel_row() -> None:
    row = {"model": "llama-2-7b-synthetic", "hardware": "h200", "engine": "llamacpp", "format": "q4_k_m",
           "concurrency": "8", "prompt_len": "128", "output_len": "256", "output_throughput": "146.5",
           "engine_settings": '{"parallel": 32}'}
    published.compare([row], PUB)
    assert row["published_refs"] == "h200.server.p32.c8"
    assert row["output_throughput_vs_published"] == pytest.approx(146.5 / 182)


def test_pipeline_summary_has_published_columns() -> None:
    import csv

    with open(ROOT / "results" / "summary.csv") as f:
        header = next(csv.reader(f))
    assert "published_refs" in header and "output_throughput_vs_published" in header


def test_bad_published_file_fails_naming_the_problem(tmp_path: Path) -> None:
    p = tmp_path / "p.yaml"
    p.write_text("sources: {a: {title: t, ref: r}}\nrows:\n"
                 "  - {id: x, source: nope, kind: measurement, metric: output_throughput, value: 1}\n")
    with pytest.raises(ConfigError, match="unknown source 'nope'"):
        published.load(p)
    p.write_text("sources: {a: {title: t, ref: r}}\nrows:\n  - {id: x, source: a, kind: measurement, metric: m}\n")
    with pytest.raises(ConfigError, match="exactly one of"):
        published.load(p)
