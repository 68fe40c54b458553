"""Stage: build the pinned llama.cpp tools (CPU here, CUDA on GPU hardware).

Static binaries (BUILD_SHARED_LIBS=OFF) so the finished ``bin/`` can be renamed
into place and cached as one artifact. CPU code is compiled for the instruction
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

from bakeoff.artifacts import staged_dir
from bakeoff.cpuflags import cpu_model_name, ggml_cmake_flags, read_cpu_flags
from bakeoff.errors import ToolchainError
from bakeoff.manifest import read_manifest, verify, write_manifest
from bakeoff.schema import HardwareCfg, ToolchainCfg


def backend_tag(hw: HardwareCfg) -> str:
    """Directory tag of a build flavour: ``cpu`` or ``cuda<arch>``."""
    return "cpu" if hw.backend == "cpu" else f"cuda{hw.cuda_arch}"


def cmake_args(tc: ToolchainCfg, hw: HardwareCfg) -> list[str]:
    """Configure arguments for this toolchain on this hardware."""
    args = [
        "-DCMAKE_BUILD_TYPE=Release",
        "-DBUILD_SHARED_LIBS=OFF",
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


def build(tc: ToolchainCfg, hw: HardwareCfg, source_dir: Path, out_dir: Path, jobs: int | None = None) -> None:
    """Configure, build the configured targets, and install ``bin/`` + manifest."""
    src_manifest = verify(source_dir)
    if src_manifest.get("commit") != tc.commit:
        raise ToolchainError(f"{source_dir} holds commit {src_manifest.get('commit')}, config pins {tc.commit}")
    tree = source_dir / "llama.cpp"
    work = out_dir.parent / f".{out_dir.name}.cmake"
    jobs = jobs or os.cpu_count() or 1
    with staged_dir(out_dir) as stage:
        args = cmake_args(tc, hw)
        _run(["cmake", "-S", str(tree), "-B", str(work), *args])
        _run(["cmake", "--build", str(work), "--config", "Release", "-j", str(jobs), "--target", *tc.targets])
        (stage / "bin").mkdir()
        for target in tc.targets:
            built = work / "bin" / target
            if not built.is_file():
                raise ToolchainError(f"target {target} was not produced in {work / 'bin'}")
            shutil.copy2(built, stage / "bin" / target)
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
        )
    shutil.rmtree(work, ignore_errors=True)


def toolchain_bin(toolchain_dir: Path, tool: str) -> Path:
    """Path of a built tool, after checking the build's manifest."""
    read_manifest(toolchain_dir)
    path = toolchain_dir / "bin" / tool
    if not path.is_file():
        raise ToolchainError(f"{tool} is not in toolchain {toolchain_dir}")
    return path
