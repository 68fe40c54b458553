"""Instruction-set flags for building llama.cpp without native CPU detection.

Why: on the CI/dev machines cpuid advertises AMX but the kernel does not enable
it, so native (host-detected) builds die with SIGILL. We read what the *kernel*
reports in /proc/cpuinfo and turn on exactly those ggml ISA switches. AMX is
never enabled, whatever cpuinfo says: ggml's AMX path needs kernel permission
(arch_prctl) that cpuinfo does not prove.
"""

from __future__ import annotations

from pathlib import Path

# ggml CMake switch -> every /proc/cpuinfo flag it needs.
_GGML_SWITCHES: dict[str, tuple[str, ...]] = {
    "GGML_SSE42": ("sse4_2",),
    "GGML_AVX": ("avx",),
    "GGML_AVX2": ("avx2",),
    "GGML_BMI2": ("bmi2",),
    "GGML_FMA": ("fma",),
    "GGML_F16C": ("f16c",),
    "GGML_AVX_VNNI": ("avx_vnni",),
    "GGML_AVX512": ("avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw"),
    "GGML_AVX512_VBMI": ("avx512vbmi",),
    "GGML_AVX512_VNNI": ("avx512_vnni",),
    "GGML_AVX512_BF16": ("avx512_bf16",),
}


def read_cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> set[str]:
    """Return the flag set of the first CPU listed in ``cpuinfo``."""
    for line in cpuinfo.read_text().splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return set(value.split())
    return set()


def ggml_cmake_flags(flags: set[str]) -> list[str]:
    """CMake ``-D`` arguments for a portable-but-fast CPU build of ggml."""
    args = ["-DGGML_NATIVE=OFF", "-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF"]
    for switch, needed in _GGML_SWITCHES.items():
        on = all(f in flags for f in needed)
        args.append(f"-D{switch}={'ON' if on else 'OFF'}")
    return args


def cpu_model_name(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """Human-readable CPU model, for manifests and hardware reports."""
    for line in cpuinfo.read_text().splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name":
            return value.strip()
    return "unknown"
