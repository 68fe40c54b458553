"""ECC the seed's way: volatile errors stop, history warns and triggers the single-card check, growth stops.

Facts are NVML-shaped: tests/fixtures/hardware/v100x2.handwritten.json (**hand-written**, see that folder's
README), copied here with the counts each test sets. The llama-bench speeds below are **hand-written** inputs
of the verdict logic, not measurements; the stage test runs a stand-in ``llama-bench`` (a script that prints
llama-bench's ``-o json`` shape) because the real check needs a GPU node.
"""

from __future__ import annotations

import copy
import json
import re
import sys
import textwrap
from pathlib import Path

import pytest

from bakeoff.composition.compose import load_config
from bakeoff.hardware.doctor import DoctorError, analyze, recheck
from bakeoff.hardware.ecc import growth, judge, plan_single_gpu_bench
from bakeoff.stages import gpu_check

from conftest import ROOT, planned_jobs, results_root, snakemake

FIX = Path(__file__).parent / "fixtures" / "hardware"
H200_RECORD = ROOT / "runs/h200-llamacpp-matrix-2026-12-04/hardware.json"  # the doctor's record on an H200 node


def _v100(gpu1_volatile: int = 0, gpu1_aggregate: int = 0) -> dict:
    facts = copy.deepcopy(json.loads((FIX / "v100x2.handwritten.json").read_text()))
    facts["driver_version"] = "535.104.05"  # the seed's
    ecc = facts["gpus"][1]["ecc"]
    ecc["volatile"]["uncorrected"], ecc["aggregate"]["uncorrected"] = gpu1_volatile, gpu1_aggregate
    return facts


def _seed_cfg():
    return load_config(["experiment=blog_v100"])


def test_the_seeds_node_one_historical_error_is_a_warning_not_a_stop() -> None:
    cfg = _seed_cfg()
    rep = analyze(_v100(gpu1_aggregate=1), cfg.hardware, cfg.doctor)
    assert rep["ecc_uncorrected"] == {}
    assert list(rep["ecc_history"].values()) == [1] and "GPU1" in next(iter(rep["ecc_history"]))
    assert any("historical (aggregate)" in w and "gpu-check" in w for w in rep["warnings"])


def test_an_error_since_boot_stops_the_run() -> None:
    cfg = _seed_cfg()
    with pytest.raises(DoctorError, match=r"since boot \(volatile\) on .*GPU1"):
        analyze(_v100(gpu1_volatile=1, gpu1_aggregate=1), cfg.hardware, cfg.doctor)


def test_growth_between_the_checks_stops_the_run(tmp_path: Path) -> None:
    cfg = _seed_cfg()
    before = tmp_path / "hardware.json"
    before.write_text(json.dumps({**_v100(gpu1_aggregate=1), **analyze(_v100(gpu1_aggregate=1), cfg.hardware,
                                                                         cfg.doctor)}))
    same = recheck(before, tmp_path / "after.json", facts=_v100(gpu1_aggregate=1))
    assert same["checked"] and same["grew"] == []
    with pytest.raises(DoctorError, match=r"GPU1 .* aggregate uncorrectable ECC errors grew from 1 to 2"):
        recheck(before, tmp_path / "after.json", facts=_v100(gpu1_aggregate=2))
    gone = _v100(gpu1_aggregate=1)
    gone["gpus"] = gone["gpus"][:1]
    assert growth(_v100(gpu1_aggregate=1), gone) == [
        "GPU1 (Tesla V100-PCIE-32GB, 00000000:83:00.0) is no longer visible to NVML"]
    # corrected errors growing (GPU1 has 3) are not a stop
    more_corrected = _v100(gpu1_aggregate=1)
    more_corrected["gpus"][1]["ecc"]["aggregate"]["corrected"] = 50
    assert growth(_v100(gpu1_aggregate=1), more_corrected) == []


def test_recheck_on_a_cpu_record_checks_nothing(tmp_path: Path) -> None:
    before = tmp_path / "hardware.json"
    before.write_text(json.dumps({"gpus": []}))
    assert recheck(before, tmp_path / "after.json")["checked"] is False


def test_each_gpu_is_benchmarked_alone() -> None:
    plan = plan_single_gpu_bench(_v100(gpu1_aggregate=1), "/tc/bin/llama-bench", "/m/model.gguf")
    assert [p["env"]["CUDA_VISIBLE_DEVICES"] for p in plan] == ["GPU-v100-0", "GPU-v100-1"]
    for p in plan:
        cmd = p["command"]
        assert cmd[:3] == ["/tc/bin/llama-bench", "-m", "/m/model.gguf"]
        assert cmd[cmd.index("-ngl") + 1] == "99" and cmd[cmd.index("-o") + 1] == "json"
        assert "-sm" not in cmd and "-ts" not in cmd  # one card: no split


def _card(gpu: str, tg: float | None, rc: int = 0, name: str = "Tesla V100-PCIE-32GB") -> dict:
    return {"gpu": gpu, "name": name, "returncode": rc, "tg_tok_s": tg}


def test_verdicts_against_the_twin() -> None:
    """Hand-written speeds (not measured): equal within 10 % is ok; slower or failing is flagged."""
    assert [v["verdict"] for v in judge([_card("GPU0", 100.0), _card("GPU1", 95.0)])] == ["ok", "ok"]
    slow = judge([_card("GPU0", 100.0), _card("GPU1", 80.0)])
    assert [v["verdict"] for v in slow] == ["ok", "slower"] and slow[1]["ratio_to_twin"] == pytest.approx(0.8)
    assert [v["verdict"] for v in judge([_card("GPU0", 100.0), _card("GPU1", None, rc=1)])] == ["no twin", "failed"]
    assert judge([_card("GPU0", 100.0), _card("GPU1", 50.0, name="NVIDIA A100")])[1]["verdict"] == "no twin"


STANDIN_BENCH = textwrap.dedent('''\
    #!{python}
    """llama-bench stand-in (tests/test_ecc.py): prints -o json records; GPU-v100-1 decodes at 70 % of GPU-v100-0."""
    import json, os, sys
    with open(os.environ["STANDIN_LOG"], "a") as f:
        f.write(json.dumps({{"argv": sys.argv[1:], "visible": os.environ.get("CUDA_VISIBLE_DEVICES")}}) + "\\n")
    tg = 100.0 if os.environ["CUDA_VISIBLE_DEVICES"] == "GPU-v100-0" else 70.0
    rec = dict(model_size=1, model_n_params=1, flash_attn=False, stddev_ts=0.5)
    print(json.dumps([dict(rec, n_prompt=128, n_gen=0, avg_ts=1000.0), dict(rec, n_prompt=0, n_gen=64, avg_ts=tg)]))
''')


def test_the_stage_runs_llama_bench_per_card_and_stops_on_a_slow_one(tmp_path: Path, monkeypatch) -> None:
    tc, model = tmp_path / "toolchain", tmp_path / "model"
    (tc / "bin").mkdir(parents=True)
    model.mkdir()
    (tc / "manifest.json").write_text('{"kind": "toolchain"}')
    bench = tc / "bin" / "llama-bench"
    bench.write_text(STANDIN_BENCH.format(python=sys.executable))
    bench.chmod(0o755)
    monkeypatch.setenv("STANDIN_LOG", str(tmp_path / "calls.jsonl"))
    cfg = _seed_cfg()
    record = tmp_path / "hardware.json"

    record.write_text(json.dumps(analyze(_v100(), cfg.hardware, cfg.doctor)))  # no history: nothing runs
    assert gpu_check.run(record=record, model_dir=model, toolchain_dir=tc, out=tmp_path / "c.json")["needed"] is False
    assert not (tmp_path / "calls.jsonl").exists()

    record.write_text(json.dumps({**_v100(gpu1_aggregate=1), **analyze(_v100(gpu1_aggregate=1), cfg.hardware,
                                                                         cfg.doctor)}))
    with pytest.raises(DoctorError, match=r"GPU1 .*: slower \(tg 70.0 tok/s vs twin 100.0"):
        gpu_check.run(record=record, model_dir=model, toolchain_dir=tc, out=tmp_path / "c.json")
    calls = [json.loads(ln) for ln in (tmp_path / "calls.jsonl").read_text().splitlines()]
    assert [c["visible"] for c in calls] == ["GPU-v100-0", "GPU-v100-1"]
    rep = gpu_check.run(record=record, model_dir=model, toolchain_dir=tc, out=tmp_path / "c.json", allow=True)
    assert [c["verdict"] for c in rep["cards"]] == ["ok", "slower"]
    with pytest.raises(DoctorError, match=r"needs a GGUF \(--input\).*given neither"):
        gpu_check.run(record=record, model_dir=None, toolchain_dir=None, out=tmp_path / "c.json")


def _node_plan(tmp_path: Path, record: dict) -> dict[str, dict[str, str]]:
    """gpu_check's and the f16 serve_load's planned fields in a dry run of `snakemake node` (H200 config) with
    ``record`` as the doctor's finished record."""
    root = results_root(tmp_path / "work")
    (root / "results").mkdir()
    (root / "results/hardware.json").write_text(json.dumps(record))
    out = snakemake("-n", "--cores", "16", "node", "--config", "experiment=h200_llamacpp", cwd=root).stdout
    jobs = planned_jobs(out)
    assert "doctor" not in [rule for rule, _ in jobs]  # its record is there: the checkpoint is resolved
    check = [f for rule, f in jobs if rule == "gpu_check"]
    # the schedule's first server: the only serving job that waits for no other (bakeoff.loadgen.blocks)
    serve = [f for rule, f in jobs if rule in ("serve_load", "serve_block") and "results/raw/" not in f["input"]]
    assert len(check) == len(serve) == 1, jobs
    return {"gpu_check": check[0], "serve_first": serve[0]}


def test_on_a_clean_card_no_server_waits_for_the_check_s_gguf(tmp_path: Path) -> None:
    """The doctor's record decides the check's inputs (a checkpoint): an H200 node's real record has no ECC
    history, so the check needs no GGUF and no build, takes one core and runs beside the build; the schedule's
    first server then waits for no other format's quantization. The same record with one lifetime uncorrectable error on the card
    (set here) brings back the smallest GGUF, the tools and every core."""
    facts = json.loads(H200_RECORD.read_text())
    assert facts["ecc_history"] == {}
    clean = _node_plan(tmp_path / "clean", facts)
    assert clean["gpu_check"]["input"] == "results/hardware.json"
    assert clean["gpu_check"].get("threads", "1") == "1"  # a dry run prints no "threads: 1"
    first = clean["serve_first"]
    served = re.search(r"models/llama2-7b-synthetic/(\w+)/manifest.json", first["input"]).group(1)
    others = {"f16", "q8_0", "q4_k_m"} - {served}
    assert not [f for f in others if f"/{f}/manifest.json" in first["input"]], first["input"]

    facts["gpus"][0]["ecc"]["aggregate"]["uncorrected"] = 1
    cfg = load_config(["experiment=h200_llamacpp"])
    scarred = _node_plan(tmp_path / "scarred", {**facts, **analyze(facts, cfg.hardware, cfg.doctor)})
    check = scarred["gpu_check"]
    assert "models/llama2-7b-synthetic/q4_k_m/manifest.json" in check["input"]
    assert "build/llamacpp/0c1e57098-cuda90/manifest.json" in check["input"] and check["threads"] == "16"


def test_the_dag_checks_before_the_first_server_and_after_the_last() -> None:
    out = snakemake("-n", "--forceall", "--cores", "1", "--config", "experiment=blog_v100").stdout
    jobs = [ln.split()[1].rstrip(":") for ln in out.splitlines() if ln.startswith("rule ")]
    serves = [i for i, j in enumerate(jobs) if j == "serve_load"]
    assert serves and jobs.index("gpu_check") < min(serves) and jobs.index("ecc_recheck") > max(serves)
    smoke = snakemake("-n", "--forceall", "--cores", "1").stdout  # CPU: neither
    assert "rule gpu_check:" not in smoke and "rule ecc_recheck:" not in smoke
