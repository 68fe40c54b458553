"""Manifests: what an artifact directory holds, and proof that it still does.

Each model format and toolchain build ends with ``manifest.json`` listing every
file with its size and sha256, the tool (and version) that made it, and where
its input came from. ``verify`` checks the files so a corrupted or swapped
file is caught before a benchmark silently measures the wrong thing.

Hashing a 7B model's weights takes seconds to tens of seconds, and every stage
that reads them verifies them. So a large file's digest is kept per machine,
by inode, with its size, mtime and ctime (``$BAKEOFF_CACHE_DIR/sha256``): any
rewrite or replacement changes the ctime, which cannot be set back, and the
file is read again. ``bakeoff verify`` always reads every byte.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bakeoff.errors import ManifestError
from bakeoff.layout import cache_root

MANIFEST = "manifest.json"
_CHUNK = 1 << 20
MEMO_MIN_BYTES = 64 << 20  # smaller files are re-read: cheap, and the memo stays a handful of entries


def _read_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _stamp(st: os.stat_result) -> list[int]:
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def _memo_slot(st: os.stat_result) -> Path | None:
    root = cache_root()
    if root is None or st.st_size < MEMO_MIN_BYTES:
        return None
    return root / "sha256" / f"{st.st_dev}-{st.st_ino}.json"


def sha256_file(path: Path, *, memo: bool = False) -> str:
    """Hex sha256 of a file, read in chunks (weights can be many GB); with ``memo``, the digest last computed
    on this machine if the file's inode, size, mtime and ctime are unchanged since."""
    st = path.stat()
    slot = _memo_slot(st) if memo else None
    if slot is not None:
        try:
            rec = json.loads(slot.read_text())
            if rec["stamp"] == _stamp(st):
                return rec["sha256"]
        except (OSError, ValueError, KeyError, TypeError):
            pass
    digest = _read_sha256(path)
    if slot is not None and _stamp(path.stat()) == _stamp(st):  # not changed while it was read
        try:
            slot.parent.mkdir(parents=True, exist_ok=True)
            tmp = slot.with_name(f"{slot.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps({"stamp": _stamp(st), "sha256": digest, "path": str(path.resolve())}))
            os.replace(tmp, slot)
        except OSError:
            pass  # an unwritable cache only costs the next read
    return digest


def describe_files(root: Path, only: list[str] | None = None) -> list[dict[str, Any]]:
    """Every regular file under ``root`` (except the manifest), sorted by path.

    ``only`` restricts the listing to those relative paths (a source tree is
    recorded by its archive, not by its thousands of extracted files).
    """
    out = []
    candidates = [root / o for o in only] if only is not None else sorted(root.rglob("*"))
    for p in candidates:
        if p.is_file() and p.name != MANIFEST:
            out.append({"path": p.relative_to(root).as_posix(), "bytes": p.stat().st_size, "sha256": sha256_file(p, memo=True)})
    return out


def write_manifest(root: Path, only: list[str] | None = None, **fields: Any) -> dict[str, Any]:
    """Describe ``root`` and write its manifest; ``fields`` add provenance."""
    files = describe_files(root, only)
    manifest = {
        **fields,
        "files": files,
        "total_bytes": sum(f["bytes"] for f in files),
        "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    (root / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return manifest


def read_manifest(path: Path) -> dict[str, Any]:
    """Load a manifest given the file or its directory."""
    path = Path(path)
    if path.is_dir():
        path = path / MANIFEST
    if not path.is_file():
        raise ManifestError(f"no manifest at {path}")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ManifestError(f"manifest {path} is not valid JSON: {e}") from e


def verify(path: Path, *, memo: bool = True) -> dict[str, Any]:
    """Check every recorded file's size and sha256; raise naming the first mismatch.

    ``memo=False`` reads every byte even of files whose digest this machine already holds (``bakeoff verify``).
    """
    path = Path(path)
    root = path if path.is_dir() else path.parent
    manifest = read_manifest(path)
    for entry in manifest["files"]:
        f = root / entry["path"]
        if not f.is_file():
            raise ManifestError(f"{f}: listed in {root / MANIFEST} but missing")
        size = f.stat().st_size
        if size != entry["bytes"]:
            raise ManifestError(f"{f}: size {size} != recorded {entry['bytes']} bytes")
        digest = sha256_file(f, memo=memo)
        if digest != entry["sha256"]:
            raise ManifestError(f"{f}: sha256 {digest} != recorded {entry['sha256']} (file corrupted or replaced)")
    return manifest


def write_format_manifest(stage: Path, src: Mapping[str, Any], fmt: str, **fields: Any) -> dict[str, Any]:
    """The manifest of one model format made from the artifact whose manifest is ``src``.

    Every format-making stage records the same lineage (model, source, format); ``fields`` add how it was made.
    """
    return write_manifest(stage, kind="model-format", model=src["model"], format=fmt, source=src["source"], **fields)


def verify_command(a: argparse.Namespace) -> None:
    """``bakeoff verify PATH...``: every byte of each artifact re-hashed against its manifest."""
    for p in a.paths:
        path = Path(p)
        m = verify(path.parent if path.name == MANIFEST else path, memo=False)
        print(f"ok  {p}  ({len(m['files'])} files, {m['total_bytes']} bytes)")
