"""`.venv/bin/dvc repro`, as the docs give it, from a shell without the venv on PATH (right after `make setup`).

DVC runs its stage's command through the shell with the caller's PATH, so a bare `snakemake` there fails unless the
venv is activated. The test asks DVC for the command it would run (`repro --dry --force`: DVC itself, from the plain
shell), then runs exactly that command through the shell with the same plain PATH, as a Snakemake dry run.
"""

from __future__ import annotations

import os
import shutil
import subprocess

from conftest import BIN, ROOT


def plain_env() -> dict[str, str]:
    """This environment without the venv's bin (or any folder holding a snakemake or dvc) on PATH."""
    keep = [d for d in os.environ.get("PATH", "").split(os.pathsep)
            if d and not any(os.access(os.path.join(d, p), os.X_OK) for p in ("snakemake", "dvc"))]
    return {**os.environ, "PATH": os.pathsep.join(keep or ["/usr/bin", "/bin"])}


def test_the_plain_path_has_no_snakemake() -> None:
    assert shutil.which("snakemake", path=plain_env()["PATH"]) is None


def test_dvc_repro_runs_its_stage_from_a_plain_shell() -> None:
    env = plain_env()
    dry = subprocess.run([str(BIN / "dvc"), "repro", "--dry", "--force"], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=300)
    assert dry.returncode == 0, dry.stdout + dry.stderr
    commands = [line.removeprefix("> ") for line in dry.stdout.splitlines() if line.startswith("> ")]
    assert len(commands) == 1 and "snakemake" in commands[0], dry.stdout
    # The stage's command, as DVC's shell would run it, planning every job (-n --forceall: also after a run).
    plan = subprocess.run(["/bin/sh", "-c", f"{commands[0]} -n --forceall --quiet rules"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert plan.returncode == 0, f"{commands[0]!r} from a plain shell:\n{plan.stdout[-2000:]}\n{plan.stderr[-3000:]}"
    assert "serve_load" in plan.stdout + plan.stderr, plan.stdout[-2000:]
