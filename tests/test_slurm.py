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
