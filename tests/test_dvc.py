"""DVC: on a fresh clone `dvc exp run -S` composes params.yaml with DVC's Hydra and runs the pipeline on it;
a second `dvc repro` runs nothing; a further `-S` reaches the pipeline.

The clone reuses the test session's pipeline run (the ``ci`` experiment), so DVC drives Snakemake over
measurements that already exist, as it would on a developer's checkout: nothing is measured twice.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from bakeoff.composition.compose import config_hash, load_config

from conftest import BIN, ROOT, TEST_BUILD, TEST_MODELS, Pipeline

pytestmark = pytest.mark.slow


def _run(cmd: list[str], cwd: Path, env: dict, timeout: float = 3000) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{cmd} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


@pytest.fixture(scope="module")
def clone(pipeline: Pipeline, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """A fresh clone of this repository's HEAD, with the test pipeline's artifacts and measurements reused."""
    base = tmp_path_factory.mktemp("dvc")
    clone = base / "clone"
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "PYTHONPATH": str(clone / "src")}
    _run(["git", "clone", "-q", str(ROOT), str(clone)], base, env)
    # A fresh clone rebuilds and re-measures everything. Reuse the test pipeline's state instead: hard
    # links for the big, read-only artifacts, a copy of Snakemake's metadata (it is rewritten in place).
    for src, d in ((TEST_MODELS, "models"), (TEST_BUILD, "build"), (pipeline.results / "raw", "results/raw"),
                   (pipeline.hardware_path, "results/hardware.json")):  # the doctor's record: serve_load reads it
        (clone / d).parent.mkdir(parents=True, exist_ok=True)
        linked = subprocess.run(["cp", "-al", str(src.resolve()), str(clone / d)], capture_output=True)
        if linked.returncode != 0:  # another filesystem: copy (slower, same result)
            shutil.rmtree(clone / d, ignore_errors=True)
            _run(["cp", "-a", str(src.resolve()), str(clone / d)], base, env)
    shutil.copytree(pipeline.root / ".snakemake" / "metadata", clone / ".snakemake" / "metadata")
    return clone, env


def test_dvc_repro_on_a_fresh_clone_then_no_op(clone: tuple[Path, dict]) -> None:
    path, env = clone
    assert not (path / "results" / "summary.csv").exists()
    first = _run([str(BIN / "dvc"), "exp", "run", "-S", "experiment=ci"], path, env)
    assert "Running stage 'bakeoff'" in first.stdout, first.stdout[-2000:]
    assert "rule serve_load" not in first.stdout + first.stderr  # Snakemake reused the measurements
    assert (path / "results" / "summary.csv").stat().st_size > 0
    assert (path / "results" / "metrics.json").is_file()
    assert (path / "results" / "mlflow" / "runs.json").is_file()

    second = _run([str(BIN / "dvc"), "repro"], path, env)
    assert "Running stage" not in second.stdout
    assert "didn't change, skipping" in second.stdout
    status = _run([str(BIN / "dvc"), "status"], path, env)
    assert "Data and pipelines are up to date" in status.stdout


def test_dvc_exp_run_set_param_reaches_the_pipeline(clone: tuple[Path, dict]) -> None:
    """`-S` (a cheap one: only the summary side re-runs) -> DVC composes params.yaml -> Snakemake runs it."""
    path, env = clone
    out = _run([str(BIN / "dvc"), "exp", "run", "-S", "experiment=ci", "-S", "tracking.experiment=bakeoff-exp"],
               path, env)
    assert "Running stage 'bakeoff'" in out.stdout
    assert json.loads((path / "results" / "mlflow" / "runs.json").read_text())["experiment"] == "bakeoff-exp"
    with open(path / "results" / "summary.csv", newline="") as f:
        hashes = {r["config_hash"] for r in csv.DictReader(f)}
    assert hashes == {config_hash(load_config(["experiment=ci", "tracking.experiment=bakeoff-exp"], ROOT / "conf"))}
