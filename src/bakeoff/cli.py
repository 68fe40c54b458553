"""The ``bakeoff`` command line: one table of commands, each with its arguments and its handler.

``bakeoff stage <name>`` runs one DAG rule's module; the Snakefile calls these, one rule per stage, passing the
slice of config the stage depends on as JSON (so a change to that slice re-runs exactly that rule). Errors a
user can fix are printed as one clear message, without a traceback.

Why a table: the parser, the help and the list of stages are all read from :data:`COMMANDS` and
:data:`STAGES`, so a command is added in one place. A handler is named as ``module:function`` and imported only
when its command runs: ``bakeoff stage ...`` starts once per job, and most handlers pull in heavy libraries.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

from bakeoff.config.stageargs import StageArgs, json_arg
from bakeoff.errors import BakeoffError
from bakeoff.layout import COLUMNS_DOC


@dataclass(frozen=True)
class Arg:
    """One argument: ``add_argument``'s flags and keywords."""

    flags: tuple[str, ...]
    options: dict[str, Any] = field(default_factory=dict)


def arg(*flags: str, **options: Any) -> Arg:
    return Arg(flags, options)


@dataclass(frozen=True)
class Command:
    help: str
    handler: str  # "module:function", taking the parsed arguments
    args: tuple[Arg, ...] = ()
    aliases: tuple[str, ...] = ()


# The DAG's stages: `bakeoff stage <name>` -> the rule module's handler, taking StageArgs.
STAGES: dict[str, str] = {
    "doctor": "bakeoff.stages.doctor:run_stage",
    "fetch-llamacpp": "bakeoff.stages.fetch_llamacpp:run_stage",
    "build-llamacpp": "bakeoff.stages.build_llamacpp:run_stage",
    "build-llamacpp-python": "bakeoff.stages.build_llamacpp_python:run_stage",
    "fetch-model": "bakeoff.stages.fetch_model:run_stage",
    "model-fp16": "bakeoff.stages.model_fp16:run_stage",
    "fp8-online": "bakeoff.stages.fp8_online:run_stage",
    "quantize-fp8": "bakeoff.stages.quantize_fp8:run_stage",
    "dequant-fp8": "bakeoff.stages.dequant_fp8:run_stage",
    "convert-gguf": "bakeoff.stages.convert_gguf:run_stage",
    "quantize-gguf": "bakeoff.stages.quantize_gguf:run_stage",
    "serve-load": "bakeoff.stages.serve_load:run_stage",
    "serve-block": "bakeoff.stages.serve_block:run_stage",
    "kernel-bench": "bakeoff.stages.kernel_bench:run_stage",
    "gpu-check": "bakeoff.stages.gpu_check:run_stage",
    "ecc-recheck": "bakeoff.stages.doctor:run_recheck",
}

OVERRIDES = arg("overrides", nargs="*", help="Hydra overrides, e.g. experiment=blog_v100")
INDEXES = arg("indexes", nargs="*", help="cells.json of every variant")

COMMANDS: dict[str, Command] = {
    "config": Command("print the composed, validated config", "bakeoff.composition.compose:config_command",
                      (OVERRIDES,)),
    "doctor": Command(
        "record this node's hardware, capabilities and health (results/hardware.json)",
        "bakeoff.stages.doctor:run_command",
        (arg("overrides", nargs="*", help="Hydra overrides, e.g. hardware=h200"),
         arg("--out", default="results/hardware.json"),
         arg("--facts", help="analyze recorded probe facts (python -m bakeoff.hardware.doctor OUT.json on the node) "
                             "instead of probing this machine"))),
    "llama-bench-compare": Command(
        "llama-bench -o json results beside the CUDA scoreboard", "bakeoff.results.llamabench:compare_command",
        (arg("bench_json"), arg("--hardware", required=True, help="the GPU it ran on, e.g. h200"),
         arg("--out", required=True, help="CSV to write"))),
    "verify": Command("re-hash artifacts against their manifests", "bakeoff.models.manifest:verify_command",
                      (arg("paths", nargs="+"),)),
    "summary": Command(
        "write results/summary.csv from the variants' cells.json", "bakeoff.stages.summary:run_command",
        (INDEXES, arg("--out", default="results/summary.csv"),
         arg("--capacity-out", help="also write results/capacity.csv (the variants' capacity searches)"),
         arg("--config-hash", default=""),
         arg("--served-config-hash", default="",
             help="the one config hash the rows were served under, where it is not the current config's (a GPU "
                  "node's record made by an earlier bakeoff); rows of any other hash are still refused"),
         arg("--points", help="results/config.json (sweep points, bakeoff.composition.sweep.points_json): adds "
                              "axis/roofline columns"),
         arg("--published", help="published numbers YAML: adds measured/published ratio columns"),
         arg("--hardware", help="results/hardware.json (the doctor's): predictions, measured CPU bandwidth"),
         arg("--kernel", nargs="*", default=[], help="llama-bench results (kernel_bench rule): kernel columns")),
        aliases=("summarize",)),
    "columns": Command(
        "the data dictionary of results/summary.csv and results/capacity.csv (bakeoff.results.columns) as Markdown",
        "bakeoff.results.column_docs:run_command",
        (arg("--write", metavar="PATH", help=f"write it there (the committed copy: {COLUMNS_DOC}) instead of "
                                             "printing it"),)),
    "trace-stats": Command(
        "the statistics the trace generator draws from, computed from a Mooncake-format trace (how "
        "data/traces/*.yaml were made)", "bakeoff.loadgen.trace:stats_command",
        (arg("trace", help="a Mooncake-format JSONL file"),
         arg("--block-tokens", type=int, default=512, help="tokens per hash_id block (Mooncake: 512)"))),
    "samples": Command(
        "write the variants' sample generations side by side (markdown + json)", "bakeoff.stages.samples:run_command",
        (arg("variants", nargs="+", help="samples.json of every variant"), arg("--out", required=True))),
    "points": Command(
        "write the sweep points JSON (results/config.json)", "bakeoff.composition.sweep:points_command",
        (arg("--smk-config", required=True, help="snakemake's --config entries as JSON"),
         arg("--hashes", default="", help="the points' config hashes (only so a config change re-runs the rule)"),
         arg("--out", required=True))),
    "versions": Command(
        "write the pinned versions (results/versions.json)", "bakeoff.results.versions:run_command",
        (arg("--config", required=True, help="results/config.json"),
         arg("--toolchain", help="llama.cpp toolchain manifest.json"),
         arg("--model-source", help="models/<model>/source/manifest.json"),
         arg("--hardware-json", help="results/hardware.json (optional; tolerated if absent)"),
         arg("--summary", help="results/summary.csv: each engine's served versions (served_<engine>)"),
         arg("--out", required=True))),
    "plots": Command(
        "render the report plots (PNG) from the summary and per-request JSONL", "bakeoff.report.plots:run_command",
        (INDEXES, arg("--summary", required=True), arg("--out", required=True, help="output directory"))),
    "pages": Command(
        "render the report's HTML pages (summary; hardware + versions)", "bakeoff.report.index:run_command",
        (arg("--summary", required=True), arg("--versions", required=True), arg("--config", required=True),
         arg("--hardware-json"), arg("--summary-html", required=True), arg("--environment-html", required=True),
         arg("--index-html", help="also write the self-contained report page (results/report/index.html)"),
         arg("--capacity", help="results/capacity.csv, for the index page"),
         arg("--answer-csv", help="also write the index page's answer as a table (results/answer.csv)"),
         arg("--plots", nargs="*", default=[], help="PNG plots the index page embeds"))),
    "dvc-params": Command(
        "re-compose params.yaml with DVC's Hydra composer (after editing conf/)",
        "bakeoff.composition.compose:dvc_params_command",
        (arg("overrides", nargs="*", help="Hydra overrides (default: none, the committed default)"),
         arg("--out", default="params.yaml"))),
    "timings": Command(
        "where a run spent its time: the rules' benchmark files, by rule (markdown)",
        "bakeoff.results.timings:run_command", (arg("bench_dir", nargs="?", default="logs/bench"),)),
    "check-baselines": Command(
        "fail unless every engine's 16-bit variant has an ok cell", "bakeoff.results.baselines:run_command",
        (arg("summary"), arg("--out", required=True))),
    "dvc-metrics": Command(
        "write results/metrics.json (DVC metrics) from the summary", "bakeoff.results.dvc_metrics:run_command",
        (arg("summary"), arg("--out", required=True))),
    "track": Command(
        "log this invocation to MLflow (parent run + one child per cell)", "bakeoff.results.tracking:run_command",
        (INDEXES, arg("--summary", required=True), arg("--config", required=True), arg("--versions", required=True),
         arg("--plots", nargs="*", default=[]), arg("--uri", required=True), arg("--experiment", required=True),
         arg("--out", required=True))),
    "load": Command(
        "run the load generator alone against an OpenAI-compatible server", "bakeoff.loadgen.command:run_command",
        (arg("--url", required=True, help="base URL, e.g. http://127.0.0.1:8000"),
         arg("--model", required=True, help="model name the server serves"),
         arg("--tokenizer", help="HF tokenizer dir/name for exact-length prompts (default: --model)"),
         arg("--concurrency", type=int, default=1), arg("--prompt-len", type=int, default=128),
         arg("--output-len", type=int, default=128), arg("--num-requests", type=int, default=32),
         arg("--warmup", type=int, default=2),
         arg("--request-rate", type=float, default=None, help="Poisson req/s (default: closed loop)"),
         arg("--start", choices=["burst", "ramp"], default="burst",
             help="closed loop: every user at once (burst, as vllm bench serve) or staggered over --ramp-s (ramp: "
                  "latency statistics over the steady span after it)"),
         arg("--ramp-s", type=float, default=None, help="the ramp's length (default: the warm-up's median latency)"),
         arg("--api-key", default=None), arg("--seed", type=int, default=0),
         arg("--records", help="write per-request records (JSONL) here"))),
    "node": Command(
        "run the GPU node's share of the DAG elsewhere: plan, pack, collect, unpack, record, return-build",
        "bakeoff.node.command:run_command",
        (arg("action", choices=["plan", "pack", "collect", "unpack", "record", "return-build"]),
         arg("tarball", nargs="?", help="unpack, record: the node-results.tgz that came back; plan: the first override"),
         arg("overrides", nargs="*", help="plan: the experiment's Hydra overrides, e.g. experiment=h100_capacity "
                                          "hardware=h100 (bakeoff.node.plan)"),
         arg("--record", metavar="RUN", help="plan: a record folder (runs/<name>): its plan beside the minutes its "
                                             "call logs show, as Markdown"),
         arg("--repo", default=".", help="the checkout (pack, unpack) or the node's run directory (collect)"),
         arg("--source", help="pack: the pinned llama.cpp source (build/llamacpp/src-<commit>; with --quality, "
                              "its sdist builds the binding wheel; default: conf/engine/llamacpp.yaml's commit)"),
         arg("--wheels", help="pack: folder of the wheels the node lacks; pack --quality: the download cache "
                              "(default ~/.cache/bakeoff/wheels/quality)"),
         arg("--out", default=None,
             help="pack: bundle folder (node-bundle; with --vllm, build/node-vllm; with --quality, build/node-quality); "
                  "collect: tarball to write"),
         arg("--vllm", metavar="VERSION",
             help="pack: instead of the bundle, vLLM VERSION for the node as parts (bakeoff.node.vllm)"),
         arg("--quality", action="store_true",
             help="pack: instead of the bundle, quality for the node as parts: the embedded model, lm-eval, "
                  "compressed-tensors, the binding wheel (bakeoff.node.quality)"),
         arg("--build", metavar="ARCHIVE",
             help="pack: instead of the bundle, a llama.cpp build a node returned (node.sh --return-build: "
                  "llamacpp-build-<key>.tar.xz, or its .part0) as parts the next node installs (bakeoff.node.build_carry)"),
         arg("--vllm-wheels", help="pack --vllm: the download cache (default ~/.cache/bakeoff/wheels/vllm-V)"),
         arg("--part-mib", type=float, default=None,
             help="pack --vllm/--quality/--build: part size in MiB (default: up to 55, what fits a call beside the "
                  "working tree)"),
         arg("--offline", action="store_true", help="pack --vllm/--quality: use only wheels already in the cache"),
         arg("--resume", action="append", default=[], metavar="TGZ",
             help="pack: an earlier node-results.tgz whose finished cells the node keeps (repeatable)"))),
    "stage": Command(
        "run one pipeline stage (called by the Snakefile)", "bakeoff.cli:run_stage",
        (arg("stage", choices=list(STAGES)),
         arg("--out", required=True, help="output manifest.json or directory"),
         arg("--input", help="input artifact (manifest.json or directory)"),
         arg("--spec", help="the stage's config slice: JSON, or @file holding it"),
         arg("--hardware", help="hardware config: JSON, or @file holding it"),
         arg("--tree", help="llama.cpp source tree artifact"),
         arg("--toolchain", help="built llama.cpp toolchain artifact"),
         arg("--eval-toolchain", help="built llama-cpp-python artifact (the GGUF evaluation server)"),
         arg("--tokenizer", help="HF checkpoint whose tokenizer builds the prompts"),
         arg("--format", help="format name of the output"),
         arg("--watch-pid", type=int, default=None,
             help="stop (and stop the server) when this process -- the launching snakemake -- dies"),
         arg("--jobs", type=int, default=None, help="parallel build/quantize threads"),
         arg("--flash-attn", choices=["on", "off", "auto"], default="auto", help="llama-bench's -fa (the server's)"))),
}


def handler(ref: str) -> Callable[[Any], None]:
    """The function a ``module:function`` reference names, its module imported now."""
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


def run_stage(a: argparse.Namespace) -> None:
    """``bakeoff stage <name>``: the rule module's handler, with the stage's arguments typed (JSON from @files)."""
    given = {f.name: getattr(a, f.name) for f in fields(StageArgs)}
    given.update(spec=json_arg(a.spec, "--spec"), hardware=json_arg(a.hardware, "--hardware"))
    handler(STAGES[a.stage])(StageArgs(**given))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bakeoff", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    for name, cmd in COMMANDS.items():
        s = sub.add_parser(name, help=cmd.help, aliases=list(cmd.aliases))
        for a in cmd.args:
            s.add_argument(*a.flags, **a.options)
        s.set_defaults(handler=cmd.handler)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from bakeoff.engines.session import Interrupted

    try:
        handler(args.handler)(args)
    except (BakeoffError, Interrupted) as e:
        print(f"bakeoff: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
