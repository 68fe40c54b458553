"""llama.cpp's ``llama-server`` from the pinned toolchain build."""

from __future__ import annotations

from typing import Any

from bakeoff.engines.base import Engine, register
from bakeoff.engines.flags import settings_to_flags
from bakeoff.engines.toolchain import toolchain_bin
from bakeoff.errors import BakeoffError
from bakeoff.gpu import llamacpp_flags
from bakeoff.layout import GGUF_NAME
from bakeoff.manifest import read_manifest


@register
class LlamaCppEngine(Engine):
    name = "llamacpp"
    serves = "gguf"
    health_path = "/health"

    def command(self) -> list[str]:
        if self.spec.toolchain_dir is None:
            raise BakeoffError("the llamacpp engine needs a built toolchain (build/llamacpp/<commit>-<backend>)")
        e = self.spec.engine
        cmd = [str(toolchain_bin(self.spec.toolchain_dir, "llama-server")), "-m", str(self.spec.model_dir / GGUF_NAME),
               "--host", self.host, "--port", str(self.port), "--alias", self.spec.served_name]
        cmd += settings_to_flags(e.settings)
        cmd += llamacpp_flags(self.spec.hardware, e.settings)
        if e.api_key:
            cmd += ["--api-key", e.api_key]
        return cmd + list(e.extra_args)

    def versions(self) -> dict[str, str]:
        m = read_manifest(self.spec.toolchain_dir) if self.spec.toolchain_dir else {}
        return {"engine": "llamacpp", "engine_version": f"llama.cpp@{m.get('commit', '?')}",
                "llamacpp_build": m.get("backend", "?")}

    def capabilities(self) -> dict[str, Any]:
        # llama-server ignores `echo` and returns logprobs only for generated tokens (checked by the canary).
        return {"serves": self.serves, "parallel_slots": self.spec.engine.settings.get("parallel"),
                "prompt_logprobs": False}
