"""A node's results come back whole however large: node.sh splits a tarball over one returned file's limit into
parts, and `bakeoff node unpack` / `record` join them.

Why: a device call brings back files of at most 16 MiB each; a capacity record's per-request files made a 25 MB
tarball that did not come back at all (runs/h100-capacity-steady-2026-12-07 was fetched by hand)."""

from __future__ import annotations

import os
import re
import subprocess
import tarfile
from pathlib import Path

import pytest

from bakeoff.errors import BakeoffError
from bakeoff.node import bundle

LIMIT = 16 * 2**20  # the device tool's limit on one returned file (its README, "Limits")


def _split_lines() -> str:
    """node.sh's lines from the collect to the split: the part that runs after Snakemake on the node."""
    text = bundle.NODE_SH
    start = text.index('python3 -m bakeoff.cli node collect')
    end = text.index("\nfi\n", start) + 4
    return text[start:end].split("\n", 1)[1]  # without the collect itself: the test makes the tarball


def _results_tree(root: Path, mib: int) -> Path:
    raw = root / "results/raw/x/m/vllm-fp16"
    raw.mkdir(parents=True)
    (raw / "c1-p8.jsonl").write_bytes(os.urandom(mib * 2**20))  # random: gzip cannot shrink it
    (root / "results/hardware.json").write_text("{}\n")
    return root


def _node_sh_tail(out: Path) -> None:
    subprocess.run(["bash", "-c", "set -e\n" + _split_lines()], env={**os.environ, "OUT": str(out)}, check=True)


def test_a_large_tarball_comes_back_in_parts_under_the_limit_and_is_joined_whole(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "snakemake.log").write_text("")
    bundle.collect(_results_tree(tmp_path / "node", 40), out / "node-results.tgz")
    original = (out / "node-results.tgz").read_bytes()
    _node_sh_tail(out)
    parts = sorted(p.name for p in out.glob("node-results.tgz.part*"))
    assert not (out / "node-results.tgz").exists() and parts == ["node-results.tgz.part0", "node-results.tgz.part1",
                                                                 "node-results.tgz.part2"]
    assert all((out / p).stat().st_size <= bundle.RETURN_PART_BYTES < LIMIT for p in parts)
    assert re.search(r"in parts node-results\.tgz\.part0 node-results\.tgz\.part1 node-results\.tgz\.part2",
                     (out / "snakemake.log").read_text())
    joined = bundle.whole(out / "node-results.tgz")
    assert joined.read_bytes() == original
    names = bundle.unpack(joined, tmp_path / "here", correct=False)
    assert "results/raw/x/m/vllm-fp16/c1-p8.jsonl" in names


def test_a_small_tarball_stays_whole(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "snakemake.log").write_text("")
    bundle.collect(_results_tree(tmp_path / "node", 1), out / "node-results.tgz")
    _node_sh_tail(out)
    assert (out / "node-results.tgz").is_file() and not list(out.glob("*.part*"))
    with tarfile.open(bundle.whole(out / "node-results.tgz")) as tar:
        assert "results/hardware.json" in tar.getnames()


def test_a_missing_part_or_tarball_is_named(tmp_path: Path) -> None:
    with pytest.raises(BakeoffError, match="no such file, and no parts"):
        bundle.whole(tmp_path / "node-results.tgz")
    for i in (0, 2):
        (tmp_path / f"node-results.tgz.part{i}").write_bytes(b"x")
    with pytest.raises(BakeoffError, match="one is missing"):
        bundle.whole(tmp_path / "node-results.tgz")
    assert not (tmp_path / "node-results.tgz").exists()
