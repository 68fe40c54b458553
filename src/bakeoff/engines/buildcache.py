"""A build cache outside the clone, so a fresh checkout on a machine that built before skips the compile.

A compiled toolchain depends on the source commit, the backend, the cmake
arguments, the targets and the compilers, and on nothing else we control; the
cache key is a hash of exactly those. An entry is a finished artifact
directory with its manifest (sha256 of every file). It is used only when its
recorded key equals the wanted key and every file still matches its hash;
anything else is deleted and rebuilt, never used. Entries appear atomically
(staged, then renamed), so a build killed half-way leaves no entry.

Location: ``$BAKEOFF_CACHE_DIR``, else ``$XDG_CACHE_HOME/bakeoff``, else
``~/.cache/bakeoff``. ``BAKEOFF_CACHE_DIR=off`` disables it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from bakeoff.errors import ManifestError
from bakeoff.layout import cache_root
from bakeoff.models.manifest import MANIFEST, read_manifest, verify

KEY_FIELD = "cache_key"


def tool_identity(*commands: list[str]) -> list[str]:
    """The first line each compiler or tool prints for ``--version`` (a new compiler is a new key)."""
    out = []
    for cmd in commands:
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
            text = (proc.stdout or proc.stderr).strip().splitlines()
            out.append(f"{cmd[0]}: {text[0] if text else 'no output'}")
        except (OSError, subprocess.TimeoutExpired) as e:
            out.append(f"{cmd[0]}: unavailable ({type(e).__name__})")
    return out


def cache_key(parts: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:32]


def _entry(kind: str, key: str) -> Path | None:
    root = cache_root()
    return None if root is None else root / kind / key


def restore(kind: str, key: str, stage: Path) -> bool:
    """Copy a valid entry into ``stage`` (an empty staging directory); False when there is none."""
    entry = _entry(kind, key)
    if entry is None or not (entry / MANIFEST).is_file():
        return False
    try:
        manifest = verify(entry)
        if manifest.get(KEY_FIELD) != key:
            raise ManifestError(f"{entry} records key {manifest.get(KEY_FIELD)!r}, wanted {key!r}")
    except ManifestError as e:
        print(f"build cache: discarding {entry}: {e}", file=sys.stderr, flush=True)
        shutil.rmtree(entry, ignore_errors=True)
        return False
    shutil.copytree(entry, stage, dirs_exist_ok=True)
    print(f"build cache: reused {entry}", file=sys.stderr, flush=True)
    return True


def store(kind: str, key: str, built: Path) -> Path | None:
    """Put a finished artifact directory (whose manifest records ``key``) into the cache; best effort."""
    entry = _entry(kind, key)
    if entry is None:
        return None
    if read_manifest(built).get(KEY_FIELD) != key:
        raise ManifestError(f"{built} does not record cache key {key}")
    tmp = entry.parent / f".{key}.partial-{os.getpid()}"
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(built, tmp)
        shutil.rmtree(entry, ignore_errors=True)
        tmp.rename(entry)
    except OSError as e:  # a full or read-only cache never fails the build
        print(f"build cache: not stored ({e})", file=sys.stderr, flush=True)
        shutil.rmtree(tmp, ignore_errors=True)
        return None
    print(f"build cache: stored {entry}", file=sys.stderr, flush=True)
    return entry
