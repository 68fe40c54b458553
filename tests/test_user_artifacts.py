"""`make test` leaves a user's artifacts alone (issue 45, item 4).

Why: the clone's models/, build/ and results/ are what `make run` made. The tests used to link their pipeline runs'
models/ and build/ to them, so `make test` after `make run` rewrote manifests and the llama-cpp-python build, added
formats and models the user never asked for, and the user's next `snakemake -n` planned 17 jobs. The tests now keep
their artifacts in conftest.TEST_ARTIFACTS (`.bakeoff-test/`); these tests hold them to that.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from conftest import (
    ARTIFACTS_CHECK,
    BUILT,
    ROOT,
    TEST_ARTIFACTS,
    WORKFLOW,
    Pipeline,
    UserArtifacts,
    results_root,
    root_plan,
    user_state,
)

# A path into the clone's own models/, build/ or results/, as a test would spell it (joined here so that this file
# does not match itself).
CLONE_ARTIFACT = re.compile("ROOT" + r'\s*/\s*"(models|build|results)"')


def test_a_results_root_links_the_tests_artifacts_never_the_clones(tmp_path: Path) -> None:
    root = results_root(tmp_path / "run")
    for name in BUILT:
        assert (root / name).resolve() == (TEST_ARTIFACTS / name).resolve()
        assert (root / name).resolve() != (ROOT / name).resolve()
    for name in WORKFLOW:  # the workflow and its inputs are the repository's, read-only
        assert (root / name).resolve() == (ROOT / name).resolve()
    assert not (root / "results").exists()  # its results/ is its own, made by its run


def test_the_tests_artifacts_are_ignored_by_git() -> None:
    """Persistent inside the clone, so never committed: git must ignore every path under them."""
    for name in BUILT:
        path = (TEST_ARTIFACTS / name / "x" / "manifest.json").relative_to(ROOT)
        assert subprocess.run(["git", "check-ignore", "-q", str(path)], cwd=ROOT).returncode == 0, path


def test_no_test_names_the_clones_models_build_or_results() -> None:
    """A test reads built artifacts from conftest.TEST_MODELS / TEST_BUILD (or a fixture), pipeline outputs from its
    own results root: a path into the clone's own would read, or make, a user's artifacts."""
    found = [f"{p.name}:{n}: {line.strip()}" for p in sorted(Path(__file__).parent.glob("*.py"))
             for n, line in enumerate(p.read_text().splitlines(), 1) if CLONE_ARTIFACT.search(line)]
    assert not found, "\n".join(found)


@pytest.mark.slow
def test_the_tests_left_the_clones_artifacts_alone(pipeline: Pipeline, user_artifacts_at_start: UserArtifacts | None) -> None:
    """After the session's pipeline run and every other test of the session (collection puts this one last), no file
    under the clone's models/, build/ or results/ was created, rewritten or deleted, and a dry run of the default
    experiment in the clone plans no job it did not plan before the tests: after `make run`, none (the issue's own
    test, `make run`, `make test`, `snakemake -n`; compared with the start, since a clone without `make run` plans
    everything)."""
    assert test_the_tests_left_the_clones_artifacts_alone.__name__ == ARTIFACTS_CHECK  # conftest finds it by name
    before = user_artifacts_at_start
    assert before is not None, "the session-start snapshot was not taken"
    after = user_state()
    changed = sorted(p for p in before.files.keys() | after.keys()
                     if before.files.get(p, "absent") != after.get(p, "absent"))
    assert not changed, (f"{len(changed)} paths under the clone's models/, build/, results/ changed during the tests "
                         "(path: before -> after, (mtime_ns, size), None for a folder):\n"
                         + "\n".join(f"  {p}: {before.files.get(p, 'absent')} -> {after.get(p, 'absent')}"
                                     for p in changed[:30]))
    new_jobs = sorted(root_plan() - before.plan)
    assert not new_jobs, f"a dry run in the clone now plans jobs it did not before the tests: {new_jobs}"
