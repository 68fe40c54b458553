"""How a node's GPUs are linked, from the doctor's probe facts alone.

Why its own module: the doctor reports it and ``hardware=auto`` composes a config's ``interconnect`` from it
(bakeoff.hardware.match), so both read it here rather than one from the other.
"""

from __future__ import annotations

from typing import Any

TOPO_LEVELS = {0: "X", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}  # nvidia-smi topo -m labels


def topology(facts: dict[str, Any]) -> dict[str, Any]:
    """GPU-to-GPU matrix in nvidia-smi's labels (NV<n> = n NVLink links) and the node's interconnect."""
    gpus = facts.get("gpus", [])
    by_bus = {g["bus_id"].lower(): g["index"] for g in gpus}
    pcie = facts.get("pcie_topology") or [[None] * len(gpus) for _ in gpus]
    matrix: list[list[str]] = []
    any_nvlink = False
    for a, g in enumerate(gpus):
        row = []
        for b in range(len(gpus)):
            if a == b:
                row.append("X")
                continue
            n = sum(1 for ln in g.get("nvlink", []) if by_bus.get(str(ln.get("remote_bus_id") or "").lower()) == b)
            if n:
                any_nvlink = True
                row.append(f"NV{n}")
            else:
                row.append(TOPO_LEVELS.get(pcie[a][b], "?") if pcie[a][b] is not None else "?")
        matrix.append(row)
    inter = None if len(gpus) < 2 else ("nvlink" if any_nvlink else "pcie")
    return {"labels": [f"GPU{g['index']}" for g in gpus], "matrix": matrix, "interconnect": inter}
