"""A subset of the ``ci`` experiment through a real Slurm (tests/slurmcluster.py) with ``snakemake --executor slurm``.

Why: the SLURM profile had only been planned. Here every non-local rule of the ``ci`` experiment's
llama.cpp q4_k_m variant (doctor, both builds, the fp16 model, convert, quantize, kernel bench, serve)
is an sbatch job on a controller and node this module starts. One module-scoped run does the expensive
work once: run 1 cancels the serving job with ``scancel`` while it runs (Snakemake must fail that job;
``--keep-going`` finishes the rest), run 2 must redo only it, and a local run serves the same artifacts
for the reference summary. The tests read the scheduler's own records: ``jobcomp/filetxt`` for state and
allocated CPUs/memory, ``scontrol show job`` (kept for MinJobAge) for the job's comment and log file.

Status comes from the plugin's ``squeue`` command: this cluster has no slurmdbd (see docs/development.md, the cluster tier).
"""

from __future__ import annotations

import csv
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from bakeoff.composition.compose import load_config
from bakeoff.composition.walltime import serve_minutes

from conftest import BIN, ROOT, WORKFLOW, planned_jobs
from slurmcluster import SlurmCluster, mem_mb, slurm_cluster, tres

pytestmark = [pytest.mark.slow, pytest.mark.cluster]  # slow too: `pytest -m "not slow"` never starts a cluster

PROFILE = ROOT / "workflow" / "profiles" / "slurm" / "config.yaml"
# The ci experiment's llama.cpp q4_k_m variant: a build, a quantize, a serve_load and the summary.
CONFIG = ["--config", "experiment=ci", "overrides=~experiment.variants.vllm experiment.variants.llamacpp=[q4_k_m]"]
TARGET = "results/summary.csv"
CANCEL = "serve_load"  # the rule whose job run 1 cancels mid-run: once its server has started (its log exists)
SERVED, SERVER_LOG = "llamacpp-q4_k_m", "server.log"
# This cluster's differences from a site with slurmdbd: job status from squeue (MinJobAge keeps finished
# jobs there), a short first status poll (a test waits for it), and the job logs kept for the tests to read.
EXECUTOR_SETTINGS = {"slurm-status-command": "squeue", "slurm-init-seconds-before-status-checks": 1,
                     "slurm-keep-successful-logs": True}
RUN_TIMEOUT = 1500
# The profile's groups (rule=group): a group's jobs go to Slurm as one job, commented rule_<group>_<rules>.
GROUPS = dict(g.split("=", 1) for g in yaml.safe_load(PROFILE.read_text()).get("groups", []))


def slurm_minutes(limit: str) -> int:
    """A Slurm time limit as scontrol prints it ([D-]HH:MM:SS) in minutes."""
    days, _, clock = limit.rpartition("-")
    h, m, s = (int(x) for x in clock.split(":"))
    return int(days or 0) * 1440 + h * 60 + m + (s > 0)


def is_job_of(comment: str, rule: str) -> bool:
    """Whether a Slurm job's comment is that of ``rule``'s job, or of the group job that holds it."""
    return comment.startswith((f"rule_{rule}_", f"rule_{GROUPS[rule]}_") if rule in GROUPS else f"rule_{rule}_")


def cluster_profile(partition: str, dest: Path) -> Path:
    """The user-facing profile with this cluster's partition and executor settings; resources untouched.

    On a CPU config no rule asks for a GPU, so there is no gres to change.
    """
    profile = yaml.safe_load(PROFILE.read_text())
    profile["default-resources"]["slurm_partition"] = partition
    profile.update(EXECUTOR_SETTINGS)
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "config.yaml").write_text(yaml.safe_dump(profile, sort_keys=False))
    return dest


def largest_requests() -> tuple[int, int]:
    """The profile's largest cpus_per_task and mem_mb: the node must fit every job it submits."""
    profile = yaml.safe_load(PROFILE.read_text())
    res = [profile["default-resources"], *profile.get("set-resources", {}).values()]
    return max(int(r.get("cpus_per_task", 1)) for r in res), max(int(r.get("mem_mb", 1)) for r in res)


def workdir(path: Path, artifacts: Path | None = None) -> Path:
    """A pipeline directory: the workflow read-only; models/ and build/ its own, or ``artifacts``'s.

    Its own, not the tests' shared ones (conftest.TEST_ARTIFACTS) nor the clone's: the module's run must build
    everything, so that every rule of the variant is a Slurm job."""
    path.mkdir(parents=True)
    for name in WORKFLOW:
        (path / name).symlink_to(ROOT / name)
    for name in ("models", "build"):
        if artifacts is None:
            (path / name).mkdir()
        else:
            (path / name).symlink_to(artifacts / name)
    return path


def smk_env(cluster: SlurmCluster) -> dict[str, str]:
    return {**cluster.env, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}


def smk(cwd: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "snakemake"), *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=RUN_TIMEOUT)


@dataclass
class PlannedJob:
    rule: str
    comment: str  # what the plugin passes as sbatch --comment: rule_<name>[_wildcards_<values>]
    fields: dict[str, str]

    @property
    def resources(self) -> dict[str, str]:
        return dict(r.split("=", 1) for r in self.fields.get("resources", "").split(", ") if "=" in r)


def plan(out: str) -> dict[str, PlannedJob]:
    """A dry run's jobs by their Slurm comment."""
    jobs = {}
    for rule, fields in planned_jobs(out):
        values = [w.split("=", 1)[1] for w in fields.get("wildcards", "").split(", ") if "=" in w]
        comment = f"rule_{rule}" + (f"_wildcards_{'_'.join(values)}" if values else "")
        jobs[comment] = PlannedJob(rule, comment, fields)
    return jobs


@dataclass
class ClusterRun:
    cluster: SlurmCluster
    root: Path
    planned: dict[str, PlannedJob]
    run1: subprocess.CompletedProcess
    cancelled: str  # Slurm job id cancelled in run 1
    run1_records: int  # jobcomp records when run 1 ended
    run2: subprocess.CompletedProcess
    local_rows: list[dict[str, str]]
    jobs: dict[str, dict[str, str]] = field(default_factory=dict)  # job id -> scontrol show job
    records: list[dict[str, str]] = field(default_factory=list)  # jobcomp records of runs 1 and 2

    def rows(self) -> list[dict[str, str]]:
        with open(self.root / TARGET, newline="") as f:
            return list(csv.DictReader(f))


def _run_and_cancel(cluster: SlurmCluster, cwd: Path, env: dict[str, str], profile: Path,
                    log: Path) -> tuple[subprocess.CompletedProcess, str]:
    """Run 1: the pipeline with --keep-going; scancel the CANCEL rule's job once it has started serving."""
    args = [str(BIN / "snakemake"), "--profile", str(profile), "--keep-going", *CONFIG, "--", TARGET]
    with open(log, "w") as out:
        proc = subprocess.Popen(args, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    cancelled = ""
    deadline = time.monotonic() + RUN_TIMEOUT
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            if not cancelled:
                running = [i for i, state, comment in cluster.queue()
                           if state == "RUNNING" and is_job_of(comment, CANCEL)]
                if running and SERVER_LOG in {p.name for p in cwd.glob(f"results/raw/ci/*/{SERVED}/*")}:
                    cluster.run("scancel", running[0])
                    cancelled = running[0]
            time.sleep(1)
        if proc.poll() is None:
            raise AssertionError(f"run 1 did not end within {RUN_TIMEOUT} s:\n{log.read_text()[-3000:]}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
            proc.wait(60)
    assert cancelled, f"run 1 ended before its {CANCEL} job ran:\n{log.read_text()[-4000:]}"
    return subprocess.CompletedProcess(args, proc.returncode, log.read_text(), ""), cancelled


@pytest.fixture(scope="module")
def cluster_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterRun]:
    base = tmp_path_factory.mktemp("cluster")
    cpus, mem = largest_requests()
    with slurm_cluster(base / "slurm", min_cpus=cpus, min_mem_mb=mem) as cluster:
        env = smk_env(cluster)
        profile = cluster_profile(cluster.partition, base / "profile")
        root = workdir(base / "pipeline")
        dry = smk(root, env, "--profile", str(profile), "-n", *CONFIG, "--", TARGET)
        assert dry.returncode == 0, dry.stderr[-3000:]
        planned = plan(dry.stdout)
        run1, cancelled = _run_and_cancel(cluster, root, env, profile, base / "run1.log")
        run1_records = len(cluster.records())
        run2 = smk(root, env, "--profile", str(profile), *CONFIG, "--", TARGET)
        assert run2.returncode == 0, f"run 2 failed:\n{run2.stdout[-3000:]}\n{run2.stderr[-5000:]}"
        # The local reference serves the same artifacts: the doctor's record and the kernel bench are copied
        # (with their times, so they count as made), and it runs serve_load and the summary itself.
        local = workdir(base / "local", artifacts=root)
        for name in ("results/hardware.json", "results/kernel"):
            dst = local / name
            dst.parent.mkdir(parents=True, exist_ok=True)
            (shutil.copytree if (root / name).is_dir() else shutil.copy2)(root / name, dst)
        ref = smk(local, env, "--cores", "all", *CONFIG, "--", TARGET)
        assert ref.returncode == 0, f"the local reference run failed:\n{ref.stdout[-3000:]}\n{ref.stderr[-5000:]}"
        assert "serve_load" in ref.stderr and "build_llamacpp" not in ref.stderr, ref.stderr[-3000:]
        with open(local / TARGET, newline="") as f:
            local_rows = list(csv.DictReader(f))
        run = ClusterRun(cluster, root, planned, run1, cancelled, run1_records, run2, local_rows)
        run.records = cluster.records()
        run.jobs = {r["JobId"]: cluster.job(r["JobId"]) for r in run.records}
        yield run


def _comment(job: dict[str, str]) -> str:
    return job.get("Comment", "").strip()


def planned_of(run: ClusterRun, job: dict[str, str]) -> PlannedJob | None:
    """The planned job a Slurm job ran: by its comment, or for a group job the one planned job of its group
    (this run serves one variant, so the serving group holds one job)."""
    comment = _comment(job)
    if comment in run.planned:
        return run.planned[comment]
    grouped = [p for p in run.planned.values() if p.rule in GROUPS and comment.startswith(f"rule_{GROUPS[p.rule]}_")]
    return grouped[0] if len(grouped) == 1 else None


def slurm_log_dir(job: dict[str, str], planned: PlannedJob) -> str:
    """The plugin's log folder: rule_<rule>, or group_<group>_<rules> for a group job."""
    comment = _comment(job)
    return f"rule_{planned.rule}" if comment == planned.comment else f"group_{comment.removeprefix('rule_')}"


def test_every_job_completed_with_the_cpus_and_memory_it_requested(cluster_run: ClusterRun) -> None:
    records = [r for r in cluster_run.records if r["JobId"] != cluster_run.cancelled]
    submitted = set()
    for record in records:
        job = cluster_run.jobs[record["JobId"]]
        planned = planned_of(cluster_run, job)
        assert planned, f"Slurm job {record['JobId']} ({_comment(job)}) is no job of the plan"
        submitted.add(planned.rule)
        if planned.rule in GROUPS:  # the profile's grouping reached Slurm: the serving job ran as its group's job
            assert _comment(job).startswith(f"rule_{GROUPS[planned.rule]}_"), _comment(job)
        want = planned.resources
        got = tres(record)
        assert record["JobState"] == "COMPLETED", (record["JobId"], planned.comment, record["JobState"], record["ExitCode"])
        assert int(got["cpu"]) == int(want["cpus_per_task"]) == int(record["ProcCnt"]), (
            f"{planned.comment}: allocated {got['cpu']} CPUs, the profile asks {want['cpus_per_task']}")
        assert mem_mb(got["mem"]) == int(want["mem_mb"]), (
            f"{planned.comment}: allocated {got['mem']} memory, the profile asks mem_mb={want['mem_mb']}")
        threads = int(planned.fields.get("threads", 1))
        assert threads <= int(got["cpu"]), (
            f"{planned.comment} runs {threads} threads on the {got['cpu']} CPUs Slurm allocated: make rule "
            f"{planned.rule}'s set-threads and cpus_per_task agree in workflow/profiles/slurm/config.yaml")
        assert record["Partition"] == cluster_run.cluster.partition
    # What the issue asks to go through the scheduler; bookkeeping stays on the submit host.
    assert {"doctor", "build_llamacpp", "quantize_gguf", "kernel_bench", "serve_load"} <= submitted, submitted
    assert not submitted & {"summary", "samples", "points", "fetch_llamacpp", "fetch_model"}, submitted
    # Every planned non-local job went through Slurm.
    local = {"summary", "samples", "points", "fetch_llamacpp", "fetch_model"}
    assert {p.rule for p in cluster_run.planned.values()} - local == submitted


def test_no_job_used_more_memory_than_slurm_gave_it(cluster_run: ClusterRun) -> None:
    """Peak RSS (Snakemake's benchmark record, measured inside the job) within the job's allocation: a site
    that enforces memory (cgroups) would otherwise kill it. This node (task/none) does not enforce it."""
    checked = 0
    for record in cluster_run.records:
        job = cluster_run.jobs[record["JobId"]]
        planned = planned_of(cluster_run, job)
        assert planned, _comment(job)
        bench = planned.fields.get("benchmark")
        if not bench or record["JobId"] == cluster_run.cancelled:
            continue
        with open(cluster_run.root / bench, newline="") as f:
            peak = [row["max_rss"] for row in csv.DictReader(f, delimiter="\t")][-1]
        if peak == "NA":
            continue
        checked += 1
        allocated = mem_mb(tres(record)["mem"])
        assert float(peak) <= allocated, (
            f"{planned.comment} peaked at {float(peak):.0f} MB RSS, over the {allocated} MB Slurm allocated "
            f"(its mem_mb): raise mem_mb for rule {planned.rule} in workflow/profiles/slurm/config.yaml")
    assert checked >= 3, f"only {checked} jobs had a peak RSS to check"


def test_summary_has_the_rows_and_statuses_of_a_local_run(cluster_run: ClusterRun) -> None:
    def key(rows: list[dict[str, str]]) -> list[tuple[str, ...]]:
        return sorted((r["engine"], r["format"], r["concurrency"], r["prompt_len"], r["status"]) for r in rows)

    rows = cluster_run.rows()
    assert rows and key(rows) == key(cluster_run.local_rows), (key(rows), key(cluster_run.local_rows))
    assert {r["status"] for r in rows} == {"ok"}, [(r["format"], r["status"], r.get("reason")) for r in rows]


def test_a_cancelled_job_fails_and_a_rerun_redoes_only_it(cluster_run: ClusterRun) -> None:
    run1 = cluster_run.run1.stdout
    assert cluster_run.run1.returncode != 0, run1[-3000:]
    if CANCEL in GROUPS:  # a group job: Snakemake names the group, and the failed job's Slurm log
        assert f"Error in group {GROUPS[CANCEL]}" in run1 and f"/{cluster_run.cancelled}.log (check log" in run1, \
            run1[-4000:]
    else:
        assert f"Error in rule {CANCEL}" in run1 and f"SLURM-job '{cluster_run.cancelled}' failed" in run1, run1[-4000:]
    assert "CANCELLED" in run1, run1[-4000:]
    records = cluster_run.records
    state = {r["JobId"]: r["JobState"] for r in records}
    assert state[cluster_run.cancelled] == "CANCELLED", state
    # Run 2 submitted exactly one job: the cancelled one's rule and wildcards, and it completed.
    rerun = records[cluster_run.run1_records:]
    cancelled = _comment(cluster_run.jobs[cluster_run.cancelled])
    assert [_comment(cluster_run.jobs[r["JobId"]]) for r in rerun] == [cancelled], rerun
    assert rerun[0]["JobState"] == "COMPLETED", rerun[0]
    # Everything else of run 1 completed before the rerun.
    done = [r for r in records[:cluster_run.run1_records] if r["JobId"] != cluster_run.cancelled]
    assert done and all(r["JobState"] == "COMPLETED" for r in done), done


def test_job_records_show_the_log_paths_the_rules_declare(cluster_run: ClusterRun) -> None:
    """Each job's record names its Slurm log (StdOut); that log names the rule's declared log, which exists."""
    for record in cluster_run.records:
        job = cluster_run.jobs[record["JobId"]]
        planned = planned_of(cluster_run, job)
        assert planned, _comment(job)
        assert record["WorkDir"] == str(cluster_run.root), record
        stdout = Path(job["StdOut"])
        assert stdout.is_relative_to(cluster_run.root / ".snakemake" / "slurm_logs" / slurm_log_dir(job, planned)), stdout
        assert stdout.name == f"{record['JobId']}.log" and stdout.exists(), stdout
        declared = planned.fields["log"]
        assert f"log: {declared}" in stdout.read_text(), (stdout, declared)
        assert (cluster_run.root / declared).stat().st_size > 0, declared


# Two variants of one experiment: the comparison the serving group exists for.
TWO = ["--config", "experiment=ci", "overrides=~experiment.variants.vllm experiment.variants.llamacpp=[q8_0,q4_k_m]"]


def test_an_experiments_serving_jobs_ran_in_one_slurm_job(cluster_run: ClusterRun, tmp_path: Path) -> None:
    """Both variants' serving jobs run inside one Slurm job (the profile's `serve` group), so one allocation on one
    node serves the whole comparison. The module's run serves one variant; this one serves two, on its artifacts."""
    cluster = cluster_run.cluster
    env = smk_env(cluster)
    root = workdir(tmp_path / "two", artifacts=cluster_run.root)
    for name in ("results/hardware.json", "results/kernel"):  # made by the module's run, with their times
        dst = root / name
        dst.parent.mkdir(parents=True, exist_ok=True)
        (shutil.copytree if (cluster_run.root / name).is_dir() else shutil.copy2)(cluster_run.root / name, dst)
    before = len(cluster.records())
    run = smk(root, env, "--profile", str(cluster_profile(cluster.partition, tmp_path / "profile")), *TWO, "--", TARGET)
    assert run.returncode == 0, f"{run.stdout[-3000:]}\n{run.stderr[-5000:]}"
    new = cluster.records()[before:]
    jobs = {r["JobId"]: cluster.job(r["JobId"]) for r in new}
    serving = [i for i, job in jobs.items() if _comment(job).startswith(f"rule_{GROUPS['serve_load']}_")]
    assert len(serving) == 1, [_comment(job) for job in jobs.values()]
    assert not [c for c in map(_comment, jobs.values()) if c.startswith("rule_serve_load")], "a serving job ran alone"
    log = Path(jobs[serving[0]]["StdOut"]).read_text()
    for variant in ("llamacpp-q8_0", "llamacpp-q4_k_m"):  # both jobs ran inside that one Slurm job
        assert f"results/raw/ci/smollm2-135m/{variant}/cells.json" in log, log[-3000:]
    assert "2 of 2 steps (100%) done" in log, log[-3000:]
    # Its time limit is its jobs' own times summed (Snakemake's group arithmetic), not a fixed figure per job.
    cfg = load_config(["experiment=ci", *TWO[2].removeprefix("overrides=").split()])
    asked = sum(serve_minutes(cfg, e, f, last_block=True) for e, f in cfg.variants())
    assert cfg.load.repeats == 1 and slurm_minutes(jobs[serving[0]]["TimeLimit"]) == asked, (jobs[serving[0]], asked)
    with open(root / TARGET, newline="") as f:
        rows = list(csv.DictReader(f))
    assert {r["format"] for r in rows} == {"q8_0", "q4_k_m"} and {r["status"] for r in rows} == {"ok"}
    assert len({r["node_id"] for r in rows}) == 1, {r["node_id"] for r in rows}
