"""The build cache: an entry is used only when its key and every file's sha256 match; otherwise rebuilt.

The fast tests drive bakeoff.engines.buildcache on real artifact directories (real manifests, real sha256). The
slow ones check the pipeline's own toolchain: recorded with its key, and restored from the cache by the
real build stage on a fresh output directory without compiling.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from bakeoff.engines import buildcache
from bakeoff.models.manifest import read_manifest, write_manifest

from conftest import bakeoff


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("BAKEOFF_CACHE_DIR", str(root))
    return root


def _artifact(path: Path, key: str, payload: bytes = b"\x7fELF built") -> Path:
    (path / "bin").mkdir(parents=True)
    (path / "bin" / "tool").write_bytes(payload)
    write_manifest(path, kind="test-build", cache_key=key)
    return path


def test_cache_location_follows_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("BAKEOFF_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert buildcache.cache_root() == tmp_path / "bakeoff"
    monkeypatch.setenv("BAKEOFF_CACHE_DIR", "off")
    assert buildcache.cache_root() is None


def test_key_changes_with_every_part() -> None:
    base = {"commit": "0c1e57098", "backend": "cpu", "cmake_args": ["-DA=ON"], "compilers": ["c++: g++ 12"]}
    keys = {buildcache.cache_key(base)}
    for change in ({"commit": "deadbeef"}, {"backend": "cuda90"}, {"cmake_args": ["-DA=OFF"]},
                   {"compilers": ["c++: g++ 13"]}):
        keys.add(buildcache.cache_key({**base, **change}))
    assert len(keys) == 5
    assert buildcache.cache_key(dict(reversed(list(base.items())))) == buildcache.cache_key(base)


def test_empty_cache_restores_nothing_then_a_stored_entry_is_reused(cache: Path, tmp_path: Path) -> None:
    stage = tmp_path / "stage"
    stage.mkdir()
    assert buildcache.restore("llamacpp", "k1", stage) is False and not any(stage.iterdir())
    built = _artifact(tmp_path / "built", "k1")
    entry = buildcache.store("llamacpp", "k1", built)
    assert entry == cache / "llamacpp" / "k1"
    assert buildcache.restore("llamacpp", "k1", stage) is True
    assert (stage / "bin" / "tool").read_bytes() == b"\x7fELF built"
    assert read_manifest(stage)["cache_key"] == "k1"
    assert not [p for p in entry.parent.iterdir() if p.name.startswith(".")]  # no staging leftovers


def test_a_corrupted_entry_is_discarded_never_used(cache: Path, tmp_path: Path) -> None:
    buildcache.store("llamacpp", "k1", _artifact(tmp_path / "built", "k1"))
    tool = cache / "llamacpp" / "k1" / "bin" / "tool"
    tool.write_bytes(b"\x7fELF BUILT")  # same size, other bytes
    stage = tmp_path / "stage"
    stage.mkdir()
    assert buildcache.restore("llamacpp", "k1", stage) is False
    assert not (cache / "llamacpp" / "k1").exists() and not any(stage.iterdir())


def test_an_entry_recording_another_key_is_discarded(cache: Path, tmp_path: Path) -> None:
    buildcache.store("llamacpp", "k1", _artifact(tmp_path / "built", "k1"))
    (cache / "llamacpp" / "k1").rename(cache / "llamacpp" / "k2")  # an entry filed under the wrong key
    stage = tmp_path / "stage"
    stage.mkdir()
    assert buildcache.restore("llamacpp", "k2", stage) is False
    assert not (cache / "llamacpp" / "k2").exists()


def test_storing_refuses_an_artifact_of_another_key(cache: Path, tmp_path: Path) -> None:
    with pytest.raises(Exception, match="does not record cache key"):
        buildcache.store("llamacpp", "k2", _artifact(tmp_path / "built", "k1"))
    assert not (cache / "llamacpp" / "k2").exists()


@pytest.mark.slow
def test_the_build_stage_restores_the_pipelines_toolchain_without_compiling(toolchain: Path, cache: Path,
                                                                            tmp_path: Path) -> None:
    """A fresh output directory on a machine that built before: the real stage reuses the cache entry."""
    m = read_manifest(toolchain)
    assert m["cache_key"] == buildcache.cache_key(m["cache_key_parts"])
    buildcache.store("llamacpp", m["cache_key"], toolchain)  # what the pipeline's build stored in its cache
    from bakeoff.composition.compose import load_config

    cfg = load_config([])
    src = next(p for p in toolchain.parent.iterdir() if p.name.startswith("src-"))
    out = tmp_path / "build" / toolchain.name
    t0 = time.monotonic()
    proc = bakeoff("stage", "build-llamacpp", "--spec", cfg.engines["llamacpp"].toolchain.model_dump_json(),
                   "--hardware", cfg.hardware.model_dump_json(), "--input", str(src / "manifest.json"),
                   "--out", str(out / "manifest.json"), env={"BAKEOFF_CACHE_DIR": str(cache)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "build cache: reused" in proc.stderr and "cmake" not in proc.stderr.split("build cache: reused")[0]
    assert time.monotonic() - t0 < 120  # a compile takes minutes on this machine
    assert read_manifest(out)["cache_key"] == m["cache_key"]
    assert json.loads((out / "manifest.json").read_text())["files"] == m["files"]
    assert os.access(out / "bin" / "llama-server", os.X_OK)
