"""The client's verdict on itself (bakeoff.loadgen.health) and repeats on fresh servers, against llama-server."""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from bakeoff.composition.compose import load_config
from bakeoff.config.schema import LoadCfg
from bakeoff.engines import ServerSpec, get_engine
from bakeoff.layout import CELLS_INDEX
from bakeoff.loadgen import health
from bakeoff.loadgen.cellload import CellLoad
from bakeoff.loadgen.prompts import make_prompts
from bakeoff.loadgen.runner import run_cell
from bakeoff.results import spread
from bakeoff.serving.job import ServeJob
from bakeoff.stages import serve_load, summary

from conftest import MODEL, cpu_toolchain


def test_verdict_names_each_worker_and_threshold_it_passed() -> None:
    calm = {"worker": 0, "loop_lag_p99_ms": 3.0, "schedule_delay_p99_ms": 1.0, "cpu_share": 0.05}
    assert health.verdict([calm]) == {"client_saturated": False, "client_saturated_reason": ""}
    busy = {"worker": 3, "loop_lag_p99_ms": 180.0, "schedule_delay_p99_ms": 90.0, "cpu_share": 0.95}
    both = health.verdict([calm, busy])
    assert both["client_saturated"] and "worker 3: event-loop lag p99 180.0 ms > 25 ms" in both["client_saturated_reason"]
    assert "worker 3: schedule delay p99 90.0 ms" in both["client_saturated_reason"]
    assert "worker 3: CPU 0.95 of one core" in both["client_saturated_reason"]
    assert "worker 0" not in both["client_saturated_reason"]
    # any one signal alone flags the cell, naming only the one it passed
    for key, value, word in (("loop_lag_p99_ms", 40.0, "lag"), ("schedule_delay_p99_ms", 80.0, "schedule"),
                             ("cpu_share", 0.9, "CPU")):
        one = health.verdict([{**calm, key: value}])
        assert one["client_saturated"] and word in one["client_saturated_reason"], key
        assert sum(w in one["client_saturated_reason"] for w in ("lag", "schedule", "CPU")) == 1, key
    # at the threshold is not past it
    assert not health.verdict([{"loop_lag_p99_ms": health.LAG_P99_MS_MAX,
                                "schedule_delay_p99_ms": health.SCHEDULE_DELAY_P99_MS_MAX,
                                "cpu_share": health.CPU_SHARE_MAX}])["client_saturated"]
    # the cell's columns take the worst worker of each signal, and the total CPU
    cols = health.cell_health([{**calm, "cpu_s": 1.0}, {**busy, "cpu_s": 2.5}])
    assert cols["client_workers"] == 2 and cols["client_cpu_s"] == 3.5 and cols["client_cpu_share"] == 0.95
    assert cols["client_loop_lag_p99_ms"] == 180.0 and cols["client_schedule_delay_p99_ms"] == 90.0


@pytest.fixture(scope="module")
def llama(gguf_models: Path) -> dict:
    cfg = load_config([])
    # The tests' own loads, not the default experiment's llama.cpp override of them (engines.llamacpp.load).
    cfg.engines["llamacpp"] = cfg.engines["llamacpp"].model_copy(update={"load": {}})
    return dict(cfg=cfg, models=gguf_models, toolchain=cpu_toolchain())


@pytest.fixture
def server(llama: dict, tmp_path: Path) -> Iterator[str]:
    cfg = llama["cfg"]
    spec = ServerSpec(engine=cfg.engines["llamacpp"], hardware=cfg.hardware, model_dir=llama["models"] / "q4_k_m",
                      served_name="smol", log_path=tmp_path / "server.log", toolchain_dir=llama["toolchain"])
    with get_engine("llamacpp")(spec) as engine:
        engine.ready(120)
        yield engine.base_url


def _cell(url: str, tokenizer_dir: Path, on_start: Callable[[], None] | None = None,
          on_end: Callable[[], None] | None = None) -> dict:
    from transformers import AutoTokenizer

    prompts = make_prompts(AutoTokenizer.from_pretrained(tokenizer_dir), 32, 6, seed=1)
    res = run_cell(url, "smol", CellLoad(prompts[1:], prompt_len=32, output_len=32, concurrency=2,
                                         warmup_prompts=prompts[:1]),
                   show_progress=False, on_measure_start=on_start, on_measure_end=on_end)
    assert all(r.success for r in res.records)
    return res.client


@pytest.mark.slow
def test_a_client_busy_in_its_own_event_loop_is_flagged_saturated(server: str, llama: dict) -> None:
    """The same cell twice on one llama-server: as is, then with 80 ms CPU bursts blocking the client's loop.

    Between bursts the hog sleeps 40 ms, so the client still gets its loop (a hog that only yields with
    ``sleep(0)`` starves every chunk read and stretches the cell to minutes) at two thirds CPU share.
    """
    calm = _cell(server, llama["models"] / "fp16")
    stop = False

    async def hog() -> None:
        while not stop:
            t = time.perf_counter()
            while time.perf_counter() - t < 0.08:  # CPU with the event loop blocked, as a slow client would be
                pass
            await asyncio.sleep(0.04)

    def start() -> None:
        asyncio.get_running_loop().create_task(hog())  # runs inside the client's own loop

    def end() -> None:
        nonlocal stop
        stop = True

    busy = _cell(server, llama["models"] / "fp16", start, end)
    assert busy["client_saturated"] is True, busy
    assert "worker 0: event-loop lag p99" in busy["client_saturated_reason"]
    assert busy["client_loop_lag_p99_ms"] > 60 and busy["client_cpu_share"] > 2 * calm["client_cpu_share"]
    assert calm["client_loop_lag_p99_ms"] < busy["client_loop_lag_p99_ms"] / 3
    assert calm["client_saturated"] is False, calm


@pytest.mark.slow
def test_repeats_run_on_fresh_servers_and_get_spread_columns(llama: dict, tmp_path: Path) -> None:
    cfg = llama["cfg"]
    model_dir = tmp_path / "q4_k_m"
    shutil.copytree(llama["models"] / "q4_k_m", model_dir)
    load = LoadCfg(concurrency=[1], prompt_len=[32], output_len=16, num_requests=3, warmup_requests=1, repeats=3)
    index = serve_load.run(ServeJob(engine_cfg=cfg.engines["llamacpp"], hardware=cfg.hardware, load=load,
                                    experiment="t", model=MODEL, fmt="q4_k_m", engine_name="llamacpp",
                                    model_dir=model_dir, tokenizer_dir=llama["models"] / "fp16",
                                    out_dir=tmp_path / "raw", toolchain_dir=llama["toolchain"], show_progress=False))
    cells = index["cells"]
    assert [c["repeat"] for c in cells] == [0, 1, 2] and all(c["status"] == "ok" for c in cells)
    assert [c["server_start"] for c in cells] == [1, 2, 3]  # each repeat after the first on a fresh server
    assert all(isinstance(c["client_saturated"], bool) and "client_cpu_share" in c for c in cells)
    log = (tmp_path / "raw" / "server.log").read_text()
    assert log.count("$ ") == 3  # three server command lines in the one log
    rows = summary.rows([tmp_path / "raw" / CELLS_INDEX], {})
    spread.extend(rows)
    assert all(r["repeats_ok"] == 3 and r["repeat_server_starts"] == 3 for r in rows)
    mean, std, ci = (float(rows[0][f"output_throughput_{s}"]) for s in ("mean", "std", "ci95"))
    measured = [float(r["output_throughput"]) for r in rows]
    assert mean == pytest.approx(sum(measured) / 3, rel=1e-5) and std > 0 and ci > std  # t(0.975, 2) / sqrt(3) > 1


@pytest.mark.slow
def test_a_c1_cell_on_four_slots_measures_no_request_on_a_never_used_slot(llama: dict, tmp_path: Path) -> None:
    """llama-server hands each request the least-recently-used idle slot, so c=1 requests walk through all 4
    slots: the warm-up must reach every one, not just the one a c=1 warm-up of 1 request would touch."""
    import re

    cfg = llama["cfg"]
    engine_cfg = cfg.engines["llamacpp"].model_copy(
        update={"settings": {**cfg.engines["llamacpp"].settings, "parallel": 4, "ctx_size": 4096}})
    model_dir = tmp_path / "q4_k_m"
    shutil.copytree(llama["models"] / "q4_k_m", model_dir)
    n = 6
    load = LoadCfg(concurrency=[1], prompt_len=[32], output_len=8, num_requests=n, warmup_requests=1)
    index = serve_load.run(ServeJob(engine_cfg=engine_cfg, hardware=cfg.hardware, load=load, experiment="t",
                                    model=MODEL, fmt="q4_k_m", engine_name="llamacpp", model_dir=model_dir,
                                    tokenizer_dir=llama["models"] / "fp16", out_dir=tmp_path / "raw",
                                    toolchain_dir=llama["toolchain"], show_progress=False))
    (cell,) = index["cells"]
    assert cell["status"] == "ok" and cell["warmup_requests"] == 4
    log = (tmp_path / "raw" / "server.log").read_text()
    launched = [int(m) for m in re.findall(r"launch_slot_: id +(\d+) \| task", log)]
    assert len(launched) == 4 + n, launched
    warm, measured = launched[:4], launched[4:]
    assert sorted(warm) == [0, 1, 2, 3]  # one warm-up on each slot
    assert set(measured) <= set(warm)
