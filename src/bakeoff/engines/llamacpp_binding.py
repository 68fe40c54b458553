"""The llama.cpp scorer binding as a carried wheel: how it is built from the pinned sdist and checked on arrival.

Two routes to the same files, and the manifest's ``binding_route`` says which:

* ``sdist``: ``pip install`` of the source tree's ``source.tar.gz`` (wherever the tree has it).
* ``carried wheel``: on a GPU node of the node route. Why: the bundle's trimmed tree leaves out the 76 MB sdist
  (over a call's 64 MiB beside the working tree), and the node's pip has no network for the build isolation
  it would need anyway. With ``LLAMA_BUILD=OFF`` the package is Python only (CMake compiles nothing), so the
  wheel :func:`build_wheel` makes here, at pack time, from the same verified sdist holds the files the node's
  own install would have; it travels in the quality payload (bakeoff.node.quality) with :func:`provenance`,
  and :func:`carried_binding` installs it only where that provenance names the sdist sha256 the trimmed tree
  was cut from (``trimmed_from_sha256`` of its manifest), the pinned commit and version, and the wheel's own
  sha256. A wheel built from another sdist is refused, naming both digests.

Why this lives among the engines and not in the stage: both the stage (bakeoff.stages.build_llamacpp_python,
which installs it) and the node route's packer (bakeoff.node.quality, which builds and carries it) need it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path

from bakeoff.errors import ToolchainError
from bakeoff.layout import BINDING_PROVENANCE, SOURCE_ARCHIVE
from bakeoff.models.manifest import sha256_file, verify

BINDING_CMAKE_ARGS = ["-DLLAMA_BUILD=OFF", "-DLLAVA_BUILD=OFF"]  # the Python package only: no C++ compiled here
ROUTE_SDIST = "sdist"
ROUTE_WHEEL = "carried wheel"
# Files a Python-only wheel never holds: one of them means CMake compiled something, and the wheel would carry
# another libllama than the toolchain's.
NATIVE_SUFFIXES = (".so", ".dylib", ".dll", ".a", ".pyd")


def sdist_sha256(src: dict) -> str | None:
    """The sha256 of the sdist a source tree's manifest comes from: its own ``source.tar.gz``, or the one a
    trimmed tree was cut from (bakeoff.node.bundle.trim_source)."""
    own = next((f["sha256"] for f in src.get("files", []) if f["path"] == SOURCE_ARCHIVE), None)
    return own or src.get("trimmed_from_sha256")


def build_wheel(source_dir: Path, dest: Path) -> Path:
    """``pip wheel --no-deps`` of the verified tree's sdist with :data:`BINDING_CMAKE_ARGS` into ``dest``: the
    binding as the sdist route installs it, as one Python-only wheel (a native file in it is an error)."""
    verify(source_dir)
    dest.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "CMAKE_ARGS": " ".join(BINDING_CMAKE_ARGS), "FORCE_CMAKE": "1"}
    cmd = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-cache-dir", "--disable-pip-version-check",
           "-w", str(dest), str(source_dir / SOURCE_ARCHIVE)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise ToolchainError(f"building the binding wheel failed ({proc.returncode}):\n{(proc.stdout + proc.stderr)[-2000:]}")
    wheels = sorted(dest.glob("llama_cpp_python-*.whl"))
    if len(wheels) != 1:
        raise ToolchainError(f"pip wheel left {[w.name for w in wheels]} in {dest}, not one llama_cpp_python wheel")
    check_python_only(wheels[0])
    return wheels[0]


def check_python_only(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as z:
        native = [n for n in z.namelist() if n.endswith(NATIVE_SUFFIXES) or ".so." in n]
    if native:
        raise ToolchainError(f"{wheel.name} holds native files {native[:5]}: built with {BINDING_CMAKE_ARGS} it "
                             "should hold Python only (the toolchain's libllama is the one it loads)")


def provenance(wheel: Path, src: dict) -> dict:
    """What travels beside a carried binding wheel: the sdist, commit and version it was built from, and itself."""
    return {"package": src.get("package"), "version": src.get("version"), "commit": src.get("commit"),
            "sdist_sha256": sdist_sha256(src), "cmake_args": BINDING_CMAKE_ARGS, "wheel": wheel.name,
            "wheel_sha256": sha256_file(wheel), "built_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def carried_binding(binding_dir: Path, src: dict, source_dir: Path) -> tuple[Path, dict]:
    """The carried wheel and its provenance, once the provenance matches the source tree's manifest ``src``."""
    path = binding_dir / BINDING_PROVENANCE
    if not path.is_file():
        raise ToolchainError(f"{source_dir} has no {SOURCE_ARCHIVE} (the node route's trimmed tree) and no binding "
                             f"wheel was carried ({path} is missing): carry the quality payload first "
                             "(bakeoff node pack --quality; docs/node-route-vllm.md)")
    prov = json.loads(path.read_text())
    wheel = binding_dir / prov["wheel"]
    tree = sdist_sha256(src)
    if prov.get("sdist_sha256") != tree:
        raise ToolchainError(f"the carried binding wheel {wheel.name} was built from the sdist with sha256 "
                             f"{prov.get('sdist_sha256')}, but the source tree {source_dir} comes from the sdist with "
                             f"sha256 {tree}: pack --quality again from the tree the bundle carries")
    for key in ("commit", "version"):
        if prov.get(key) != src.get(key):
            raise ToolchainError(f"the carried binding wheel {wheel.name} is of {key} {prov.get(key)}, the source tree "
                                 f"{source_dir} of {src.get(key)}")
    if not wheel.is_file() or sha256_file(wheel) != prov.get("wheel_sha256"):
        raise ToolchainError(f"{wheel}: missing or not the wheel its provenance names (sha256 {prov.get('wheel_sha256')})")
    return wheel, prov
