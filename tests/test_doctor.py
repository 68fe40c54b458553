"""The hardware doctor: on this CPU machine for real, and on NVML facts (recorded on an H200; hand-written V100, A100).

tests/fixtures/hardware/h200.json was recorded on an H200 node (``python -m bakeoff.hardware.doctor``). The V100
and A100 files are hand-written (``*.handwritten.json``; tests/fixtures/hardware/README.md says where each
value comes from): the same fields, shaped as NVML reports them for those parts.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from bakeoff.composition.compose import load_config
from bakeoff.config.schema import DoctorCfg
from bakeoff.engines.support import predict, variants_of
from bakeoff.hardware.doctor import DoctorError, analyze, capabilities, run

from conftest import ROOT, Pipeline, bakeoff

FIX = Path(__file__).parent / "fixtures" / "hardware"


def _facts(name: str) -> dict:
    return json.loads((FIX / f"{name}.json").read_text())


def _report(name: str, hardware: str, experiment: str = "blog_v100", *extra: str) -> tuple[dict, dict]:
    cfg = load_config([f"experiment={experiment}", f"hardware={hardware}", *extra])
    rep = analyze(_facts(name), cfg.hardware, cfg.doctor)
    return rep, predict(rep, variants_of(cfg))


def test_capability_rules_by_compute_capability() -> None:
    assert capabilities(7.0) == {"native_fp8": False, "bf16": False, "vllm_fp8_marlin": False, "any_fp8": False}
    # vLLM gates its FP8 configs (Marlin weight-only included) at 8.0: a T4 (7.5) has no FP8 path
    assert capabilities(7.5) == {"native_fp8": False, "bf16": False, "vllm_fp8_marlin": False, "any_fp8": False}
    assert capabilities(8.0) == {"native_fp8": False, "bf16": True, "vllm_fp8_marlin": True, "any_fp8": True}
    assert capabilities(8.9)["native_fp8"] and capabilities(9.0)["native_fp8"]
    assert capabilities(None, ["avx512_bf16"])["bf16"] and not capabilities(None, ["avx2"])["bf16"]


def test_v100_node_expects_the_seeds_fp8_cell_unsupported() -> None:
    rep, pred = _report("v100x2.handwritten", "v100x2")
    assert rep["compute_capability"] == 7.0 and rep["capabilities"]["any_fp8"] is False
    assert pred["vllm-fp8"]["expected"] == "unsupported" and "7.0" in pred["vllm-fp8"]["reason"]
    assert pred["vllm-fp16"]["expected"] == "supported" and pred["llamacpp-q4_k_m"]["expected"] == "supported"
    # the NVLink bridge: two links between the pair, as nvidia-smi topo -m prints it
    assert rep["topology"] == {"labels": ["GPU0", "GPU1"], "matrix": [["X", "NV2"], ["NV2", "X"]], "interconnect": "nvlink"}
    assert rep["warnings"] == []


def test_a100_node_uses_marlin_and_reports_pcie() -> None:
    cfg = load_config(["experiment=blog_v100", "hardware=auto"], facts=_facts("a100x2.handwritten"))
    rep = analyze(_facts("a100x2.handwritten"), cfg.hardware, cfg.doctor)
    pred = predict(rep, variants_of(cfg))
    assert rep["capabilities"] == {"native_fp8": False, "bf16": True, "vllm_fp8_marlin": True, "any_fp8": True}
    assert pred["vllm-fp8"]["expected"] == "supported" and "Marlin" in pred["vllm-fp8"]["reason"]
    assert rep["topology"]["matrix"] == [["X", "PXB"], ["PXB", "X"]] and rep["topology"]["interconnect"] == "pcie"
    assert rep["warnings"] == []  # the composed config says pcie, as the node is linked


def test_a_config_naming_another_gpu_stops_the_doctor_naming_both_and_the_fix() -> None:
    """The H100 records ran hardware=h200 on an H100; the doctor's own findings (data, as NVML gave them) said so."""
    h100 = json.loads((ROOT / "runs/h100-seed-2026-12-06/hardware.json").read_text())
    cfg = load_config(["experiment=h200_seed"])  # its hardware: h200
    with pytest.raises(DoctorError) as err:
        analyze(h100, cfg.hardware, cfg.doctor)
    text = str(err.value)
    assert "hardware=h200 (1 x NVIDIA H200, 140.4 GiB" in text and "1 x NVIDIA H100 80GB HBM3 (79.6 GiB" in text
    assert "gpu_model 'NVIDIA H200'" in text and "gpu_memory_gib 140.4" in text and "hardware=auto" in text
    # the seed's V100 config on an A100 pair: name, memory and compute capability all differ
    v100 = load_config(["experiment=blog_v100"])
    with pytest.raises(DoctorError, match=r"Tesla V100.*gpu_memory_gib 32 .*40 GiB.*cuda_arch 70 is not the node's 80"):
        analyze(_facts("a100x2.handwritten"), v100.hardware, v100.doctor)
    # the matching config passes without a word about the GPU
    rep = analyze(h100, load_config(["experiment=h200_seed", "hardware=h100"]).hardware, cfg.doctor)
    assert not any("H100" in w or "H200" in w for w in rep["warnings"])


def test_hardware_auto_picks_the_config_of_the_nodes_gpus_or_composes_one() -> None:
    h100 = json.loads((ROOT / "runs/h100-seed-2026-12-06/hardware.json").read_text())
    h200 = _facts("h200")
    assert load_config(["experiment=h200_seed", "hardware=auto"], facts=h100).hardware.name == "h100"
    assert load_config(["experiment=h200_seed", "hardware=auto"], facts=h200).hardware.name == "h200"
    two = copy.deepcopy(h200)
    two["gpus"].append({**copy.deepcopy(h200["gpus"][0]), "index": 1, "uuid": "GPU-other", "bus_id": "00000000:00:07.0"})
    two["pcie_topology"] = [[0, 50], [50, 0]]
    assert load_config(["experiment=h200_seed", "hardware=auto"], facts=two).hardware.name == "h200x2"  # all its GPUs
    assert load_config(["experiment=smoke", "hardware=auto"], facts={"nvml": "unavailable", "gpus": []}).hardware.name == "cpu"
    # no config names an A100: one is composed from the findings, and a hardware.<key> beside auto still wins
    hw = load_config(["experiment=blog_v100", "hardware=auto", "hardware.vllm_tensor_parallel_size=1"],
                     facts=_facts("a100x2.handwritten")).hardware
    assert (hw.name, hw.gpus, hw.gpu_model, hw.gpu_memory_gib, hw.cuda_arch, hw.interconnect) == (
        "auto-nvidia-a100-pcie-40gb-x2", 2, "NVIDIA A100-PCIE-40GB", 40.0, 80, "pcie")
    assert hw.vllm_tensor_parallel_size == 1 and hw.mem_bandwidth_gbs is None  # the doctor measures it on the node
    # a GPU the config picked for it passes the doctor's check
    analyze(_facts("a100x2.handwritten"), hw, DoctorCfg())


def test_h200_recording_native_fp8() -> None:
    facts = _facts("h200")
    assert facts["gpus"][0]["name"] == "NVIDIA H200" and facts["driver_version"].startswith("580.")
    rep, pred = _report("h200", "h200", "smoke")
    assert rep["capabilities"]["native_fp8"] and pred["vllm-fp8"]["reason"].startswith("native FP8")
    assert rep["topology"]["interconnect"] is None and rep["warnings"] == []


def test_uncorrectable_ecc_since_boot_stops_unless_overridden(tmp_path: Path) -> None:
    facts = _facts("v100x2.handwritten")
    bad = copy.deepcopy(facts)
    bad["gpus"][1]["ecc"]["volatile"]["uncorrected"] = bad["gpus"][1]["ecc"]["aggregate"]["uncorrected"] = 2
    cfg = load_config(["experiment=blog_v100"])
    with pytest.raises(DoctorError, match=r"uncorrectable ECC errors since boot .*GPU1.*doctor.allow_uncorrected_ecc=true"):
        run(cfg.hardware, cfg.doctor, tmp_path / "hw.json", facts=bad)
    assert not (tmp_path / "hw.json").exists()  # nothing half-written
    rep = run(cfg.hardware, DoctorCfg(allow_uncorrected_ecc=True), tmp_path / "hw.json", facts=bad)
    assert rep["ecc_uncorrected"] and "allowed" in rep["warnings"][0]
    # corrected errors alone (GPU1 has 3) are recorded, not fatal
    assert run(cfg.hardware, cfg.doctor, tmp_path / "ok.json", facts=facts)["ecc_uncorrected"] == {}


def test_too_few_gpus_is_a_clear_error() -> None:
    cfg = load_config(["experiment=blog_v100"])  # 2 GPUs
    with pytest.raises(DoctorError, match=r"needs 2 GPU\(s\); NVML found 1"):
        analyze(_facts("h200"), cfg.hardware, cfg.doctor)
    with pytest.raises(DoctorError, match="NVML found 0"):
        analyze({"nvml": "unavailable: no driver", "gpus": []}, cfg.hardware, cfg.doctor)


def test_doctor_on_this_machine_without_gpus(tmp_path: Path) -> None:
    out = tmp_path / "hardware.json"
    p = bakeoff("doctor", "--out", str(out))
    assert p.returncode == 0, p.stderr
    rep = json.loads(out.read_text())
    assert rep["gpus"] == [] and rep["nvml"].startswith("unavailable")
    assert rep["cpu"]["model"] and "sse2" in rep["cpu"]["flags"] and rep["cpu"]["logical_cores"] >= 1
    assert rep["cpu"]["mem_bandwidth_gbs"] > 0.5
    assert rep["capabilities"]["any_fp8"] is False
    assert "vllm-fp8: unsupported" in p.stdout and "llamacpp-q4_k_m: supported" in p.stdout


@pytest.mark.slow
def test_pipeline_runs_the_doctor_first_and_the_summary_shows_its_predictions(pipeline: Pipeline) -> None:
    rep = json.loads(pipeline.hardware_path.read_text())
    assert rep["hardware_config"]["name"] == "cpu" and rep["cpu"]["mem_bandwidth_gbs"] > 0
    assert all((pipeline.raw / v / "cells.json").stat().st_mtime >= pipeline.hardware_path.stat().st_mtime
               for v in ("vllm-fp16", "llamacpp-q4_k_m"))
    rows = pipeline.rows()
    fp8 = [r for r in rows if r["format"] == "fp8"]
    assert fp8 and all(r["predicted_status"] == "unsupported" and r["status"] == "unsupported" for r in fp8)
    ok = [r for r in rows if r["format"] == "q4_k_m"]
    assert ok and all(r["predicted_status"] == "supported" for r in ok)
    assert {r["bandwidth_source"] for r in rows} == {"measured"}
    bw = [float(r["mem_bandwidth_gbs"]) for r in rows if r["mem_bandwidth_gbs"]]
    assert bw and all(abs(b - rep["cpu"]["mem_bandwidth_gbs"]) < 1e-3 * b for b in bw)


def test_every_serving_job_depends_on_the_doctor() -> None:
    from conftest import planned_jobs, snakemake

    out = snakemake("-n", "--forceall", "--cores", "1", "results/raw/smoke/smollm2-135m/llamacpp-q4_k_m/cells.json").stdout
    assert [f["output"] for rule, f in planned_jobs(out) if rule == "doctor"] == ["results/hardware.json"]
