"""The configured GPU against the node's, and the hardware config that fits a node.

Why: every row names a hardware config (``hardware``), and the roofline, the build's CUDA architecture and
the reader all take the config's word for what the GPU is. A config naming another GPU than the node's (an
H200 config on an H100) mislabels every row, so the doctor stops the run before any job
(:func:`mismatches`), and ``hardware=auto`` picks the config that fits the doctor's findings, or composes one
from them where none does (:func:`choose`), so a node's GPU never needs a hand edit.

Everything here reads the doctor's facts (``bakeoff.hardware.doctor.probe``: ``gpus``, each with ``name``,
``memory_total_mib``, ``compute_capability``) and config dicts, never NVML itself: tests and recorded
nodes feed it data.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from bakeoff.hardware.topology import topology

# A config's gpu_memory_gib is NVML's total in GiB (140.4 for an H200); more than this share away from the
# node's is another GPU (a config written from a datasheet's GB, 141, still matches).
MEMORY_TOLERANCE = 0.10
GIB = 1 << 30


def gpu_memory_gib(gpu: Mapping[str, Any]) -> float:
    return float(gpu["memory_total_mib"]) / 1024.0


def config_memory_gib(hw: Mapping[str, Any]) -> float | None:
    """A hardware config's GPU memory in GiB; a config recorded before the field named its unit calls it
    ``gpu_memory_gb`` (the same figure: NVML's GiB, or the datasheet's within the tolerance above)."""
    mem = hw.get("gpu_memory_gib", hw.get("gpu_memory_gb"))
    return float(mem) if mem else None


def cuda_arch(gpu: Mapping[str, Any]) -> int:
    """Compute capability without the dot (``9.0`` -> 90), as ``hardware.cuda_arch`` spells it."""
    major, minor = str(gpu["compute_capability"]).split(".")
    return int(major) * 10 + int(minor)


def describe_node(gpus: Sequence[Mapping[str, Any]]) -> str:
    """``1 x NVIDIA H100 80GB HBM3 (79.6 GiB, compute capability 9.0)``, per distinct GPU."""
    if not gpus:
        return "no GPU (NVML found none)"
    kinds: dict[str, int] = {}
    for g in gpus:
        k = f"{g['name']} ({gpu_memory_gib(g):.1f} GiB, compute capability {g['compute_capability']})"
        kinds[k] = kinds.get(k, 0) + 1
    return " + ".join(f"{n} x {k}" for k, n in kinds.items())


def describe_config(hw: Mapping[str, Any]) -> str:
    if hw.get("backend") != "cuda":
        return f"hardware={hw.get('name')} (CPU only)"
    mem = config_memory_gib(hw)
    return (f"hardware={hw.get('name')} ({hw.get('gpus')} x {hw.get('gpu_model') or 'unnamed GPU'}, "
            f"{format(float(mem), 'g') if mem else '?'} GiB, cuda_arch {hw.get('cuda_arch')})")


def mismatches(facts: Mapping[str, Any], hw: Mapping[str, Any]) -> list[str]:
    """How the GPUs a CUDA config would use differ from what it says they are (empty: they match).

    Compared per GPU the config uses (the first ``gpus`` NVML lists): the name (``gpu_model`` must be
    part of NVML's name), the memory (within :data:`MEMORY_TOLERANCE`) and the compute capability
    (``cuda_arch``). A CPU config, or a config leaving a field empty, is not compared on it.
    """
    if hw.get("backend") != "cuda":
        return []
    used = list(facts.get("gpus") or [])[: int(hw.get("gpus") or 0)]
    out: list[str] = []
    model = hw.get("gpu_model")
    names = sorted({str(g["name"]) for g in used})
    if model and any(str(model).lower() not in n.lower() for n in names):
        out.append(f"gpu_model {model!r} is not the node's {', '.join(repr(n) for n in names)}")
    mem = config_memory_gib(hw)
    if mem:
        found = sorted({round(gpu_memory_gib(g), 1) for g in used})
        if any(abs(f - float(mem)) > MEMORY_TOLERANCE * float(mem) for f in found):
            out.append(f"gpu_memory_gib {mem:g} is not the node's {', '.join(f'{f:g}' for f in found)} GiB")
    arch = hw.get("cuda_arch")
    archs = sorted({cuda_arch(g) for g in used})
    if arch and any(a != int(arch) for a in archs):
        out.append(f"cuda_arch {arch} is not the node's {', '.join(str(a) for a in archs)}")
    return out


def fits(facts: Mapping[str, Any], hw: Mapping[str, Any]) -> bool:
    """The node can run ``hw`` as it describes itself: enough GPUs, each the one it names (CPU: no GPU used)."""
    if hw.get("backend") != "cuda":
        return False
    gpus = facts.get("gpus") or []
    return bool(hw.get("gpu_model")) and 1 <= int(hw.get("gpus") or 0) <= len(gpus) and not mismatches(facts, hw)


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def compose(facts: Mapping[str, Any]) -> dict[str, Any]:
    """A hardware config (every field of HardwareCfg) for every GPU the node has, from the doctor's findings alone.

    Bandwidth and peak FLOP/s are left empty (no datasheet to read): the doctor measures the device copy on
    the node and the roofline uses that (``bandwidth_source``). Mixed GPU models are refused: one config
    names one GPU.
    """
    gpus = list(facts.get("gpus") or [])
    names = sorted({str(g["name"]) for g in gpus})
    if len(names) != 1:
        raise ValueError(f"hardware=auto composes a config for one GPU model; the node has {describe_node(gpus)}")
    n = len(gpus)
    bandwidths = [g.get("mem_bandwidth_gbs") for g in gpus]
    return {"name": "auto-" + _slug(names[0]) + (f"-x{n}" if n > 1 else ""), "backend": "cuda", "gpus": n,
            "gpu_model": names[0], "gpu_memory_gib": round(min(gpu_memory_gib(g) for g in gpus), 1),
            "cuda_arch": min(cuda_arch(g) for g in gpus),
            "interconnect": topology(dict(facts))["interconnect"] if n > 1 else None,
            "mem_bandwidth_gbs": round(min(bandwidths), 2) if all(bandwidths) else None,
            "peak_tflops_fp16": None, "vllm_image": None, "visible_devices": None, "llamacpp_split_mode": "layer",
            "llamacpp_tensor_split": None, "vllm_tensor_parallel_size": None, "gres": None, "llamacpp_env": None}


def choose(facts: Mapping[str, Any], configs: Mapping[str, Mapping[str, Any]]) -> tuple[str, dict[str, Any] | None]:
    """The config for this node: ``(name, None)`` for one of ``configs``, or ``(name, composed)`` for a new one.

    No GPU: the CPU config (``cpu``). Else the configs that :func:`fits` the node, the one using the most of
    its GPUs first (then by name); none fits: :func:`compose`.
    """
    gpus = facts.get("gpus") or []
    if not gpus:
        if "cpu" not in configs:
            raise ValueError("hardware=auto on a node without GPUs needs conf/hardware/cpu.yaml")
        return "cpu", None
    fitting = sorted((name for name, hw in configs.items() if fits(facts, hw)),
                     key=lambda name: (-int(configs[name]["gpus"]), name))
    if fitting:
        return fitting[0], None
    made = compose(facts)
    return str(made["name"]), made
