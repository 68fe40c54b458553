"""DVC: on a fresh clone `dvc repro` runs the default pipeline; a second `dvc repro` runs nothing."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import BIN, ROOT, snakemake


def _run(cmd: list[str], cwd: Path, env: dict, timeout: float = 3000) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{cmd} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


@pytest.mark.slow
def test_dvc_repro_on_a_fresh_clone_then_no_op(tmp_path: Path) -> None:
    snakemake("--cores", "all")  # make this checkout's pipeline state current, so the clone can reuse it
    clone = tmp_path / "clone"
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "PYTHONPATH": str(clone / "src")}
    _run(["git", "clone", "-q", str(ROOT), str(clone)], tmp_path, env)
    # A fresh clone rebuilds everything (~10 min on 2 cores). Reuse this checkout's artifacts instead:
    # hard links for the big, read-only ones, a copy of Snakemake's metadata (it is rewritten in place).
    for d in ("models", "build", "results/raw"):
        (clone / d).parent.mkdir(parents=True, exist_ok=True)
        linked = subprocess.run(["cp", "-al", str(ROOT / d), str(clone / d)], capture_output=True)
        if linked.returncode != 0:  # another filesystem: copy (slower, same result)
            shutil.rmtree(clone / d, ignore_errors=True)
            _run(["cp", "-a", str(ROOT / d), str(clone / d)], tmp_path, env)
    shutil.copytree(ROOT / ".snakemake" / "metadata", clone / ".snakemake" / "metadata")
    assert not (clone / "results" / "summary.csv").exists()

    first = _run([str(BIN / "dvc"), "repro"], clone, env)
    assert "Running stage 'bakeoff'" in first.stdout, first.stdout[-2000:]
    assert "rule serve_load" not in first.stdout + first.stderr  # Snakemake reused the measurements
    assert (clone / "results" / "summary.csv").stat().st_size > 0
    assert (clone / "results" / "metrics.json").is_file()
    assert (clone / "results" / "mlflow" / "runs.json").is_file()

    second = _run([str(BIN / "dvc"), "repro"], clone, env)
    assert "Running stage" not in second.stdout
    assert "didn't change, skipping" in second.stdout
    status = _run([str(BIN / "dvc"), "status"], clone, env)
    assert "Data and pipelines are up to date" in status.stdout
