"""Stage: build the pinned llama.cpp tools (CPU here, CUDA on GPU hardware), once per toolchain key.

The build is shared: ``bin/`` holds the tools and ``lib/`` the shared libraries
they link (``libllama``, ``libggml*``; RPATH ``$ORIGIN/../lib``), and the GGUF
scoring server loads that same ``libllama`` through llama-cpp-python, so the
load tests and the quality scores run the same binary code. A finished build
is kept in the build cache outside the clone (bakeoff.engines.buildcache), keyed by
everything that changes it; a fresh clone reuses it. CPU code is compiled for the instruction
sets /proc/cpuinfo lists, never host-detected native flags (SIGILL on machines whose
cpuid advertises AMX the kernel does not enable). CUDA builds take their
``CMAKE_CUDA_ARCHITECTURES`` from the hardware config (70 V100, 90 H100/H200).
Nothing in the build may reach the network: the prebuilt web UI download and
OpenSSL are switched off.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from bakeoff.config.schema import HardwareCfg, ToolchainCfg
from bakeoff.config.stageargs import StageArgs
from bakeoff.engines.buildcache import cache_key, restore, store, tool_identity
from bakeoff.errors import ToolchainError
from bakeoff.hardware.cpuflags import cpu_model_name, ggml_cmake_flags, read_cpu_flags
from bakeoff.layout import LIBLLAMA, LLAMACPP_CACHE_KIND, backend_tag
from bakeoff.models.artifacts import staged_dir
from bakeoff.models.manifest import verify, write_manifest


def cmake_args(tc: ToolchainCfg, hw: HardwareCfg) -> list[str]:
    """Configure arguments for this toolchain on this hardware."""
    args = [
        "-DCMAKE_BUILD_TYPE=Release",
        "-DBUILD_SHARED_LIBS=ON",
        "-DCMAKE_BUILD_WITH_INSTALL_RPATH=ON",
        "-DCMAKE_INSTALL_RPATH=$ORIGIN/../lib",  # tools find lib/, libraries find each other
        "-DLLAMA_BUILD_TESTS=OFF",
        "-DLLAMA_BUILD_EXAMPLES=OFF",
        "-DLLAMA_BUILD_TOOLS=ON",
        "-DLLAMA_BUILD_SERVER=ON",
        "-DLLAMA_BUILD_UI=OFF",
        "-DLLAMA_USE_PREBUILT_UI=OFF",
        "-DLLAMA_OPENSSL=OFF",
        f"-DLLAMA_BUILD_COMMIT={tc.commit}",
        *ggml_cmake_flags(read_cpu_flags()),
    ]
    if hw.backend == "cuda":
        args += ["-DGGML_CUDA=ON", f"-DCMAKE_CUDA_ARCHITECTURES={hw.cuda_arch}"]
    return args


def _run(cmd: list[str]) -> None:
    """Run a build step with its output streaming into the rule's log."""
    print("$ " + " ".join(cmd), file=sys.stderr, flush=True)
    proc = subprocess.run(cmd, stdout=sys.stderr, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        raise ToolchainError(f"build step failed ({proc.returncode}): {' '.join(cmd)}; the lines above say why")


def tool_version(binary: Path) -> str:
    """What a built tool says of itself (``--version`` prints to stderr)."""
    proc = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=60)
    text = (proc.stdout + proc.stderr).strip()
    if proc.returncode != 0:
        raise ToolchainError(f"{binary} --version failed ({proc.returncode}): {text[-500:]}")
    return text


def key_parts(tc: ToolchainCfg, hw: HardwareCfg) -> dict[str, Any]:
    """Everything that changes the compiled result: the build cache's key."""
    compilers = [["cmake", "--version"], [os.environ.get("CXX", "c++"), "--version"],
                 [os.environ.get("CC", "cc"), "--version"]]
    if hw.backend == "cuda":
        compilers.append(["nvcc", "--version"])
    return {"kind": "llamacpp-build", "commit": tc.commit, "package": tc.package, "version": tc.version,
            "backend": backend_tag(hw), "cmake_args": cmake_args(tc, hw), "targets": sorted(tc.targets),
            "compilers": tool_identity(*compilers)}


def _copy_outputs(tc: ToolchainCfg, work: Path, stage: Path) -> None:
    """The targets into ``bin/``, every shared library they need into ``lib/`` (real files, no links)."""
    (stage / "bin").mkdir()
    (stage / "lib").mkdir()
    for target in tc.targets:
        built = work / "bin" / target
        if not built.is_file():
            raise ToolchainError(f"target {target} was not produced in {work / 'bin'}")
        shutil.copy2(built, stage / "bin" / target)
    libs = sorted({p.name: p for p in work.rglob("lib*.so*") if p.is_file() or p.is_symlink()}.values())
    for lib in libs:  # libllama.so -> libllama.so.0 -> ...: each name the loader may ask for, as a file
        shutil.copy2(lib.resolve(), stage / "lib" / lib.name)
    if not (stage / LIBLLAMA).is_file():
        raise ToolchainError(f"the build produced no {LIBLLAMA} (found: {[p.name for p in libs]})")


def build(tc: ToolchainCfg, hw: HardwareCfg, source_dir: Path, out_dir: Path, jobs: int | None = None) -> None:
    """Restore from the build cache, or configure, build the targets, and install ``bin/``, ``lib/`` + manifest."""
    src_manifest = verify(source_dir)
    if src_manifest.get("commit") != tc.commit:
        raise ToolchainError(f"{source_dir} holds commit {src_manifest.get('commit')}, config pins {tc.commit}")
    parts = key_parts(tc, hw)
    key = cache_key(parts)
    tree = source_dir / "llama.cpp"
    work = out_dir.parent / f".{out_dir.name}.cmake"
    jobs = jobs or os.cpu_count() or 1
    with staged_dir(out_dir) as stage:
        if restore(LLAMACPP_CACHE_KIND, key, stage):
            return
        args = cmake_args(tc, hw)
        _run(["cmake", "-S", str(tree), "-B", str(work), *args])
        _run(["cmake", "--build", str(work), "--config", "Release", "-j", str(jobs), "--target", *tc.targets])
        _copy_outputs(tc, work, stage)
        version = tool_version(stage / "bin" / "llama-server")
        write_manifest(
            stage,
            kind="llamacpp-build",
            package=tc.package,
            package_version=tc.version,
            commit=tc.commit,
            backend=backend_tag(hw),
            cuda_arch=hw.cuda_arch,
            cmake_args=args,
            cpu=cpu_model_name(),
            version_text=version,
            targets=tc.targets,
            cache_key=key,
            cache_key_parts=parts,
        )
        store(LLAMACPP_CACHE_KIND, key, stage)
    shutil.rmtree(work, ignore_errors=True)


def run_stage(a: StageArgs) -> None:
    """``bakeoff stage build-llamacpp``: the fetched source (``--input``) built for ``--hardware``."""
    build(a.spec_as(ToolchainCfg), a.hardware_cfg(), a.dir("input"), a.out_dir, jobs=a.jobs)
