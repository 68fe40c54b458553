"""Shared fixtures, in two tiers.

``make test-fast`` (``pytest -m "not slow"``) starts no server and builds
nothing. Every test that does is marked ``slow``; ``make test`` runs both.

Tests that read pipeline outputs share one session-scoped run of the ``ci``
experiment (conf/experiment/ci.yaml) through the fixture :func:`pipeline`. It
runs the real Snakefile in a temporary results root. Its ``models/`` and
``build/`` are the tests' own, :data:`TEST_ARTIFACTS` (``.bakeoff-test/``,
git-ignored and kept between sessions, so a second ``make test`` rebuilds
nothing), never the clone's: those hold a user's ``make run`` artifacts, and
``make test`` must leave them, and ``results/``, as they were (issue 45, item 4;
tests/test_user_artifacts.py checks it). No test depends on another having run
first.
"""

from __future__ import annotations

import csv
import dataclasses
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
MODEL = "smollm2-135m"
EXPERIMENT = "ci"
# What a pipeline working directory needs from the repository: the workflow and its inputs (read-only).
WORKFLOW = ("Snakefile", "workflow", "conf", "data", "envs")
# The tests' built artifacts (models/, build/), shared by every pipeline run of the tests so a build happens once per
# checkout, and kept apart from the clone's own models/ and build/, which are a user's `make run` artifacts. Persistent
# (a developer's second `make test` reuses them) and git-ignored; on a machine that built llama.cpp before, the
# compile is restored from the build cache outside the clone (bakeoff.engines.buildcache), so a fresh folder costs
# the model conversions, not the compile.
TEST_ARTIFACTS = ROOT / ".bakeoff-test"
BUILT = ("models", "build")
TEST_MODELS = TEST_ARTIFACTS / "models"
TEST_BUILD = TEST_ARTIFACTS / "build"
# What `make run` leaves in the clone, which no test may create, rewrite or delete (tests/test_user_artifacts.py).
USER_ARTIFACTS = ("models", "build", "results")
ARTIFACTS_CHECK = "test_the_tests_left_the_clones_artifacts_alone"  # runs last: it compares against the session start


def snakemake(*args: str, check: bool = True, timeout: float = 3000, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """Run the project's Snakefile with the venv's snakemake, in ``cwd`` (the repository by default)."""
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    proc = subprocess.run([str(BIN / "snakemake"), *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"snakemake {' '.join(args)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
    return proc


def planned_jobs(plan: str) -> list[tuple[str, dict[str, str]]]:
    """A dry run's jobs in order: rule name and its printed fields (input, threads, resources, ...)."""
    jobs: list[tuple[str, dict[str, str]]] = []
    for line in plan.splitlines():
        m = re.match(r"^\s*(?:local)?(?:rule|checkpoint) (\w+):", line)  # indented: inside a group job
        if m:
            jobs.append((m.group(1), {}))
        elif jobs and (f := re.match(r"^\s+(\w+): (.*)$", line)):
            jobs[-1][1][f.group(1)] = f.group(2)
    return jobs


SPEC_REF = re.compile(r"(?:--spec|--hardware) '?@([^ ']+)")  # a config slice a stage command names


def spec_texts(plan: str, cwd: Path = ROOT) -> str:
    """The config slices (``--spec @file``, ``--hardware @file``) that a dry run's commands name, joined."""
    refs = dict.fromkeys(SPEC_REF.findall(plan))
    return "\n".join((cwd / ref).read_text() for ref in refs)


def bakeoff(*args: str, env: dict | None = None, timeout: float = 900, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "bakeoff"), *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=timeout)


def record_table(run: Path, script: str) -> tuple[str, str]:
    """A record's README table between ``<!-- <script>: begin -->`` and ``end``, and what ``run/<script>`` prints
    (its ``table()``): a record's hand-run script and the table it put in the README, to compare."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"record_{run.name}_{Path(script).stem}", run / script)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    text = (run / "README.md").read_text()
    begin, end = f"<!-- {script}: begin -->\n", f"<!-- {script}: end -->"
    return text[text.index(begin) + len(begin):text.index(end)], mod.table()


def results_root(path: Path) -> Path:
    """A working directory for the real Snakefile whose results/, logs/ and .snakemake/ are its own, and whose
    models/ and build/ are the tests' (:data:`TEST_ARTIFACTS`), never the clone's."""
    path.mkdir(parents=True, exist_ok=True)
    for name in WORKFLOW:
        (path / name).symlink_to(ROOT / name)
    for name in BUILT:
        (TEST_ARTIFACTS / name).mkdir(parents=True, exist_ok=True)
        (path / name).symlink_to(TEST_ARTIFACTS / name)
    return path


def user_state() -> dict[str, tuple[int, int] | None]:
    """Every path under the clone's models/, build/ and results/: (mtime_ns, size) of a file or link, None for a
    folder (its mtime moves with its entries, which are listed themselves). Links are not followed."""
    state: dict[str, tuple[int, int] | None] = {}
    for name in USER_ARTIFACTS:
        top = ROOT / name
        if not top.is_dir():
            continue
        state[name] = None
        for folder, dirs, files in os.walk(top):
            rel = Path(folder).relative_to(ROOT)
            for d in dirs:
                state[str(rel / d)] = None
            for f in files:
                try:
                    st = (Path(folder) / f).lstat()
                except FileNotFoundError:  # removed while walking: absent
                    continue
                state[str(rel / f)] = (st.st_mtime_ns, st.st_size)
    return state


def root_plan() -> frozenset[tuple[str, str]]:
    """The jobs a dry run of the default experiment in the clone plans, as (rule, output): after ``make run``, none."""
    return frozenset((rule, f.get("output", "")) for rule, f in planned_jobs(snakemake("-n", "--cores", "1").stdout))


@dataclass(frozen=True)
class UserArtifacts:
    """The clone's artifacts as the session found them: files under models/, build/, results/ and the dry run's jobs."""

    files: dict[str, tuple[int, int] | None]
    plan: frozenset[tuple[str, str]]


@pytest.fixture(scope="session", autouse=True)
def user_artifacts_at_start(request: pytest.FixtureRequest) -> UserArtifacts | None:
    """The clone's artifacts before any test of the session ran (autouse, so it comes before every other fixture),
    for the check that the tests left them alone. Taken only where that check runs (the slow tier): a dry run costs
    seconds, which the fast tier's workers need not spend."""
    if not any(item.name == ARTIFACTS_CHECK for item in request.session.items):
        return None
    return UserArtifacts(user_state(), root_plan())


# Fixtures that start servers, build or run the pipeline: a test using one belongs to the slow tier.
HEAVY_FIXTURES = {"pipeline", "models", "gguf_models", "toolchain"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Refuse a test that needs a heavy fixture without the ``slow`` mark: it would run the pipeline in the fast
    tier, which promises to start no server and build nothing. Put the check of the clone's artifacts last, after
    every test that could have written them."""
    items.sort(key=lambda i: i.name == ARTIFACTS_CHECK)  # stable: the others keep their order
    wrong = [f"{i.nodeid} (uses {', '.join(sorted(HEAVY_FIXTURES & set(getattr(i, 'fixturenames', ()))))})"
             for i in items if HEAVY_FIXTURES & set(getattr(i, "fixturenames", ())) and not i.get_closest_marker("slow")]
    if wrong:
        raise pytest.UsageError("tests that need the pipeline, a model or a build must be marked slow:\n  "
                                + "\n  ".join(wrong))


@dataclass(frozen=True)
class Pipeline:
    """One finished pipeline run: its working directory and the paths tests read."""

    root: Path
    experiment: str = EXPERIMENT
    plan_after_run: str = ""  # a dry run made at once after the run, before other tests touch the tests' models/, build/

    @property
    def results(self) -> Path:
        return self.root / "results"

    @property
    def raw(self) -> Path:
        return self.results / "raw" / self.experiment / MODEL

    @property
    def summary_path(self) -> Path:
        return self.results / "summary.csv"

    @property
    def hardware_path(self) -> Path:
        return self.results / "hardware.json"

    def rows(self) -> list[dict[str, str]]:
        with open(self.summary_path, newline="") as f:
            return list(csv.DictReader(f))

    def snakemake(self, *args: str, check: bool = True, timeout: float = 3000) -> subprocess.CompletedProcess:
        return snakemake(*args, check=check, timeout=timeout, cwd=self.root)


@pytest.fixture(scope="session")
def pipeline(tmp_path_factory: pytest.TempPathFactory) -> Pipeline:
    """The ``ci`` experiment, rule all (summary, samples, plots, pages, DVC metrics, MLflow), plus the FP8 family."""
    run = Pipeline(results_root(tmp_path_factory.mktemp("pipeline")))
    run.snakemake("--cores", "all", "--config", f"experiment={EXPERIMENT}", "--", "all",
                  *(f"models/{MODEL}/{f}/manifest.json" for f in ("fp8-dynamic", "fp8-dequant", "q8_0")))
    plan = run.snakemake("-n", "--cores", "1", "--config", f"experiment={EXPERIMENT}").stdout
    return dataclasses.replace(run, plan_after_run=plan)


@pytest.fixture(scope="session")
def models(pipeline: Pipeline) -> Path:
    """Every format of the embedded model, made by the pipeline (in the tests' models/)."""
    return TEST_MODELS / MODEL


@pytest.fixture(scope="session")
def gguf_models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The embedded model's fp16 (tokenizer) and q4_k_m GGUF and their toolchain, made by the pipeline's own
    rules only if missing (seconds when present): for tests that need one llama-server, not the ci run."""
    root = results_root(tmp_path_factory.mktemp("gguf"))
    snakemake("--cores", "all", f"models/{MODEL}/q4_k_m/manifest.json", f"models/{MODEL}/fp16/manifest.json", cwd=root)
    return TEST_MODELS / MODEL


def cpu_toolchain() -> Path:
    """The llama.cpp CPU build in the tests' build/ (made by the pipeline or :func:`gguf_models`)."""
    dirs = [d for d in (TEST_BUILD / "llamacpp").glob("*-cpu") if (d / "manifest.json").exists()]
    assert len(dirs) == 1, dirs
    return dirs[0]


@pytest.fixture(scope="session")
def toolchain(pipeline: Pipeline) -> Path:
    return cpu_toolchain()


def _is_server(argv: list[str]) -> bool:
    """A server process itself (not a command line that merely mentions one)."""
    if not argv:
        return False
    if Path(argv[0]).name == "llama-server":
        return True
    return any(a in ("vllm.entrypoints.openai.api_server", "llama_cpp.server", "bakeoff.quality.gguf_server")
               for a in argv[1:3])


def _server_pids() -> set[int]:
    import psutil

    pids = set()
    for p in psutil.process_iter(["pid", "cmdline", "status"]):
        if p.info.get("status") != psutil.STATUS_ZOMBIE and _is_server(p.info.get("cmdline") or []):
            pids.add(p.info["pid"])
    return pids


@pytest.fixture(scope="session", autouse=True)
def no_server_outlives_the_tests() -> Iterator[None]:
    """Every server a test (or the pipeline) starts must be gone when the session ends."""
    before = _server_pids()
    yield
    deadline = time.monotonic() + 30
    while (left := _server_pids() - before) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left, f"server processes outlived the tests: {sorted(left)}"
