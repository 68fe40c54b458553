"""The doctor refuses a driver older than the CUDA toolkit of the build environment, before any build.

The V100 facts are the hand-written fixture (tests/fixtures/hardware/README.md) with the driver set here to
the seed's 535.104.05; the H200 facts were recorded on an H200 node (driver 580.159.04).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml

from bakeoff.composition.compose import load_config
from bakeoff.hardware import driver
from bakeoff.hardware.doctor import DoctorError, analyze

from conftest import ROOT, planned_jobs, snakemake

FIX = Path(__file__).parent / "fixtures" / "hardware"
SEED_DRIVER = "535.104.05"


def _facts(name: str, driver_version: str | None = None) -> dict:
    facts = json.loads((FIX / f"{name}.json").read_text())
    if driver_version:
        facts = copy.deepcopy(facts)
        facts["driver_version"] = driver_version
    return facts


def test_the_table_has_its_source_and_every_cuda_env_is_in_it() -> None:
    data = driver.load_table()
    assert data["source"].startswith("https://docs.nvidia.com/cuda/")
    table = data["minimum_driver"]
    assert all(isinstance(v, str) for v in table.values())  # 570.26 must not become a float
    assert table["12.4.1"] == "550.54.15" and table["12.2.2"] == SEED_DRIVER
    cuda_envs = [p for p in (ROOT / "envs").glob("*.yaml") if driver.toolkit_of_env(p)]
    assert {p.name for p in cuda_envs} >= {"llamacpp-cuda.yaml", "llamacpp-cuda-v100x2.yaml"}
    assert all(driver.toolkit_of_env(p) in table for p in cuda_envs)


def test_version_order_is_numeric() -> None:
    assert driver.version_key("535.104.05") > driver.version_key("535.54.03")
    assert driver.version_key("570.26") < driver.version_key("570.124.06")
    assert driver.newest_toolkit_for(SEED_DRIVER, driver.load_table()["minimum_driver"]) == "12.2.2"


def test_seed_driver_with_the_cuda_12_4_env_is_refused_naming_both_versions_and_the_fixes() -> None:
    cfg = load_config(["experiment=blog_v100", "hardware.llamacpp_env=llamacpp-cuda.yaml"])
    with pytest.raises(DoctorError) as e:
        analyze(_facts("v100x2.handwritten", SEED_DRIVER), cfg.hardware, cfg.doctor)
    msg = str(e.value)
    assert "535.104.05" in msg and "550.54.15" in msg and "CUDA 12.4.1" in msg and "envs/llamacpp-cuda.yaml" in msg
    assert "CUDA <= 12.2.2" in msg and "install driver >= 550.54.15" in msg


def test_v100x2_uses_the_cuda_12_2_env_that_fits_the_seed_driver() -> None:
    cfg = load_config(["experiment=blog_v100"])
    assert cfg.hardware.toolchain_env == "llamacpp-cuda-v100x2.yaml"
    env = yaml.safe_load((ROOT / "envs" / cfg.hardware.toolchain_env).read_text())
    assert any(str(d).startswith("cuda-nvcc=12.2") for d in env["dependencies"])
    rep = analyze(_facts("v100x2.handwritten", SEED_DRIVER), cfg.hardware, cfg.doctor)
    assert rep["driver_check"]["ok"] is True and rep["driver_check"]["cuda_toolkit"] == "12.2.2"
    assert rep["driver_check"]["min_driver"] == SEED_DRIVER


def test_h200_recording_passes_and_cpu_is_not_checked() -> None:
    cfg = load_config(["experiment=h200_llamacpp"])
    rep = analyze(_facts("h200"), cfg.hardware, cfg.doctor)
    assert rep["driver_check"]["ok"] is True and rep["driver_check"]["driver"].startswith("580.")
    cpu = load_config([])
    assert analyze({"nvml": "unavailable", "gpus": []}, cpu.hardware, cpu.doctor)["driver_check"] is None


def test_an_env_missing_from_the_table_is_a_warning_that_says_what_to_add(tmp_path: Path) -> None:
    (tmp_path / "x.yaml").write_text("channels: [nvidia/label/cuda-99.1.0]\ndependencies: []\n")
    rec = driver.check("580.1", "x.yaml", envs_dir=tmp_path)
    assert rec["ok"] is None and "99.1.0" in rec["message"] and "add its minimum driver" in rec["message"]
    assert "does not exist" in driver.check("580.1", "missing.yaml", envs_dir=tmp_path)["message"]


@pytest.mark.parametrize("target,config", [("0c1e57098-cuda70", ["--config", "experiment=blog_v100"]),
                                           ("0c1e57098-cpu", [])])
def test_a_build_waits_for_the_doctor(target: str, config: list[str]) -> None:
    """CUDA: the driver check comes first; CPU: the doctor's bandwidth probe never shares the cores with a compile."""
    out = snakemake("-n", "--forceall", "--cores", "1", f"build/llamacpp/{target}/manifest.json", *config).stdout
    jobs = dict(planned_jobs(out))
    assert "results/hardware.json" in jobs["build_llamacpp"]["input"]
