"""Published numbers as data: complete against the reference, sourced, and compared as measured/published."""

from __future__ import annotations

from pathlib import Path

import pytest

from bakeoff.composition.compose import load_config
from bakeoff.errors import ConfigError
from bakeoff.results import published

from conftest import Pipeline

PUB = published.load()


def _by_id(i: str) -> published.Row:
    return next(r for r in PUB.rows if r.id == i)


def test_every_row_cites_a_known_source() -> None:
    assert len(PUB.rows) > 60
    for r in PUB.rows:
        assert r.source in PUB.sources, r.id


# The reference's tables (shared/reference/published_numbers.md), transcribed here as the check: each
# number must be the value of its own row, not merely of some row.
SCOREBOARD = {  # llama.cpp CUDA scoreboard, Llama-2-7B Q4_0: pp512 / tg128, without and with flash attention
    "v100": (3042.64, 129.08, 2973.78, 134.76),
    "a100": (4849.53, 190.88, 5285.96, 200.90),
    "h100": (9918.34, 267.81, 11263.29, 280.74),
    "rtx4090": (11992.70, 186.21, 14770.63, 188.96),
}
SEED_THROUGHPUT = {"vllm_fp8": (40, 110, 170), "llamacpp_q4km": (55, 80, 120)}  # tok/s at c=1/8/32


def test_scoreboard_and_seed_tables_are_each_in_their_own_row() -> None:
    for gpu, (pp0, tg0, pp1, tg1) in SCOREBOARD.items():
        for metric, fa, value in (("pp512", 0, pp0), ("tg128", 0, tg0), ("pp512", 1, pp1), ("tg128", 1, tg1)):
            assert _by_id(f"sb.{gpu}.{metric}.fa{fa}").value == value, (gpu, metric, fa)
    for variant, values in SEED_THROUGHPUT.items():
        for c, value in zip((1, 8, 32), values, strict=True):
            assert _by_id(f"seed.tput.{variant}.c{c}").value == value, (variant, c)


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


def test_seed_fp8_rows_compare_with_what_ran_in_fp8s_place() -> None:
    """On a V100 vLLM refuses FP8: the seed's "vLLM FP8" numbers are compared with fp8-dequant, which says so."""
    rows = [_blog_row("vllm", "fp8", 8, status="unsupported", output_throughput=""),
            _blog_row("vllm", "fp8-dequant", 8, output_throughput=99)]
    published.compare(rows, PUB)
    fp8, deq = rows
    assert deq["output_throughput_vs_published"] == pytest.approx(99 / 110)
    assert "seed.tput.vllm_fp8.c8: fp8-dequant in place of fp8 (fp8: unsupported)" in deq["published_compared_as"]
    assert fp8["output_throughput_vs_published"] == "" and "seed.tput.vllm_fp8.c8" not in fp8["published_refs"]
    # where vLLM accepted the FP8 checkpoint, it is the one compared, and the fallback is not
    ran = [_blog_row("vllm", "fp8", 8, output_throughput=120), _blog_row("vllm", "fp8-dequant", 8, output_throughput=99)]
    published.compare(ran, PUB)
    assert ran[0]["output_throughput_vs_published"] == pytest.approx(120 / 110)
    assert "in place of" not in ran[0]["published_compared_as"]
    assert ran[1]["output_throughput_vs_published"] == ""


def test_one_published_number_for_both_prompt_lengths_is_compared_once() -> None:
    """The seed's table gives one throughput per concurrency: both prompt lengths' cells share one ratio."""
    rows = [_blog_row("llamacpp", "q4_k_m", 1, output_throughput=50),
            {**_blog_row("llamacpp", "q4_k_m", 1, output_throughput=66), "prompt_len": "1024"},
            _blog_row("llamacpp", "q4_k_m", 8, output_throughput=80)]
    published.compare(rows, PUB)
    p128, p1024, c8 = rows
    assert p128["output_throughput_vs_published"] == p1024["output_throughput_vs_published"] == \
        pytest.approx((50 + 66) / 2 / 55)
    assert ("seed.tput.llamacpp_q4km.c1: one published number for prompt_len 128/1024, compared once with the "
            "mean of 2 rows") in p128["published_compared_as"]
    assert c8["output_throughput_vs_published"] == pytest.approx(1.0)  # a group of one cell: its own value
    assert "for prompt_len 128; only this row measured it" in c8["published_compared_as"]
    assert "mean of 1 " not in c8["published_compared_as"]


def test_blog_v100_runs_the_fallback_and_the_seeds_open_loop_load() -> None:
    cfg = load_config(["experiment=blog_v100"])
    assert ("vllm", "fp8-dequant") in cfg.variants() and ("vllm_open", "fp8") in cfg.variants()
    open_loop, _ = cfg.load.for_variant(cfg.engines["vllm_open"].load, "fp8")
    assert (open_loop.request_rate, open_loop.num_requests, open_loop.concurrency) == (8, 100, [100])
    closed, _ = cfg.load.for_variant(cfg.engines["vllm"].load, "fp8")
    assert closed.request_rate is None and closed.concurrency == [1, 8, 32]
    # the seed's variants must still all run: dropping one is a mismatch, naming what is missing
    off = load_config(["experiment=blog_v100", "experiment.variants.vllm=[fp16,fp8-dequant]"]).model_dump(mode="json")
    assert published.check_settings(off, PUB, "seed") == [
        "seed.setting.variants: experiment.variants.vllm = ['fp16', 'fp8-dequant'] lacks ['fp8'], "
        "published ['fp16', 'fp8'] (§1, §3.3, §3.5)"]


def test_engine_settings_match_selects_the_parallel_row() -> None:
    row = {"model": "llama-2-7b-synthetic", "hardware": "h200", "engine": "llamacpp", "format": "q4_k_m",
           "concurrency": "8", "prompt_len": "128", "output_len": "256", "output_throughput": "146.5",
           "engine_settings": '{"parallel": 32}'}
    published.compare([row], PUB)
    assert row["published_refs"] == "h200.server.p32.c8"
    assert row["output_throughput_vs_published"] == pytest.approx(146.5 / 182)


@pytest.mark.slow
def test_pipeline_summary_has_published_columns(pipeline: Pipeline) -> None:
    header = list(pipeline.rows()[0])
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
