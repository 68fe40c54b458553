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
from bakeoff.layout import COLUMNS_DOC


def _dir(p: str) -> Path:
    """Accept a manifest path or its directory; stages work on directories."""
    path = Path(p)
    return path.parent if path.name == "manifest.json" else path


def _cmd_config(a: argparse.Namespace) -> None:
    from bakeoff.composition.compose import config_hash, load_config

    cfg = load_config(a.overrides)
    print(json.dumps({"config_hash": config_hash(cfg), **cfg.model_dump(mode="json")}, indent=2))


def _cmd_verify(a: argparse.Namespace) -> None:
    from bakeoff.models.manifest import verify

    for p in a.paths:
        m = verify(_dir(p), memo=False)  # every byte: the explicit check
        print(f"ok  {p}  ({len(m['files'])} files, {m['total_bytes']} bytes)")


def _cmd_summary(a: argparse.Namespace) -> None:
    from bakeoff.stages.summary import COLUMNS, rows, write_csv

    # Each experiment's current config hash: per sweep point where the points file is given, else the one hash.
    points = json.loads(Path(a.points).read_text()) if a.points else {}
    expected = ({name: p["config_hash"] for name, p in points.items()} if points else
                {json.loads(Path(p).read_text())["variant"]["experiment"]: a.config_hash for p in a.indexes})
    if a.served_config_hash:  # a record served under an earlier config: its rows as they are, still one config
        expected = dict.fromkeys(expected, a.served_config_hash)
    records = rows([Path(p) for p in a.indexes], expected)
    columns = list(COLUMNS)
    if a.kernel:  # llama-bench beside the served rows (bakeoff.stages.kernel_bench)
        from bakeoff.stages.kernel_bench import join

        columns += [c for c in join(records, [Path(p) for p in a.kernel]) if c not in columns]
    if a.points:  # sweep axes, roofline and published ratios (bakeoff.results.derived)
        from bakeoff.results.derived import extend

        facts = json.loads(Path(a.hardware).read_text()) if a.hardware else None
        columns += [c for c in extend(records, json.loads(Path(a.points).read_text()),
                                      Path(a.published) if a.published else None, facts)
                    if c not in columns]
    from bakeoff.results import spread  # spread across repeats, and each difference's verdict

    margins = spread.margins_of(points) if points else None  # answer.equivalence_margin_pct per experiment
    columns += [c for c in spread.extend(records, margins) if c not in columns]
    write_csv(Path(a.out), records, columns)
    if a.capacity_out:
        from bakeoff.stages.summary import CAPACITY_COLUMNS, capacity_rows

        write_csv(Path(a.capacity_out), capacity_rows([Path(p) for p in a.indexes]), CAPACITY_COLUMNS)


def _cmd_columns(a: argparse.Namespace) -> None:
    from bakeoff.models.artifacts import atomic_write_text
    from bakeoff.results.column_docs import render

    if a.write:
        Path(a.write).parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(Path(a.write), render())
    else:
        sys.stdout.write(render())


def _cmd_trace_stats(a: argparse.Namespace) -> None:
    from bakeoff.loadgen.trace import read, trace_stats

    print(json.dumps(trace_stats(read(Path(a.trace), a.block_tokens), a.block_tokens), indent=2))


def _cmd_node(a: argparse.Namespace) -> None:
    from bakeoff.stages import node

    if a.action == "pack" and a.vllm:
        _pack_vllm(a)
    elif a.action == "pack":
        if not a.source or not a.wheels:
            raise BakeoffError("node pack needs --source (the fetch_llamacpp output) and --wheels")
        out = node.pack(repo=Path(a.repo), source=_dir(a.source), wheels=Path(a.wheels), out=Path(a.out or "node-bundle"),
                        resume=[Path(t) for t in a.resume])
        print(f"bundle in {out}: run `bash {out}/node.sh experiment=...` on the node")
    elif a.action == "record":
        if not a.out:
            raise BakeoffError("node record needs --out (the run record's folder)")
        paths = node.record(Path(a.tarball), Path(a.out))
        print("\n".join(str(p) for p in paths.values()))
    elif a.action == "collect":
        if not a.out:
            raise BakeoffError("node collect needs --out (the tarball to write)")
        names = node.collect(Path(a.repo), Path(a.out))
        print(f"{len(names)} node results in {a.out}")
    else:
        names = node.unpack(Path(a.tarball), Path(a.repo), correct=False)
        print(f"{len(names)} node results unpacked under {a.repo}")
        if fix := node.correct_unpacked(Path(a.repo)):
            print(f"the run's hardware config ({fix['as_run']['name']}) does not describe the node "
                  f"({'; '.join(fix['mismatches'])}): rows and results/hardware.json now name hardware={fix['name']}, "
                  "the run's config kept as hardware_config_as_run")
        print("next: snakemake --touch node --config ... hardware=auto")


def _pack_vllm(a: argparse.Namespace) -> None:
    """``node pack --vllm V``: vLLM's trimmed wheel and the wheels the node lacks, as parts with one manifest."""
    from bakeoff.layout import NODE_VLLM_DIR, cache_root
    from bakeoff.stages.node_vllm import MIB, default_part_bytes, pack_vllm

    out = Path(a.out or Path(a.repo) / NODE_VLLM_DIR)
    if a.vllm_wheels:
        wheels = Path(a.vllm_wheels)
    elif (cache := cache_root()) is not None:
        wheels = cache / "wheels" / f"vllm-{a.vllm}"
    else:
        raise BakeoffError("BAKEOFF_CACHE_DIR=off: give --vllm-wheels (a folder outside the checkout)")
    if a.part_mib:
        part, why = int(a.part_mib * MIB), f"--part-mib {a.part_mib:g}"
    else:
        part, why = default_part_bytes(Path(a.repo), extra_bytes=256 * 1024)
    m = pack_vllm(version=a.vllm, wheels=wheels, out=out, part_bytes=part, part_bytes_why=why, fetch=not a.offline)
    for p in m["parts"]:
        print(f"{out / p['name']}  {p['bytes']} bytes  sha256 {p['sha256']}")
    n = len(m["parts"])
    print(f"{n} parts of {m['payload']['bytes']} bytes; on the node, one call each (carry {out}/node.sh, "
          f"node_parts.py, manifest.json and the part): bash {out}/node.sh --part {out}/part-01 ... part-{n:02d}")


def _cmd_points(a: argparse.Namespace) -> None:
    """Write the invocation's sweep points (axes, hash, full config) -- results/config.json.

    Recomposed from Snakemake's ``--config`` entries by the same function the
    Snakefile uses, so the rule's params stay short (the entries plus hashes).
    """
    from bakeoff.composition.compose import find_conf_dir
    from bakeoff.composition.sweep import points_from_snakemake, points_json
    from bakeoff.models.artifacts import atomic_write_text

    smk = json.loads(a.smk_config)
    if not isinstance(smk, dict):
        raise BakeoffError("--smk-config must be a JSON object (snakemake's --config entries)")
    conf = find_conf_dir()
    data = json.loads(points_json(points_from_snakemake(smk, conf_dir=conf), conf_dir=conf))
    atomic_write_text(Path(a.out), json.dumps(data, indent=2, sort_keys=True) + "\n")


def _cmd_versions(a: argparse.Namespace) -> None:
    from bakeoff.models.artifacts import atomic_write_text
    from bakeoff.results.versions import collect

    cfg = json.loads(Path(a.config).read_text())
    first = next(iter(cfg.values()))
    tc = next((e["toolchain"] for e in first["config"]["engines"].values() if e.get("toolchain")), None)
    from bakeoff.composition.compose import find_conf_dir

    # The git state of the workflow's source (the checkout whose conf/ this run composed), wherever results go.
    v = collect(find_conf_dir().resolve().parent, toolchain_manifest=Path(a.toolchain) if a.toolchain else None,
                source_manifest=Path(a.model_source) if a.model_source else None,
                hardware_json=Path(a.hardware_json) if a.hardware_json else None,
                config_hash=" ".join(p["config_hash"] for p in cfg.values()), toolchain_cfg=tc,
                vllm_image=first["config"]["hardware"].get("vllm_image"),
                summary_csv=Path(a.summary) if a.summary else None)
    atomic_write_text(Path(a.out), json.dumps(v, indent=2, sort_keys=True) + "\n")


def _cmd_plots(a: argparse.Namespace) -> None:
    from bakeoff.report.plots import render_all

    for p in render_all(Path(a.summary), [Path(p) for p in a.indexes], Path(a.out)):
        print(p)


def _cmd_pages(a: argparse.Namespace) -> None:
    from bakeoff.report.pages import environment_html, summary_html

    summary_html(Path(a.summary), Path(a.summary_html))
    environment_html(Path(a.versions), Path(a.config), Path(a.environment_html),
                     Path(a.hardware_json) if a.hardware_json else None)
    if a.index_html:
        from bakeoff.report.index import index_html

        index_html(Path(a.summary), Path(a.capacity) if a.capacity else None, [Path(p) for p in a.plots],
                   Path(a.index_html), Path(a.answer_csv) if a.answer_csv else None)


def _cmd_dvc_params(a: argparse.Namespace) -> None:
    """Re-compose params.yaml exactly as `dvc exp run` does (DVC's own composer), for `dvc repro`."""
    from dvc.utils.hydra import compose_and_dump

    from bakeoff.composition.compose import find_conf_dir, load_config_file

    conf = find_conf_dir()
    compose_and_dump(Path(a.out), str(conf), None, "config", str(conf.parent), list(a.overrides))
    load_config_file(Path(a.out))  # validate what DVC will run
    print(f"wrote {a.out}")


def _cmd_timings(a: argparse.Namespace) -> None:
    from bakeoff.results.timings import markdown

    print(markdown(Path(a.bench_dir)))


def _cmd_check_baselines(a: argparse.Namespace) -> None:
    from bakeoff.results.baselines import check

    for name, b in check(Path(a.summary), Path(a.out)).items():
        print(f"baseline {name} ({', '.join(b['formats'])}): {b['ok']} of {b['cells']} cells ok", file=sys.stderr)


def _cmd_dvc_metrics(a: argparse.Namespace) -> None:
    from bakeoff.results.dvc_metrics import write

    write(Path(a.summary), Path(a.out))


def _cmd_track(a: argparse.Namespace) -> None:
    from bakeoff.results.tracking import log_invocation

    rec = log_invocation(summary=Path(a.summary), config_json=Path(a.config), versions_json=Path(a.versions),
                         cell_indexes=[Path(p) for p in a.indexes], plots=[Path(p) for p in a.plots],
                         uri=a.uri, experiment=a.experiment, out=Path(a.out), root=Path.cwd())
    print(f"parent run {rec['parent_run_id']} with {len(rec['children'])} cell runs in {rec['tracking_uri']}")


def _cmd_samples(a: argparse.Namespace) -> None:
    from bakeoff.stages.samples import collect

    collect([Path(p) for p in a.variants], Path(a.out))


def _cmd_load(a: argparse.Namespace) -> None:
    """One-off load test against any OpenAI-compatible server."""
    from transformers import AutoTokenizer

    from bakeoff.loadgen.metrics import summarize
    from bakeoff.loadgen.prompts import make_prompts
    from bakeoff.loadgen.runner import run_cell

    if a.concurrency < 1:
        raise BakeoffError(f"--concurrency must be >= 1, got {a.concurrency}")
    if a.prompt_len < 4 or a.output_len < 1 or a.num_requests < 1:
        raise BakeoffError("--prompt-len must be >= 4, --output-len and --num-requests >= 1")
    tok = AutoTokenizer.from_pretrained(a.tokenizer or a.model)
    prompts = make_prompts(tok, a.prompt_len, a.num_requests + a.warmup, seed=a.seed)
    res = run_cell(base_url=a.url, model=a.model, prompts=prompts[a.warmup:], prompt_len=a.prompt_len,
                   output_len=a.output_len, concurrency=a.concurrency, request_rate=a.request_rate,
                   warmup_prompts=prompts[:a.warmup], api_key=a.api_key, seed=a.seed,
                   count_tokens=lambda t: len(tok.encode(t, add_special_tokens=False)), label="load")
    metrics = {**summarize(res.records, res.duration_s), **res.client}
    if a.records:
        with open(a.records, "w") as f:
            for r in res.records:
                f.write(json.dumps(r.to_json()) + "\n")
    print(json.dumps(metrics, indent=2))


def _doctor_text(r: dict, predictions: dict | None = None) -> str:
    """The doctor's findings in a few lines (the full record is the JSON file)."""
    lines = [f"hardware config {r['hardware_config']['name']}: CPU {r['cpu']['model']} ({r['cpu']['logical_cores']} cores, "
             f"copy bandwidth {r['cpu']['mem_bandwidth_gbs'] or 0:.1f} GB/s); NVML {r.get('nvml')}"]
    for g in r.get("gpus", []):
        lines.append(f"  GPU{g['index']} {g['name']} cc {g['compute_capability']} {g['memory_total_mib']} MiB")
    if r.get("gpus"):
        lines.append(f"  driver {r.get('driver_version')}, CUDA {r.get('cuda_driver_version')}, "
                     f"interconnect {r['topology']['interconnect']}")
    lines.append("capabilities: " + ", ".join(f"{k}={v}" for k, v in r["capabilities"].items()))
    for v, p in (predictions or {}).items():
        lines.append(f"  {v}: {p['expected']}" + (f" ({p['reason']})" if p["reason"] else ""))
    lines += [f"warning: {w}" for w in r["warnings"]]
    return "\n".join(lines)


def _cmd_doctor(a: argparse.Namespace) -> None:
    from bakeoff.composition.compose import load_config
    from bakeoff.engines.support import predict, variants_of
    from bakeoff.hardware.doctor import run

    cfg = load_config(a.overrides)
    facts = json.loads(Path(a.facts).read_text()) if a.facts else None
    report = run(cfg.hardware, cfg.doctor, Path(a.out), facts=facts)
    print(_doctor_text(report, predict(report, variants_of(cfg))))
    print(f"wrote {a.out}")


def _cmd_llama_bench_compare(a: argparse.Namespace) -> None:
    from bakeoff.results.llamabench import COLUMNS, compare, write_csv

    rows = compare(Path(a.bench_json), a.hardware)
    if not rows:
        raise BakeoffError(f"{a.bench_json}: no test matches a scoreboard row (pp512/tg128, -fa 0 or 1)")
    write_csv(rows, Path(a.out))
    for r in rows:
        print("  ".join(str(r[c]) for c in COLUMNS[:9]))


def _json_arg(value: str | None, flag: str) -> str | None:
    """``--spec``/``--hardware`` take JSON, or ``@path`` of a file holding it (what the Snakefile passes)."""
    if value is None or not value.startswith("@"):
        return value
    path = Path(value[1:])
    if not path.is_file():
        raise BakeoffError(f"{flag} {value}: no such file (a job's config slice is written when the DAG is planned)")
    return path.read_text()


def _cmd_stage(a: argparse.Namespace) -> None:
    from bakeoff.config import schema

    a.spec, a.hardware = _json_arg(a.spec, "--spec"), _json_arg(a.hardware, "--hardware")
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
    elif name == "model-fp16":
        from bakeoff.stages.model_fp16 import convert

        convert(_dir(a.input), out, fmt=a.format or "fp16")
    elif name == "fp8-online":
        from bakeoff.stages.fp8_online import make

        make(_dir(a.input), out, fmt=a.format or "fp8-online")
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
    elif name == "build-llamacpp-python":
        from bakeoff.stages.build_llamacpp_python import build

        build(schema.ToolchainCfg.model_validate_json(a.spec), schema.HardwareCfg.model_validate_json(a.hardware),
              _dir(a.input), _dir(a.toolchain), out)
    elif name == "doctor":
        from bakeoff.hardware.doctor import run as doctor

        spec = json.loads(a.spec)
        report = doctor(schema.HardwareCfg.model_validate(spec["hardware"]),
                        schema.DoctorCfg.model_validate(spec.get("doctor", {})), Path(a.out))
        print(_doctor_text(report), file=sys.stderr)
    elif name in ("serve-load", "serve-block"):
        from bakeoff.hardware.doctor import ecc_gate
        from bakeoff.stages import serve_block, serve_load
        from bakeoff.stages.serve_job import ServeJob

        job = ServeJob.from_spec(json.loads(a.spec), fmt=a.format, model_dir=_dir(a.input),
                                 tokenizer_dir=_dir(a.tokenizer), out_dir=Path(a.out).parent,
                                 toolchain_dir=_dir(a.toolchain) if a.toolchain else None,
                                 eval_toolchain_dir=_dir(a.eval_toolchain) if a.eval_toolchain else None,
                                 show_progress=sys.stderr.isatty(), launcher_pid=a.watch_pid)
        ecc_gate(job.hardware, job.doctor)
        (serve_load if name == "serve-load" else serve_block).run(job, out=Path(a.out))
    elif name == "kernel-bench":
        from bakeoff.stages.kernel_bench import run as kernel_bench

        kernel_bench(hardware=schema.HardwareCfg.model_validate_json(a.hardware), model_dir=_dir(a.input),
                     toolchain_dir=_dir(a.toolchain), fa=a.flash_attn, out=Path(a.out))
    elif name == "gpu-check":  # --spec {"record": results/hardware.json, "doctor": {...}}
        from bakeoff.stages.gpu_check import run as gpu_check

        spec = json.loads(a.spec)
        gpu_check(record=Path(spec["record"]), model_dir=_dir(a.input) if a.input else None,
                  toolchain_dir=_dir(a.toolchain) if a.toolchain else None,
                  out=Path(a.out), allow=schema.DoctorCfg.model_validate(spec.get("doctor", {})).allow_uncorrected_ecc)
    elif name == "ecc-recheck":  # --input results/hardware.json (the doctor's record before the first server)
        from bakeoff.hardware.doctor import recheck

        recheck(Path(a.input), Path(a.out))
    else:  # argparse restricts choices; kept for type checkers
        raise BakeoffError(f"unknown stage {name!r}")


STAGES = ["doctor", "fetch-llamacpp", "build-llamacpp", "build-llamacpp-python", "fetch-model", "model-fp16", "fp8-online",
          "quantize-fp8",
          "dequant-fp8", "convert-gguf", "quantize-gguf", "serve-load", "serve-block", "kernel-bench", "gpu-check", "ecc-recheck"]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bakeoff", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)

    c = sub.add_parser("config", help="print the composed, validated config")
    c.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. experiment=blog_v100")
    c.set_defaults(func=_cmd_config)

    d = sub.add_parser("doctor", help="record this node's hardware, capabilities and health (results/hardware.json)")
    d.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. hardware=h200")
    d.add_argument("--out", default="results/hardware.json")
    d.add_argument("--facts", help="analyze recorded probe facts (python -m bakeoff.hardware.doctor OUT.json on the node) "
                                   "instead of probing this machine")
    d.set_defaults(func=_cmd_doctor)

    lb = sub.add_parser("llama-bench-compare", help="llama-bench -o json results beside the CUDA scoreboard")
    lb.add_argument("bench_json")
    lb.add_argument("--hardware", required=True, help="the GPU it ran on, e.g. h200")
    lb.add_argument("--out", required=True, help="CSV to write")
    lb.set_defaults(func=_cmd_llama_bench_compare)

    v = sub.add_parser("verify", help="re-hash artifacts against their manifests")
    v.add_argument("paths", nargs="+")
    v.set_defaults(func=_cmd_verify)

    m = sub.add_parser("summary", aliases=["summarize"],
                       help="write results/summary.csv from the variants' cells.json")
    m.add_argument("indexes", nargs="*", help="cells.json of every variant")
    m.add_argument("--out", default="results/summary.csv")
    m.add_argument("--capacity-out", help="also write results/capacity.csv (the variants' capacity searches)")
    m.add_argument("--config-hash", default="")
    m.add_argument("--served-config-hash", default="",
                   help="the one config hash the rows were served under, where it is not the current config's (a "
                        "GPU node's record made by an earlier bakeoff); rows of any other hash are still refused")
    m.add_argument("--points", help="results/config.json (sweep points, bakeoff.composition.sweep.points_json): "
                   "adds axis/roofline columns")
    m.add_argument("--published", help="published numbers YAML: adds measured/published ratio columns")
    m.add_argument("--hardware", help="results/hardware.json (the doctor's): predictions, measured CPU bandwidth")
    m.add_argument("--kernel", nargs="*", default=[], help="llama-bench results (kernel_bench rule): kernel columns")
    m.set_defaults(func=_cmd_summary)

    co = sub.add_parser("columns", help="the data dictionary of results/summary.csv and results/capacity.csv "
                        "(bakeoff.results.columns) as Markdown")
    co.add_argument("--write", metavar="PATH", help=f"write it there (the committed copy: {COLUMNS_DOC}) "
                    "instead of printing it")
    co.set_defaults(func=_cmd_columns)

    ts = sub.add_parser("trace-stats", help="the statistics the trace generator draws from, computed from a "
                        "Mooncake-format trace (how data/traces/*.yaml were made)")
    ts.add_argument("trace", help="a Mooncake-format JSONL file")
    ts.add_argument("--block-tokens", type=int, default=512, help="tokens per hash_id block (Mooncake: 512)")
    ts.set_defaults(func=_cmd_trace_stats)

    sm = sub.add_parser("samples", help="write the variants' sample generations side by side (markdown + json)")
    sm.add_argument("variants", nargs="+", help="samples.json of every variant")
    sm.add_argument("--out", required=True)
    sm.set_defaults(func=_cmd_samples)

    pt = sub.add_parser("points", help="write the sweep points JSON (results/config.json)")
    pt.add_argument("--smk-config", required=True, help="snakemake's --config entries as JSON")
    pt.add_argument("--hashes", default="", help="the points' config hashes (only so a config change re-runs the rule)")
    pt.add_argument("--out", required=True)
    pt.set_defaults(func=_cmd_points)

    vs = sub.add_parser("versions", help="write the pinned versions (results/versions.json)")
    vs.add_argument("--config", required=True, help="results/config.json")
    vs.add_argument("--toolchain", help="llama.cpp toolchain manifest.json")
    vs.add_argument("--model-source", help="models/<model>/source/manifest.json")
    vs.add_argument("--hardware-json", help="results/hardware.json (optional; tolerated if absent)")
    vs.add_argument("--summary", help="results/summary.csv: each engine's served versions (served_<engine>)")
    vs.add_argument("--out", required=True)
    vs.set_defaults(func=_cmd_versions)

    pl = sub.add_parser("plots", help="render the report plots (PNG) from the summary and per-request JSONL")
    pl.add_argument("indexes", nargs="*", help="cells.json of every variant")
    pl.add_argument("--summary", required=True)
    pl.add_argument("--out", required=True, help="output directory")
    pl.set_defaults(func=_cmd_plots)

    pg = sub.add_parser("pages", help="render the report's HTML pages (summary; hardware + versions)")
    pg.add_argument("--summary", required=True)
    pg.add_argument("--versions", required=True)
    pg.add_argument("--config", required=True)
    pg.add_argument("--hardware-json")
    pg.add_argument("--summary-html", required=True)
    pg.add_argument("--environment-html", required=True)
    pg.add_argument("--index-html", help="also write the self-contained report page (results/report/index.html)")
    pg.add_argument("--capacity", help="results/capacity.csv, for the index page")
    pg.add_argument("--answer-csv", help="also write the index page's answer as a table (results/answer.csv)")
    pg.add_argument("--plots", nargs="*", default=[], help="PNG plots the index page embeds")
    pg.set_defaults(func=_cmd_pages)

    dp = sub.add_parser("dvc-params", help="re-compose params.yaml with DVC's Hydra composer (after editing conf/)")
    dp.add_argument("overrides", nargs="*", help="Hydra overrides (default: none, the committed default)")
    dp.add_argument("--out", default="params.yaml")
    dp.set_defaults(func=_cmd_dvc_params)

    tm = sub.add_parser("timings", help="where a run spent its time: the rules' benchmark files, by rule (markdown)")
    tm.add_argument("bench_dir", nargs="?", default="logs/bench")
    tm.set_defaults(func=_cmd_timings)

    cb = sub.add_parser("check-baselines", help="fail unless every engine's 16-bit variant has an ok cell")
    cb.add_argument("summary")
    cb.add_argument("--out", required=True)
    cb.set_defaults(func=_cmd_check_baselines)

    dm = sub.add_parser("dvc-metrics", help="write results/metrics.json (DVC metrics) from the summary")
    dm.add_argument("summary")
    dm.add_argument("--out", required=True)
    dm.set_defaults(func=_cmd_dvc_metrics)

    tr = sub.add_parser("track", help="log this invocation to MLflow (parent run + one child per cell)")
    tr.add_argument("indexes", nargs="*", help="cells.json of every variant")
    tr.add_argument("--summary", required=True)
    tr.add_argument("--config", required=True)
    tr.add_argument("--versions", required=True)
    tr.add_argument("--plots", nargs="*", default=[])
    tr.add_argument("--uri", required=True)
    tr.add_argument("--experiment", required=True)
    tr.add_argument("--out", required=True)
    tr.set_defaults(func=_cmd_track)

    ld = sub.add_parser("load", help="run the load generator alone against an OpenAI-compatible server")
    ld.add_argument("--url", required=True, help="base URL, e.g. http://127.0.0.1:8000")
    ld.add_argument("--model", required=True, help="model name the server serves")
    ld.add_argument("--tokenizer", help="HF tokenizer dir/name for exact-length prompts (default: --model)")
    ld.add_argument("--concurrency", type=int, default=1)
    ld.add_argument("--prompt-len", type=int, default=128)
    ld.add_argument("--output-len", type=int, default=128)
    ld.add_argument("--num-requests", type=int, default=32)
    ld.add_argument("--warmup", type=int, default=2)
    ld.add_argument("--request-rate", type=float, default=None, help="Poisson req/s (default: closed loop)")
    ld.add_argument("--api-key", default=None)
    ld.add_argument("--seed", type=int, default=0)
    ld.add_argument("--records", help="write per-request records (JSONL) here")
    ld.set_defaults(func=_cmd_load)

    nd = sub.add_parser("node", help="run the GPU node's share of the DAG elsewhere: pack, collect, unpack")
    nd.add_argument("action", choices=["pack", "collect", "unpack", "record"])
    nd.add_argument("tarball", nargs="?", help="unpack, record: the node-results.tgz that came back")
    nd.add_argument("--repo", default=".", help="the checkout (pack, unpack) or the node's run directory (collect)")
    nd.add_argument("--source", help="pack: the pinned llama.cpp source (build/llamacpp/src-<commit>)")
    nd.add_argument("--wheels", help="pack: folder of the wheels the node lacks")
    nd.add_argument("--out", default=None,
                    help="pack: bundle folder (node-bundle; with --vllm, build/node-vllm); collect: tarball to write")
    nd.add_argument("--vllm", metavar="VERSION",
                    help="pack: instead of the bundle, vLLM VERSION for the node as parts (bakeoff.stages.node_vllm)")
    nd.add_argument("--vllm-wheels", help="pack --vllm: the download cache (default ~/.cache/bakeoff/wheels/vllm-V)")
    nd.add_argument("--part-mib", type=float, default=None,
                    help="pack --vllm: part size in MiB (default: up to 55, what fits a call beside the working tree)")
    nd.add_argument("--offline", action="store_true", help="pack --vllm: use only wheels already in the cache")
    nd.add_argument("--resume", action="append", default=[], metavar="TGZ",
                    help="pack: an earlier node-results.tgz whose finished cells the node keeps (repeatable)")
    nd.set_defaults(func=_cmd_node)

    s = sub.add_parser("stage", help="run one pipeline stage (called by the Snakefile)")
    s.add_argument("stage", choices=STAGES)
    s.add_argument("--out", required=True, help="output manifest.json or directory")
    s.add_argument("--input", help="input artifact (manifest.json or directory)")
    s.add_argument("--spec", help="the stage's config slice: JSON, or @file holding it")
    s.add_argument("--hardware", help="hardware config: JSON, or @file holding it")
    s.add_argument("--tree", help="llama.cpp source tree artifact")
    s.add_argument("--toolchain", help="built llama.cpp toolchain artifact")
    s.add_argument("--eval-toolchain", help="built llama-cpp-python artifact (the GGUF evaluation server)")
    s.add_argument("--tokenizer", help="HF checkpoint whose tokenizer builds the prompts")
    s.add_argument("--format", help="format name of the output")
    s.add_argument("--watch-pid", type=int, default=None,
                   help="stop (and stop the server) when this process -- the launching snakemake -- dies")
    s.add_argument("--jobs", type=int, default=None, help="parallel build/quantize threads")
    s.add_argument("--flash-attn", choices=["on", "off", "auto"], default="auto", help="llama-bench's -fa (the server's)")
    s.set_defaults(func=_cmd_stage)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from bakeoff.engines.session import Interrupted

    try:
        args.func(args)
    except (BakeoffError, Interrupted) as e:
        print(f"bakeoff: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
