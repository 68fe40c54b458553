"""Stage: install llama-cpp-python's Python package onto the toolchain's own ``libllama``.

llama-server cannot score prompts (it ignores ``echo``), so GGUF variants are
scored through the pinned llama-cpp-python binding (bakeoff.quality.gguf_server)
on the very same GGUF file. The binding is installed from the same sdist whose
vendored tree the tools are built from, with its own C++ build switched off
(``-DLLAMA_BUILD=OFF``): at run time it loads the tools' ``lib/libllama.so``
through its supported override, ``LLAMA_CPP_LIB_PATH``. So llama.cpp is
compiled once per toolchain, and the scorer and llama-server run the same
binary code; the manifest records the library's path and sha256.

Two routes to the same files (bakeoff.engines.llamacpp_binding says why), and the manifest's
``binding_route`` says which: the tree's ``source.tar.gz``, or the carried wheel.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from bakeoff.config.schema import HardwareCfg, ToolchainCfg
from bakeoff.config.stageargs import StageArgs
from bakeoff.engines.llamacpp_binding import (
    BINDING_CMAKE_ARGS,
    ROUTE_SDIST,
    ROUTE_WHEEL,
    carried_binding,
    sdist_sha256,
)
from bakeoff.errors import ToolchainError
from bakeoff.layout import BINDING_CARRY_DIR, BINDING_SITE, LIBLLAMA, SOURCE_ARCHIVE, backend_tag, quality_site
from bakeoff.models.artifacts import staged_dir
from bakeoff.models.manifest import sha256_file, verify, write_manifest


def build(tc: ToolchainCfg, hw: HardwareCfg, source_dir: Path, toolchain_dir: Path, out_dir: Path,
          binding_dir: Path | None = None) -> None:
    """``pip install --no-deps --target`` the verified sdist's Python package into ``out_dir/site`` (or, where the
    tree has no sdist, the carried wheel from ``binding_dir``, default the quality site's; module docstring)."""
    src = verify(source_dir)
    if src.get("commit") != tc.commit or src.get("version") != tc.version:
        raise ToolchainError(f"{source_dir} holds {src.get('package')} {src.get('version')} (commit "
                             f"{src.get('commit')}), config pins {tc.version} ({tc.commit})")
    tools = verify(toolchain_dir)
    if tools.get("commit") != tc.commit:
        raise ToolchainError(f"{toolchain_dir} was built from commit {tools.get('commit')}, config pins {tc.commit}")
    lib = Path(toolchain_dir) / LIBLLAMA
    env = {**os.environ, "CMAKE_ARGS": " ".join(BINDING_CMAKE_ARGS), "FORCE_CMAKE": "1"}
    archive = Path(source_dir) / SOURCE_ARCHIVE
    route: dict = {"binding_route": ROUTE_SDIST, "sdist_sha256": sdist_sha256(src)}
    if archive.is_file():
        what = str(archive)
    else:
        wheel, prov = carried_binding(binding_dir or quality_site() / BINDING_CARRY_DIR, src, Path(source_dir))
        what = str(wheel)
        route = {"binding_route": ROUTE_WHEEL, "sdist_sha256": prov["sdist_sha256"], "binding_wheel": prov["wheel"],
                 "binding_wheel_sha256": prov["wheel_sha256"], "binding_wheel_built_utc": prov.get("built_utc")}
    with staged_dir(out_dir) as stage:
        cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-cache-dir", "--disable-pip-version-check",
               *(["--no-index"] if route["binding_route"] == ROUTE_WHEEL else []),
               "--target", str(stage / BINDING_SITE), what]
        print("$ CMAKE_ARGS=" + repr(env["CMAKE_ARGS"]) + " " + " ".join(cmd), file=sys.stderr, flush=True)
        proc = subprocess.run(cmd, env=env, stdout=sys.stderr, stderr=subprocess.STDOUT)
        if proc.returncode != 0:
            raise ToolchainError(f"installing {tc.package}=={tc.version} failed ({proc.returncode}); the log says why")
        check = subprocess.run(
            [sys.executable, "-c", "import llama_cpp, sys; sys.stdout.write(llama_cpp.__version__ + ' ' + "
             "llama_cpp.llama_cpp._lib._name)"],
            env={**os.environ, "PYTHONPATH": str(stage / BINDING_SITE), "LLAMA_CPP_LIB_PATH": str(lib.parent)},
            capture_output=True, text=True)
        if check.returncode != 0 or check.stdout.split(" ")[0] != tc.version:
            raise ToolchainError(f"the binding does not import as {tc.version} on {lib}: {check.stderr[-800:]}")
        loaded = check.stdout.split(" ", 1)[1].strip()
        if Path(loaded).resolve() != lib.resolve():
            raise ToolchainError(f"the binding loaded {loaded}, not the toolchain's {lib}")
        write_manifest(stage, kind="llamacpp-python-build", package=tc.package, version=tc.version,
                       commit=tc.commit, backend=backend_tag(hw), cmake_args=BINDING_CMAKE_ARGS,
                       lib_dir=os.path.relpath(lib.parent.resolve(), Path(out_dir).resolve()),
                       libllama_sha256=sha256_file(lib), toolchain_cache_key=tools.get("cache_key"), **route)


def run_stage(a: StageArgs) -> None:
    """``bakeoff stage build-llamacpp-python``: the binding built against the toolchain's source."""
    build(a.spec_as(ToolchainCfg), a.hardware_cfg(), a.dir("input"), a.dir("toolchain"), a.out_dir)
