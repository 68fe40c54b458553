"""The synthetic model source: real shape, random weights, one tokenizer on both sides; speed rows only.

The pipeline runs the synthetic_tiny experiment (a 2-layer llama of random F16 weights) through the normal
rules: fetch (write the GGUF) -> f16 -> llama-quantize q4_k_m -> llama-server -> the load client.
"""

from __future__ import annotations

import csv
import json
import subprocess
from pathlib import Path

import pytest
import requests
from transformers import AutoTokenizer

from bakeoff.composition.compose import load_config
from bakeoff.engines import get_engine
from bakeoff.engines.base import ServerSpec
from bakeoff.errors import ConfigError
from bakeoff.loadgen.prompts import make_prompts
from bakeoff.models.synthetic import LLAMA2_7B, vocabulary

from conftest import BIN, ROOT, TEST_MODELS, Pipeline

TINY = "synthetic-tiny"
RAW_REL = Path("results") / "raw" / "synthetic_tiny" / TINY
RUN: list[Pipeline] = []


@pytest.fixture(scope="module")
def tiny(pipeline: Pipeline) -> Path:
    """Both variants of the synthetic_tiny experiment, run by Snakemake in the test session's results root."""
    pipeline.snakemake("--cores", "all", "--config", "experiment=synthetic_tiny", "--",
                       *(str(RAW_REL / v / "cells.json") for v in ("llamacpp-f16", "llamacpp-q4_k_m")))
    RUN[:] = [pipeline]
    return TEST_MODELS / TINY


def _raw() -> Path:
    return RUN[0].root / RAW_REL


def test_vocabulary_is_exact_and_its_merges_are_consistent() -> None:
    tokens, merges = vocabulary(32000)
    assert len(tokens) == len(set(tokens)) == 32000
    index = {t: i for i, t in enumerate(tokens)}
    for a, b in merges:  # every merge joins two earlier tokens into a later one
        assert index[a] < index[a + b] and index[b] < index[a + b]


def test_llama2_7b_shape_has_the_scoreboard_models_parameter_count() -> None:
    """Same count llama-bench printed for the synthetic model on the H200 (runs/h200-llamacpp-probe-2026-12-03)."""
    bench = json.loads((ROOT / "runs" / "h200-llamacpp-probe-2026-12-03" / "llama-bench-q4_0-fa0.json").read_text())
    assert LLAMA2_7B.n_params() == bench[0]["model_n_params"] == 6_738_415_616


def test_synthetic_models_refuse_quality_and_formats_made_from_hf_weights() -> None:
    with pytest.raises(ConfigError, match=r"has no weights.*formats \['f16'\] cannot be made"):
        load_config(["experiment=synthetic_tiny", "formats.f16.input=fp16"])
    with pytest.raises(ConfigError, match=r"has no weights.*formats \['fp8'\] cannot be made"):
        load_config(["experiment=synthetic_tiny", "+experiment.variants.vllm=[fp16,fp8]",
                     "+engines.vllm.settings.kv_cache_memory_bytes=1G"])
    with pytest.raises(ConfigError, match="quality is not meaningful"):
        load_config(["experiment=synthetic_tiny", "eval=smoke"])


@pytest.mark.slow
def test_pipeline_serves_the_synthetic_model_with_exact_lengths(tiny: Path) -> None:
    src = json.loads((tiny / "source" / "manifest.json").read_text())
    assert src["source"]["kind"] == "synthetic" and src["source"]["n_params"] > 0
    for variant in ("llamacpp-f16", "llamacpp-q4_k_m"):
        idx = json.loads((_raw() / variant / "cells.json").read_text())
        cells = [json.loads((_raw() / variant / f"{c}.json").read_text()) for c in ("c1-p32", "c2-p32")]
        assert [c["status"] for c in cells] == ["ok", "ok"], idx
        for c in ("c1-p32", "c2-p32"):
            recs = [json.loads(line) for line in (_raw() / variant / f"{c}.jsonl").read_text().splitlines()]
            # the server's own usage counts: 32-token prompts (one tokenizer on both sides), 16 tokens out (ignore_eos)
            assert recs and all(r["success"] and r["prompt_tokens"] == 32 and r["output_tokens"] == 16 for r in recs)
        q = json.loads((_raw() / variant / "quality.json").read_text())
        assert q["status"] == "skipped" and "synthetic" in q["reason"]


@pytest.mark.slow
def test_summary_marks_synthetic_rows(tiny: Path, tmp_path: Path) -> None:
    points = tmp_path / "config.json"
    run = subprocess.run([str(BIN / "bakeoff"), "points", "--smk-config", '{"experiment": "synthetic_tiny"}',
                          "--out", str(points)], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    out = tmp_path / "summary.csv"
    run = subprocess.run([str(BIN / "bakeoff"), "summarize", *(str(_raw() / v / "cells.json") for v in
                          ("llamacpp-f16", "llamacpp-q4_k_m")), "--points", str(points),
                          "--hardware", str(RUN[0].hardware_path), "--out", str(out)],
                         cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    rows = list(csv.DictReader(out.open()))
    assert len(rows) == 4 and all(r["synthetic"] == "True" and r["ppl"] == "" for r in rows)
    assert all(r["predicted_status"] == "supported" and r["status"] == "ok" for r in rows)


def _server(tiny: Path, toolchain: Path, tmp_path: Path, **settings):
    cfg = load_config(["experiment=synthetic_tiny", *(f"engines.llamacpp.settings.{k}={v}" for k, v in settings.items())])
    spec = ServerSpec(engine=cfg.engines["llamacpp"], hardware=cfg.hardware, model_dir=tiny / "f16", served_name=TINY,
                      log_path=tmp_path / "server.log", toolchain_dir=toolchain)
    return get_engine("llamacpp")(spec)


@pytest.mark.slow
def test_llama_server_tokenizes_exactly_like_the_hf_tokenizer(tiny: Path, toolchain: Path, tmp_path: Path) -> None:
    tok = AutoTokenizer.from_pretrained(tiny / "source")
    texts = ["Hello world, the quick brown fox 123!", "  spaces\tand\nnewlines  ", "用 Python 写一个快速排序函数。",
             *make_prompts(tok, 64, 3, seed=1)]
    with _server(tiny, toolchain, tmp_path) as srv:
        srv.ready()
        for text in texts:
            got = requests.post(f"{srv.base_url}/tokenize", json={"content": text}, timeout=30).json()["tokens"]
            assert got == tok.encode(text, add_special_tokens=False), text


@pytest.mark.slow
def test_llama_server_slots_split_ctx_and_cut_requests_off(tiny: Path, toolchain: Path, tmp_path: Path) -> None:
    """-c 1024 --parallel 4 leaves 256 tokens a slot: 128 prompt + 256 wanted stops at 128; a 300-token prompt is refused.

    The H200 hand run's -c 8192 -np 32 is the same 256 a slot, with the same 128 + 256 requests. (This
    llama.cpp rounds a slot up to a multiple of 256 tokens, so smaller slots cannot be shown.)
    """
    tok = AutoTokenizer.from_pretrained(tiny / "source")
    short, long = make_prompts(tok, 128, 1, seed=2)[0], make_prompts(tok, 300, 1, seed=3)[0]
    with _server(tiny, toolchain, tmp_path, ctx_size=1024, parallel=4) as srv:
        srv.ready()
        assert "n_slots = 4, n_ctx_slot = 256" in srv.spec.log_path.read_text()
        body = {"model": TINY, "max_tokens": 256, "temperature": 0, "ignore_eos": True}
        r = requests.post(f"{srv.base_url}/v1/completions", json={**body, "prompt": short}, timeout=300).json()
        assert r["usage"]["prompt_tokens"] == 128 and r["usage"]["completion_tokens"] == 128
        r = requests.post(f"{srv.base_url}/v1/completions", json={**body, "prompt": long}, timeout=300)
        assert r.status_code >= 400 and "context" in r.text.lower(), r.text[:300]
