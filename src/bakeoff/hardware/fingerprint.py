"""Which machine a cell ran on, so results from different nodes are never paired as if from one.

Why: the same cell on the lent H200 moved 10-39 % from node to node, more than many format effects. A
GPU is named by its UUIDs (a node's hostname can repeat across leases; a GPU's UUID cannot); a CPU-only
machine by its hostname and ``/etc/machine-id``.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence
from pathlib import Path

MACHINE_ID = Path("/etc/machine-id")


def node_id(gpu_uuids: Sequence[str] | None = None, machine_id_file: Path = MACHINE_ID) -> str:
    """``gpu:<uuid>[,<uuid>...]`` for the server's GPUs, else ``host:<hostname>[/<machine-id prefix>]``."""
    if gpu_uuids:
        return "gpu:" + ",".join(sorted(gpu_uuids))
    try:
        mid = machine_id_file.read_text().strip()[:12]
    except OSError:
        mid = ""
    return f"host:{socket.gethostname()}" + (f"/{mid}" if mid else "")
