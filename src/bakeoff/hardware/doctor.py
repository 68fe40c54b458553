"""The hardware doctor: what this node is, what it can run, and whether it is healthy.

Why it runs first: a measurement is only interpretable with the hardware it
ran on (GPU, compute capability, driver, interconnect), an FP8 cell on a V100
should be *expected* unsupported before anyone waits for a server to fail,
and a GPU with uncorrectable ECC errors produces numbers nobody should trust.

Two halves, so the rules can be tested without a GPU:

* :func:`probe` reads the machine: CPU model and flags from ``/proc/cpuinfo``,
  memory, a measured memory bandwidth (for the CPU roofline), and every GPU
  through NVML (nvidia-ml-py): name, compute capability, memory, driver and
  CUDA versions, ECC counts (volatile and aggregate, corrected and
  uncorrected), PCIe link, NVLink links, and the GPU-to-GPU topology matrix.
* :func:`analyze` turns probed facts plus the hardware config into the
  capability matrix, topology, warnings, and the ECC gate; each engine turns
  that record into expected statuses of its variants (bakeoff.engines.support).
  Tests feed them NVML facts of V100, A100 (fixtures) and H200 (recorded) nodes.

A config naming another GPU than the node's (name, memory or compute capability) stops the run here,
before any job (bakeoff.hardware.match): its name would label every row.

Capability rules (compute capability ``cc``): native FP8 needs cc >= 8.9;
BF16 needs cc >= 8.0; vLLM's FP8 weight-only Marlin path needs cc >= 8.0 (its FP8
configs' minimum capability, in 0.6.3 as in 0.24.0); below (V100, T4) no FP8 path exists.
"""

from __future__ import annotations

import concurrent.futures
import datetime as dt
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bakeoff.errors import BakeoffError
from bakeoff.hardware import gpubandwidth
from bakeoff.hardware.cpuflags import cpu_model_name, read_cpu_flags
from bakeoff.hardware.ecc import growth, historical_uncorrected, volatile_uncorrected
from bakeoff.hardware.match import describe_config, describe_node, mismatches
from bakeoff.hardware.topology import topology
from bakeoff.models.artifacts import atomic_write_text

if TYPE_CHECKING:  # the probe also runs standalone on a bare GPU node (no pydantic there)
    from bakeoff.config.schema import DoctorCfg, HardwareCfg

SCHEMA = 1
class DoctorError(BakeoffError):
    """The node must not run this experiment (missing GPUs, uncorrectable ECC errors)."""


# --------------------------------------------------------------------------- probe
def _mem_total_bytes() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def measure_copy_bandwidth_gbs(mib: int = 256, repeats: int = 5, threads: int | None = None) -> float | None:
    """Memory bandwidth from a threaded numpy copy, GB/s counting bytes read plus written (median of repeats).

    numpy releases the GIL for large copies, so one chunk per core reads the
    whole memory system, as llama.cpp's decode threads do.
    """
    if mib <= 0:
        return None
    import numpy as np

    n = mib * (1 << 20) // 8
    src = np.ones(n, dtype=np.float64)
    dst = np.empty_like(src)
    k = max(1, threads or os.cpu_count() or 1)
    bounds = [(i * n // k, (i + 1) * n // k) for i in range(k)]

    def part(b: tuple[int, int]) -> None:
        np.copyto(dst[b[0]:b[1]], src[b[0]:b[1]])

    times = []
    with concurrent.futures.ThreadPoolExecutor(k) as pool:
        list(pool.map(part, bounds))  # warm-up: page in both arrays
        for _ in range(repeats):
            t0 = time.perf_counter()
            list(pool.map(part, bounds))
            times.append(time.perf_counter() - t0)
    return 2 * src.nbytes / statistics.median(times) / 1e9


def probe_cpu(bandwidth_mib: int = 256) -> dict[str, Any]:
    flags = sorted(read_cpu_flags())
    return {
        "model": cpu_model_name(),
        "arch": platform.machine(),
        "logical_cores": os.cpu_count(),
        "flags": flags,
        "mem_total_bytes": _mem_total_bytes(),
        "mem_bandwidth_gbs": measure_copy_bandwidth_gbs(bandwidth_mib),
        "mem_bandwidth_method": f"numpy copy, {bandwidth_mib} MiB, one thread per core, read+write bytes, median of 5",
    }


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _nvml_call(fn: Any, *args: Any) -> Any:
    """An NVML query, or None where the GPU or driver does not support it."""
    import pynvml

    try:
        return fn(*args)
    except pynvml.NVMLError:
        return None


def _ecc(pynvml: Any, h: Any) -> dict[str, Any]:
    mode = _nvml_call(pynvml.nvmlDeviceGetEccMode, h)
    out: dict[str, Any] = {"enabled": bool(mode[0]) if mode else None}
    for counter, cname in ((pynvml.NVML_VOLATILE_ECC, "volatile"), (pynvml.NVML_AGGREGATE_ECC, "aggregate")):
        out[cname] = {
            kind: _nvml_call(pynvml.nvmlDeviceGetTotalEccErrors, h, etype, counter)
            for etype, kind in ((pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, "corrected"),
                                (pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, "uncorrected"))
        }
    return out


def probe_gpus(measure_bandwidth: bool = True, torch_pythons: Sequence[str] = ()) -> dict[str, Any]:
    """Every GPU NVML sees; ``{"nvml": "unavailable: ...", "gpus": []}`` on a machine without a driver."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as e:  # no libnvidia-ml, no driver: a CPU node
        return {"nvml": f"unavailable: {e}", "gpus": []}
    try:
        cuda = _nvml_call(pynvml.nvmlSystemGetCudaDriverVersion)
        facts: dict[str, Any] = {
            "nvml": "ok",
            "driver_version": _s(pynvml.nvmlSystemGetDriverVersion()),
            "cuda_driver_version": f"{cuda // 1000}.{cuda % 1000 // 10}" if cuda else None,
            "gpus": [],
        }
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        bus_ids = [_s(pynvml.nvmlDeviceGetPciInfo(h).busId) for h in handles]
        for i, h in enumerate(handles):
            cc = pynvml.nvmlDeviceGetCudaComputeCapability(h)
            links = []
            for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
                if _nvml_call(pynvml.nvmlDeviceGetNvLinkState, h, link) != pynvml.NVML_FEATURE_ENABLED:
                    continue
                remote = _nvml_call(pynvml.nvmlDeviceGetNvLinkRemotePciInfo, h, link)
                links.append({"link": link, "remote_bus_id": _s(remote.busId) if remote else None})
            facts["gpus"].append({
                "index": i,
                "name": _s(pynvml.nvmlDeviceGetName(h)),
                "uuid": _s(pynvml.nvmlDeviceGetUUID(h)),
                "bus_id": bus_ids[i],
                "compute_capability": f"{cc[0]}.{cc[1]}",
                "memory_total_mib": pynvml.nvmlDeviceGetMemoryInfo(h).total // (1 << 20),
                "ecc": _ecc(pynvml, h),
                "pcie": {"gen": _nvml_call(pynvml.nvmlDeviceGetCurrPcieLinkGeneration, h),
                         "width": _nvml_call(pynvml.nvmlDeviceGetCurrPcieLinkWidth, h),
                         "max_gen": _nvml_call(pynvml.nvmlDeviceGetMaxPcieLinkGeneration, h),
                         "max_width": _nvml_call(pynvml.nvmlDeviceGetMaxPcieLinkWidth, h)},
                "nvlink": links,
                **(gpubandwidth.probe(i, torch_pythons) if measure_bandwidth else {}),
            })
        facts["pcie_topology"] = [[0 if a == b else _nvml_call(pynvml.nvmlDeviceGetTopologyCommonAncestor, ha, hb)
                                   for b, hb in enumerate(handles)] for a, ha in enumerate(handles)]
        return facts
    finally:
        pynvml.nvmlShutdown()


def nvidia_smi_topo() -> str | None:
    """``nvidia-smi topo -m`` as printed, where the tool exists (kept verbatim for the record)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        p = subprocess.run([exe, "topo", "-m"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"failed: {e}"
    return p.stdout if p.returncode == 0 else f"failed ({p.returncode}): {p.stderr.strip()[:300]}"


def probe(bandwidth_mib: int = 256, torch_pythons: Sequence[str] = ()) -> dict[str, Any]:
    """Everything readable about this node (the part a fixture records)."""
    return {"host": socket.gethostname(), "kernel": platform.release(), "cpu": probe_cpu(bandwidth_mib),
            **probe_gpus(torch_pythons=torch_pythons), "nvidia_smi_topo": nvidia_smi_topo()}


# --------------------------------------------------------------------------- analyze
def _cc(gpu: dict[str, Any]) -> float:
    major, minor = str(gpu["compute_capability"]).split(".")
    return int(major) + int(minor) / 10


def capabilities(cc: float | None, cpu_flags: list[str] | None = None) -> dict[str, bool]:
    """The capability matrix of one compute capability (None: CPU, no CUDA path; BF16 from the CPU flags)."""
    if cc is None:
        bf16 = bool({"avx512_bf16", "amx_bf16"} & set(cpu_flags or []))
        return {"native_fp8": False, "bf16": bf16, "vllm_fp8_marlin": False, "any_fp8": False}
    return {"native_fp8": cc >= 8.9, "bf16": cc >= 8.0, "vllm_fp8_marlin": cc >= 8.0, "any_fp8": cc >= 8.0}


def ecc_uncorrected(facts: dict[str, Any]) -> dict[str, int]:
    """GPU -> uncorrectable ECC errors since the driver loaded (volatile): these stop a run (bakeoff.hardware.ecc)."""
    return volatile_uncorrected(facts)


def analyze(facts: dict[str, Any], hw: HardwareCfg, doctor: DoctorCfg) -> dict[str, Any]:
    """Capability matrix, topology and warnings for ``hw`` on the probed node; raises DoctorError."""
    gpus = facts.get("gpus", [])
    warnings: list[str] = []
    if hw.backend == "cuda" and len(gpus) < hw.gpus:
        raise DoctorError(f"hardware config {hw.name!r} needs {hw.gpus} GPU(s); NVML found {len(gpus)} "
                          f"({facts.get('nvml', 'not probed')}). Pick the matching hardware= config.")
    driver = None
    if hw.backend == "cuda":  # before any build: the toolkit the build environment pins must fit the driver
        from bakeoff.hardware.driver import check as driver_check

        driver = driver_check(facts.get("driver_version"), hw.toolchain_env)
        if driver["ok"] is False:
            raise DoctorError(driver["message"])
        if driver["message"]:
            warnings.append(driver["message"])
    bad = ecc_uncorrected(facts)
    if bad and not doctor.allow_uncorrected_ecc:
        raise DoctorError(f"uncorrectable ECC errors since boot (volatile) on {bad}: results from this node cannot "
                          "be trusted. Fix or drain the GPU, or override with doctor.allow_uncorrected_ecc=true")
    if bad:
        warnings.append(f"uncorrectable ECC errors since boot on {bad}, allowed by doctor.allow_uncorrected_ecc")
    history = historical_uncorrected(facts)
    if history:
        warnings.append(f"historical (aggregate) uncorrectable ECC errors on {history}, none since boot: rule "
                        "gpu_check benchmarks each GPU alone before any server where a llama.cpp toolchain is "
                        "configured (results/gpu-check.json), and the run stops if any count grows while it "
                        "measures (results/hardware-after.json)")
    used = gpus[: hw.gpus] if hw.backend == "cuda" else []
    cc = min((_cc(g) for g in used), default=None)
    caps = capabilities(cc, (facts.get("cpu") or {}).get("flags"))
    topo = topology(facts)
    if hw.backend == "cuda":
        if wrong := mismatches(facts, hw.model_dump(mode="json")):
            raise DoctorError(
                f"{describe_config(hw.model_dump(mode='json'))} does not describe this node, which has "
                f"{describe_node(used)}: {'; '.join(wrong)}. Every row would name the wrong GPU. Run with "
                "hardware=auto (the config is picked from conf/hardware/, or composed, from these findings), or "
                "name the conf/hardware/ config of this GPU (docs/your-gpu-box.md makes one)")
        if hw.gpus > 1 and hw.interconnect and topo["interconnect"] and hw.interconnect != topo["interconnect"]:
            warnings.append(f"hardware.interconnect={hw.interconnect} but the GPUs are linked by {topo['interconnect']}")
    elif gpus:
        warnings.append(f"hardware config {hw.name!r} is CPU-only; {len(gpus)} GPU(s) present are not used")
    return {"compute_capability": cc, "capabilities": caps, "topology": topo,
            "ecc_uncorrected": bad, "ecc_history": history, "driver_check": driver, "warnings": warnings}


def run(hw: HardwareCfg, doctor: DoctorCfg, out: Path, facts: dict[str, Any] | None = None) -> dict[str, Any]:
    """Probe (unless facts are given), analyze, and write ``out`` atomically. Raises DoctorError."""
    facts = facts if facts is not None else probe(doctor.bandwidth_probe_mib, [hw.vllm_python] if hw.vllm_python else [])
    report = {"schema": SCHEMA, "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
              "hardware_config": hw.model_dump(mode="json"), **facts, **analyze(facts, hw, doctor)}
    atomic_write_text(out, json.dumps(report, indent=2) + "\n")
    return report


def recheck(before: Path, out: Path, facts: dict[str, Any] | None = None) -> dict[str, Any]:
    """After the last server: stop if any uncorrectable count grew since the doctor's record ``before``.

    Growth stops the run even with ``doctor.allow_uncorrected_ecc`` (that override accepts a known count, not
    errors appearing during the measurement). The record is written either way; Snakemake drops it if we raise.
    """
    record = json.loads(Path(before).read_text())
    if not record.get("gpus"):
        rep = {"schema": SCHEMA, "checked": False, "reason": "no GPUs in the doctor's record", "grew": []}
        atomic_write_text(out, json.dumps(rep, indent=2) + "\n")
        return rep
    now = facts if facts is not None else probe_gpus()
    grew = growth(record, now)
    rep = {"schema": SCHEMA, "checked": True, "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
           "before_created": record.get("created"), "grew": grew,
           "gpus": [{"uuid": g["uuid"], "index": g["index"], "ecc": g.get("ecc")} for g in now.get("gpus", [])]}
    atomic_write_text(out, json.dumps(rep, indent=2) + "\n")
    if grew:
        raise DoctorError("uncorrectable ECC errors appeared while this run measured: " + "; ".join(grew)
                          + ". Its results cannot be trusted; drain the GPU and re-run.")
    return rep


def ecc_gate(hw: HardwareCfg, doctor: DoctorCfg) -> None:
    """Re-check volatile ECC right before a server starts (cheap; the doctor's file may be hours old)."""
    if hw.backend != "cuda" or doctor.allow_uncorrected_ecc:
        return
    bad = ecc_uncorrected(probe_gpus())
    if bad:
        raise DoctorError(f"uncorrectable ECC errors on {bad}: not starting a server. "
                          "Override with doctor.allow_uncorrected_ecc=true")


if __name__ == "__main__":  # python -m bakeoff.hardware.doctor OUT.json: the probe alone (what fixtures record)
    import sys

    atomic_write_text(Path(sys.argv[1]), json.dumps(probe(), indent=2) + "\n")


def summary_text(r: dict, predictions: dict | None = None) -> str:
    """The doctor's findings in a few lines (the full record is the JSON file)."""
    lines = [f"hardware config {r['hardware_config']['name']}: CPU {r['cpu']['model']} ({r['cpu']['logical_cores']} cores, "
             f"copy bandwidth {r['cpu']['mem_bandwidth_gbs'] or 0:.1f} GB/s); NVML {r.get('nvml')}"]
    for g in r.get("gpus", []):
        lines.append(f"  GPU{g['index']} {g['name']} cc {g['compute_capability']} {g['memory_total_mib']} MiB")
    if r.get("gpus"):
        lines.append(f"  driver {r.get('driver_version')}, CUDA {r.get('cuda_driver_version')}, "
                     f"interconnect {r['topology']['interconnect']}")
    lines.append("capabilities: " + ", ".join(f"{k}={v}" for k, v in r["capabilities"].items()))
    for v, p in (predictions or {}).items():
        lines.append(f"  {v}: {p['expected']}" + (f" ({p['reason']})" if p["reason"] else ""))
    lines += [f"warning: {w}" for w in r["warnings"]]
    return "\n".join(lines)
