"""Against a real llama-server (the pinned CPU build): its own timings, its metrics, its queue.

Slow: each test starts llama-server on a tiny synthetic llama (conf/model/synthetic_tiny.yaml,
random weights: speed only, which is all these tests read).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from bakeoff.config.schema import EngineCfg, HardwareCfg
from bakeoff.engines import ServerSpec, get_engine
from bakeoff.loadgen.cellload import CellLoad
from bakeoff.loadgen.metrics import summarize
from bakeoff.loadgen.prompts import make_prompts
from bakeoff.loadgen.runner import run_cell
from bakeoff.loadgen.scrape import MetricsScraper

from conftest import BIN, results_root, snakemake
from conftest import cpu_toolchain as built_toolchain

CPU = HardwareCfg(name="cpu", backend="cpu", gpus=0)
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cpu_toolchain(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The pinned llama.cpp CPU build in the tests' build/ (the pipeline's own rule; seconds when it exists)."""
    snakemake("--cores", "all", "--config", "experiment=synthetic_tiny", "--", "build/llamacpp/0c1e57098-cpu/manifest.json",
              cwd=results_root(tmp_path_factory.mktemp("toolchain")))
    return built_toolchain()


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """synthetic_tiny's source artifact (an F16 GGUF + its tokenizer), by the fetch-model stage."""
    spec = json.loads(subprocess.run([str(BIN / "bakeoff"), "config", "experiment=synthetic_tiny"], capture_output=True,
                                     text=True, check=True).stdout)["model"]
    out = tmp_path_factory.mktemp("synthetic-tiny") / "source"
    subprocess.run([str(BIN / "bakeoff"), "stage", "fetch-model", "--spec", json.dumps(spec),
                    "--out", str(out / "manifest.json")], check=True, capture_output=True)
    return out


@pytest.fixture
def server(cpu_toolchain: Path, tiny_model: Path, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator:
    parallel = request.param
    # One compute thread: on a 2-core machine a server using both starves its own HTTP thread, tokens pile up
    # in the send buffer, and the client's TPOT reads ~20 % short of the server's (measured here).
    cfg = EngineCfg(plugin="llamacpp", serves="gguf", startup_timeout_s=120,
                    settings={"ctx_size": 1024 * parallel, "parallel": parallel, "metrics": True, "threads": 1})
    spec = ServerSpec(engine=cfg, hardware=CPU, model_dir=tiny_model, served_name="tiny",
                      log_path=tmp_path / "server.log", toolchain_dir=cpu_toolchain)
    engine = get_engine("llamacpp")(spec).start()
    try:
        engine.ready()
        yield engine
    finally:
        engine.stop()


def _cell(engine, tokenizer, concurrency: int, n: int, output_len: int, scraper: MetricsScraper | None = None):
    prompts = make_prompts(tokenizer, 32, n + 1, seed=concurrency, tag=f"c{concurrency}-")
    res = run_cell(engine.base_url, "tiny", CellLoad(prompts[1:], prompt_len=32, output_len=output_len,
                                                     concurrency=concurrency, warmup_prompts=prompts[:1]),
                   show_progress=False,
                   on_measure_start=scraper.start if scraper else None, on_measure_end=scraper.stop if scraper else None)
    return res, summarize(res.records, res.duration_s)


@pytest.mark.parametrize("server", [1], indirect=True)
def test_server_tpot_agrees_with_client_tpot_at_c1(server, tiny_model: Path):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    res, m = _cell(server, tokenizer, concurrency=1, n=8, output_len=128)
    assert m["completed"] == 8
    # every request carried the final chunk's timings
    assert all(r.server_tpot_ms is not None and r.server_tpot_ms > 0 for r in res.records)
    client, own = m["median_tpot_ms"], m["server_median_tpot_ms"]
    assert abs(own - client) / client < 0.03, (own, client)


@pytest.mark.parametrize(("server", "running"), [(1, 1), (4, 3)], indirect=["server"])
def test_requests_wait_only_when_slots_are_fewer_than_concurrency(server, tiny_model: Path, running: int):
    """3 concurrent requests: with 1 slot two are deferred; with 4 slots none waits."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    scraper = MetricsScraper(server.base_url, server.metric_names, label=server.name, interval_s=0.05)
    _, m = _cell(server, tokenizer, concurrency=3, n=6, output_len=96, scraper=scraper)
    cols = scraper.columns()
    assert m["completed"] == 6 and cols["metrics_scrapes"] > 3
    assert cols["peak_running_requests"] == running
    if running < 3:
        assert cols["peak_waiting_requests"] > 0
        assert 0 < cols["kv_cache_peak_pct"] <= 100
    else:
        assert cols["peak_waiting_requests"] == 0
        # 3 busy slots of 1024 tokens hold at most 3 x (32 + 96) tokens of the 4 x 1024
        assert 0 < cols["kv_cache_peak_pct"] <= 100 * 3 * (32 + 96) / 4096 + 1e-9


def test_llama_bench_stage_records_pp_and_tg(cpu_toolchain: Path, tiny_model: Path, tmp_path: Path):
    """The kernel_bench rule's stage on the CPU build: llama-bench's own records, pp512 and tg128, at -fa off."""
    out = tmp_path / "f16-faoff.json"
    proc = subprocess.run([str(BIN / "bakeoff"), "stage", "kernel-bench", "--hardware", CPU.model_dump_json(),
                           "--flash-attn", "off", "--input", str(tiny_model / "manifest.json"),
                           "--toolchain", str(cpu_toolchain / "manifest.json"), "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    k = json.loads(out.read_text())
    assert k["flash_attn"] == "off" and k["tg_tok_s"] > 0 and k["pp_tok_s"] > k["tg_tok_s"]
    assert {(r["n_prompt"], r["n_gen"]) for r in k["records"]} == {(512, 0), (0, 128)}
    assert all(int(r["flash_attn"]) == 0 for r in k["records"])
