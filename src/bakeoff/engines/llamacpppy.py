"""GGUF scoring through the pinned llama-cpp-python binding (bakeoff.quality.gguf_server).

The evaluation route for GGUF files: llama-server cannot score prompts, and
llama-cpp-python's own ``llama_cpp.server`` returns misaligned prompt
logprobs (see bakeoff.quality.gguf_server), so bakeoff serves the same GGUF
file through a small scoring server on the same binding. The binding is the
install in ``build/llamacpp-python/<toolchain>/``, put on the server's
PYTHONPATH, and it loads the tools' own ``libllama`` (``LLAMA_CPP_LIB_PATH``):
the same binary code llama-server runs.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from bakeoff.engines.base import Engine, register
from bakeoff.engines.toolchain import library_dir
from bakeoff.errors import BakeoffError
from bakeoff.layout import BINDING_SITE, GGUF_NAME
from bakeoff.models.manifest import read_manifest


def _value(v: Any) -> str:
    return str(v) if not isinstance(v, bool) else ("True" if v else "False")


@register
class LlamaCppPythonEngine(Engine):
    name = "llamacpppy"
    serves = "gguf"
    health_path = "/v1/models"
    context_setting = "n_ctx"
    toolchain = "llamacpp-python"

    def command(self) -> list[str]:
        if self.spec.toolchain_dir is None:
            raise BakeoffError("the llamacpppy engine needs the built binding (build/llamacpp-python/<toolchain>)")
        e = self.spec.engine
        cmd = [sys.executable, "-m", "bakeoff.quality.gguf_server", "--model", str(self.spec.model_dir / GGUF_NAME),
               "--model_alias", self.spec.served_name, "--host", self.host, "--port", str(self.port)]
        # Flags are the settings' names as written (n_ctx, n_threads, n_batch), as llama_cpp.server spells them.
        for key, value in e.settings.items():
            if value is not None:
                cmd += [f"--{key}", _value(value)]
        if self.spec.hardware.backend == "cuda" and e.settings.get("n_gpu_layers") is None:
            cmd += ["--n_gpu_layers", "-1"]  # score on the GPU the load cells used, every layer offloaded
        if e.api_key:
            raise BakeoffError("the GGUF scoring server binds loopback only and takes no api_key")
        return cmd + list(e.extra_args)

    def env(self) -> dict[str, str]:
        env = super().env()
        site = str((self.spec.toolchain_dir or "") and self.spec.toolchain_dir / BINDING_SITE)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (site, env.get("PYTHONPATH", "")) if p)
        if self.spec.toolchain_dir is not None:
            env["LLAMA_CPP_LIB_PATH"] = str(library_dir(self.spec.toolchain_dir))
        return env

    def versions(self) -> dict[str, str]:
        m = read_manifest(self.spec.toolchain_dir) if self.spec.toolchain_dir else {}
        return {"engine": "llamacpppy", "engine_version": f"llama-cpp-python {m.get('version', '?')}",
                "llamacpp_commit": m.get("commit", "?"), "libllama_sha256": m.get("libllama_sha256", "?")}

    def capabilities(self) -> dict[str, Any]:
        return {"serves": self.serves, "prompt_logprobs": True, "generation": False}
