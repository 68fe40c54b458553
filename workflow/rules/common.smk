# Config composition, wildcard constraints and input functions.
import json
import os
import re
from pathlib import Path

from snakemake.exceptions import WorkflowError

from bakeoff.composition.compose import config_hash
from bakeoff.engines import get_engine
from bakeoff.errors import ConfigError
from bakeoff.layout import spec_path, toolchain_id
from bakeoff.loadgen.blocks import previous, schedule, slot_of
from bakeoff.composition.sweep import SERVED_KEY, points_from_snakemake
from bakeoff.composition.walltime import serve_minutes

# One point per sweep combination (--config sweep="a=1,2"); one point without a sweep.
# --config composed=params.yaml runs DVC's Hydra-composed config instead (see dvc.yaml).
try:
    POINTS = {p.name: p for p in points_from_snakemake(config, conf_dir=Path(workflow.basedir) / "conf")}
except ConfigError as e:
    raise WorkflowError(f"bakeoff config: {e}") from None

CFG = next(iter(POINTS.values())).cfg  # the build side (model, formats, toolchain) is shared by all points


# Before the first job of a real run (never for a plan, -n): what on this machine stops an engine from serving as
# configured, e.g. a CUDA config whose vLLM interpreter has a CPU-only torch (bakeoff.composition.compose.run_problems).
# Not asked where nothing the engines need would run: --touch, or only the bookkeeping that reads results (the
# submit host's share over a GPU node's results, bakeoff.node; the Snakefile's localrules), where no engine
# is installed; nor for fetching llama.cpp's pinned source, which the submit host does for a node without network
# (docs/node-route-vllm.md). Any other rule, the doctor first, asks.
BOOKKEEPING_RULES = {"all", "points", "summary", "check_baselines", "samples", "versions", "plots", "pages",
                     "dvc_metrics", "track", "fetch_llamacpp"}


onstart:
    from snakemake_interface_executor_plugins.settings import DeploymentMethod
    from bakeoff.composition.compose import run_problems

    _asks = not workflow.touch and any(j.rule.name not in BOOKKEEPING_RULES for j in workflow.dag.needrun_jobs())
    _conda = DeploymentMethod.CONDA in (workflow.deployment_settings.deployment_method or ())
    _problems = sorted({p for point in POINTS.values() for p in run_problems(point.cfg, conda=_conda)} if _asks else ())
    if _problems:
        raise WorkflowError("bakeoff: nothing has run:\n" + "\n".join(f"  {p}" for p in _problems))
CONFIG_HASH = config_hash(CFG)
POINT_HASHES = " ".join(f"{n}:{p.hash}" for n, p in POINTS.items())
TC = CFG.toolchain
TOOLCHAIN_ID = toolchain_id(TC.commit, CFG.hardware) if TC else None
MODEL_NAME = CFG.model.name


def variant_repeats(cfg, engine, fmt):
    """Blocks a variant runs in: its load's repeats (an engine entry may set its own load)."""
    return cfg.load.for_variant(cfg.engines[engine].load, fmt)[0].repeats


# Each sweep point's server starts, in order: every variant once per block, shuffled by load.block_seed
# (bakeoff.loadgen.blocks). Each serving job waits for the one before it (serve_inputs).
SCHEDULES = {
    name: schedule(p.cfg.variants(), [variant_repeats(p.cfg, e, f) for e, f in p.cfg.variants()], p.cfg.load.block_seed)
    for name, p in POINTS.items()
}


# GPU rules (doctor, serve_load) ask a cluster for the hardware config's GPUs as a SLURM gres; nothing
# on CPU configs. Jobs never share GPUs: each serving job takes all of them (and all local cores), and
# bakeoff.hardware.gpu pins its server to explicit device ids (Snakemake's gpu resource would only count them).
GPU_RESOURCES = {"gres": CFG.hardware.slurm_gres} if CFG.hardware.slurm_gres else {}

# Site-local settings (conf/site/local.yaml, ignored by git): the partition and account of every job a cluster
# runs (set on every rule at the end of the Snakefile, over the profile's defaults), and the cache outside the
# clone (an explicit $BAKEOFF_CACHE_DIR wins).
SITE_RESOURCES = {k: v for k, v in (("slurm_partition", CFG.site.slurm_partition),
                                    ("slurm_account", CFG.site.slurm_account)) if v}
CACHE_DIR_VAR = "BAKEOFF_CACHE_DIR"  # read by bakeoff.layout.cache_root in every job
if CFG.site.cache_dir:
    os.environ.setdefault(CACHE_DIR_VAR, os.path.expanduser(CFG.site.cache_dir))


# Pinned environment per role (envs/), used with --sdm conda on a cluster.
LLAMACPP_ENV = f"../../envs/{CFG.hardware.toolchain_env}"
# The build waits for the doctor: on CUDA the doctor refuses a driver older than that environment's CUDA
# toolkit needs (bakeoff.hardware.driver); everywhere its bandwidth probe (the roofline's B) must not share the
# cores with a compile. ancient(): a re-run doctor never makes a finished build look out of date.
BUILD_GATE = [ancient(HARDWARE)]


def serve_env(wildcards):
    """The serving job's environment, as its engine names it (Engine.conda_env)."""
    return f"../../envs/{get_engine(CFG.engines[wildcards.engine].plugin).conda_env(CFG.hardware.backend)}"


def _alt(names):
    """Regex matching exactly these names (never an empty alternative)."""
    names = sorted(names)
    return "|".join(re.escape(n) for n in names) if names else "(?!)"


def formats_with(method):
    return [f for f, q in CFG.formats.items() if q.method == method]


wildcard_constraints:
    model=re.escape(MODEL_NAME),
    experiment=_alt(POINTS),
    engine=_alt(CFG.experiment.variants),
    commit="[0-9a-f]{7,40}",
    fa="on|off|auto",
    block=r"\d+",
    toolchain="[0-9a-f]{7,40}-[a-z0-9]+",


def gpu_check_format():
    """The GGUF the single-card ECC check benchmarks (the smallest the experiment makes), or None.

    Only on CUDA with a llama.cpp toolchain: bakeoff.hardware.ecc runs llama-bench on each GPU alone.
    """
    if CFG.hardware.backend != "cuda" or TOOLCHAIN_ID is None:
        return None
    ggufs = [f for f in CFG.needed_formats() if CFG.formats[f].gguf_type]
    return next((f for f in ("q4_k_m", "q8_0", "f16") if f in ggufs), ggufs[0] if ggufs else None)


def gpu_check_inputs(wildcards):
    """The single-card check's GGUF and tools, only where the doctor's record shows ECC history.

    doctor is a checkpoint, so on a clean card gpu_check needs neither, and no server waits for a
    quantization it does not serve (on a fresh H200 node, q4_k_m's before the f16 server).
    """
    from bakeoff.hardware.ecc import single_gpu_check_needed

    record = json.loads(Path(checkpoints.doctor.get().output[0]).read_text())
    if not single_gpu_check_needed(record):
        return {}
    return {"model": MODEL.format(model=MODEL_NAME, format=gpu_check_format()), "toolchain": toolchain_manifest()}


def gpu_check_args(wildcards, input):
    """The check's --input and --toolchain, when the DAG gave it those."""
    names = {"model": "--input", "toolchain": "--toolchain"}
    return " ".join(f"{flag} {input[key]}" for key, flag in names.items() if key in input.keys())


def gpu_check_threads(wildcards, input):
    """Every core while it benchmarks (each GPU alone); one when it has nothing to run, so it need not wait
    for the build."""
    return workflow.cores if "model" in input.keys() else 1


def ecc_after():
    """The ECC re-check after the last server (CUDA only): its target, or nothing."""
    return [HARDWARE_AFTER] if CFG.hardware.backend == "cuda" else []


def model_input(wildcards):
    """The artifact a format is made from: the source or another format."""
    parent = CFG.formats[wildcards.format].input
    if parent == "source":
        return MODEL_SOURCE.format(model=wildcards.model)
    return MODEL.format(model=wildcards.model, format=parent)


def toolchain_manifest():
    if TOOLCHAIN_ID is None:
        raise WorkflowError("a GGUF format is requested but no llamacpp engine (with a toolchain) is configured")
    return TOOLCHAIN.format(toolchain=TOOLCHAIN_ID)


def source_tree_manifest():
    return LLAMACPP_SRC.format(commit=TC.commit)


def build_threads():
    """The cores the llama.cpp build claims from the scheduler: all but one (at least one).

    The core left over runs the one-thread jobs that measure nothing and need no toolchain (the model's
    fetch, its fp16 copy, FP8 quantization, the GGUF conversion) beside the compile rather than after it.
    A serving or benchmarking job claims every core, so none starts while the build runs. The compiler
    itself runs one process more than it claims (the rule's shell): alone, it uses every core; beside a model
    job, the two share. The count is not a param, so another --cores never makes a finished build out of date."""
    return max(1, workflow.cores - 1)


def spec_file(text):
    """``@path`` of a file holding ``text`` (a job's JSON config slice), for ``bakeoff stage --spec/--hardware``."""
    path = Path(spec_path(text))
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(text)
        tmp.replace(path)
    return f"@{path}"


def hardware_spec(wildcards):
    return spec_file(CFG.hardware.model_dump_json())


def toolchain_spec(wildcards):
    return spec_file(TC.model_dump_json())


def model_spec(wildcards):
    return spec_file(CFG.model.model_dump_json())


def format_spec(wildcards):
    return spec_file(CFG.formats[wildcards.format].model_dump_json())


def model_manifests():
    return [MODEL.format(model=MODEL_NAME, format=f) for f in CFG.needed_formats()]


def slot_output(experiment, slot):
    """What one server start of the schedule writes: a block's index, or cells.json for the variant's last block."""
    last = variant_repeats(POINTS[experiment].cfg, slot.engine, slot.format) - 1
    return (CELLS if slot.block == last else BLOCK).format(experiment=experiment, model=MODEL_NAME,
                                                           engine=slot.engine, format=slot.format, block=slot.block)


def wildcard_slot(wildcards):
    """The schedule slot of a serve_block job (its block) or a serve_load job (the variant's last block)."""
    exp, e, f = wildcards.experiment, wildcards.engine, wildcards.format
    block = int(wildcards.block) if "block" in wildcards.keys() else variant_repeats(POINTS[exp].cfg, e, f) - 1
    return slot_of(SCHEDULES[exp], e, f, block)


def slot_made_under_current_config(experiment, slot):
    """This schedule slot's output exists and records the experiment's current config hash."""
    out = Path(slot_output(experiment, slot))
    try:
        return json.loads(out.read_text()).get("config_hash") == POINTS[experiment].hash
    except (OSError, ValueError):
        return False


def serve_runtime(last_block):
    """A serving job's Slurm wall time in minutes, from its own cells (bakeoff.composition.walltime); the serving
    group job asks for the sum of its jobs' times."""
    def runtime(wildcards):
        return serve_minutes(POINTS[wildcards.experiment].cfg, wildcards.engine, wildcards.format, last_block=last_block)
    return runtime


def serve_inputs(wildcards):
    """A variant's server needs its format, the fp16 tokenizer, (llama.cpp) the toolchain, and its turn."""
    inputs = {
        "hardware": HARDWARE,  # the doctor runs first
        "model": MODEL.format(model=wildcards.model, format=wildcards.format),
        # A synthetic model has no HF checkpoint: its source carries the tokenizer.json of its GGUF vocab.
        "tokenizer": (MODEL_SOURCE.format(model=wildcards.model) if CFG.model.source == "synthetic"
                      else MODEL.format(model=wildcards.model, format="fp16")),
    }
    # The job's config slice: a file named by its hash, so a config change is a new, newer input and the job
    # re-runs even where Snakemake kept no params record of its outputs (written at parse time, SERVE_SPECS).
    inputs["spec"] = serve_spec(wildcards).removeprefix("@")
    prev = previous(SCHEDULES[wildcards.experiment], wildcard_slot(wildcards))
    if prev is not None:
        # The order: always there, so the job's set of inputs (which Snakemake records and compares) is the same
        # before and after it ran. Not ancient: Snakemake skips its own checks (a changed spec) for a job
        # downstream of one that re-runs, and an ancient edge would then hide them. So a re-made predecessor
        # re-runs the jobs after it in the schedule; each reuses its kept cells, quality and samples
        # (serve_load), so nothing is measured twice.
        inputs["after"] = slot_output(wildcards.experiment, prev)
    if gpu_check_format() is not None:  # a card with ECC history is benchmarked alone before any server
        inputs["gpu_check"] = ancient(GPU_CHECK)
    engine = CFG.engines[wildcards.engine]
    if get_engine(engine.plugin).toolchain is not None:
        inputs["toolchain"] = TOOLCHAIN_INPUTS[get_engine(engine.plugin).toolchain]()
    if engine.eval_server is not None and get_engine(engine.eval_server.plugin).toolchain and CFG.eval.tasks:
        inputs["eval_toolchain"] = TOOLCHAIN_INPUTS[get_engine(engine.eval_server.plugin).toolchain]()
    return inputs


def pybinding_manifest():
    toolchain_manifest()  # same precondition: a llamacpp engine with a toolchain
    return PYBINDING.format(toolchain=TOOLCHAIN_ID)


# What each Engine.toolchain value asks the DAG to build.
TOOLCHAIN_INPUTS = {"llamacpp": toolchain_manifest, "llamacpp-python": pybinding_manifest}


def doctor_spec(wildcards):
    """The doctor's config slice: the hardware config and its own settings (not the experiment)."""
    return spec_file(json.dumps({"hardware": CFG.hardware.model_dump(mode="json"), "doctor": CFG.doctor.model_dump(mode="json")},
                                sort_keys=True))


def serve_spec_text(experiment, slot):
    """The config slice a variant's results depend on (a change re-runs it)."""
    cfg = POINTS[experiment].cfg
    return json.dumps({
        "engine_name": slot.engine,
        "format": slot.format,
        "engine": cfg.engines[slot.engine].model_dump(mode="json"),
        "hardware": cfg.hardware.model_dump(mode="json"),
        "doctor": cfg.doctor.model_dump(mode="json"),
        "load": cfg.load.model_dump(mode="json"),
        "experiment": cfg.experiment.name,
        "model": cfg.model.name,
        "model_source": cfg.model.source,
        "eval": cfg.eval.model_dump(mode="json"),
        "block": slot.block,
        "order": slot.order,
        "config_hash": POINTS[experiment].hash,
    }, sort_keys=True)


def aligned_spec(text, output, current):
    """Path of the spec file holding ``text``, an input of the job making ``output``, dated to decide it.

    Snakemake lists a folder once and caches what it found (existence and mtime), so specs are written and
    dated here, at parse time, never by an input function. An output made under this config (``current``):
    its spec is dated 1970, so a spec written anew (a fresh clone, a copied results/) re-runs nothing. An output
    of another config (e.g. one switched back to): its spec is dated now, newer than the output, so the job
    re-runs. No output yet: the job runs anyway."""
    path = spec_file(text).removeprefix("@")
    if Path(output).exists():
        os.utime(path, (0, 0) if current else None)
    return path


def write_serve_specs():
    """Every serving job's spec file (aligned_spec), by (experiment, schedule slot)."""
    specs = {}
    for experiment, slots in SCHEDULES.items():
        for slot in slots:
            path = aligned_spec(serve_spec_text(experiment, slot), slot_output(experiment, slot),
                                slot_made_under_current_config(experiment, slot))
            specs[experiment, slot] = f"@{path}"
    return specs


def serve_spec(wildcards):
    """``@path`` of this serving job's spec (SERVE_SPECS)."""
    return SERVE_SPECS[wildcards.experiment, wildcard_slot(wildcards)]


SERVE_SPECS = write_serve_specs()


def points_made_under_current_config():
    """results/config.json exists and records every point with its current config hash."""
    try:
        made = json.loads(Path(POINTS_FILE).read_text())
        return {n: v.get("config_hash") for n, v in made.items()} == {n: p.hash for n, p in POINTS.items()}
    except (OSError, ValueError, AttributeError):
        return False


# The points rule's input: its params as a file, so a config change re-writes results/config.json even where
# Snakemake kept no params record of it (results/ copied, a node's results unpacked).
POINTS_SPEC = aligned_spec(json.dumps({"smk_config": config, "hashes": POINT_HASHES}, sort_keys=True), POINTS_FILE,
                           points_made_under_current_config())


def toolchain_arg(wildcards, input):
    args = f"--toolchain {input.toolchain}" if "toolchain" in input.keys() else ""
    if "eval_toolchain" in input.keys():
        args += f" --eval-toolchain {input.eval_toolchain}"
    return args


def block_indexes():
    """Every earlier block's index: the summary reads only cells.json, but the node must make them all."""
    return [slot_output(name, s) for name in POINTS for s in SCHEDULES[name]]


def cell_indexes():
    return [CELLS.format(experiment=name, model=MODEL_NAME, engine=e, format=f)
            for name, p in POINTS.items() for e, f in p.cfg.variants()]


def versions_inputs(wildcards):
    """The pinned-versions record reads the toolchain and model manifests (and follows every new summary)."""
    inputs = {"config": POINTS_FILE, "summary": SUMMARY, "model_source": MODEL_SOURCE.format(model=MODEL_NAME),
              "hardware": HARDWARE}
    if TOOLCHAIN_ID is not None and toolchain_manifest() in variant_toolchains():
        inputs["toolchain"] = toolchain_manifest()  # only a build the variants use: a vLLM-only node builds none
    return inputs


def plot_files():
    from bakeoff.report.plots import PLOTS

    return [PLOT.format(name=Path(p).stem) for p in PLOTS]


def report_pages():
    return [REPORT_PAGE.format(page=p) for p in ("index", "summary", "environment")]


def variant_files(pattern, experiment=None):
    """``pattern`` for every variant of every sweep point (or of one point)."""
    return [pattern.format(experiment=name, model=MODEL_NAME, engine=e, format=f)
            for name, p in POINTS.items() if experiment in (None, name) for e, f in p.cfg.variants()]


def sample_files():
    return [SAMPLES.format(experiment=name, model=MODEL_NAME) for name in POINTS]


def all_outputs():
    """The single source of `rule all`'s targets. Every variant's cells.json is one, so deleting a variant's
    index re-measures it (Snakemake does not rebuild a missing input of an up-to-date summary on its own)."""
    return [SUMMARY, BASELINES, *cell_indexes(), *sample_files(), *plot_files(), *report_pages(), DVC_METRICS, *ecc_after(),
            *([TRACKED] if CFG.tracking.enabled else [])]


def kernel_files():
    """llama-bench results for every llama.cpp variant, at its server's flash-attention setting (deduplicated)."""
    from bakeoff.stages.kernel_bench import flash_attn_mode

    out = []
    for p in POINTS.values():
        for e, f in p.cfg.variants():
            eng = p.cfg.engines[e]
            if get_engine(eng.plugin).toolchain == "llamacpp":  # served by the llama.cpp tools
                path = KERNEL.format(model=MODEL_NAME, format=f, fa=flash_attn_mode(eng.settings.get("flash_attn")))
                if path not in out:
                    out.append(path)
    return out


def prepare_outputs():
    """What a GPU node makes before its GPU is needed (node.sh --prepare, in the background): every format's model
    and the toolchains its variants' servers (and scorers) build. Targets, not `--until` rules: Snakemake's --until
    left a format made from the fetched source unscheduled ("Out of jobs ready to be started")."""
    return [*model_manifests(), *variant_toolchains()]


def variant_toolchains():
    """The toolchains the variants' servers (and, where quality is scored, their scorers) build."""
    out = []
    for e, _ in CFG.variants():
        engine = CFG.engines[e]
        plugins = [engine.plugin] + ([engine.eval_server.plugin] if engine.eval_server is not None and CFG.eval.tasks else [])
        for plugin in plugins:
            if (tc := get_engine(plugin).toolchain) is not None and (path := TOOLCHAIN_INPUTS[tc]()) not in out:
                out.append(path)
    return out


def node_outputs():
    """What the GPU node makes: the doctor's record, every variant's cells, the kernel benchmarks.

    Everything downstream of these (summary, samples, plots, pages, MLflow) is bookkeeping for the submit
    host, which reads them as they come back (bakeoff.node).
    """
    return [HARDWARE, *block_indexes(), *kernel_files(), *ecc_after()]
