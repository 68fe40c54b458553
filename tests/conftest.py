"""Shared fixtures. Tests run the real pipeline on the real embedded model.

The pipeline writes into the repository's own models/ and build/ (ignored by
git), exactly as `make run` does, so a developer's later run is incremental.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
MODEL = "smollm2-135m"
FORMATS = ["fp16", "fp8", "fp8-dequant", "f16", "q8_0", "q4_k_m"]  # plus fp8-dynamic


def snakemake(*args: str, check: bool = True, timeout: float = 3000) -> subprocess.CompletedProcess:
    """Run the project's Snakefile with the venv's snakemake."""
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    proc = subprocess.run([str(BIN / "snakemake"), *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"snakemake {' '.join(args)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
    return proc


def bakeoff(*args: str, env: dict | None = None, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "bakeoff"), *args], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=timeout)


@pytest.fixture(scope="session")
def models() -> Path:
    """The smoke experiment (rule all: summary + samples) run by Snakemake (no-op when up to date), plus fp8-dynamic."""
    snakemake("--cores", "all", "all", f"models/{MODEL}/fp8-dynamic/manifest.json")
    return ROOT / "models" / MODEL


@pytest.fixture(scope="session")
def toolchain(models: Path) -> Path:
    dirs = [d for d in (ROOT / "build" / "llamacpp").iterdir() if d.name.endswith("-cpu") and (d / "manifest.json").exists()]
    assert len(dirs) == 1, dirs
    return dirs[0]


def _is_server(argv: list[str]) -> bool:
    """A server process itself (not a command line that merely mentions one)."""
    if not argv:
        return False
    if Path(argv[0]).name == "llama-server":
        return True
    return any(a in ("vllm.entrypoints.openai.api_server", "llama_cpp.server") for a in argv[1:3])


def _server_pids() -> set[int]:
    import psutil

    pids = set()
    for p in psutil.process_iter(["pid", "cmdline", "status"]):
        if p.info.get("status") != psutil.STATUS_ZOMBIE and _is_server(p.info.get("cmdline") or []):
            pids.add(p.info["pid"])
    return pids


@pytest.fixture(scope="session", autouse=True)
def no_server_outlives_the_tests():
    """Every server a test (or the pipeline) starts must be gone when the session ends."""
    import time

    before = _server_pids()
    yield
    deadline = time.monotonic() + 30
    while (left := _server_pids() - before) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left, f"server processes outlived the tests: {sorted(left)}"
