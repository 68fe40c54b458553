"""A skeleton engine plugin: SGLang's OpenAI-compatible server (docs/extending.md).

Name it in an engine config as ``plugin: "sglang_engine:SglangEngine"`` with this folder on PYTHONPATH, or copy it
to src/bakeoff/engines/sglang.py and import it in src/bakeoff/engines/__init__.py to make ``plugin: sglang`` a
built-in. Only ``command`` and ``versions`` are required; every other hook has a default in ``Engine``.
"""

from __future__ import annotations

import importlib.metadata
import sys

from bakeoff.engines.base import Engine, register
from bakeoff.engines.flags import settings_to_flags


@register
class SglangEngine(Engine):
    name = "sglang"
    serves = "hf"  # it serves HF checkpoints: fp16, fp8, ... (GGUF engines say "gguf")
    health_path = "/health"
    context_setting = "context_length"  # the setting that bounds one request's tokens
    # The server's own words for "this build or GPU cannot run this format": a start failure matching one is
    # `unsupported`, any other `failed`.
    unsupported_patterns = (r"not supported on this GPU",)

    def command(self) -> list[str]:
        e = self.spec.engine
        return [sys.executable, "-m", "sglang.launch_server", "--model-path", str(self.spec.model_dir.resolve()),
                "--served-model-name", self.spec.served_name, "--host", self.host, "--port", str(self.port),
                *settings_to_flags(e.settings), *e.extra_args]

    def versions(self) -> dict[str, str]:
        try:
            version = importlib.metadata.version("sglang")
        except importlib.metadata.PackageNotFoundError:
            version = "not installed"
        return {"engine": self.name, "engine_version": version}
