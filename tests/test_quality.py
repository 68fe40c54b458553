"""Quality: lm-eval through real servers, the logprob canary, KL against fp16, samples."""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from bakeoff.composition.compose import load_config
from bakeoff.engines import ServerSpec, get_engine
from bakeoff.engines.toolchain import library_dir
from bakeoff.proc import ManagedProcess, free_port
from bakeoff.quality import canary
from bakeoff.quality.localdata import documents, mc_items
from bakeoff.quality.topk import kl_position, mean_kl

from conftest import MODEL, TEST_BUILD, TEST_MODELS, Pipeline


@pytest.fixture(scope="module")
def summary(pipeline: Pipeline) -> dict[tuple[str, str], dict]:
    """One row per variant (quality columns are per variant)."""
    return {(r["engine"], r["format"]): r for r in pipeline.rows()}


def _server(engine: str, fmt: str, toolchain_dir: Path, tmp_path: Path):
    cfg = load_config([])
    e = cfg.engines["llamacpp"]
    engine_cfg = e if engine == "llamacpp" else e.eval_server
    spec = ServerSpec(engine=engine_cfg, hardware=cfg.hardware, model_dir=TEST_MODELS / MODEL / fmt,
                      served_name=MODEL, log_path=tmp_path / f"{engine}.log", toolchain_dir=toolchain_dir)
    return get_engine(engine_cfg.plugin)(spec)


def test_local_datasets_are_deterministic_and_sized() -> None:
    assert len(documents()) == 79 and sum(len(d["text"].split()) for d in documents()) > 50_000
    items = mc_items()
    assert len(items) >= 100
    assert all(len(i["choices"]) == 4 and 0 <= i["label"] < 4 for i in items)
    labels = [i["label"] for i in items]
    assert max(labels.count(k) for k in range(4)) < 0.4 * len(items)  # answers are not all in one slot


def test_topk_kl_is_zero_for_identical_and_positive_for_different() -> None:
    p = {"a": math.log(0.7), "b": math.log(0.2)}
    assert kl_position(p, p) == pytest.approx(0.0, abs=1e-12)
    q = {"a": math.log(0.4), "b": math.log(0.5)}
    exact = 0.7 * math.log(0.7 / 0.4) + 0.2 * math.log(0.2 / 0.5) + 0.1 * math.log(0.1 / 0.1)
    assert kl_position(p, q) == pytest.approx(exact)
    with pytest.raises(ValueError, match="same positions"):
        mean_kl([p], [p, q])


@pytest.mark.slow
def test_canary_rejects_llama_server(models: Path, toolchain: Path, tmp_path: Path) -> None:
    tok = AutoTokenizer.from_pretrained(TEST_MODELS / MODEL / "fp16")
    with _server("llamacpp", "q4_k_m", toolchain, tmp_path) as srv:
        srv.ready()
        with pytest.raises(canary.CanaryError, match="does not echo prompt logprobs"):
            canary.check(srv.base_url, MODEL, tok)


@pytest.mark.slow
def test_canary_accepts_bakeoffs_gguf_scorer_on_the_same_file(models: Path, toolchain: Path, tmp_path: Path) -> None:
    binding = TEST_BUILD / "llamacpp-python" / toolchain.name
    tok = AutoTokenizer.from_pretrained(TEST_MODELS / MODEL / "fp16")
    with _server("llamacpppy", "q4_k_m", binding, tmp_path) as srv:
        srv.ready()
        result = canary.check(srv.base_url, MODEL, tok)
        # Its logprobs are the model's: " over" after "The quick brown fox jumps" is near-certain.
        ids = tok.encode("The quick brown fox jumps over", add_special_tokens=False)
        lp = canary.prompt_logprobs(srv.base_url, MODEL, ids)
        assert lp["token_logprobs"][len(ids) - 1] > -0.1
    assert result["canary_margin_nats"] >= canary.MIN_MARGIN_NATS


@pytest.mark.slow
def test_canary_rejects_llama_cpp_pythons_own_server(models: Path, toolchain: Path, tmp_path: Path) -> None:
    """llama_cpp.server 0.3.36 pairs each echoed token with the next position's logits: rejected."""
    binding = TEST_BUILD / "llamacpp-python" / toolchain.name
    port = free_port()
    cmd = [sys.executable, "-m", "llama_cpp.server", "--model", str(TEST_MODELS / MODEL / "q4_k_m" / "model.gguf"),
           "--model_alias", MODEL, "--host", "127.0.0.1", "--port", str(port), "--n_ctx", "2048",
           "--logits_all", "True"]
    tok = AutoTokenizer.from_pretrained(TEST_MODELS / MODEL / "fp16")
    proc = ManagedProcess(cmd, tmp_path / "llama_cpp.server.log", env={**os.environ, "PYTHONPATH": str(binding / "site"),
                                                                     "LLAMA_CPP_LIB_PATH": str(library_dir(binding))}).start()
    try:
        proc.wait_healthy(f"http://127.0.0.1:{port}/v1/models", 120)
        with pytest.raises(canary.CanaryError, match="misaligned"):
            canary.check(f"http://127.0.0.1:{port}", MODEL, tok, as_text=True)  # it accepts only text prompts
    finally:
        proc.stop()


@pytest.mark.slow
def test_vllm_passed_the_canary_on_its_load_server(pipeline: Pipeline) -> None:
    q = json.loads((pipeline.raw / "vllm-fp16" / "quality.json").read_text())
    assert q["status"] == "ok", q
    assert q["route"] == "load server"
    assert q["canary"]["canary_margin_nats"] >= canary.MIN_MARGIN_NATS


@pytest.mark.slow
def test_every_supported_variant_has_quality_columns(summary: dict) -> None:
    limit = load_config(["experiment=ci"]).eval.limit
    for (engine, fmt), r in summary.items():
        if fmt == "fp8":
            assert r["quality_status"] == "unsupported" and r["ppl"] == "", r
            continue
        assert r["quality_status"] == "ok", (engine, fmt, r["quality_reason"])
        for col in ("ppl", "bits_per_byte", "accuracy", "ppl_rel_delta_vs_fp16", "kl_vs_fp16"):
            assert math.isfinite(float(r[col])), (engine, fmt, col)
        assert r["ppl_task"] == "pydoc_ppl" and int(r["ppl_n"]) == limit["pydoc_ppl"]
        assert r["accuracy_task"] == "pydoc_mc/acc_norm" and int(r["accuracy_n"]) == limit["pydoc_mc"]
    assert summary[("llamacpp", "q4_k_m")]["quality_route"].startswith("llamacpppy")
    assert summary[("llamacpp", "q4_k_m")]["quality_ref"] == "llamacpp-f16"
    assert summary[("llamacpp", "f16")]["quality_ref"] == "llamacpp-f16"


@pytest.mark.slow
def test_perplexity_is_finite_and_sane(summary: dict) -> None:
    r = summary[("vllm", "fp16")]
    assert 2.0 < float(r["ppl"]) < 500.0
    assert 0.3 < float(r["bits_per_byte"]) < 3.0
    assert 0.0 <= float(r["accuracy"]) <= 1.0  # a score of 8 questions: a number, not a finding
    assert float(r["ppl_rel_delta_vs_fp16"]) == 0.0 and float(r["kl_vs_fp16"]) == 0.0


@pytest.mark.slow
def test_q4_k_m_is_not_better_than_fp16_beyond_noise(summary: dict) -> None:
    f16, q4 = (summary[("llamacpp", f)] for f in ("f16", "q4_k_m"))
    # Scoring is deterministic (temperature 0, same text); allow 1% for numeric noise.
    assert float(q4["ppl"]) >= float(f16["ppl"]) * 0.99
    assert float(q4["kl_vs_fp16"]) > 0.0 and float(f16["kl_vs_fp16"]) == 0.0
    # The same engine-independent check across engines: llama.cpp f16 vs the HF fp16 on vLLM.
    assert abs(float(f16["ppl"]) / float(summary[("vllm", "fp16")]["ppl"]) - 1) < 0.05


@pytest.mark.slow
def test_samples_side_by_side_include_quicksort(pipeline: Pipeline) -> None:
    md = (pipeline.results / "samples" / pipeline.experiment / f"{MODEL}.md").read_text()
    assert "quicksort" in md
    data = json.loads((pipeline.results / "samples" / pipeline.experiment / f"{MODEL}.json").read_text())
    prompts = load_config(["experiment=ci"]).eval.samples.prompts
    by_variant = {v["variant"]: v for v in data}
    for name in ("vllm-fp16", "llamacpp-q4_k_m"):
        texts = [s["text"] for s in by_variant[name]["samples"]]
        assert len(texts) == len(prompts) and all(t and t.strip() for t in texts), name
    assert by_variant["vllm-fp8"]["samples"] == [] and "unsupported" in by_variant["vllm-fp8"]["reason"]


@pytest.mark.slow
def test_unknown_eval_task_fails_clearly_before_any_server(pipeline: Pipeline) -> None:
    """The schedule's first serving job (the others wait for it) stops on the unknown task before its server."""
    from bakeoff.loadgen.blocks import schedule

    cfg = load_config(["experiment=ci"])
    first = schedule(cfg.variants(), cfg.load.repeats, cfg.load.block_seed)[0]
    variant = f"{first.engine}-{first.format}"
    proc = pipeline.snakemake("--cores", "all", f"results/raw/badtask/{MODEL}/{variant}/cells.json", "--config",
                              "experiment=ci", "overrides=experiment.name=badtask eval.tasks=[pydoc_ppl,no_such_task]",
                              check=False)
    assert proc.returncode != 0
    log = (pipeline.root / "logs" / "results" / "raw" / "badtask" / MODEL / f"{variant}.log").read_text()
    assert "unknown eval task(s) ['no_such_task']" in log
    assert not (pipeline.results / "raw" / "badtask" / MODEL / variant / "server.log").exists()


@pytest.mark.slow
def test_a_rerun_through_snakemake_reuses_the_score_and_samples(pipeline: Pipeline, summary: dict) -> None:
    """Snakemake deletes quality.json and samples.json before it reruns serve_load; both come back unchanged.

    The forced job is one variant's whole serving job: its cells, samples and score are all kept, so no
    server starts. ``--touch`` then leaves the run as up to date as it was for the tests after this one.
    """
    engine, fmt = next(k for k, r in summary.items() if r["quality_status"] == "ok" and k[0] == "llamacpp")
    variant = pipeline.raw / f"{engine}-{fmt}"
    before = {name: (variant / name).read_text() for name in ("quality.json", "samples.json", "cells.json")}
    logs = [variant / "server.log", variant / "eval-server.log"]  # rewritten by every server start
    started = [p.stat().st_mtime_ns for p in logs]
    config = ("--config", f"experiment={pipeline.experiment}")
    try:
        pipeline.snakemake("--cores", "all", "--force", *config, "--", str(variant.relative_to(pipeline.root) / "cells.json"))
        log = (pipeline.root / "logs" / "results" / "raw" / pipeline.experiment / MODEL / f"{engine}-{fmt}.log").read_text()
        assert "quality: reusing quality.json" in log
        assert [p.stat().st_mtime_ns for p in logs] == started  # no server started: nothing was measured again
        for name, text in before.items():
            assert (variant / name).read_text() == text, name
    finally:
        pipeline.snakemake("--cores", "1", "--touch", *config)
