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
    """Dependencies and params of each stage whose hashes differ from dvc.lock (``{}``: the lock is current)."""
    p = subprocess.run([str(BIN / "dvc"), "status", "--json"], cwd=repo, env=_env(), capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    status = json.loads(p.stdout or "{}")
    return {stage: changed for stage, entries in status.items() for e in entries
            if isinstance(e, dict) and (changed := e.get("changed deps"))}


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
