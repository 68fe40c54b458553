"""A payload for the GPU node, packed here as parts under one manifest: what vLLM's and quality's packs share.

Why one packer: each carried payload (vLLM, bakeoff.node.vllm; quality, bakeoff.node.quality) is a tar of files cut
into parts that one call each carries, and ``node_parts.py`` on the node receives, assembles and installs every one
of them the same way, from the manifest alone. So the tar, the parts, the manifest's common keys, ``node.sh`` and
``node_parts.py`` are written here once; each pack says only what goes in and how the node installs it.

The part size (:func:`default_part_bytes`) is what one call leaves beside the working tree that travels with it.
"""

from __future__ import annotations

import json
import os
import shutil
import tarfile
import time
from collections.abc import Sequence
from pathlib import Path

from bakeoff.errors import BakeoffError
from bakeoff.node import parts as node_parts

MIB = 1 << 20
CALL_LIMIT = 64 * MIB  # what one call to the GPU node carries: working tree + carried paths
DEFAULT_PART_MIB = 55
# What a part call carries beside its part: node.sh, node_parts.py and the manifest (a manifest of ~100 wheels
# is under 64 KiB; 256 KiB leaves room).
PART_EXTRA_BYTES = 256 * 1024
# The node: the Python and platform pip downloads for (its python3 is CPython 3.12.3, x86-64).
PYTHON_VERSION = "3.12"
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64", "manylinux_2_31_x86_64", "manylinux_2_34_x86_64", "manylinux_2_35_x86_64")
FOR_NODE = {"python": f"CPython {PYTHON_VERSION}", "platforms": list(PLATFORMS),
            "node_packages": "workflow/node-packages.txt"}


def default_part_bytes(repo: Path, extra_bytes: int = 0) -> tuple[int, str]:
    """The largest part that fits one call beside the checkout that travels with it (at most 55 MiB).

    Every call sends the working tree (tracked and untracked-not-ignored files, and shared/) plus what it carries; a part
    call also carries ``node.sh``, ``node_parts.py`` and the manifest (``extra_bytes``), and 1 MiB is kept spare.
    """
    from bakeoff.node.bundle import checkout_files

    files = {repo / n for n in checkout_files(repo)} | {p for p in (repo / "shared").rglob("*") if p.is_file()}
    tree = sum(p.stat().st_size for p in files)  # shared/ travels too, ignored or not
    room = CALL_LIMIT - tree - extra_bytes - MIB
    part = min(DEFAULT_PART_MIB * MIB, room)
    if part < 4 * MIB:
        raise BakeoffError(f"the checkout that travels with every call is {tree / MIB:.1f} MiB: less than 4 MiB of "
                           f"a call's 64 MiB is left for a part; slim the working tree or give --part-mib")
    why = (f"min({DEFAULT_PART_MIB} MiB, 64 MiB - the working tree that travels with each call "
           f"({tree / MIB:.1f} MiB) - node.sh, node_parts.py and this manifest - 1 MiB spare)")
    return part, why


def wheel_rows(wheels: Sequence[tuple[str, Path]], prefix: str, required_by: dict[str, list[str]]) -> list[dict]:
    """One manifest row a wheel: its path in the payload, name, bytes, sha256 and what required it."""
    return [{"file": f"{prefix}/{w.name}", "name": n, "bytes": w.stat().st_size, "sha256": node_parts.sha256_file(w),
             "required_by": sorted(set(required_by.get(n, [])))} for n, w in wheels]


def pack_payload(*, out: Path, package: str, version: str, members: Sequence[tuple[str, Path]], install: dict,
                 part_bytes: int, part_bytes_why: str, extra: dict) -> dict:
    """Tar ``members`` (payload path, file) into parts of at most ``part_bytes`` under ``out``, with the manifest
    (the common keys, ``install`` as node_parts.install reads it, then ``extra``), ``node.sh`` and ``node_parts.py``.

    The tar's members carry no time or owner, so the same files make the same payload (and the same sha256). The
    old manifest goes first: parts without their manifest are never taken. Returns the manifest.
    """
    from bakeoff.node.bundle import NODE_SH

    out.mkdir(parents=True, exist_ok=True)
    (out / node_parts.MANIFEST_NAME).unlink(missing_ok=True)
    staging = out / ".staging"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    payload = staging / "payload.tar"
    with tarfile.open(payload, "w", format=tarfile.PAX_FORMAT) as tar:
        for arcname, path in members:
            ti = tar.gettarinfo(str(path), arcname=arcname)
            ti.mtime, ti.uid, ti.gid, ti.uname, ti.gname = 0, 0, 0, "", ""
            with open(path, "rb") as f:
                tar.addfile(ti, f)
    parts = node_parts.split(payload, out, part_bytes)
    manifest = {
        "kind": "node-carry", "package": package, "version": version,
        "packed_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "for_node": FOR_NODE,
        "payload": {"bytes": payload.stat().st_size, "sha256": node_parts.sha256_file(payload), "members": len(members)},
        "part_bytes": part_bytes, "part_bytes_why": part_bytes_why, "parts": parts,
        "install": install,
        **extra,
    }
    tmp = out / f".{node_parts.MANIFEST_NAME}.tmp"
    tmp.write_text(json.dumps(manifest, indent=2) + "\n")
    os.replace(tmp, out / node_parts.MANIFEST_NAME)
    (out / "node.sh").write_text(NODE_SH)
    shutil.copy2(Path(node_parts.__file__), out / "node_parts.py")
    shutil.rmtree(staging)
    return manifest
