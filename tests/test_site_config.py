"""The site-local config group: conf/site/local.yaml (ignored by git) is loaded when it exists, and only then.

A test cannot write conf/site/local.yaml (other tests share the checkout), so it puts a local.yaml into a folder
of its own on Hydra's search path, where `optional site: local` finds it the same way.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from bakeoff.composition.compose import config_hash, load_config

from conftest import ROOT, snakemake

LOCAL = """# @package _global_
site:
  slurm_partition: mypart
  slurm_account: myacct
  cache_dir: /scratch/bakeoff-cache
hardware:
  vllm_image: registry.example.org/vllm/vllm-openai@sha256:0123
"""


def _site(tmp_path: Path) -> str:
    (tmp_path / "site").mkdir(parents=True)
    (tmp_path / "site" / "local.yaml").write_text(LOCAL)
    return f"hydra.searchpath=[file://{tmp_path}]"


def test_local_yaml_is_ignored_by_git_and_the_example_is_not() -> None:
    ignored = subprocess.run(["git", "check-ignore", "-q", "conf/site/local.yaml"], cwd=ROOT)
    assert ignored.returncode == 0
    example = subprocess.run(["git", "check-ignore", "-q", "conf/site/example.yaml"], cwd=ROOT)
    assert example.returncode == 1


def test_without_a_local_file_the_config_is_unchanged_and_with_one_it_wins(tmp_path: Path) -> None:
    plain = load_config(["experiment=blog_v100"])
    assert plain.site.slurm_partition is None and plain.hardware.vllm_image == "vllm/vllm-openai:v0.6.3.post1"
    local = load_config(["experiment=blog_v100", _site(tmp_path)])
    assert (local.site.slurm_partition, local.site.slurm_account) == ("mypart", "myacct")
    assert local.hardware.vllm_image == "registry.example.org/vllm/vllm-openai@sha256:0123"  # over the experiment's
    # where jobs run and caches live is not what is measured: the hash ignores site (the image is hardware's)
    assert config_hash(load_config(["site=example"])) == config_hash(load_config([]))


def test_the_slurm_plan_asks_for_the_site_partition_and_account(tmp_path: Path) -> None:
    plan = snakemake("-n", "--profile", "workflow/profiles/slurm", "results/summary.csv", "--config",
                     "experiment=ci", f"overrides={_site(tmp_path)}").stdout
    resources = [line for line in plan.splitlines() if line.strip().startswith("resources:")]
    assert resources and all("slurm_partition=mypart" in r and "slurm_account=myacct" in r for r in resources)
