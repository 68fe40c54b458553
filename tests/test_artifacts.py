"""Manifests, atomic artifact directories and CPU build flags (no tools needed)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from bakeoff.errors import ManifestError
from bakeoff.hardware.cpuflags import ggml_cmake_flags, read_cpu_flags
from bakeoff.models import manifest
from bakeoff.models.artifacts import staged_dir
from bakeoff.models.manifest import read_manifest, verify, write_manifest


def _make(root: Path) -> Path:
    (root / "sub").mkdir(parents=True)
    (root / "a.bin").write_bytes(b"\x00" * 1000)
    (root / "sub" / "b.txt").write_text("hello")
    write_manifest(root, kind="test", model="m")
    return root


def test_manifest_records_and_verifies(tmp_path: Path) -> None:
    root = _make(tmp_path / "art")
    m = verify(root)
    assert [f["path"] for f in m["files"]] == ["a.bin", "sub/b.txt"]
    assert m["total_bytes"] == 1005
    assert m["files"][1]["sha256"] == "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"


def test_corrupted_file_is_named(tmp_path: Path) -> None:
    root = _make(tmp_path / "art")
    data = bytearray((root / "a.bin").read_bytes())
    data[500] ^= 0xFF  # same size, different content
    (root / "a.bin").write_bytes(bytes(data))
    with pytest.raises(ManifestError, match=r"a\.bin: sha256 .* \(file corrupted or replaced\)"):
        verify(root)


def test_missing_and_truncated_files_are_named(tmp_path: Path) -> None:
    root = _make(tmp_path / "art")
    (root / "a.bin").write_bytes(b"\x00" * 10)
    with pytest.raises(ManifestError, match=r"a\.bin: size 10 != recorded 1000"):
        verify(root)
    (root / "sub" / "b.txt").unlink()
    (root / "a.bin").write_bytes(b"\x00" * 1000)
    with pytest.raises(ManifestError, match=r"b\.txt: listed in .* but missing"):
        verify(root)


def test_a_large_file_is_hashed_once_per_machine_until_it_changes(tmp_path: Path, monkeypatch) -> None:
    """The digest memo: a stage's verify takes a large file's sha256 from the memo while its inode, size,
    mtime and ctime are unchanged; a same-size rewrite with the mtime set back is still read again (its
    ctime moved); ``bakeoff verify`` (memo=False) reads every byte. a.bin is "large" here (threshold 1000)."""
    monkeypatch.setenv("BAKEOFF_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(manifest, "MEMO_MIN_BYTES", 1000)
    root = _make(tmp_path / "art")
    slots = list((tmp_path / "cache" / "sha256").glob("*.json"))
    assert len(slots) == 1 and json.loads(slots[0].read_text())["path"] == str((root / "a.bin").resolve())

    rec = json.loads(slots[0].read_text())  # the memo is what verify consults: a wrong digest in it shows
    slots[0].write_text(json.dumps({**rec, "sha256": "0" * 64}))
    with pytest.raises(ManifestError, match=r"a.bin: sha256 0{64} != recorded"):
        verify(root)
    assert verify(root, memo=False)["total_bytes"] == 1005
    slots[0].write_text(json.dumps(rec))
    verify(root)

    time.sleep(0.05)  # past the kernel's timestamp tick
    st = (root / "a.bin").stat()
    (root / "a.bin").write_bytes(b"\x01" * 1000)  # same size
    os.utime(root / "a.bin", ns=(st.st_atime_ns, st.st_mtime_ns))  # mtime set back; ctime cannot be
    with pytest.raises(ManifestError, match="a.bin: sha256 .* != recorded"):
        verify(root)


def test_no_manifest_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ManifestError, match="no manifest"):
        read_manifest(tmp_path)


def test_staged_dir_leaves_nothing_on_failure(tmp_path: Path) -> None:
    final = tmp_path / "out"
    with pytest.raises(RuntimeError), staged_dir(final) as stage:
        (stage / "half.bin").write_bytes(b"x")
        raise RuntimeError("boom")
    assert not final.exists()
    assert list(tmp_path.iterdir()) == []


def test_staged_dir_replaces_previous_output_whole(tmp_path: Path) -> None:
    final = tmp_path / "out"
    final.mkdir()
    (final / "stale.bin").write_bytes(b"old")
    with staged_dir(final) as stage:
        (stage / "new.bin").write_bytes(b"new")
    assert sorted(p.name for p in final.iterdir()) == ["new.bin"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_cpu_flags_never_enable_native_or_amx(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fma sse4_2 avx avx2 f16c bmi2 amx_tile amx_int8 amx_bf16\n")
    args = ggml_cmake_flags(read_cpu_flags(info))
    assert "-DGGML_NATIVE=OFF" in args
    assert "-DGGML_AVX2=ON" in args
    assert "-DGGML_AVX512=OFF" in args  # not listed, so not compiled in
    assert all(a.endswith("=OFF") for a in args if "AMX" in a)


def test_cpu_flags_of_this_machine_are_a_subset_of_what_it_reports() -> None:
    flags = read_cpu_flags()
    args = ggml_cmake_flags(flags)
    if "-DGGML_AVX512=ON" in args:
        assert {"avx512f", "avx512bw", "avx512vl"} <= flags
    if "-DGGML_AVX2=ON" in args:
        assert "avx2" in flags
