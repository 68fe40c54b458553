"""Workloads against real servers: vLLM's prefix cache on shared prefixes, llama.cpp on chat sessions.

Slow: each starts servers of the embedded model on this CPU.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bakeoff.composition.compose import load_config
from bakeoff.config.schema import LoadCfg
from bakeoff.serving.job import ServeJob
from bakeoff.stages import serve_load

from conftest import MODEL, TEST_MODELS, results_root, snakemake

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def fp16(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The embedded model's fp16 directory, made by the pipeline's own rules only if missing."""
    out = TEST_MODELS / MODEL / "fp16"
    if not (out / "manifest.json").exists():
        snakemake("--cores", "all", f"models/{MODEL}/fp16/manifest.json", cwd=results_root(tmp_path_factory.mktemp("m")))
    return out


def test_vllm_reports_the_implied_hit_rate_with_caching_on_and_none_with_it_off(fp16: Path, tmp_path: Path) -> None:
    cfg = load_config(["experiment=cpu_prefix_cache"])
    load = LoadCfg.model_validate({**cfg.load.model_dump(), "concurrency": [1], "output_len": 4, "num_requests": 8,
                                   "workload": {"kind": "shared_prefix", "shared_prefix": {
                                       "groups": 2, "prompts_per_group": 4, "system_prompt_len": 256}}})
    rows = {}
    for engine in ("vllm", "vllm_nocache"):
        job = ServeJob(engine_cfg=cfg.engines[engine], hardware=cfg.hardware, load=load, experiment="t", model=MODEL,
                       fmt="fp16", engine_name=engine, model_dir=fp16, tokenizer_dir=fp16,
                       out_dir=tmp_path / engine, toolchain_dir=None, show_progress=False)
        (row,) = serve_load.run(job)["cells"]
        rows[engine] = row
    implied = (8 - 2) * 256 / (8 * (256 + 32))
    on, off = rows["vllm"], rows["vllm_nocache"]
    for row in (on, off):
        assert row["status"] == "ok" and row["workload"] == "shared_prefix", row.get("reason")
        assert row["implied_prefix_hit_rate"] == pytest.approx(implied)
        assert row["total_input_tokens"] == 8 * 288  # token-id prompts reach the server exactly
    assert on["prefix_caching"] == "on" and off["prefix_caching"] == "off"
    assert on["prefix_cache_hit_rate"] == pytest.approx(implied, abs=0.05), on["prefix_cache_source"]
    assert on["prefix_cache_queries"] >= on["prefix_cache_hits"] > 0
    assert off["prefix_cache_hit_rate"] == pytest.approx(0.0, abs=0.01) and off["prefix_cache_hits"] == 0
    # vLLM's own latency histograms over each cell's window: its 8 first tokens, timed no later than the client saw them.
    for row in (on, off):
        assert row["server_latency_requests"] == 8, row["server_latency_source"]
        assert 0 < row["server_mean_ttft_ms"] <= 1.05 * row["mean_ttft_ms"] + 5, (row["server_mean_ttft_ms"],
                                                                                 row["mean_ttft_ms"])
        assert row["server_mean_queue_ms"] is not None and row["server_mean_queue_ms"] <= row["server_mean_ttft_ms"]
        # its threads, watched over the window: on this CPU the engine's compute threads work through every prompt
        assert row["core_watch_source"].startswith("/proc threads"), row["core_watch_source"]
        assert row["server_cpu_cores"] >= row["server_busiest_thread_cpu_share"] > 0.1, row["server_busiest_thread"]
        assert 0 <= row["client_server_core_overlap_share"] <= 1
    # The servers were started with the switch each plugin made of the setting.
    log_on = (tmp_path / "vllm" / "server.log").read_text()
    assert "--no-enable-prefix-caching" in (tmp_path / "vllm_nocache" / "server.log").read_text() or \
        "enable_prefix_caching=False" in (tmp_path / "vllm_nocache" / "server.log").read_text()
    assert "no-enable-prefix-caching" not in log_on


def test_llamacpp_runs_multiturn_sessions_through_the_pipeline(tmp_path: Path) -> None:
    root = results_root(tmp_path / "run")
    overrides = "load.mode=fixed load.concurrency=[2] experiment.variants={llamacpp:[q4_k_m]}"
    snakemake("--cores", "all", "--config", "experiment=cpu_multiturn", f"overrides={overrides}", "--",
              "results/summary.csv", cwd=root, timeout=3000)
    cells = [json.loads(p.read_text()) for p in (root / "results" / "raw" / "cpu_multiturn" / MODEL /
                                                   "llamacpp-q4_k_m").glob("c*-p*.json")]
    (cell,) = cells
    assert cell["status"] == "ok" and cell["workload"] == "multiturn" and cell["prefix_caching"] == "on"
    assert cell["requests"] == cell["completed"] == 12  # 4 sessions of 3 turns
    assert cell["median_ttft_first_turn_ms"] > 0 and cell["median_ttft_later_turns_ms"] > 0
    assert cell["client_prompt_build_s"] >= 0 and 0 < cell["implied_prefix_hit_rate"] < 1
    assert cell["prefix_cache_hits"] > 0  # a later turn reuses its slot's cached history
    records = [json.loads(line) for line in (root / "results" / "raw" / "cpu_multiturn" / MODEL / "llamacpp-q4_k_m" /
                                             "c2-p32.jsonl").read_text().splitlines()]
    by_index = {r["index"]: r for r in records}
    for i, r in by_index.items():  # each later turn's prompt holds the previous turn's prompt and answer
        if i % 3:
            prev = by_index[i - 1]
            assert r["prompt_tokens"] >= prev["prompt_tokens"] + prev["output_tokens"]
    with open(root / "results" / "summary.csv") as f:
        header = f.readline()
    assert "workload_detail" in header and "prefix_cache_hit_rate" in header
