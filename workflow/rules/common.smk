# Config composition, wildcard constraints and input functions.
import json
import re
from pathlib import Path

from snakemake.exceptions import WorkflowError

from bakeoff.config import config_hash, load_config, overrides_from_snakemake
from bakeoff.errors import ConfigError
from bakeoff.stages.build_llamacpp import backend_tag

try:
    CFG = load_config(overrides_from_snakemake(config), conf_dir=Path(workflow.basedir) / "conf")
except ConfigError as e:
    raise WorkflowError(f"bakeoff config: {e}") from None

CONFIG_HASH = config_hash(CFG)
TC = CFG.engines["llamacpp"].toolchain if "llamacpp" in CFG.engines else None
TOOLCHAIN_ID = f"{TC.commit}-{backend_tag(CFG.hardware)}" if TC else None
MODEL_NAME = CFG.model.name


def _alt(names):
    """Regex matching exactly these names (never an empty alternative)."""
    names = sorted(names)
    return "|".join(re.escape(n) for n in names) if names else "(?!)"


def formats_with(method):
    return [f for f, q in CFG.formats.items() if q.method == method]


wildcard_constraints:
    model=re.escape(MODEL_NAME),
    experiment=re.escape(CFG.experiment.name),
    engine=_alt(CFG.experiment.variants),
    commit="[0-9a-f]{7,40}",
    toolchain="[0-9a-f]{7,40}-[a-z0-9]+",


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


def format_spec(wildcards):
    return CFG.formats[wildcards.format].model_dump_json()


def model_manifests():
    return [MODEL.format(model=MODEL_NAME, format=f) for f in CFG.needed_formats()]


def serve_inputs(wildcards):
    """A variant's server needs its format, the fp16 tokenizer, and (llama.cpp) the toolchain."""
    inputs = {
        "model": MODEL.format(model=wildcards.model, format=wildcards.format),
        "tokenizer": MODEL.format(model=wildcards.model, format="fp16"),
    }
    engine = CFG.engines[wildcards.engine]
    if engine.plugin == "llamacpp":
        inputs["toolchain"] = toolchain_manifest()
    if engine.eval_server is not None and engine.eval_server.plugin == "llamacpppy" and CFG.eval.tasks:
        inputs["eval_toolchain"] = pybinding_manifest()
    return inputs


def pybinding_manifest():
    toolchain_manifest()  # same precondition: a llamacpp engine with a toolchain
    return PYBINDING.format(toolchain=TOOLCHAIN_ID)


def serve_spec(wildcards):
    """The config slice a variant's results depend on (a change re-runs it)."""
    return json.dumps({
        "engine_name": wildcards.engine,
        "engine": CFG.engines[wildcards.engine].model_dump(mode="json"),
        "hardware": CFG.hardware.model_dump(mode="json"),
        "load": CFG.load.model_dump(mode="json"),
        "experiment": CFG.experiment.name,
        "model": CFG.model.name,
        "model_source": CFG.model.source,
        "eval": CFG.eval.model_dump(mode="json"),
    }, sort_keys=True)


def toolchain_arg(wildcards, input):
    args = f"--toolchain {input.toolchain}" if "toolchain" in input.keys() else ""
    if "eval_toolchain" in input.keys():
        args += f" --eval-toolchain {input.eval_toolchain}"
    return args


def cell_indexes():
    return [CELLS.format(experiment=CFG.experiment.name, model=MODEL_NAME, engine=e, format=f)
            for e, f in CFG.variants()]


def variant_files(pattern):
    return [pattern.format(experiment=CFG.experiment.name, model=MODEL_NAME, engine=e, format=f)
            for e, f in CFG.variants()]


def all_outputs():
    """The single source of `rule all`'s targets."""
    return [SUMMARY, SAMPLES.format(experiment=CFG.experiment.name, model=MODEL_NAME)]
