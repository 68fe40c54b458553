"""Stage: build llama-cpp-python from the pinned sdist, for evaluating GGUF files.

llama-server cannot score prompts (it ignores ``echo``), so GGUF variants are
evaluated through llama-cpp-python's OpenAI-compatible server on the very same
GGUF file. The binding is built from the same sdist whose vendored tree the
C++ tools come from, so both read the GGUF identically. It is installed with
``pip --target`` into a cached artifact, not into the environment: pip's
default build uses host-native CPU flags, which crash here (SIGILL, AMX
advertised by cpuid but not enabled by the kernel), so the same ISA flags as the
tools' build are passed through ``CMAKE_ARGS``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from bakeoff.artifacts import staged_dir
from bakeoff.errors import ToolchainError
from bakeoff.manifest import verify, write_manifest
from bakeoff.schema import HardwareCfg, ToolchainCfg
from bakeoff.stages.build_llamacpp import backend_tag, cmake_args
from bakeoff.stages.fetch_llamacpp import ARCHIVE

SITE = "site"
# The tools' flags that do not apply to the binding (it builds shared libraries, no tools or web UI).
_TOOL_ONLY = ("-DBUILD_SHARED_LIBS", "-DLLAMA_BUILD_TOOLS", "-DLLAMA_BUILD_SERVER", "-DLLAMA_BUILD_EXAMPLES",
              "-DLLAMA_BUILD_TESTS", "-DLLAMA_BUILD_UI")


def binding_cmake_args(tc: ToolchainCfg, hw: HardwareCfg) -> list[str]:
    args = [a for a in cmake_args(tc, hw) if not a.startswith(_TOOL_ONLY)]
    return [*args, "-DLLAVA_BUILD=OFF", "-DLLAMA_BUILD_SERVER=OFF"]


def build(tc: ToolchainCfg, hw: HardwareCfg, source_dir: Path, out_dir: Path, jobs: int | None = None) -> None:
    """``pip install --no-deps --target`` the verified sdist into ``out_dir/site``."""
    src = verify(source_dir)
    if src.get("commit") != tc.commit or src.get("version") != tc.version:
        raise ToolchainError(f"{source_dir} holds {src.get('package')} {src.get('version')} (commit "
                             f"{src.get('commit')}), config pins {tc.version} ({tc.commit})")
    args = binding_cmake_args(tc, hw)
    env = {**os.environ, "CMAKE_ARGS": " ".join(args), "CMAKE_BUILD_PARALLEL_LEVEL": str(jobs or os.cpu_count() or 1),
           "FORCE_CMAKE": "1"}
    with staged_dir(out_dir) as stage:
        cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-cache-dir", "--disable-pip-version-check",
               "--target", str(stage / SITE), str(source_dir / ARCHIVE)]
        print("$ CMAKE_ARGS=" + repr(env["CMAKE_ARGS"]) + " " + " ".join(cmd), file=sys.stderr, flush=True)
        proc = subprocess.run(cmd, env=env, stdout=sys.stderr, stderr=subprocess.STDOUT)
        if proc.returncode != 0:
            raise ToolchainError(f"building {tc.package}=={tc.version} failed ({proc.returncode}); the log says why")
        check = subprocess.run([sys.executable, "-c", "import llama_cpp, sys; sys.stdout.write(llama_cpp.__version__)"],
                               env={**os.environ, "PYTHONPATH": str(stage / SITE)}, capture_output=True, text=True)
        if check.returncode != 0 or check.stdout.strip() != tc.version:
            raise ToolchainError(f"the built binding does not import as {tc.version}: {check.stderr[-800:]}")
        write_manifest(stage, kind="llamacpp-python-build", package=tc.package, version=tc.version,
                       commit=tc.commit, backend=backend_tag(hw), cmake_args=args)
