"""Which GPUs a server may use, and how one model spans several of them.

Why this module: Snakemake's ``gpu`` resource only *counts* GPUs, it never
picks them. bakeoff therefore pins every server it starts to an explicit
device list (``CUDA_VISIBLE_DEVICES``) and gives each serving job the whole
node's GPUs (and all cores), so two jobs never share a GPU by accident. The
multi-GPU flags of each engine (``Engine.hardware_flags``) come from the
hardware config, not from each experiment, so the same experiment runs on a
1-GPU and a 2-GPU node.

NVLink multicast stays off in every process bakeoff starts (NCCL,
PyTorch symmetric memory, NVSHMEM): on shared hosts it can take the GPUs out
of service, and a server started with its own environment must carry the
setting too.
"""

from __future__ import annotations

from collections.abc import Mapping

from bakeoff.config.schema import HardwareCfg
from bakeoff.errors import ConfigError

MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def visible_devices(hw: HardwareCfg, environ: Mapping[str, str]) -> list[str]:
    """The device ids a server for ``hw`` may use.

    The config's ``visible_devices`` wins; else a scheduler's allocation
    (SLURM sets ``CUDA_VISIBLE_DEVICES`` for the job) if it holds enough GPUs;
    else ``0..gpus-1``. Too few allocated GPUs is a config error, not a
    silently smaller run.
    """
    if hw.backend != "cuda":
        return []
    if hw.visible_devices is not None:
        return [str(d) for d in hw.visible_devices]
    given = environ.get("CUDA_VISIBLE_DEVICES")
    if given is not None and given.strip():
        ids = [d.strip() for d in given.split(",") if d.strip()]
        if len(ids) < hw.gpus:
            raise ConfigError(f"hardware {hw.name!r} needs {hw.gpus} GPU(s) but CUDA_VISIBLE_DEVICES={given!r} "
                              f"allocates {len(ids)}")
        return ids[: hw.gpus]
    return [str(i) for i in range(hw.gpus)]


def server_env(hw: HardwareCfg, environ: Mapping[str, str]) -> dict[str, str]:
    """Environment entries every server process gets on this hardware."""
    env = dict(MULTICAST_OFF)
    if hw.backend == "cuda":
        env["CUDA_VISIBLE_DEVICES"] = ",".join(visible_devices(hw, environ))
        # Number GPUs as NVML and nvidia-smi do (PCI bus order), so a device index means one GPU everywhere
        # (bakeoff.hardware.telemetry maps the server's devices to NVML handles through it).
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    return env


def docker_gpu_args(hw: HardwareCfg, environ: Mapping[str, str]) -> list[str]:
    """``docker run`` arguments: exactly the visible devices, and multicast off inside the container."""
    args = ["--gpus", f"\"device={','.join(visible_devices(hw, environ))}\""]
    for k, v in MULTICAST_OFF.items():
        args += ["-e", f"{k}={v}"]
    return args
