# bakeoff's DAG. Wiring only: the path templates (from bakeoff.layout), includes, and `rule all`.
# Configuration is Hydra's (conf/); pass overrides with --config, e.g.
#   snakemake --cores all results/summary.csv --config experiment=blog_v100
import shlex
import sys
from pathlib import Path

from snakemake.utils import min_version

min_version("9.0")

# Rules call the `bakeoff` CLI: every job's shell appends the bin folder of the Python running Snakemake to
# PATH, so `.venv/bin/snakemake ...` works from a shell without the venv activated (a `bakeoff` already on
# PATH, such as a job's conda environment's, still comes first).
shell.prefix(f"set -euo pipefail; export PATH=\"$PATH\":{shlex.quote(str(Path(sys.executable).parent))}; ")

# Path grammar: every artifact path bakeoff writes is defined once, in src/bakeoff/layout.py (its docstring
# lists them); the rules use its templates. Logs mirror outputs under logs/, benchmark timings under logs/bench/.
from bakeoff.layout import (
    ANSWER_TABLE,
    BASELINES,
    BLOCK,
    CAPACITY_TABLE,
    CELLS,
    DVC_METRICS,
    GPU_CHECK,
    HARDWARE,
    HARDWARE_AFTER,
    KERNEL,
    LLAMACPP_SRC,
    MODEL,
    MODEL_SOURCE,
    PLOT,
    POINTS_FILE,
    PYBINDING,
    QUALITY,
    REPORT_PAGE,
    SAMPLES,
    SUMMARY,
    TOOLCHAIN,
    TRACKED,
    VARIANT_SAMPLES,
    VERSIONS,
)


include: "workflow/rules/common.smk"
include: "workflow/rules/doctor.smk"
include: "workflow/rules/toolchain.smk"
include: "workflow/rules/models.smk"
include: "workflow/rules/serve.smk"
include: "workflow/rules/kernel.smk"
include: "workflow/rules/node.smk"
include: "workflow/rules/summary.smk"
include: "workflow/rules/samples.smk"
include: "workflow/rules/report.smk"
include: "workflow/rules/track.smk"

# On a cluster (workflow/profiles/slurm) these run on the submit host: bookkeeping, no GPU, little CPU.
localrules:
    all,
    points,
    summary,
    check_baselines,
    samples,
    versions,
    plots,
    pages,
    dvc_metrics,
    track,
    fetch_llamacpp,
    fetch_model,


rule all:
    input:
        all_outputs(),
    default_target: True


# The site's Slurm partition and account (SITE_RESOURCES, common.smk) on every rule; local rules ignore them.
for _rule in workflow.rules:
    _rule.resources.update(SITE_RESOURCES)
