"""The ``bakeoff`` command line.

``bakeoff stage <name>`` runs one DAG stage; the Snakefile calls these, one
rule per stage, passing the slice of config the stage depends on as JSON (so a
change to that slice re-runs exactly that rule). Errors a user can fix are
printed as one clear message, without a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bakeoff.errors import BakeoffError


def _dir(p: str) -> Path:
    """Accept a manifest path or its directory; stages work on directories."""
    path = Path(p)
    return path.parent if path.name == "manifest.json" else path


def _cmd_config(a: argparse.Namespace) -> None:
    from bakeoff.config import config_hash, load_config

    cfg = load_config(a.overrides)
    print(json.dumps({"config_hash": config_hash(cfg), **cfg.model_dump(mode="json")}, indent=2))


def _cmd_verify(a: argparse.Namespace) -> None:
    from bakeoff.manifest import verify

    for p in a.paths:
        m = verify(_dir(p))
        print(f"ok  {p}  ({len(m['files'])} files, {m['total_bytes']} bytes)")


def _cmd_summarize(a: argparse.Namespace) -> None:
    from bakeoff.config import config_hash, load_config
    from bakeoff.stages.summarize import rows, write_csv

    cfg = load_config(a.overrides)
    write_csv(Path(a.out), rows(cfg, Path(a.models_root), config_hash(cfg)))


def _cmd_stage(a: argparse.Namespace) -> None:
    from bakeoff import schema

    out = _dir(a.out)
    name = a.stage
    if name == "fetch-llamacpp":
        from bakeoff.stages.fetch_llamacpp import fetch

        fetch(schema.ToolchainCfg.model_validate_json(a.spec), out)
    elif name == "build-llamacpp":
        from bakeoff.stages.build_llamacpp import build

        build(schema.ToolchainCfg.model_validate_json(a.spec), schema.HardwareCfg.model_validate_json(a.hardware),
              _dir(a.input), out, jobs=a.jobs)
    elif name == "fetch-model":
        from bakeoff.stages.fetch_model import fetch

        fetch(schema.ModelCfg.model_validate_json(a.spec), out)
    elif name == "to-fp16":
        from bakeoff.stages.to_fp16 import convert

        convert(_dir(a.input), out, fmt=a.format or "fp16")
    elif name == "quantize-fp8":
        from bakeoff.stages.quantize_fp8 import quantize

        q = schema.QuantCfg.model_validate_json(a.spec)
        quantize(_dir(a.input), out, scheme=q.scheme or "FP8_DYNAMIC", ignore=q.ignore, fmt=a.format or "fp8")
    elif name == "dequant-fp8":
        from bakeoff.stages.dequant_fp8 import dequantize

        dequantize(_dir(a.input), out, fmt=a.format or "fp8-dequant")
    elif name == "convert-gguf":
        from bakeoff.stages.convert_gguf import convert

        q = schema.QuantCfg.model_validate_json(a.spec)
        convert(_dir(a.input), _dir(a.tree), out, outtype=q.gguf_type or "F16", fmt=a.format or "f16")
    elif name == "quantize-gguf":
        from bakeoff.stages.quantize_gguf import quantize

        q = schema.QuantCfg.model_validate_json(a.spec)
        if not q.gguf_type:
            raise BakeoffError(f"format {a.format!r} has no gguf_type")
        quantize(_dir(a.input), _dir(a.toolchain), out, q.gguf_type, a.format, threads=a.jobs or 0)
    else:  # argparse restricts choices; kept for type checkers
        raise BakeoffError(f"unknown stage {name!r}")


STAGES = ["fetch-llamacpp", "build-llamacpp", "fetch-model", "to-fp16", "quantize-fp8", "dequant-fp8",
          "convert-gguf", "quantize-gguf"]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bakeoff", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)

    c = sub.add_parser("config", help="print the composed, validated config")
    c.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. experiment=blog_v100")
    c.set_defaults(func=_cmd_config)

    v = sub.add_parser("verify", help="re-hash artifacts against their manifests")
    v.add_argument("paths", nargs="+")
    v.set_defaults(func=_cmd_verify)

    m = sub.add_parser("summarize", help="write results/summary.csv for the composed experiment")
    m.add_argument("overrides", nargs="*", help="the Hydra overrides the pipeline ran with")
    m.add_argument("--out", default="results/summary.csv")
    m.add_argument("--models-root", default="models")
    m.set_defaults(func=_cmd_summarize)

    s = sub.add_parser("stage", help="run one pipeline stage (called by the Snakefile)")
    s.add_argument("stage", choices=STAGES)
    s.add_argument("--out", required=True, help="output manifest.json or directory")
    s.add_argument("--input", help="input artifact (manifest.json or directory)")
    s.add_argument("--spec", help="the stage's config slice, as JSON")
    s.add_argument("--hardware", help="hardware config, as JSON")
    s.add_argument("--tree", help="llama.cpp source tree artifact")
    s.add_argument("--toolchain", help="built llama.cpp toolchain artifact")
    s.add_argument("--format", help="format name of the output")
    s.add_argument("--jobs", type=int, default=None, help="parallel build/quantize threads")
    s.set_defaults(func=_cmd_stage)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except BakeoffError as e:
        print(f"bakeoff: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
