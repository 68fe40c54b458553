"""Your own GPU box: a hardware config made from conf/hardware/_template.yaml runs the seed's experiment.

docs/your-gpu-box.md tells a user to copy the template, set its name, and run `experiment=blog_v100
hardware=<name>`. Here the copy goes to a folder of its own (Hydra's search path), never into conf/.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bakeoff.composition.compose import load_config
from bakeoff.errors import ConfigError

from conftest import ROOT, planned_jobs, snakemake

TEMPLATE = ROOT / "conf" / "hardware" / "_template.yaml"
ONE_GPU_VLLM = ["engines.vllm.settings.tensor_parallel_size=1", "engines.vllm_open.settings.tensor_parallel_size=1"]


def _box(tmp_path: Path, name: str, **fields: str) -> str:
    """The template with its name set (and any field replaced), as conf/hardware/<name>.yaml of a search path."""
    lines = []
    for line in TEMPLATE.read_text().splitlines():
        key = line.split(":", 1)[0]
        if key == "name":
            line = f"name: {name}"
        elif key in fields:
            line = f"{key}: {fields[key]}"
        lines.append(line)
    (tmp_path / "hardware").mkdir(parents=True, exist_ok=True)
    (tmp_path / "hardware" / f"{name}.yaml").write_text("\n".join(lines) + "\n")
    return f"hydra.searchpath=[file://{tmp_path}]"


def test_the_template_names_every_hardware_field() -> None:
    from bakeoff.config.schema import HardwareCfg

    keys = {line.split(":", 1)[0] for line in TEMPLATE.read_text().splitlines() if line and line[0].isalpha()}
    assert keys == set(HardwareCfg.model_fields), keys ^ set(HardwareCfg.model_fields)


def test_the_template_as_it_is_is_refused_until_named() -> None:
    with pytest.raises(ConfigError, match="hardware.name"):
        load_config(["hardware=_template"])


def test_a_box_from_the_template_plans_the_seed_experiment(tmp_path: Path) -> None:
    search = _box(tmp_path, "mybox")
    cfg = load_config(["experiment=blog_v100", "hardware=mybox", search, *ONE_GPU_VLLM])
    assert (cfg.hardware.name, cfg.hardware.backend, cfg.hardware.gpus, cfg.hardware.cuda_arch) == ("mybox", "cuda", 1, 80)
    assert cfg.hardware.vllm_image is None  # vLLM from pip, not a container
    # blog_v100 serves vLLM with tensor parallelism 2: one GPU is refused by name until it is set to 1
    with pytest.raises(ConfigError, match="tensor_parallel_size=2 exceeds hardware.gpus=1"):
        load_config(["experiment=blog_v100", "hardware=mybox", search])

    plan = snakemake("-n", "-p", "--forceall", "--cores", "1", "--config", "experiment=blog_v100", "hardware=mybox",
                     f"overrides={search} {' '.join(ONE_GPU_VLLM)}").stdout
    rules = {rule for rule, _ in planned_jobs(plan)}
    assert {"doctor", "build_llamacpp", "fetch_model", "quantize_fp8", "quantize_gguf", "serve_load"} <= rules
    assert "build/llamacpp/0c1e57098-cuda80/manifest.json" in plan  # the CUDA build for this box's cuda_arch


def test_a_two_gpu_box_from_the_template_runs_blog_v100_as_written(tmp_path: Path) -> None:
    search = _box(tmp_path, "mybox2", gpus="2", interconnect="nvlink", llamacpp_tensor_split="[1, 1]",
                  gres="gpu:a100:2")
    cfg = load_config(["experiment=blog_v100", "hardware=mybox2", search])
    assert cfg.hardware.tensor_parallel_size == 2 and cfg.hardware.slurm_gres == "gpu:a100:2"
