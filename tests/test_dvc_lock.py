"""The committed dvc.lock must describe the committed tree: its dependency and param hashes, as DVC computes them.

Why: a stale lock makes `dvc status` and `dvc exp show` describe results the code no longer makes, and a
later `dvc repro` compares against the wrong baseline. The check runs real DVC (`dvc status --json`) on a
fresh clone of HEAD, so uncommitted edits and build products (``__pycache__``, results) play no part; the
clone has no outputs, so only changed dependencies and params count.

Refreshing the lock needs a pipeline run (DVC records the outputs' hashes next to the inputs'):
``.venv/bin/dvc repro && git add dvc.lock`` (or, right after ``make run`` on the committed tree,
``.venv/bin/dvc commit -f bakeoff``).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from conftest import BIN, ROOT

REFRESH = "`.venv/bin/dvc repro && git add dvc.lock` (a pipeline run), then commit"


def _env() -> dict[str, str]:
    return {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "DVC_NO_ANALYTICS": "1",
            "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}


def stale_inputs(repo: Path) -> dict:
    """Dependencies and params of each stage whose hashes differ from dvc.lock, and ``"command": "changed"``
    where the stage's command differs from the lock's (``{}``: the lock is current). Missing outputs do not
    count: a clone has none."""
    p = subprocess.run([str(BIN / "dvc"), "status", "--json"], cwd=repo, env=_env(), capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    status = json.loads(p.stdout or "{}")
    out: dict = {}
    for stage, entries in status.items():
        for e in entries:
            if e == "changed command":
                out.setdefault(stage, {})["command"] = "changed"
            elif isinstance(e, dict) and (changed := e.get("changed deps")):
                out.setdefault(stage, {}).update(changed)
    return out


def _clone(tmp_path: Path) -> Path:
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True, env=_env(), timeout=120)
    return clone


def test_the_committed_dvc_lock_matches_the_committed_tree(tmp_path: Path) -> None:
    stale = stale_inputs(_clone(tmp_path))
    assert not stale, f"dvc.lock is stale against the committed tree: {stale}. Refresh it: {REFRESH}"


def test_the_check_sees_a_changed_dependency(tmp_path: Path) -> None:
    """The check is not vacuous: a committed edit to a dependency of the lock shows up as stale."""
    clone = _clone(tmp_path)
    before = stale_inputs(clone)
    with open(clone / "data" / "published_numbers.yaml", "a") as f:
        f.write("\n# an edit the lock has not seen\n")
    subprocess.run(["git", "commit", "-qam", "edit a dependency"], cwd=clone, check=True, env=_env())
    after = stale_inputs(clone)
    assert after.get("bakeoff", {}).get("data/published_numbers.yaml") == "modified"
    assert "data/published_numbers.yaml" not in before.get("bakeoff", {})


def test_the_check_sees_a_changed_command_and_a_changed_param(tmp_path: Path) -> None:
    """A stage command or a param edited since the lock is stale too, not only a dependency file."""
    clone = _clone(tmp_path)
    dvc_yaml = clone / "dvc.yaml"
    dvc_yaml.write_text(dvc_yaml.read_text().replace("snakemake --cores all", "snakemake --cores 1", 1))
    params = clone / "params.yaml"
    text = params.read_text()
    assert "  output_len: 32\n" in text
    params.write_text(text.replace("  output_len: 32\n", "  output_len: 31\n", 1))
    subprocess.run(["git", "commit", "-qam", "edit the command and a param"], cwd=clone, check=True, env=_env())
    after = stale_inputs(clone).get("bakeoff", {})
    assert after.get("command") == "changed"
    assert after.get("params.yaml") == {"load": "modified"}
