"""A node's llama.cpp build, returned and carried to the next node (bakeoff.node.build_carry), end to end on real
files: a build cache entry stored by bakeoff.engines.buildcache as the build stage stores one, returned in parts as
node.sh --return-build writes them, packed here, received part by part by the node's own node_parts.py (a
subprocess, standard library only, as on the node), and restored by the build stage's lookup.

Only the compile is not run: the entry's files stand for its binaries (an executable, a library under two names).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from bakeoff.engines import buildcache
from bakeoff.errors import BakeoffError
from bakeoff.layout import LLAMACPP_CACHE_KIND, NODE_CACHE_DIR
from bakeoff.models.manifest import verify, write_manifest
from bakeoff.node import build_carry

MIB = 2**20
PARTS = {"kind": "llamacpp-build", "commit": "0c1e57098", "backend": "cuda90", "version": "0.3.36",
         "targets": ["llama-server"], "cmake_args": ["-DGGML_CUDA=ON"], "compilers": ["nvcc: 13.0"]}


def built_entry(cache: Path) -> tuple[str, Path]:
    """A build cache entry as the build stage leaves one: bin/ executable, lib/ with one library under two names."""
    key = buildcache.cache_key(PARTS)
    stage = cache.parent / "stage"
    (stage / "bin").mkdir(parents=True)
    (stage / "lib").mkdir()
    server = stage / "bin" / "llama-server"
    server.write_text("#!/bin/sh\necho built\n")
    server.chmod(0o755)
    lib = os.urandom(3 * MIB // 2)  # incompressible: the archive's size shows whether the copy went in twice
    (stage / "lib" / "libggml-cuda.so").write_bytes(lib)
    (stage / "lib" / "libggml-cuda.so.0").write_bytes(lib)
    write_manifest(stage, kind="llamacpp-build", commit=PARTS["commit"], cpu="a test CPU", cache_key=key,
                   cache_key_parts=PARTS)
    entry = buildcache.store(LLAMACPP_CACHE_KIND, key, stage)
    assert entry is not None
    return key, entry


def test_a_build_returned_in_parts_is_installed_part_by_part_and_restored_by_the_build_stages_lookup(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    built_on = tmp_path / "node1" / "cache"
    monkeypatch.setenv("BAKEOFF_CACHE_DIR", str(built_on))
    key, _ = built_entry(built_on)

    returned = build_carry.return_builds(built_on, tmp_path / "out", part_bytes=MIB)
    assert [p.name for p in returned] == [f"llamacpp-build-{key}.tar.xz.part{k}" for k in range(2)]
    assert sum(p.stat().st_size for p in returned) < 2 * MIB  # the library's second name is a link, not a copy

    pack = tmp_path / "node-build"
    m = build_carry.pack_build(returned[0], pack, part_bytes=MIB, part_bytes_why="test")
    assert m["install"] == {"target": f"{NODE_CACHE_DIR}/{LLAMACPP_CACHE_KIND}/{key}",
                            "untar": [f"llamacpp-build-{key}.tar.xz"]}
    assert m["cache_key"] == key and m["built_on"]["cpu"] == "a test CPU" and len(m["parts"]) == 2

    node2 = tmp_path / "node2" / "cache"
    target = node2 / LLAMACPP_CACHE_KIND / key  # the manifest's target, under this test's cache root
    for k, part in enumerate(m["parts"]):  # one call a part, as on the node
        out = subprocess.run([sys.executable, str(pack / "node_parts.py"), "receive", "--manifest",
                              str(pack / "manifest.json"), str(pack / part["name"]), "--state", str(tmp_path / "state"),
                              "--target", str(target)], capture_output=True, text=True, check=True).stdout
        assert ("installed llama.cpp build" in out) == (k == len(m["parts"]) - 1), out

    monkeypatch.setenv("BAKEOFF_CACHE_DIR", str(node2))
    stage = tmp_path / "restored"
    stage.mkdir()
    assert buildcache.restore(LLAMACPP_CACHE_KIND, key, stage) is True
    verify(stage)
    assert os.access(stage / "bin" / "llama-server", os.X_OK)
    assert (stage / "lib" / "libggml-cuda.so.0").read_bytes() == (stage / "lib" / "libggml-cuda.so").read_bytes()
    # a carried-in build is not this node's to return
    assert build_carry.built_here(node2) == []
    with pytest.raises(BakeoffError, match="no llama.cpp build made on this node"):
        build_carry.return_builds(node2, tmp_path / "out2")


def test_what_is_not_a_returned_build_is_refused_by_name(tmp_path: Path) -> None:
    other = tmp_path / "x.tar.xz"
    with tarfile.open(other, "w:xz") as tar:
        (tmp_path / "f").write_text("{}")
        tar.add(tmp_path / "f", arcname="manifest.json")
    with pytest.raises(BakeoffError, match="x.tar.xz: its manifest is not a llama.cpp build's"):
        build_carry.pack_build(other, tmp_path / "p", part_bytes=MIB, part_bytes_why="test")
    (tmp_path / "y.tar.xz").write_bytes(b"not a tarball")
    with pytest.raises(BakeoffError, match="y.tar.xz: not a returned llama.cpp build"):
        build_carry.archive_manifest(tmp_path / "y.tar.xz")


def test_a_carried_build_names_what_differs_from_the_wanted_one() -> None:
    carry = {"cache_key_parts": PARTS}
    assert build_carry.matches(carry, {**PARTS, "compilers": ["other"]}) == []  # known only on the node
    assert build_carry.matches(carry, {**PARTS, "commit": "deadbeef"}) == [
        "commit: carried '0c1e57098', wanted 'deadbeef'"]


def test_a_plan_with_a_carried_build_sends_it_before_the_prepare_and_restores_instead_of_compiling(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """h100_prefix_cache (vLLM and llama.cpp): the build's part call comes before the prepare, the background
    restores instead of compiling, and the part calls count what they measured, with no build to wait for."""
    from bakeoff.composition.compose import load_config
    from bakeoff.layout import backend_tag
    from bakeoff.node.observed import load_records
    from bakeoff.node.plan import CARRIED_PART_CALL_S, RESTORE_BUILD_S, make_plan, render

    from conftest import ROOT

    overrides = ["experiment=h100_prefix_cache", "hardware=h100"]
    cfg = load_config(overrides, ROOT / "conf")
    assert cfg.toolchain is not None
    wanted = {**PARTS, "commit": cfg.toolchain.commit, "backend": backend_tag(cfg.hardware),
              "targets": sorted(cfg.toolchain.targets), "version": cfg.toolchain.version}
    records = load_records(ROOT / "runs")

    def plan(repo: Path, use: bool = True):  # noqa: ANN202 - a Plan
        return make_plan(overrides, records=records, repo=repo, conf_dir=ROOT / "conf", use_carried_build=use)

    def packed(repo: Path, parts: dict) -> Path:
        cache = repo / "node-cache"
        monkeypatch.setenv("BAKEOFF_CACHE_DIR", str(cache))
        monkeypatch.setitem(globals(), "PARTS", parts)
        built_entry(cache)
        (returned,) = build_carry.return_builds(cache, repo / "out", part_bytes=8 * MIB)
        build_carry.pack_build(returned, repo / "build" / "node-build", part_bytes=8 * MIB, part_bytes_why="test")
        return repo

    compiled = plan(tmp_path / "none")
    repo = packed(tmp_path / "carried", wanted)
    carried = plan(repo)
    assert carried.build is not None and carried.compiled_s == pytest.approx(compiled.total_s)
    commands = [c.command for c in carried.calls]
    prepare = next(k for k, c in enumerate(commands) if " --prepare " in c)
    assert commands[:prepare] == ["bash build/node-build/node.sh --part build/node-build/part-01"]
    (restore,) = [i for j in carried.background if j.rule == "build_llamacpp" for i in j.items]
    assert restore.seconds == RESTORE_BUILD_S and "carried build" in restore.source
    vllm_parts = [c for c in carried.calls if "--part build/node-vllm/" in c.command]
    assert vllm_parts and vllm_parts[0].seconds == CARRIED_PART_CALL_S
    assert carried.total_s < compiled.total_s - 180  # the compile was the wait the first run call had
    assert "where they do not, the node compiles and the plan is" in render(carried)
    # asked for only by `bakeoff node plan`: a record's re-plan, like any other caller, compiles as its node did
    assert plan(repo, use=False).total_s == pytest.approx(compiled.total_s)
    # a build of another commit is not counted
    other = packed(tmp_path / "other", {**wanted, "commit": "deadbeef"})
    assert plan(other).build is None and plan(other).total_s == pytest.approx(compiled.total_s)


def test_node_sh_return_build_writes_the_nodes_own_build_into_out_and_names_a_missing_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The real node.sh and bakeoff's own CLI from a bundle's repo.tgz (its src/ as packed), on a stand-in node."""
    from test_node_prepare import stand_in_bundle

    from conftest import ROOT

    bundle, env = stand_in_bundle(tmp_path, "rule node:\n    input: []\n", src=ROOT / "src")
    cache, out = tmp_path / "node-cache", tmp_path / "out"
    env["BAKEOFF_CACHE_DIR"] = str(cache)
    none = subprocess.run(["bash", str(bundle / "node.sh"), "--return-build"], env=env, capture_output=True, text=True,
                          timeout=120)
    assert none.returncode != 0 and "no llama.cpp build made on this node" in none.stderr, none.stdout + none.stderr
    monkeypatch.setenv("BAKEOFF_CACHE_DIR", str(cache))
    key, _ = built_entry(cache)
    ran = subprocess.run(["bash", str(bundle / "node.sh"), "--return-build"], env=env, capture_output=True, text=True,
                         timeout=120)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert build_carry.archive_manifest(out / f"llamacpp-build-{key}.tar.xz")["cache_key"] == key
    assert "bakeoff node pack --build" in ran.stdout
