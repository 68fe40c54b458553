# bakeoff's DAG. Wiring only: the path grammar, includes, and `rule all`.
# Configuration is Hydra's (conf/); pass overrides with --config, e.g.
#   snakemake --cores all results/summary.csv --config experiment=blog_v100
from snakemake.utils import min_version

min_version("9.0")

# --------------------------------------------------------------------------
# Path grammar: every artifact path bakeoff writes, defined once, here.
#   build/llamacpp/src-{commit}/          pinned llama.cpp source tree (from the llama-cpp-python sdist)
#   build/llamacpp/{toolchain}/           built tools; toolchain = {commit}-{backend}, backend = cpu | cuda<arch>
#   build/llamacpp-python/{toolchain}/    llama-cpp-python built from the same sdist (the GGUF evaluation server)
#   results/hardware.json                 the doctor's record: GPUs, driver, ECC, topology, CPU, capabilities
#   models/{model}/source/                the model as fetched (hub snapshot, embedded GGUF, or synthetic GGUF)
#   models/{model}/{format}/              one format: fp16, fp8, fp8-dynamic, fp8-dequant, f16, q8_0, q4_k_m
#   results/raw/{experiment}/{model}/{engine}-{format}/
#       c{conc}-p{prompt}[-r{repeat}].jsonl   per-request records of one load cell
#       c{conc}-p{prompt}[-r{repeat}].json    that cell's metrics, status and reason
#       cells.json, server.log                the variant's index; its server's log
#       quality.json, topk.json               its quality scores (lm-eval, canary) and top-k logprobs for KL
#       samples.json                          its generations of the fixed prompt set
#   results/kernel/{model}/{format}-fa{fa}.json   llama-bench pp512/tg128 of one GGUF, fa = the server's on|off|auto
#   results/summary.csv                   one row per cell (every sweep point), quality columns joined per variant
#   results/baselines.json                each engine's 16-bit variant and its ok cells (the run fails without any)
#   results/samples/{experiment}/{model}.md   every variant's generations, side by side
#   results/config.json, versions.json    the invocation's composed config per sweep point; pinned versions
#   results/plots/<name>.png              report plots (also logged to MLflow)
#   results/report/{summary,environment}.html   report pages (snakemake --report report.html)
#   results/metrics.json                  DVC metrics, from the summary
#   results/mlflow/runs.json              the MLflow parent run and its cell runs of this invocation
# Each artifact directory is complete exactly when its manifest.json exists.
# Logs mirror outputs under logs/, benchmark timings under logs/bench/.
# --------------------------------------------------------------------------
HARDWARE = "results/hardware.json"
LLAMACPP_SRC = "build/llamacpp/src-{commit}/manifest.json"
TOOLCHAIN = "build/llamacpp/{toolchain}/manifest.json"
PYBINDING = "build/llamacpp-python/{toolchain}/manifest.json"
MODEL_SOURCE = "models/{model}/source/manifest.json"
MODEL = "models/{model}/{format}/manifest.json"
CELLS = "results/raw/{experiment}/{model}/{engine}-{format}/cells.json"
QUALITY = "results/raw/{experiment}/{model}/{engine}-{format}/quality.json"
VARIANT_SAMPLES = "results/raw/{experiment}/{model}/{engine}-{format}/samples.json"
SUMMARY = "results/summary.csv"
BASELINES = "results/baselines.json"
SAMPLES = "results/samples/{experiment}/{model}.md"
POINTS_FILE = "results/config.json"
VERSIONS = "results/versions.json"
PLOT = "results/plots/{name}.png"
REPORT_PAGE = "results/report/{page}.html"
DVC_METRICS = "results/metrics.json"
TRACKED = "results/mlflow/runs.json"
KERNEL = "results/kernel/{model}/{format}-fa{fa}.json"


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
