"""Multi-GPU config logic: which devices a server gets, how llama.cpp and vLLM span them, what the schema refuses.

These build the real engine command lines and environments (nothing is started: there is no GPU here).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bakeoff.composition.compose import load_config
from bakeoff.engines import get_engine
from bakeoff.engines.base import ServerSpec
from bakeoff.errors import ConfigError
from bakeoff.hardware.gpu import MULTICAST_OFF, server_env, visible_devices
from bakeoff.results import roofline


def _spec(cfg, engine: str, tmp_path: Path) -> ServerSpec:
    """A spec whose toolchain directory has the layout the engine checks (the binary is never run here)."""
    (tmp_path / "bin").mkdir(exist_ok=True)
    (tmp_path / "bin" / "llama-server").touch()
    (tmp_path / "manifest.json").write_text('{"kind": "toolchain", "commit": "0c1e57098", "backend": "cuda90"}')
    return ServerSpec(engine=cfg.engines[engine], hardware=cfg.hardware, model_dir=tmp_path, served_name="m",
                      log_path=tmp_path / "server.log", toolchain_dir=tmp_path)


def _flag(cmd: list[str], name: str) -> str | None:
    return cmd[cmd.index(name) + 1] if name in cmd else None


def test_one_h200_offloads_every_layer_without_a_split(tmp_path: Path) -> None:
    cfg = load_config(["experiment=h200_llamacpp"])
    cmd = get_engine("llamacpp")(_spec(cfg, "llamacpp", tmp_path)).command()
    assert _flag(cmd, "--n-gpu-layers") == "999" and "--split-mode" not in cmd and "--tensor-split" not in cmd
    assert _flag(cmd, "--parallel") == "32" and _flag(cmd, "--ctx-size") == "49152"


@pytest.mark.parametrize("mode", ["layer", "row"])
def test_two_h200s_split_the_model_as_configured(tmp_path: Path, mode: str) -> None:
    cfg = load_config(["experiment=h200_llamacpp", "hardware=h200x2", f"hardware.llamacpp_split_mode={mode}",
                       "hardware.llamacpp_tensor_split=[3,1]"])
    cmd = get_engine("llamacpp")(_spec(cfg, "llamacpp", tmp_path)).command()
    assert _flag(cmd, "--split-mode") == mode and _flag(cmd, "--tensor-split") == "3,1"
    # the roofline: row split reads both GPUs' shards at once, layer split one GPU after the other
    bw = roofline.effective_bandwidth_gbs(cfg.hardware.model_dump(), "llamacpp", cfg.engines["llamacpp"].settings)
    assert bw == {"row": 8600.0, "layer": 4300.0}[mode]


def test_explicit_engine_settings_win_over_the_hardware_defaults() -> None:
    llamacpp_flags, vllm_flags = get_engine("llamacpp").hardware_flags, get_engine("vllm").hardware_flags
    hw = load_config(["experiment=blog_v100"]).hardware
    assert llamacpp_flags(hw, {"n_gpu_layers": 99, "split_mode": "row", "tensor_split": "1,1"}) == []
    assert vllm_flags(hw, {"tensor_parallel_size": 2}) == []
    assert vllm_flags(hw, {}) == ["--tensor-parallel-size", "2"]
    cpu = load_config([]).hardware
    assert llamacpp_flags(cpu, {}) == [] and vllm_flags(cpu, {}) == []


def test_seed_vllm_container_gets_exactly_its_gpus_and_multicast_off(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    cfg = load_config(["experiment=blog_v100"])
    cmd = get_engine("vllm")(_spec(cfg, "vllm", tmp_path)).command()
    assert cmd[:3] == ["docker", "run", "--rm"] and _flag(cmd, "--gpus") == '"device=0,1"'
    env_args = {cmd[i + 1] for i, a in enumerate(cmd) if a == "-e"}
    assert env_args == {f"{k}={v}" for k, v in MULTICAST_OFF.items()}
    assert cmd.count("--tensor-parallel-size") == 1 and _flag(cmd, "--tensor-parallel-size") == "2"


def test_visible_devices_come_from_config_then_scheduler_then_default(monkeypatch) -> None:
    hw = load_config(["hardware=h200x2", "experiment=h200_llamacpp"]).hardware
    assert visible_devices(hw, {}) == ["0", "1"]
    assert visible_devices(hw, {"CUDA_VISIBLE_DEVICES": "4,5,6"}) == ["4", "5"]  # SLURM's allocation
    with pytest.raises(ConfigError, match=r"needs 2 GPU\(s\) but CUDA_VISIBLE_DEVICES='3' allocates 1"):
        visible_devices(hw, {"CUDA_VISIBLE_DEVICES": "3"})
    pinned = load_config(["hardware=h200x2", "experiment=h200_llamacpp", "hardware.visible_devices=[2,3]"]).hardware
    assert visible_devices(pinned, {"CUDA_VISIBLE_DEVICES": "0,1"}) == ["2", "3"]
    env = server_env(pinned, {})
    assert env["CUDA_VISIBLE_DEVICES"] == "2,3" and all(env[k] == v for k, v in MULTICAST_OFF.items())


def test_every_server_gets_multicast_off_even_on_cpu(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "1")  # a user's environment cannot turn it back on
    cfg = load_config([])
    env = get_engine("llamacpp")(_spec(cfg, "llamacpp", tmp_path)).env()
    assert all(env[k] == v for k, v in MULTICAST_OFF.items()) and "CUDA_VISIBLE_DEVICES" not in server_env(cfg.hardware, {})


@pytest.mark.parametrize(("overrides", "message"), [
    (["hardware=h200x2", "hardware.llamacpp_tensor_split=[1,1,1]"], "one share per GPU"),
    (["hardware=h200x2", "hardware.visible_devices=[0,0]"], "2 distinct devices"),
    (["hardware=h200x2", "hardware.vllm_tensor_parallel_size=4"], "exceeds hardware.gpus 2"),
    (["hardware=h200x2", "hardware.gres=gpu:h200:1"], "different GPU count"),
    (["hardware=cpu", "+hardware.gres=gpu:1"], "cannot have hardware.gpus > 0 or GPU settings"),
    (["experiment=blog_v100", "hardware=h200"], "tensor_parallel_size=2 exceeds hardware.gpus=1"),
])
def test_impossible_multi_gpu_configs_are_refused_by_name(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(["experiment=h200_llamacpp", *overrides] if "experiment=blog_v100" not in overrides else overrides)


def test_llama_server_slots_split_the_context() -> None:
    """--parallel 32 with -c 8192 leaves 256 tokens a slot (255 usable): a 128+256 request cannot fit, so the
    config is refused; 32 x 1280 is refused too for 1024+256 (the slot's last position), 32 x 1536 is not."""
    with pytest.raises(ConfigError, match="per-request context of 255 tokens"):
        load_config(["experiment=h200_llamacpp", "engines.llamacpp.settings.ctx_size=8192"])
    with pytest.raises(ConfigError, match="per-request context of 1279 tokens"):
        load_config(["experiment=h200_llamacpp", "engines.llamacpp.settings.ctx_size=40960"])
    assert load_config(["experiment=h200_llamacpp"]).engines["llamacpp"].settings["ctx_size"] == 32 * 1536


def test_split_mode_sweep_on_two_gpus_plans_both_layouts() -> None:
    from conftest import snakemake, spec_texts

    out = snakemake("-n", "-p", "--cores", "1", "results/summary.csv", "--config", "experiment=h200_llamacpp",
                    "overrides=hardware=h200x2", "sweep=hardware.llamacpp_split_mode=layer,row").stdout
    specs = spec_texts(out)
    for mode in ("layer", "row"):
        for fmt in ("f16", "q8_0", "q4_k_m"):
            assert f"results/raw/h200_llamacpp.llamacpp_split_mode{mode}/llama2-7b-synthetic/llamacpp-{fmt}/cells.json" in out
        assert f'"llamacpp_split_mode": "{mode}"' in specs and '"gpus": 2' in specs


def test_gguf_scoring_server_offloads_on_gpu_nodes_only(tmp_path: Path) -> None:
    for overrides, expect in ((["experiment=blog_v100"], "-1"), ([], None)):
        cfg = load_config(overrides)
        spec = ServerSpec(engine=cfg.engines["llamacpp"].eval_server, hardware=cfg.hardware, model_dir=tmp_path,
                          served_name="m", log_path=tmp_path / "eval.log", toolchain_dir=tmp_path)
        assert _flag(get_engine("llamacpppy")(spec).command(), "--n_gpu_layers") == expect
