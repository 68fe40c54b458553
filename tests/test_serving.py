"""Serving and load against the real servers with the embedded model."""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest

from bakeoff.composition.compose import load_config
from bakeoff.config.schema import LoadCfg
from bakeoff.config.slo import SLO_PRESETS
from bakeoff.engines import ServerSpec, get_engine
from bakeoff.errors import BakeoffError
from bakeoff.loadgen.capacity import bracket_from_cells
from bakeoff.models.manifest import read_manifest
from bakeoff.proc import ServerStartError
from bakeoff.serving import measure as measure_cell
from bakeoff.serving.capacity import fixed_verdicts
from bakeoff.serving.job import ServeJob
from bakeoff.stages import serve_load

from conftest import TEST_MODELS, Pipeline, _server_pids, bakeoff, cpu_toolchain

pytestmark = pytest.mark.slow
ISSUE_COLUMNS = ["engine", "engine_version", "format", "model", "hardware", "concurrency", "prompt_len", "output_len",
                 "requests", "completed", "failed", "status", "reason", "output_throughput", "request_throughput",
                 "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "p99_tpot_ms", "median_itl_ms", "p99_itl_ms",
                 "median_e2el_ms", "p99_e2el_ms", "peak_rss_bytes", "weight_bytes", "bits_per_weight"]


@pytest.fixture(scope="module")
def summary(pipeline: Pipeline) -> list[dict]:
    return pipeline.rows()


def test_summary_has_every_cell_of_the_experiment(summary: list[dict]) -> None:
    cfg = load_config(["experiment=ci"])
    expected = {(e, f, str(c), str(p)) for e, f in cfg.variants() for c in cfg.load.concurrency
                for p in cfg.load.prompt_len}
    assert {(r["engine"], r["format"], r["concurrency"], r["prompt_len"]) for r in summary} == expected
    assert all(col in summary[0] for col in ISSUE_COLUMNS)


def test_fp8_is_an_unsupported_row_with_the_engines_own_error(summary: list[dict]) -> None:
    fp8 = [r for r in summary if (r["engine"], r["format"]) == ("vllm", "fp8")]
    assert fp8 and all(r["status"] == "unsupported" for r in fp8)
    assert all("static_scaled_fp8_quant" in r["reason"] for r in fp8)


def test_every_other_cell_ran_and_measured(summary: list[dict]) -> None:
    for r in summary:
        if r["format"] == "fp8":
            continue
        assert r["status"] == "ok", (r["engine"], r["format"], r["concurrency"], r["reason"])
        assert int(r["completed"]) == int(r["requests"]) and int(r["failed"]) == 0
        assert float(r["output_throughput"]) > 0
        assert 0 < float(r["median_ttft_ms"]) <= float(r["p99_ttft_ms"])
        assert float(r["median_tpot_ms"]) > 0 and float(r["median_e2el_ms"]) > float(r["median_ttft_ms"])
        assert int(r["peak_rss_bytes"]) > 0
        # ci serves vLLM's 16-bit checkpoints in float32 (4 bytes a weight); llama.cpp reads the GGUF as stored.
        stored = read_manifest(TEST_MODELS / r["model"] / r["format"])["weight_bytes"]
        assert int(r["weight_bytes"]) == stored * (2 if r["engine"] == "vllm" else 1)
        assert r["engine_version"] in ("0.32.0", "llama.cpp@0c1e57098")


def test_requests_are_exact_length_and_use_server_token_counts(pipeline: Pipeline) -> None:
    cfg = load_config(["experiment=ci"])
    c, p = max(cfg.load.concurrency), cfg.load.prompt_len[0]
    for variant in ["vllm-fp16", "llamacpp-q4_k_m"]:
        for line in (pipeline.raw / variant / f"c{c}-p{p}.jsonl").read_text().splitlines():
            rec = json.loads(line)
            assert rec["success"] and rec["tokens_from"] == "usage"
            assert rec["output_tokens"] == cfg.load.output_len  # ignore_eos + max_tokens
            assert rec["prompt_tokens"] == p, variant  # exact-length prompts
            assert len(rec["itl"]) >= 1


def _small_load(**kw) -> LoadCfg:
    base = dict(concurrency=[1, 2], prompt_len=[32], output_len=48, num_requests=6, warmup_requests=0)
    return LoadCfg(**{**base, **kw})


def _llama_variant(models: Path, tmp_path: Path) -> dict:
    cfg = load_config([])
    model_dir = tmp_path / "q4_k_m"
    shutil.copytree(models / "q4_k_m", model_dir)  # a unique path, to find this test's server
    # The test's own load, not the default experiment's llama.cpp override of it (engines.llamacpp.load).
    engine_cfg = cfg.engines["llamacpp"].model_copy(update={"load": {}})
    return dict(engine_cfg=engine_cfg, hardware=cfg.hardware, experiment="t", model="smollm2-135m",
                fmt="q4_k_m", engine_name="llamacpp", model_dir=model_dir, tokenizer_dir=models / "fp16",
                toolchain_dir=cpu_toolchain(), show_progress=False)


def _kill_server_when_busy(model_dir: Path, log: Path) -> threading.Thread:
    """SIGKILL the server once its log shows it serving a request (inside the first cell, on any machine speed)."""
    def killer() -> None:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if log.exists() and "launch_slot_" in log.read_text(errors="replace"):
                for p in psutil.process_iter(["pid", "cmdline"]):
                    if str(model_dir) in " ".join(p.info["cmdline"] or []):
                        os.killpg(p.info["pid"], signal.SIGKILL)
                        return
            time.sleep(0.05)

    t = threading.Thread(target=killer, daemon=True)
    t.start()
    return t


def test_server_killed_mid_cell_fails_that_cell_and_rerun_redoes_only_it(gguf_models: Path, tmp_path: Path) -> None:
    v = _llama_variant(gguf_models, tmp_path)
    out = tmp_path / "raw"
    killer = _kill_server_when_busy(v["model_dir"], out / "server.log")
    index = serve_load.run(ServeJob(load=_small_load(), out_dir=out, **v))
    killer.join()
    status = {c["cell"]: c for c in index["cells"]}
    assert status["c1-p32"]["status"] == "failed"
    # How it ended comes first; the log holds no error, so its last line is quoted as such, never as the cause.
    reason = status["c1-p32"]["reason"]
    assert reason.startswith("server died mid-cell: server killed by SIGKILL (signal 9); no error in its log"), reason
    assert status["c1-p32"]["failed"] >= 1
    assert status["c2-p32"]["status"] == "ok"  # the server was restarted for the rest
    ok_mtime = (out / "c2-p32.json").stat().st_mtime_ns
    index2 = serve_load.run(ServeJob(load=_small_load(), out_dir=out, **v))
    assert [c["status"] for c in index2["cells"]] == ["ok", "ok"]
    assert (out / "c2-p32.json").stat().st_mtime_ns == ok_mtime, "a finished cell must not be re-run"


def test_server_that_cannot_start_is_failed_not_unsupported(models: Path, tmp_path: Path) -> None:
    """A misspelled flag is our mistake, not a property of the hardware: ``failed``, with the engine's words."""
    v = _llama_variant(models, tmp_path)
    v["engine_cfg"] = v["engine_cfg"].model_copy(update={"extra_args": ["--no-such-flag"]})
    t0 = time.monotonic()
    index = serve_load.run(ServeJob(load=_small_load(), out_dir=tmp_path / "raw", **v))
    assert time.monotonic() - t0 < 60
    assert {c["status"] for c in index["cells"]} == {"failed"}
    assert "--no-such-flag" in index["cells"][0]["reason"]


def test_vllm_kv_cache_from_a_fraction_of_node_memory_fails_and_the_explicit_size_runs(
        pipeline: Pipeline, models: Path, tmp_path: Path) -> None:
    """The small-node failure, reproduced: a fraction of the node's memory below the worker's own RSS.

    vLLM's CPU worker sizes the KV cache as gpu_memory_utilization x the node's total minus its RSS; at 1%
    of this node that is negative, and the start fails. That is a resource failure (``failed``), never
    ``unsupported``. The same variant with the explicit size the config sets (the pipeline's vllm-fp16,
    same model, same settings otherwise) measured every cell.
    """
    cfg = load_config(["experiment=ci"])
    explicit = cfg.engines["vllm"]
    assert explicit.settings["kv_cache_memory_bytes"]
    fraction = explicit.model_copy(update={"settings": {**{k: v for k, v in explicit.settings.items()
                                                           if k != "kv_cache_memory_bytes"},
                                                        "gpu_memory_utilization": 0.01}})
    index = serve_load.run(ServeJob(engine_cfg=fraction, hardware=cfg.hardware, load=_small_load(concurrency=[1]),
                                    experiment="t", model="smollm2-135m", fmt="fp16", engine_name="vllm",
                                    model_dir=models / "fp16", tokenizer_dir=models / "fp16", out_dir=tmp_path / "raw",
                                    toolchain_dir=None, show_progress=False))
    cell = index["cells"][0]
    assert cell["status"] == "failed", cell
    assert "Available memory on node" in cell["reason"] and "kv" in cell["reason"]
    ran = [r for r in pipeline.rows() if (r["engine"], r["format"]) == ("vllm", "fp16")]
    assert ran and all(r["status"] == "ok" for r in ran)
    assert all(json.loads(r["engine_settings"])["kv_cache_memory_bytes"] == "1G" for r in ran)


def test_server_not_ready_within_timeout_is_stopped_with_log_tail(models: Path, tmp_path: Path) -> None:
    cfg = load_config([])
    e = cfg.engines["vllm"].model_copy(update={"startup_timeout_s": 3})
    spec = ServerSpec(engine=e, hardware=cfg.hardware, model_dir=models / "fp16", served_name="m",
                      log_path=tmp_path / "vllm.log")
    engine = get_engine("vllm")(spec).start()
    pid = engine.pid()
    t0 = time.monotonic()
    with pytest.raises(ServerStartError) as err:
        engine.ready()
    assert time.monotonic() - t0 < 30
    assert "not ready after 3s" in str(err.value)
    assert "server log tail" in str(err.value) and "vllm" in err.value.log_tail.lower()
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_bad_load_parameters_are_refused_before_any_server_starts(models: Path, tmp_path: Path) -> None:
    proc = bakeoff("load", "--url", "http://127.0.0.1:9", "--model", "m", "--tokenizer", str(models / "fp16"),
                   "--concurrency", "0")
    assert proc.returncode == 2 and "--concurrency must be >= 1" in proc.stderr
    before = _server_pids()
    v = _llama_variant(models, tmp_path)
    with pytest.raises(BakeoffError, match="exceeds"):
        serve_load.run(ServeJob(load=_small_load(prompt_len=[3000]), out_dir=tmp_path / "raw", **v))
    assert not (tmp_path / "raw" / "server.log").exists()
    assert _server_pids() == before


def test_cli_load_runs_against_any_openai_server(models: Path, tmp_path: Path) -> None:
    cfg = load_config([])
    spec = ServerSpec(engine=cfg.engines["llamacpp"], hardware=cfg.hardware, model_dir=models / "q8_0",
                      served_name="smol", log_path=tmp_path / "server.log",
                      toolchain_dir=cpu_toolchain())
    with get_engine("llamacpp")(spec) as engine:
        engine.ready(120)
        proc = bakeoff("load", "--url", engine.base_url, "--model", "smol", "--tokenizer", str(models / "fp16"),
                       "--concurrency", "2", "--prompt-len", "64", "--output-len", "16", "--num-requests", "4",
                       "--records", str(tmp_path / "r.jsonl"))
    assert proc.returncode == 0, proc.stderr
    m = json.loads(proc.stdout)  # stdout is pure JSON: the progress bar is on stderr
    assert m["completed"] == 4 and m["total_output_tokens"] == 64
    assert len((tmp_path / "r.jsonl").read_text().splitlines()) == 4


@pytest.mark.parametrize("how", ["ctrl-c", "kill-9"])
def test_interrupting_snakemake_leaves_no_server(pipeline: Pipeline, how: str) -> None:
    """Ctrl-C on the whole job group, or SIGKILL of snakemake alone: the server must go either way."""
    import subprocess
    import sys as _sys

    exp = f"interrupt-{how.replace('-', '')}"
    out = pipeline.results / "raw" / exp
    shutil.rmtree(out, ignore_errors=True)
    target = f"results/raw/{exp}/smollm2-135m/llamacpp-q4_k_m/cells.json"
    overrides = (f"experiment.name={exp} experiment.variants={{llamacpp:[q4_k_m]}} load.concurrency=[1] "
                 "load.prompt_len=[32] load.output_len=200 load.num_requests=50")
    bindir = Path(_sys.executable).parent
    env = {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}"}
    before = _server_pids()
    proc = subprocess.Popen([str(bindir / "snakemake"), "--cores", "2", target, "--config", f"overrides={overrides}"],
                            cwd=pipeline.root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while not (_server_pids() - before) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _server_pids() - before, "the server never started"
        time.sleep(3)  # load is running
        if how == "ctrl-c":
            os.killpg(proc.pid, signal.SIGINT)  # what a terminal does: the whole foreground group
        else:
            os.kill(proc.pid, signal.SIGKILL)  # snakemake alone, without a chance to clean up
        deadline = time.monotonic() + 60
        while (_server_pids() - before) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not (_server_pids() - before), "a server outlived the interrupted pipeline"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
        subprocess.run([str(bindir / "snakemake"), "--unlock", "--cores", "1"], cwd=pipeline.root, env=env,
                       capture_output=True)
        shutil.rmtree(out, ignore_errors=True)


def test_changed_settings_rerun_cells_instead_of_reusing_them(models: Path, tmp_path: Path) -> None:
    v = _llama_variant(models, tmp_path)
    out = tmp_path / "raw"
    load = _small_load(concurrency=[1], num_requests=2, output_len=8)
    first = serve_load.run(ServeJob(load=load, out_dir=out, **v))["cells"][0]
    again = serve_load.run(ServeJob(load=load, out_dir=out, **v))["cells"][0]
    assert again["started_utc"] == first["started_utc"]  # same settings: reused
    v["engine_cfg"] = v["engine_cfg"].model_copy(update={"settings": {**v["engine_cfg"].settings, "parallel": 2}})
    changed = serve_load.run(ServeJob(load=load, out_dir=out, **v))["cells"][0]
    assert changed["started_utc"] != first["started_utc"]
    assert changed["engine_settings"]["parallel"] == 2


def test_every_llamacpp_row_records_the_slot_context_the_server_set(summary: list[dict]) -> None:
    settings = load_config(["experiment=ci"]).engines["llamacpp"].settings
    for r in summary:
        if r["engine"] == "llamacpp" and r["status"] == "ok":
            assert int(r["slot_ctx"]) == settings["ctx_size"] // settings["parallel"], r
            assert "capped" not in r["load_note"]


def test_a_slot_capped_at_the_training_context_is_read_and_said(models: Path, tmp_path: Path) -> None:
    """SmolLM2 was trained at 8192 tokens: llama-server cuts 2 slots of 12288 to 8192 each, and says so only in its log."""
    cfg = load_config([])
    engine_cfg = cfg.engines["llamacpp"].model_copy(update={"settings": {"ctx_size": 24576, "parallel": 2}})
    spec = ServerSpec(engine=engine_cfg, hardware=cfg.hardware, model_dir=models / "q8_0", served_name="smol",
                      log_path=tmp_path / "server.log", toolchain_dir=cpu_toolchain())
    with get_engine("llamacpp")(spec) as engine:
        engine.ready(120)
        facts, notes = engine.started_facts()
    assert facts == {"slot_ctx": 8192}
    assert notes == ["llama-server capped each of its 2 slots at 8192 tokens (the model's training context is 8192), "
                     "not ctx_size/parallel = 12288: KV occupancy is of 2 x 8192 tokens"]
    assert "exceeds the training context of the model" in (tmp_path / "server.log").read_text()


class _MeteredNvml:
    """Hand-written NVML stand-in for one GPU drawing a constant 250 W: its energy counter follows the clock.

    The thing under test is serve_load's wiring of the measured window (warm-up outside it, the energy
    divided by the cell's output tokens), with a real server and client; this machine has no GPU to meter.
    """

    WATTS = 250

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802 (NVML's names)
        return 1

    def nvmlDeviceGetHandleByIndex(self, i: int) -> str:  # noqa: N802
        return "GPU-metered"

    def nvmlDeviceGetUUID(self, h: str) -> str:  # noqa: N802
        return h

    def nvmlDeviceGetHandleByUUID(self, u: str) -> str:  # noqa: N802
        return u

    def nvmlDeviceGetEnforcedPowerLimit(self, h: str) -> int:  # noqa: N802
        return 700_000

    def nvmlDeviceGetMemoryInfo(self, h: str) -> SimpleNamespace:  # noqa: N802
        return SimpleNamespace(used=10**9, total=80 * 10**9)

    def nvmlDeviceGetUtilizationRates(self, h: str) -> SimpleNamespace:  # noqa: N802
        return SimpleNamespace(gpu=50)

    def nvmlDeviceGetPowerUsage(self, h: str) -> int:  # noqa: N802
        return self.WATTS * 1000

    def nvmlDeviceGetTotalEnergyConsumption(self, h: str) -> int:  # noqa: N802
        return int(time.monotonic() * self.WATTS * 1000)  # mJ


def test_energy_covers_the_measured_requests_only(models: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from bakeoff.engines.window import MeasuredWindow
    from bakeoff.hardware import telemetry

    monkeypatch.setattr(telemetry, "_nvml", _MeteredNvml)
    monkeypatch.setattr(measure_cell, "MeasuredWindow", lambda engine, gpu: MeasuredWindow(engine, gpu=True))
    load = _small_load(concurrency=[1], num_requests=3, warmup_requests=6, output_len=32)
    cell = serve_load.run(ServeJob(load=load, out_dir=tmp_path / "raw", **_llama_variant(models, tmp_path)))["cells"][0]
    assert cell["status"] == "ok" and cell["warmup_requests"] == 6 and cell["energy_source"] == "nvml_total_energy_counter"
    measured_s = cell["duration_s"]
    # The six warm-ups took a good share of the cell's time, so energy over the whole cell would miss the bound below.
    assert cell["ended_utc"] - cell["started_utc"] > 1.5 * measured_s
    assert cell["energy_j"] / _MeteredNvml.WATTS == pytest.approx(measured_s, rel=0.05, abs=0.1)
    assert cell["joules_per_output_token"] == pytest.approx(cell["energy_j"] / cell["total_output_tokens"])
    assert cell["gpu_uuids"] == ["GPU-metered"] and cell["avg_power_w"] == pytest.approx(_MeteredNvml.WATTS, rel=0.01)


def test_capacity_mode_keeps_every_probe_as_a_cell_and_reuses_the_search(models: Path, tmp_path: Path) -> None:
    load = _small_load(concurrency=[1], num_requests=2, output_len=8, mode="capacity",
                       capacity={"slo": ["server"], "min_requests": 12, "waves": 1, "max_probes": 3,
                                 "max_concurrency": 4, "rate": True})
    v = _llama_variant(models, tmp_path)
    out = tmp_path / "raw"
    index = serve_load.run(ServeJob(load=load, out_dir=out, **v))
    (row,) = index["capacity"]
    assert row["capacity_verdict_rule"] == "point"  # unset, on CPU: the point rule (config.schema.default_verdict)
    probes = [c for c in index["cells"] if c.get("probe_of")]
    closed = [c for c in probes if c["probe_of"] == "concurrency"]
    rechecks = len(row["concurrency_recheck"].split("; ")) if row["concurrency_recheck"] else 0
    assert row["concurrency_probes"] <= 3 and len(closed) == row["concurrency_probes"] + rechecks
    assert len(probes) - len(closed) == row.get("rate_probes", 0)
    # The capacity is the highest pass of the search's first probes, or of the fixed cells that seeded its bracket;
    # a boundary re-check that disagrees marks it uncertain and does not move it.
    seeded = json.loads(row["concurrency_seeded"] or "{}")
    fixed = [c for c in index["cells"] if not c.get("probe_of")]
    known_pass, known_fail = bracket_from_cells(fixed_verdicts(fixed, SLO_PRESETS["server"], row["prompt_len"]))
    assert known_pass == 1 and seeded == {"pass": known_pass, **({"fail": known_fail} if known_fail else {})}
    passed = [c["concurrency"] for c in closed if c["probe_passed"] and not c.get("probe_recheck")]
    assert row["capacity_concurrency"] == max(passed + [seeded.get("pass", 0)])
    if row["concurrency_uncertain"]:
        assert "pass" in row["concurrency_recheck"] and "fail" in row["concurrency_recheck"]
    for c in probes:  # a probe is a cell: its files, its SLO, its verdict
        assert (out / f"{c['cell']}.json").is_file() and (out / f"{c['cell']}.jsonl").is_file()
        assert c["slo"] == "server" and c["status"] in ("ok", "degraded", "failed")
    opened = [c for c in probes if c["probe_of"] == "rate"]
    assert opened or not row["capacity_concurrency"]  # a closed capacity above 0 opens the rate search
    for c in opened:  # open loop: its concurrency is the peak the arrivals made, never its request count
        assert c["concurrency"] == c["peak_in_flight"] and c["request_rate"]
    # 12 requests arrive over longer than one lasts, so the two differ and the check above can fail
    assert not opened or min(c["peak_in_flight"] for c in opened) < 12, [c["peak_in_flight"] for c in opened]
    if row["capacity_concurrency"]:
        best = next(c for c in closed if c["concurrency"] == row["capacity_concurrency"])
        assert row["output_throughput_at_capacity"] == best["output_throughput"]
    again = serve_load.run(ServeJob(load=load, out_dir=out, **v))
    assert again["capacity"] == index["capacity"]  # kept: the search is not run again for the same settings
    assert [c["started_utc"] for c in again["cells"]] == [c["started_utc"] for c in index["cells"]]
