"""The SLURM profile plans here (snakemake-executor-plugin-slurm, dry run): GPU rules ask for the config's GPUs."""

from __future__ import annotations

import pytest

from conftest import ROOT, planned_jobs, snakemake

PROFILE = "workflow/profiles/slurm"


def _jobs(out: str) -> dict[str, list[str]]:
    """rule name -> the resources of each of its planned jobs."""
    jobs: dict[str, list[str]] = {}
    for rule, fields in planned_jobs(out):
        jobs.setdefault(rule, []).append(fields.get("resources", ""))
    return jobs


@pytest.mark.parametrize(("experiment", "gres"), [("blog_v100", "gres=gpu:v100:2"), ("h200_llamacpp", "gres=gpu:h200:1")])
def test_slurm_profile_plans_gpu_rules_with_the_configs_gres(experiment: str, gres: str) -> None:
    out = snakemake("--profile", PROFILE, "-n", "--forceall", "results/summary.csv",
                    "--config", f"experiment={experiment}").stdout
    jobs = _jobs(out)
    for rule in ("serve_load", "doctor"):
        assert jobs[rule] and all(gres in r for r in jobs[rule]), (rule, jobs.get(rule))
    # builds run on compute nodes without a GPU; bookkeeping stays on the submit host
    assert "build_llamacpp" in jobs and not any("gres=" in r for r in jobs["build_llamacpp"])
    assert "summary" in jobs and "points" in jobs


def test_bookkeeping_is_local_and_gpu_work_is_not() -> None:
    """The Snakefile's localrules: (a dry run prints every job as 'rule', so read the directive)."""
    text = (ROOT / "Snakefile").read_text()
    block = text.split("localrules:", 1)[1].split("\n\n", 1)[0]
    local = {name.strip().rstrip(",") for name in block.split() if name.strip()}
    assert {"all", "points", "summary", "samples", "plots", "pages", "track", "dvc_metrics", "versions"} <= local
    assert not local & {"doctor", "serve_load", "build_llamacpp", "build_llamacpp_python", "quantize_gguf", "quantize_fp8"}


def test_slurm_profile_asks_for_no_gpu_on_cpu_configs() -> None:
    out = snakemake("--profile", PROFILE, "-n", "--forceall", "results/summary.csv").stdout
    jobs = _jobs(out)
    assert jobs["serve_load"] and not any("gres=" in r for rs in jobs.values() for r in rs)


def test_an_experiments_serving_jobs_are_one_group_job_one_allocation() -> None:
    """Nodes of one kind differ by more than most margins: every variant of a comparison is served in one
    Slurm job (a Snakemake group job), so they share one node."""
    out = snakemake("--profile", PROFILE, "-n", "--forceall", "results/summary.csv",
                    "--config", "experiment=blog_v100").stdout
    assert out.count("Group job serve ") == 1, out[-3000:]
    group = out.split("Group job serve ", 1)[1]
    inside = [line.strip() for line in group.splitlines() if line.startswith("    rule ")]
    outside = [line for line in out.splitlines() if line.startswith(("rule serve_", "localrule serve_"))]
    assert not outside, outside
    served = [rule for rule, _ in planned_jobs(out) if rule.startswith("serve_")]
    assert sorted(inside) == sorted(f"rule {r}:" for r in served) and inside.count("rule serve_load:") > 1, inside


class _Planned:
    """A planned job as Snakemake's group resource arithmetic reads one: its resources, no pipe group."""

    pipe_group = None

    def __init__(self, resources: dict[str, int]) -> None:
        self.resources = resources


def _int_resources(text: str) -> dict[str, int]:
    pairs = (item.split("=", 1) for item in text.split(", ") if "=" in item)
    return {k: int(v) for k, v in pairs if k in ("runtime", "mem_mb", "cpus_per_task")}


def test_the_serving_group_asks_slurm_for_its_jobs_own_times() -> None:
    """Snakemake asks for a group's chained jobs' runtimes summed (memory and CPUs: the largest job's). Each serving
    job's runtime is its own cells' budget (bakeoff.composition.walltime), so blog_v100's 21 serving jobs ask for
    hours, not the 168 h that 480 min a job made; the group's request is computed here by Snakemake's own code."""
    from snakemake.resources import GroupResources, Resources

    from bakeoff.composition.compose import load_config
    from bakeoff.composition.walltime import serve_minutes

    cfg = load_config(["experiment=blog_v100"])
    out = snakemake("--profile", PROFILE, "-n", "--forceall", "--config", "experiment=blog_v100").stdout
    serving = [(rule, f) for rule, f in planned_jobs(out) if rule in ("serve_load", "serve_block")]
    assert len(serving) == 21, len(serving)
    # The chain: every serving job but the first waits for another's output, so each is a layer of its own.
    outputs = {path: i for i, (_, f) in enumerate(serving) for path in f["output"].split(", ")}
    before = {i: [outputs[p] for p in f["input"].split(", ") if p in outputs] for i, (_, f) in enumerate(serving)}
    assert sorted(len(b) for b in before.values()) == [0] + [1] * 20, before
    order = [next(i for i, b in before.items() if not b)]
    while len(order) < len(serving):
        order.append(next(i for i, b in before.items() if b == [order[-1]]))
    for rule, f in serving:
        w = dict(kv.split("=", 1) for kv in f["wildcards"].split(", "))
        expected = serve_minutes(cfg, w["engine"], w["format"], last_block=rule == "serve_load")
        assert _int_resources(f["resources"])["runtime"] == expected, (rule, w, f["resources"])
    group = GroupResources.basic_layered([[_Planned(_int_resources(serving[i][1]["resources"]))] for i in order],
                                         Resources(), run_local=False, additive_resources=["runtime"], sortby=["runtime"])
    total = sum(_int_resources(f["resources"])["runtime"] for _, f in serving)
    assert group["runtime"] == total and 12 * 60 <= total <= 24 * 60, total
    assert (group["mem_mb"], group["cpus_per_task"]) == (128000, 16)  # one job's, not their sum


def test_the_documented_slurm_command_ends_with_the_report_and_mlflow() -> None:
    """The Slurm route's command runs rule all, as `make run` does: summary, report pages, plots, MLflow."""
    from conftest import ROOT

    doc = (ROOT / "docs" / "gpu-and-slurm.md").read_text()
    submit = next(line for line in doc.splitlines() if "--profile workflow/profiles/slurm" in line and "# submit" in line)
    args = submit.split("#", 1)[0].split()[1:]  # after .venv/bin/snakemake
    rules = {rule for rule, _ in planned_jobs(snakemake(*args, "-n", "--forceall").stdout)}
    assert {"summary", "pages", "plots", "track"} <= rules, rules
