"""Where every artifact lives and what its files are called: the path grammar, defined once.

Why one module: the Snakefile plans the DAG from these templates and the
stages write to the same places, so a name spelled twice drifts. Templates use
Snakemake's ``{wildcard}`` syntax; the helpers below fill or read them. Nothing
else builds an artifact path by hand or reads one by its depth.

  build/llamacpp/src-{commit}/          pinned llama.cpp source tree (from the llama-cpp-python sdist)
  build/llamacpp/{toolchain}/           built tools; toolchain = {commit}-{backend}, backend = cpu | cuda<arch>
  build/llamacpp-python/{toolchain}/    llama-cpp-python built from the same sdist (the GGUF evaluation server)
  results/hardware.json                 the doctor's record: GPUs, driver, ECC, topology, CPU, capabilities
  results/gpu-check.json                (GPU) each card's short llama-bench alone, when one has ECC history
  results/hardware-after.json           (GPU) ECC counts re-read after the last server; a grown count fails it
  models/{model}/source/                the model as fetched (hub snapshot, embedded GGUF, or synthetic GGUF)
  models/{model}/{format}/              one format: fp16, fp8, fp8-dynamic, fp8-dequant, f16, q8_0, q4_k_m
  results/raw/{experiment}/{model}/{engine}-{format}/
      c{conc}-p{prompt}[-r{repeat}].jsonl   per-request records of one load cell
      c{conc}-p{prompt}[-r{repeat}].json    that cell's metrics, status and reason
      cells.json, server.log                the variant's index (every block's cells); its server's log
      block-{block}.json                    the index of one earlier block's cells (repeats > 1; the last block writes cells.json)
      quality.json, topk.json               its quality scores (lm-eval, canary) and top-k logprobs for KL
      samples.json                          its generations of the fixed prompt set
      cap-{slo}-{c|r}{load}-p{prompt}.json[l]   one capacity probe (load.mode: capacity), recorded as a cell
      capacity.json                         what the variant's capacity searches found (also in cells.json)
      kept/{quality,samples}.json           the copies a rerun reuses (Snakemake deletes a job's declared outputs first)
  results/kernel/{model}/{format}-fa{fa}.json   llama-bench pp512/tg128 of one GGUF, fa = the server's on|off|auto
  results/summary.csv                   one row per cell (every sweep point), quality columns joined per variant
  results/capacity.csv                  one row per variant, prompt length and SLO: its capacity (load.mode: capacity)
  results/baselines.json                each engine's 16-bit variant and its ok cells (the run fails without any)
  results/samples/{experiment}/{model}.md   every variant's generations, side by side
  results/config.json, versions.json    the invocation's composed config per sweep point; pinned versions
  results/plots/<name>.png              report plots (also logged to MLflow)
  results/report/{summary,environment}.html   report pages (snakemake --report report.html)
  results/report/answer.csv             the index page's answer as a table: leaders, verdicts, intervals, block directions
  results/metrics.json                  DVC metrics, from the summary
  results/mlflow/runs.json              the MLflow parent run and its cell runs of this invocation
  .snakemake/bakeoff-specs/{digest}.json   a job's config slice (``--spec @file``), named by its content
  build/node-vllm/                      vLLM for the GPU node: part-01.., manifest.json, node.sh, node_parts.py
  build/node-quality/                   quality for the GPU node (the embedded model, lm-eval, compressed-tensors, the
                                        llama.cpp binding's wheel): the same four kinds of file
  .venv-gpu/                            a GPU box's interpreter with vLLM's CUDA build (make setup-gpu)
  $BAKEOFF_CACHE_DIR (~/.cache/bakeoff)    outside the clone: finished builds; files' sha256 by inode (manifest)

Each artifact directory is complete exactly when its manifest.json exists.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple, Protocol

MANIFEST = "manifest.json"

# File names inside an artifact directory.
GGUF_NAME = "model.gguf"  # a GGUF format's single weights file
CELLS_INDEX = "cells.json"  # a variant's index of its cells (what the summary reads)
QUALITY_FILE = "quality.json"
TOPK_FILE = "topk.json"
SAMPLES_FILE = "samples.json"
CAPACITY_FILE = "capacity.json"
SERVER_LOG = "server.log"
EVAL_SERVER_LOG = "eval-server.log"
# Snakemake removes a job's declared outputs before it runs, so what a rerun may reuse (quality, samples)
# is also kept here, undeclared, and restored from it.
KEPT_DIR = "kept"
LIBLLAMA = "lib/libllama.so"  # inside a toolchain directory
BINDING_SITE = "site"  # inside a llama-cpp-python directory: the installed package
SOURCE_ARCHIVE = "source.tar.gz"  # inside the llama.cpp source directory

# The node route's carried vLLM: the parts folder here, and where node.sh installs it on the node (the
# experiment's engines.vllm.pythonpath names the same folder).
NODE_VLLM_DIR = "build/node-vllm"
NODE_VLLM_SITE = "/tmp/bakeoff-vllm/site"
# The node route's carried quality payload (bakeoff.node.quality): the parts folder here, where node.sh installs it
# on the node (and puts it on the stages' PYTHONPATH once installed; the environment variable moves it, for tests),
# and the folder inside that site holding the llama.cpp binding's wheel and its provenance (a dot name: never an
# importable package on that path).
NODE_QUALITY_DIR = "build/node-quality"
NODE_QUALITY_SITE = "/tmp/bakeoff-quality/site"
QUALITY_SITE_ENV = "BAKEOFF_QUALITY_SITE"
BINDING_CARRY_DIR = ".bakeoff-binding"
BINDING_PROVENANCE = "binding.json"  # beside the carried binding wheel: the sdist it was built from
# The node route's carried llama.cpp build (bakeoff.node.build_carry): the parts folder here, and the build cache
# node.sh points BAKEOFF_CACHE_DIR at on the node, where a carried build is installed as the entry the build stage
# looks for (cache root / LLAMACPP_CACHE_KIND / key).
NODE_BUILD_DIR = "build/node-build"
NODE_CACHE_DIR = "/tmp/bakeoff-cache"
LLAMACPP_CACHE_KIND = "llamacpp"
# Beside .venv on a GPU box: the interpreter with vLLM's CUDA build (`make setup-gpu`, the Makefile's GPU_VENV),
# which GPU hardware configs name as hardware.vllm_python.
GPU_VENV = ".venv-gpu"
GPU_VENV_PYTHON = f"{GPU_VENV}/bin/python"
GPU_SETUP = "make setup-gpu"

# Snakemake output templates (each a manifest or a file the rule writes).
HARDWARE = "results/hardware.json"
GPU_CHECK = "results/gpu-check.json"
HARDWARE_AFTER = "results/hardware-after.json"
LLAMACPP_SRC = f"build/llamacpp/src-{{commit}}/{MANIFEST}"
TOOLCHAIN = f"build/llamacpp/{{toolchain}}/{MANIFEST}"
PYBINDING = f"build/llamacpp-python/{{toolchain}}/{MANIFEST}"
MODEL_SOURCE = f"models/{{model}}/source/{MANIFEST}"
MODEL = f"models/{{model}}/{{format}}/{MANIFEST}"
VARIANT_DIR = "results/raw/{experiment}/{model}/{engine}-{format}"
CELLS = f"{VARIANT_DIR}/{CELLS_INDEX}"
BLOCK = f"{VARIANT_DIR}/block-{{block}}.json"
QUALITY = f"{VARIANT_DIR}/{QUALITY_FILE}"
VARIANT_SAMPLES = f"{VARIANT_DIR}/{SAMPLES_FILE}"
SUMMARY = "results/summary.csv"
CAPACITY_TABLE = "results/capacity.csv"
ANSWER_TABLE = "results/report/answer.csv"
BASELINES = "results/baselines.json"
SAMPLES = "results/samples/{experiment}/{model}.md"
POINTS_FILE = "results/config.json"
VERSIONS = "results/versions.json"
PLOT = "results/plots/{name}.png"
REPORT_PAGE = "results/report/{page}.html"
DVC_METRICS = "results/metrics.json"
TRACKED = "results/mlflow/runs.json"
KERNEL = "results/kernel/{model}/{format}-fa{fa}.json"
# A job's config slice travels as a file, so a failing job's command line is short and its error readable;
# the name is the content's digest, so Snakemake's params trigger still re-runs a job when its slice changes.
SPEC = ".snakemake/bakeoff-specs/{digest}.json"
# The data dictionary of the summary and capacity tables, generated from bakeoff.results.columns (committed).
COLUMNS_DOC = "docs/columns.md"


class _Backend(Protocol):
    backend: str
    cuda_arch: int | None


def backend_tag(hw: _Backend) -> str:
    """Directory tag of a build flavour: ``cpu`` or ``cuda<arch>``."""
    return "cpu" if hw.backend == "cpu" else f"cuda{hw.cuda_arch}"


def toolchain_id(commit: str, hw: _Backend) -> str:
    """The ``{toolchain}`` wildcard: one build of one commit for one backend."""
    return f"{commit}-{backend_tag(hw)}"


def tool_path(toolchain_dir: Path, tool: str) -> Path:
    """Where a built llama.cpp tool lives in its toolchain directory."""
    return Path(toolchain_dir) / "bin" / tool


def cell_name(concurrency: Any, prompt_len: Any, repeat: Any = 0) -> str:
    """A load cell's file stem: ``c{conc}-p{prompt}``, plus ``-r{repeat}`` for every repeat after the first.

    Accepts the summary's strings as well as ints (``""``/``"0"``/None mean the first repeat).
    """
    base = f"c{concurrency}-p{prompt_len}"
    return base if repeat in (None, "", 0, "0") else f"{base}-r{repeat}"


def probe_name(slo: str, kind: str, value: float, prompt_len: int, recheck: bool = False) -> str:
    """A capacity probe's file stem: ``cap-{slo}-c{conc}-p{prompt}`` (closed loop) or ``cap-{slo}-r{rate}-p{prompt}``;
    a boundary re-check of the same load ends in ``-again``."""
    load = f"c{int(value)}" if kind == "concurrency" else f"r{value:.4g}"
    return f"cap-{slo}-{load}-p{prompt_len}" + ("-again" if recheck else "")


def is_cell_stem(stem: str) -> bool:
    """Whether a file stem is a cell or probe name (``c8-p128``, ``c8-p128-r2``, ``cap-cpu-c4-p32``), not an index
    or a log."""
    return re.fullmatch(r"c\d+-p\d+(-r[1-9]\d*)?|cap-[a-z0-9_]+-(c\d+|r[0-9.e+-]+)-p\d+(-again)?", stem) is not None


def row_cell_name(row: Mapping[str, Any]) -> str:
    """The cell name of a summary row or cell record (a capacity probe's is its own, in ``cell``)."""
    return row.get("cell") or cell_name(row["concurrency"], row["prompt_len"], row.get("repeat"))


def variant_name(engine: str, fmt: str) -> str:
    return f"{engine}-{fmt}"


def row_variant_key(row: Mapping[str, Any]) -> str:
    """``<experiment>/<engine>-<format>`` of a summary row (matches :attr:`VariantKey.key`)."""
    return f"{row['experiment']}/{variant_name(row['engine'], row['format'])}"


def variant_dir(experiment: str, model: str, engine: str, fmt: str, root: Path = Path(".")) -> Path:
    return Path(root) / VARIANT_DIR.format(experiment=experiment, model=model, engine=engine, format=fmt)


class VariantKey(NamedTuple):
    """What a variant directory's path says: its sweep point, model and ``<engine>-<format>``."""

    experiment: str
    model: str
    variant: str

    @property
    def key(self) -> str:
        """``<experiment>/<engine>-<format>``: how reports and MLflow name a variant."""
        return f"{self.experiment}/{self.variant}"


def variant_of(variant_file: Path) -> VariantKey:
    """Read the variant of a file in its directory (such as ``cells.json``) by the grammar above."""
    d = Path(variant_file).parent
    return VariantKey(experiment=d.parent.parent.name, model=d.parent.name, variant=d.name)


def spec_path(text: str) -> str:
    """Where a job's config slice ``text`` is kept: a path named by its sha256."""
    import hashlib

    return SPEC.format(digest=hashlib.sha256(text.encode()).hexdigest()[:20])


def cache_root() -> Path | None:
    """The per-machine cache outside the clone, or None when switched off (``BAKEOFF_CACHE_DIR=off``)."""
    explicit = os.environ.get("BAKEOFF_CACHE_DIR")
    if explicit:
        return None if explicit == "off" else Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "bakeoff"


def quality_site() -> Path:
    """Where the node route's carried quality payload is installed (``$BAKEOFF_QUALITY_SITE`` moves it, for tests)."""
    return Path(os.environ.get(QUALITY_SITE_ENV) or NODE_QUALITY_SITE)
