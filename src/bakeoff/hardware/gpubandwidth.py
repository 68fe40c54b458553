"""Device-memory bandwidth of one GPU, measured on the node: a device-to-device copy through torch.

Why measured: the decode roofline divides by this number, and a datasheet or a figure from another node
is not the node a cell ran on. Counted like the doctor's host copy: bytes read plus bytes written, over
the median of timed repeats (CUDA events), with a buffer far larger than L2. Run as a subprocess
(``python gpubandwidth.py <nvml-index>``) with ``CUDA_DEVICE_ORDER=PCI_BUS_ID``, so the index means NVML's GPU
and the doctor's process never holds a CUDA context.

Which interpreter: bakeoff's own venv holds torch's CPU build on a GPU box, so the probe runs under the first of
the given interpreters whose torch reaches the GPU (the vLLM interpreter, ``make setup-gpu``'s, first). The file
runs as a script, so that interpreter needs torch only, not bakeoff.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

METHOD = "torch device-to-device copy, {mib} MiB, read+write bytes, CUDA events, median of {repeats}"


def measure(index: int, mib: int = 2048, repeats: int = 10) -> dict[str, Any]:
    """Copy bandwidth of GPU ``index`` (CUDA order), GB/s; raises where torch or CUDA is missing."""
    import torch

    dev = torch.device("cuda", index)
    n = mib * (1 << 20)
    src = torch.empty(n, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    times = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        dst.copy_(src)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1000.0)
    times.sort()
    median = times[len(times) // 2]
    return {"mem_bandwidth_gbs": 2 * n / median / 1e9, "mem_bandwidth_method": METHOD.format(mib=mib, repeats=repeats),
            "torch": torch.__version__}


def probe(index: int, pythons: Sequence[str] = (), timeout_s: float = 120.0) -> dict[str, Any]:
    """:func:`measure` in a child process under the first of ``pythons`` (then this one) where it runs, recorded
    as ``mem_bandwidth_python``; ``{"mem_bandwidth_error": why}``, each interpreter's reason, when none can."""
    env = {**os.environ, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    errors = []
    for python in dict.fromkeys([*pythons, sys.executable]):
        try:
            p = subprocess.run([python, str(Path(__file__).resolve()), str(index)], env=env,
                               capture_output=True, text=True, timeout=timeout_s)
        except (OSError, subprocess.TimeoutExpired) as e:
            errors.append(f"{python}: {str(e)[:300]}")
            continue
        if p.returncode == 0:
            return {**json.loads(p.stdout.strip().splitlines()[-1]), "mem_bandwidth_python": python}
        lines = (p.stderr or p.stdout).strip().splitlines()
        errors.append(f"{python}: {lines[-1][:300] if lines else f'exit {p.returncode}'}")
    return {"mem_bandwidth_error": "; ".join(errors)}


if __name__ == "__main__":
    print(json.dumps(measure(int(sys.argv[1]))))
