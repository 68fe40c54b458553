"""A node's llama.cpp CUDA build, brought back once and carried to later nodes, so they skip the compile.

Why: the build takes about 5 minutes of a node's 16 CPUs (runs/h100-seed-2026-12-06: 293 s wall, 732 CPU-s), the
largest share of a llama.cpp record's plan after its cells, and every node starts bare. A finished build is a
build cache entry (bakeoff.engines.buildcache): its files and a manifest with the key of everything that made it
(source commit, cmake arguments with the CPU's instruction sets, targets, compilers). So:

* on the node that built it, ``node.sh --return-build`` writes each entry it built (not one carried in) as
  ``llamacpp-build-<key>.tar.xz`` into ``$OUT``, in parts where one returned file cannot hold it
  (:func:`return_builds`). Files with the same bytes (``libggml-cuda.so`` and its two version names are three
  copies of 70 MB) go in once, the others as hard links;
* here, ``bakeoff node pack --build <that file>`` makes it a carried payload (bakeoff.node.parts), installed on
  the next node into the entry the build stage looks for (``NODE_CACHE_DIR/llamacpp/<key>``) (:func:`pack_build`);
* the build stage there then finds the entry only where the node computes the same key: the same CPU instruction
  sets and compilers. Its hashes are checked before use (buildcache.restore). Anything else builds as before.

The plan (bakeoff.node.plan) counts the carried build's part calls and a restore instead of the compile, and says
on what condition.
"""

from __future__ import annotations

import json
import tarfile
from pathlib import Path
from typing import Any

from bakeoff.errors import BakeoffError
from bakeoff.layout import LLAMACPP_CACHE_KIND, NODE_BUILD_DIR, NODE_CACHE_DIR
from bakeoff.models.manifest import MANIFEST, verify
from bakeoff.node import parts as node_parts
from bakeoff.node.bundle import PART_SUFFIX, RETURN_PART_BYTES, whole
from bakeoff.node.payload import pack_payload

ARCHIVE = "llamacpp-build-{key}.tar.xz"
RETURN_LIMIT = 64 * 2**20  # what one call can bring back in all
MAX_RETURN_FILES = 8


def archive_entry(entry: Path, out: Path) -> Path:
    """``entry`` (a verified build cache entry) as an xz tarball at ``out``: each distinct file once, a file with
    the same bytes as one already in as a hard link to it. No times or owners: the same build, the same bytes."""
    manifest = verify(entry)
    if manifest.get("cache_key") != entry.name:
        raise BakeoffError(f"{entry}: its manifest records key {manifest.get('cache_key')!r}, not its folder's name")
    first: dict[str, str] = {}
    tmp = out.with_name(out.name + ".tmp")
    with tarfile.open(tmp, "w:xz", format=tarfile.PAX_FORMAT) as tar:
        for rel in sorted(p.relative_to(entry).as_posix() for p in entry.rglob("*") if p.is_file()):
            if rel == node_parts.INSTALLED_MARK:
                continue
            path = entry / rel
            ti = tar.gettarinfo(str(path), arcname=rel)
            ti.mtime, ti.uid, ti.gid, ti.uname, ti.gname = 0, 0, 0, "", ""
            digest = node_parts.sha256_file(path)
            if digest in first:
                ti.type, ti.linkname, ti.size = tarfile.LNKTYPE, first[digest], 0
                tar.addfile(ti)
            else:
                first[digest] = rel
                with open(path, "rb") as f:
                    tar.addfile(ti, f)
    tmp.replace(out)
    return out


def split_file(path: Path, part_bytes: int) -> list[Path]:
    """``path`` as ``path.part0..N`` of at most ``part_bytes`` each (bundle.whole joins them), or itself if it fits."""
    size = path.stat().st_size
    if size <= part_bytes:
        return [path]
    out = []
    with open(path, "rb") as f:
        k = 0
        while block := f.read(part_bytes):
            part = path.with_name(f"{path.name}{PART_SUFFIX}{k}")
            part.write_bytes(block)
            out.append(part)
            k += 1
    path.unlink()
    return out


def built_here(cache_root: Path) -> list[Path]:
    """The llama.cpp entries of the cache that this machine built: not installed from a carried payload."""
    root = cache_root / LLAMACPP_CACHE_KIND
    if not root.is_dir():
        return []
    return sorted(e for e in root.iterdir() if (e / MANIFEST).is_file() and not (e / node_parts.INSTALLED_MARK).exists())


def return_builds(cache_root: Path, out: Path, part_bytes: int = RETURN_PART_BYTES) -> list[Path]:
    """Each entry built here as an archive under ``out`` (in parts where needed); what one call can bring back, or
    an error naming what would not fit."""
    entries = built_here(cache_root)
    if not entries:
        raise BakeoffError(f"no llama.cpp build made on this node in {cache_root / LLAMACPP_CACHE_KIND} (one carried "
                           "in is not returned): run the build first (node.sh --prepare, then a run call)")
    out.mkdir(parents=True, exist_ok=True)
    files: list[Path] = []
    for entry in entries:
        files += split_file(archive_entry(entry, out / ARCHIVE.format(key=entry.name)), part_bytes)
    total = sum(f.stat().st_size for f in files)
    if total > RETURN_LIMIT or len(files) > MAX_RETURN_FILES:
        raise BakeoffError(f"the build archives come to {total / 2**20:.1f} MiB in {len(files)} files: more than one "
                           f"call brings back ({RETURN_LIMIT / 2**20:.0f} MiB, {MAX_RETURN_FILES} files)")
    return files


def archive_manifest(archive: Path) -> dict[str, Any]:
    """The build manifest inside a returned archive (its ``manifest.json`` member)."""
    try:
        with tarfile.open(archive) as tar:
            member = tar.extractfile(MANIFEST)
            if member is None:
                raise KeyError(MANIFEST)
            m = json.loads(member.read())
    except (tarfile.TarError, KeyError, OSError, json.JSONDecodeError) as e:
        raise BakeoffError(f"{archive}: not a returned llama.cpp build ({type(e).__name__}: {e})") from None
    if m.get("kind") != "llamacpp-build" or not m.get("cache_key"):
        raise BakeoffError(f"{archive}: its manifest is not a llama.cpp build's with a cache key (kind "
                           f"{m.get('kind')!r})")
    return m


def pack_build(archive: Path, out: Path, part_bytes: int, part_bytes_why: str) -> dict:
    """A returned build (``archive``, or its first part) as a carried payload under ``out``, installed on the node
    as the build cache entry of its key. Returns the payload's manifest."""
    stem, dot_part, k = archive.name.rpartition(PART_SUFFIX)
    joined = whole(archive.with_name(stem) if dot_part and k.isdigit() else archive)
    build = archive_manifest(joined)
    key = build["cache_key"]
    name = ARCHIVE.format(key=key)
    return pack_payload(
        out=out, package="llama.cpp build", version=str(build.get("commit")), members=[(name, joined)],
        install={"target": f"{NODE_CACHE_DIR}/{LLAMACPP_CACHE_KIND}/{key}", "untar": [name]},
        part_bytes=part_bytes, part_bytes_why=part_bytes_why,
        extra={"cache_key": key, "cache_key_parts": build.get("cache_key_parts", {}),
               "built_on": {"cpu": build.get("cpu"), "created_utc": build.get("created_utc"),
                            "version_text": build.get("version_text")},
               "archive_bytes": joined.stat().st_size})


def carried(repo: Path) -> dict[str, Any] | None:
    """The carried build packed here (``NODE_BUILD_DIR``'s manifest), or None."""
    path = repo / NODE_BUILD_DIR / node_parts.MANIFEST_NAME
    return node_parts.read_manifest(path) if path.is_file() else None


def matches(carry: dict[str, Any], wanted: dict[str, Any]) -> list[str]:
    """Where a carried build's key parts differ from the wanted build's, in what this machine can know (the
    commit, backend, targets and version; the node's instruction sets and compilers are known only there)."""
    have = carry.get("cache_key_parts", {})
    return [f"{k}: carried {have.get(k)!r}, wanted {wanted.get(k)!r}" for k in ("commit", "backend", "targets",
                                                                            "version") if have.get(k) != wanted.get(k)]
