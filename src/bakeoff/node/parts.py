"""A payload too large for one call to the GPU node, carried in parts and installed there once all have come.

Why: a call to the GPU node carries at most 64 MiB, but what one call leaves
in ``/tmp`` stays while the node is warm. So a payload (vLLM's wheel and the
wheels it needs) is split here into parts of a set size, each with its
sha256, under one manifest; each warm call carries one part, and the node
keeps it. Only when every part has come is the payload put together, checked
against the manifest's sha256, and installed into a fresh folder that replaces
the target in one rename: a missing or corrupted part installs nothing. A part
that comes twice is taken once. The manifest's ``install`` says what goes into the target:
``pip_no_deps`` wheels (pip install --no-index --no-deps --target), ``unzip`` wheels (extracted as they are),
``copy`` files (kept at their payload path, e.g. a wheel that a later step installs itself) and ``untar`` archives
(extracted into the target with their modes and hard links, e.g. a llama.cpp build).

This file is standard-library only: ``node.sh`` runs it with the node's own
``python3`` (``python3 node_parts.py receive ...``) before anything is
installed there, so ``bakeoff node pack`` copies it beside ``node.sh``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from collections.abc import Iterable, Sequence
from pathlib import Path

MANIFEST_NAME = "manifest.json"
PART_NAME = "part-{:02d}"
# What a finished install holds at its root: the manifest's payload sha256, so a second install is a no-op.
INSTALLED_MARK = ".bakeoff-carry.json"
CHUNK = 1 << 20


class CarryError(Exception):
    """A part or payload that cannot be used; the message names it."""


def sha256_file(path: Path) -> str:
    """bakeoff.models.manifest.sha256_file without its memo: this file runs alone on the node (module docstring)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            h.update(block)
    return h.hexdigest()


def _atomic_copy(src: Path, dest: Path) -> None:
    tmp = dest.with_name(f".{dest.name}.tmp{os.getpid()}")
    shutil.copyfile(src, tmp)
    os.replace(tmp, dest)


# --------------------------------------------------------------------------- here: split
def split(payload: Path, out_dir: Path, part_bytes: int) -> list[dict]:
    """Cut ``payload`` into ``out_dir/part-01 ...`` of at most ``part_bytes`` each; returns name, bytes, sha256."""
    if part_bytes < 1:
        raise CarryError(f"part size must be positive, not {part_bytes}")
    out_dir.mkdir(parents=True, exist_ok=True)
    for old in out_dir.glob("part-*"):
        old.unlink()
    parts = []
    with open(payload, "rb") as f:
        while True:
            name = PART_NAME.format(len(parts) + 1)
            tmp = out_dir / f".{name}.tmp"
            h, n = hashlib.sha256(), 0
            with open(tmp, "wb") as out:
                while n < part_bytes and (block := f.read(min(CHUNK, part_bytes - n))):
                    out.write(block)
                    h.update(block)
                    n += len(block)
            if n == 0:
                tmp.unlink()
                break
            os.replace(tmp, out_dir / name)
            parts.append({"name": name, "bytes": n, "sha256": h.hexdigest()})
    return parts


# --------------------------------------------------------------------------- the node: receive, assemble, install
def read_manifest(path: Path) -> dict:
    try:
        m = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise CarryError(f"{path}: cannot read the parts' manifest ({e})") from None
    for key in ("payload", "parts", "install"):
        if key not in m:
            raise CarryError(f"{path}: not a parts manifest (no {key!r})")
    return m


def _state(manifest: dict, state_root: Path) -> Path:
    """Where this payload's parts are kept: one folder per payload, so parts of two payloads never mix."""
    return state_root / manifest["payload"]["sha256"][:16]


def receive(manifest: dict, parts: Iterable[Path], state_root: Path) -> list[str]:
    """Check each part against the manifest and keep it; returns one line per part saying what was done.

    A part whose name the manifest does not list, or whose bytes differ from the manifest's sha256, is an
    error naming it, and nothing of that call is kept. A part already kept with the same bytes is skipped.
    """
    expected = {p["name"]: p for p in manifest["parts"]}
    checked = []
    for part in parts:
        part = Path(part)
        want = expected.get(part.name)
        if want is None:
            raise CarryError(f"{part}: not a part of this payload (the manifest lists {sorted(expected)})")
        if not part.is_file():
            raise CarryError(f"{part.name}: not found at {part}")
        size, digest = part.stat().st_size, sha256_file(part)
        if size != want["bytes"] or digest != want["sha256"]:
            raise CarryError(f"{part.name} is corrupted: {size} bytes, sha256 {digest}; the manifest says "
                             f"{want['bytes']} bytes, sha256 {want['sha256']}. Send {part.name} again")
        checked.append(part)
    kept = _state(manifest, state_root) / "parts"
    kept.mkdir(parents=True, exist_ok=True)
    lines = []
    for part in checked:
        dest = kept / part.name
        if dest.is_file() and dest.stat().st_size == expected[part.name]["bytes"] and \
                sha256_file(dest) == expected[part.name]["sha256"]:
            lines.append(f"{part.name}: already here, sent twice; kept the first copy")
            continue
        _atomic_copy(part, dest)
        lines.append(f"{part.name}: received ({expected[part.name]['bytes']} bytes, sha256 ok)")
    return lines


def missing(manifest: dict, state_root: Path) -> list[str]:
    kept = _state(manifest, state_root) / "parts"
    return [p["name"] for p in manifest["parts"] if not (kept / p["name"]).is_file()]


def installed(manifest: dict, target: Path) -> bool:
    try:
        mark = json.loads((target / INSTALLED_MARK).read_text())
    except (OSError, json.JSONDecodeError):
        return False
    return mark.get("payload_sha256") == manifest["payload"]["sha256"]


def assemble(manifest: dict, state_root: Path, dest: Path) -> None:
    """Append the kept parts in order into ``dest``, checking each part and then the whole against the manifest."""
    if gone := missing(manifest, state_root):
        raise CarryError(f"cannot install: {len(gone)} of {len(manifest['parts'])} parts have not come: "
                         f"{', '.join(gone)}. Send them, then run this again")
    kept = _state(manifest, state_root) / "parts"
    whole = hashlib.sha256()
    with open(dest, "wb") as out:
        for p in manifest["parts"]:
            h = hashlib.sha256()
            with open(kept / p["name"], "rb") as f:
                while block := f.read(CHUNK):
                    h.update(block)
                    whole.update(block)
                    out.write(block)
            if h.hexdigest() != p["sha256"]:
                (kept / p["name"]).unlink()
                raise CarryError(f"{p['name']} is corrupted on the node (sha256 {h.hexdigest()}, manifest "
                                 f"{p['sha256']}); removed it. Send {p['name']} again")
    if whole.hexdigest() != manifest["payload"]["sha256"]:
        raise CarryError(f"the assembled payload's sha256 {whole.hexdigest()} is not the manifest's "
                         f"{manifest['payload']['sha256']}: the parts belong to another pack")


def install(manifest: dict, state_root: Path, target: Path, python: str = sys.executable) -> str:
    """Assemble, then install into a fresh folder that replaces ``target`` in one rename; nothing on failure."""
    if installed(manifest, target):
        return f"already installed in {target}"
    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".carry-", dir=target.parent))
    try:
        payload = work / "payload.tar"
        assemble(manifest, state_root, payload)
        files = work / "files"
        with tarfile.open(payload) as tar:
            tar.extractall(files, filter="data")
        payload.unlink()
        site = work / "site"
        site.mkdir()
        wheels = [str(files / w) for w in manifest["install"].get("pip_no_deps", [])]
        if wheels:
            proc = subprocess.run([python, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                                   "--no-cache-dir", "--disable-pip-version-check", "--target", str(site), *wheels],
                                  capture_output=True, text=True)
            if proc.returncode != 0:
                raise CarryError(f"pip install --no-deps --target failed (exit {proc.returncode}):\n"
                                 f"{(proc.stdout + proc.stderr)[-3000:]}")
        for w in manifest["install"].get("unzip", []):
            with zipfile.ZipFile(files / w) as z:
                z.extractall(site)
        for t in manifest["install"].get("untar", []):  # an archive of a tree: executables stay executable
            with tarfile.open(files / t) as z:
                z.extractall(site, filter="data")
        for c in manifest["install"].get("copy", []):  # files kept as they are, at their payload path in the site
            (site / c).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(files / c, site / c)
        (site / INSTALLED_MARK).write_text(json.dumps({
            "payload_sha256": manifest["payload"]["sha256"], "package": manifest.get("package"),
            "version": manifest.get("version"), "installed_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }, indent=2) + "\n")
        old = None
        if target.exists():
            old = work / "old"
            os.replace(target, old)
        os.replace(site, target)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return f"installed {manifest.get('package')} {manifest.get('version')} into {target}"


def receive_and_install(manifest_path: Path, parts: Sequence[Path], state_root: Path, target: Path | None,
                        python: str = sys.executable) -> list[str]:
    """What ``node.sh --part`` does: keep the parts that came; install once none is missing."""
    m = read_manifest(manifest_path)
    lines = receive(m, parts, state_root)
    tgt = Path(target or m["install"]["target"])
    gone = missing(m, state_root)
    if gone:
        lines.append(f"waiting for {len(gone)} of {len(m['parts'])} parts: {', '.join(gone)}; nothing installed yet")
        return lines
    lines.append(install(m, state_root, tgt, python))
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="node_parts.py", description=__doc__.splitlines()[0])
    p.add_argument("action", choices=["receive", "status"])
    p.add_argument("parts", nargs="*", type=Path, help="receive: part files that came with this call")
    p.add_argument("--manifest", required=True, type=Path)
    p.add_argument("--state", type=Path, default=Path(os.environ.get("BAKEOFF_PARTS_DIR", "/tmp/bakeoff-parts")),
                   help="where parts are kept between calls (default $BAKEOFF_PARTS_DIR or /tmp/bakeoff-parts)")
    p.add_argument("--target", type=Path, default=None, help="install folder (default: the manifest's)")
    a = p.parse_intermixed_args(argv)
    try:
        if a.action == "receive":
            lines = receive_and_install(a.manifest, a.parts, a.state, a.target)
        else:
            m = read_manifest(a.manifest)
            tgt = Path(a.target or m["install"]["target"])
            gone = missing(m, a.state)
            lines = [f"installed in {tgt}" if installed(m, tgt) else "not installed",
                     f"missing parts: {', '.join(gone) or 'none'}"]
    except CarryError as e:
        print(f"node_parts: error: {e}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
