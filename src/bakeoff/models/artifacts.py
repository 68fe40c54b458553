"""Artifact directories that appear whole or not at all.

Why: a crash or Ctrl-C in the middle of a conversion must never leave a
directory that looks finished. Every stage writes into a hidden staging
directory next to its destination and renames it into place only after the
manifest is written; on failure the staging directory is removed.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from bakeoff.layout import KEPT_DIR


@contextlib.contextmanager
def staged_dir(final: Path) -> Iterator[Path]:
    """Yield an empty staging directory that replaces ``final`` on success."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    stage = final.parent / f".{final.name}.partial-{os.getpid()}"
    if stage.exists():
        shutil.rmtree(stage)
    stage.mkdir()
    try:
        yield stage
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    old = None
    if final.exists():
        old = final.parent / f".{final.name}.old-{os.getpid()}"
        final.rename(old)
    stage.rename(final)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def atomic_write_text(path: Path, text: str) -> None:
    """Write a file so readers see the old content or the new, never half of it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.partial-{os.getpid()}")
    try:
        tmp.write_text(text)
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)


def _kept(path: Path) -> Path:
    return path.parent / KEPT_DIR / path.name


def write_kept(path: Path, text: str) -> None:
    """Write a declared output and the undeclared copy a rerun reuses (Snakemake deletes the declared one first)."""
    atomic_write_text(_kept(Path(path)), text)
    atomic_write_text(Path(path), text)


def read_kept(path: Path) -> dict | None:
    """The JSON record kept for ``path`` by :func:`write_kept`, or None."""
    kept = _kept(Path(path))
    return json.loads(kept.read_text()) if kept.exists() else None


def restore_kept(path: Path) -> None:
    """Put the kept copy back at ``path``: the output of a rerun that reused it."""
    atomic_write_text(Path(path), _kept(Path(path)).read_text())
