"""The GPU node's share of the DAG, run by Snakemake on the node, with bookkeeping on the submit host.

Why: on a cluster the GPU jobs (doctor, CUDA build, quantize, serve_load,
kernel_bench) run on a GPU node and everything after them (summary, report,
plots, MLflow) on the submit host. Where the node shares no filesystem with
the submit host -- the lent H200, which can receive one bundle of at most
64 MiB per call and return a few files -- this module moves the work across:

1. ``bakeoff node pack`` (submit host) bundles the checkout's files, the
   Python wheels the node lacks (Snakemake and bakeoff's core dependencies),
   the pinned llama.cpp source tree made by the ``fetch_llamacpp`` rule (a
   local rule: the node has no network), and ``node.sh``.
2. ``bash <bundle>/node.sh <snakemake --config entries>`` (GPU node) runs
   ``snakemake node``: bakeoff's own rules, unchanged, up to the ``node``
   target (rules/node.smk), then ``bakeoff node collect`` tars every
   node-made result (cells, per-request records, server logs, kernel
   benchmarks, the doctor's record, manifests, Snakemake's logs) into the
   returned folder. A second call on a still-warm node continues where the
   first stopped (Snakemake is incremental; serve_load skips finished cells).
   A fresh node continues from an earlier node's tarball when the bundle is
   packed with ``--resume <node-results.tgz>``: its finished cells travel in
   the bundle, and serve_load keeps each one whose settings hash still
   matches (a changed setting re-runs it). ``node.json`` names each tarball
   and the cells taken from it.
3. ``bakeoff node unpack <tarball>`` (submit host) puts those files where
   the DAG expects them; ``snakemake --touch node`` records them as made, and
   the plain ``snakemake`` builds summary, report, plots and MLflow runs.

The source tree travels trimmed (the pinned sdist is 77 MB; the bundle limit
is 64 MiB): directories no build target reads (other backends, docs, tests,
examples, vocab GGUFs) are left out, and the trimmed tree gets its own
manifest recording every kept file, the excluded patterns and the sdist's
sha256, so the node's build verifies exactly what it compiles.
"""

from __future__ import annotations

import fnmatch
import io
import json
import os
import shutil
import subprocess
import tarfile
import time
from collections.abc import Sequence
from pathlib import Path

from bakeoff.errors import BakeoffError
from bakeoff.layout import is_cell_stem
from bakeoff.models.manifest import read_manifest, verify, write_manifest
from bakeoff.stages import node_parts

# What node.sh --prepare runs in the background (snakemake --until): the rules that need only CPUs, and their inputs.
PREPARE_RULES = ["fetch_model", "model_fp16", "fp8_online", "convert_gguf", "quantize_gguf", "build_llamacpp"]
# Parts of the llama.cpp tree no target of bakeoff's builds reads (paths relative to llama.cpp/).
TRIM = ["models/*", "docs/*", "benches/*", "tests/*", "examples/*", "media/*", "ci/*",
        "ggml/src/ggml-vulkan/*", "ggml/src/ggml-sycl/*", "ggml/src/ggml-cann/*", "ggml/src/ggml-musa/*",
        "ggml/src/ggml-opencl/*", "ggml/src/ggml-webgpu/*", "ggml/src/ggml-hexagon/*", "ggml/src/ggml-zdnn/*",
        "*.gguf"]
# What comes back from the node: results the node makes, the manifests of what it built, and the logs.
COLLECT = ["results/hardware.json", "results/hardware-after.json", "results/gpu-check.json", "results/raw/**",
           "results/kernel/**", "logs/**", "models/*/*/manifest.json", "build/llamacpp/*-cuda*/manifest.json", "node.json"]
# Checkout files the node never reads: the committed records of earlier node runs. Carried, they would count
# twice against the 64 MiB a call takes (once in the working tree, once in the bundle).
NOT_PACKED = ["runs/*"]
OLD_MTIME = 946684800  # 2000-01-01: the carried source tree predates everything the node builds from it

NODE_SH = r"""#!/bin/bash
# On the GPU node, from any directory:
#   bash <bundle>/node.sh [--part <dir>/part-NN ...] [--prepare] [<snakemake --config entries...>]
# --part: keep a part of a carried payload (bakeoff node pack --vllm; <dir>/manifest.json beside it) and install
# the payload once all its parts have come (node_parts.py); with no config entries after it, stop there.
# --prepare: start the work that needs only CPUs (the llama.cpp build, the models) in the background and return;
# it goes on while the node stays warm (later calls carry parts), and the next run waits for it.
# Otherwise: run `snakemake node` (bakeoff's own rules) in $BAKEOFF_NODE_DIR and tar the results into $OUT.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
B=$(cd "$(dirname "$0")" && pwd)
PREPARE_RULES="PREPARE_RULES_HERE"
PARTS=()
while [ "${1:-}" = "--part" ]; do
  [ $# -ge 2 ] || { echo "node.sh: --part needs a file" >&2; exit 4; }
  PARTS+=("$2"); shift 2
done
if [ ${#PARTS[@]} -gt 0 ]; then
  python3 "$B/node_parts.py" receive --manifest "$(dirname "${PARTS[0]}")/manifest.json" "${PARTS[@]}" || exit 4
  [ $# -eq 0 ] && exit 0
fi
PREPARE=0
[ "${1:-}" = "--prepare" ] && { PREPARE=1; shift; }
W=${BAKEOFF_NODE_DIR:-/tmp/bakeoff-node}
SITE=${BAKEOFF_NODE_SITE:-/tmp/bakeoff-site}
OUT=${OUT:-$W/out}
mkdir -p "$W" "$SITE/bin" "$OUT"
T0=$(date +%s)
BUDGET=${BAKEOFF_NODE_TIMEOUT_S:-540}  # this call's time for Snakemake, waiting for a background prepare included
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
if [ -f "$W/prepare.pid" ] && kill -0 "$(cat "$W/prepare.pid")" 2>/dev/null; then
  [ $PREPARE = 1 ] && { echo "node.sh: already preparing (pid $(cat "$W/prepare.pid"); $W/prepare.log)"; exit 0; }
  echo "node.sh: waiting for the background prepare (pid $(cat "$W/prepare.pid"); $W/prepare.log)"
  while kill -0 "$(cat "$W/prepare.pid")" 2>/dev/null; do
    if [ "$(left)" -lt 90 ]; then
      echo "node.sh: the background prepare is still running; it goes on: call again"; tail -n 5 "$W/prepare.log"
      exit 5
    fi
    sleep 5
  done
fi
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$B"/whl/*.whl \
  > "$OUT/pip.log" 2>&1 || { cat "$OUT/pip.log"; exit 3; }
tar xzf "$B/repo.tgz" -C "$W"
export PYTHONPATH="$W/src:$SITE" PATH="$SITE/bin:$PATH"
printf '#!/bin/sh\nexec python3 -m bakeoff.cli "$@"\n' > "$SITE/bin/bakeoff" && chmod +x "$SITE/bin/bakeoff"
cd "$W"
if [ $PREPARE = 1 ]; then
  setsid nohup timeout -k 30 "${BAKEOFF_PREPARE_TIMEOUT_S:-3000}" python3 -m snakemake node --cores all \
    --scheduler greedy --rerun-incomplete --keep-going --config "$@" --until $PREPARE_RULES \
    > "$W/prepare.log" 2>&1 < /dev/null &
  echo $! > "$W/prepare.pid"
  echo "node.sh: preparing in the background (pid $!): $PREPARE_RULES; log $W/prepare.log"
  exit 0
fi
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1
timeout -k 30 "$(left)" python3 -m snakemake --cores all --scheduler greedy --rerun-incomplete \
  --keep-going --printshellcmds node --config "$@" > "$OUT/snakemake.log" 2>&1
rc=$?
echo "snakemake rc=$rc" >> "$OUT/snakemake.log"
python3 -m bakeoff.cli node collect --out "$OUT/node-results.tgz" >> "$OUT/snakemake.log" 2>&1
tail -n 40 "$OUT/snakemake.log"
exit $rc
""".replace("PREPARE_RULES_HERE", " ".join(PREPARE_RULES))


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout


def checkout_files(repo: Path) -> list[str]:
    """Tracked and untracked-but-not-ignored files: what a fresh clone plus local edits holds."""
    names = _git(repo, "ls-files", "-co", "--exclude-standard", "-z").split("\0")
    return sorted(n for n in names if n and (repo / n).is_file())


def _matches(rel: str, patterns: Sequence[str]) -> bool:
    return any(fnmatch.fnmatch(rel, pat) for pat in patterns)


def trim_source(src_dir: Path, dest: Path) -> dict:
    """Copy the fetched llama.cpp tree minus :data:`TRIM` into ``dest`` and write its manifest."""
    src = verify(src_dir)
    tree = src_dir / "llama.cpp"
    if dest.exists():
        shutil.rmtree(dest)
    (dest / "llama.cpp").mkdir(parents=True)
    for p in sorted(tree.rglob("*")):
        rel = p.relative_to(tree).as_posix()
        if p.is_file() and not p.is_symlink() and not _matches(rel, TRIM):
            out = dest / "llama.cpp" / rel
            out.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(p, out)
    archive = next((f for f in src["files"] if f["path"].endswith(".tar.gz")), {})
    return write_manifest(dest, kind="llamacpp-source", package=src.get("package"), version=src.get("version"),
                          commit=src.get("commit"), trimmed_from_sha256=archive.get("sha256"), trimmed=TRIM)


def _resumable(rel: str) -> bool:
    """A finished cell's summary or its per-request records (``results/raw/<e>/<m>/<variant>/<cell>.json[l]``)."""
    parts = rel.split("/")
    if len(parts) != 6 or parts[:2] != ["results", "raw"]:
        return False
    stem, dot, ext = parts[-1].rpartition(".")
    return bool(dot) and ext in ("json", "jsonl") and is_cell_stem(stem)


def resumed_cells(tarballs: Sequence[Path]) -> tuple[dict[str, bytes], list[dict]]:
    """The cell files of earlier node runs (a later tarball's copy wins) and where each came from."""
    import hashlib

    files: dict[str, bytes] = {}
    sources = []
    for t in tarballs:
        taken = []
        with tarfile.open(t) as tar:
            for m in tar.getmembers():
                if m.isfile() and _resumable(m.name):
                    f = tar.extractfile(m)
                    assert f is not None
                    files[m.name] = f.read()
                    taken.append(m.name)
        if not taken:
            raise BakeoffError(f"{t}: no finished cells (results/raw/<experiment>/<model>/<variant>/<cell>.json) "
                               "to resume from")
        sources.append({"tarball": t.name, "sha256": hashlib.sha256(t.read_bytes()).hexdigest(),
                        "cells": sorted(n for n in taken if n.endswith(".json"))})
    return files, sources


def pack(*, repo: Path, source: Path, wheels: Path, out: Path, resume: Sequence[Path] = ()) -> Path:
    """Write the bundle the node runs from: repo.tgz (checkout less :data:`NOT_PACKED` + trimmed source + resumed
    cells), whl/, node.sh."""
    tree = source if source.is_absolute() else repo / source  # a relative source is inside repo, not the cwd
    src_manifest = read_manifest(tree)
    rel_source = source.resolve().relative_to(repo.resolve()) if source.is_absolute() else source
    out.mkdir(parents=True, exist_ok=True)
    staging = out / ".trimmed"
    trim_source(tree, staging)
    files = [n for n in checkout_files(repo) if not _matches(n, NOT_PACKED)]
    carried, resumed = resumed_cells(resume)
    info = {"resumed_from": resumed,
            "git_sha": _git(repo, "rev-parse", "HEAD").strip(), "git_dirty": bool(_git(repo, "status", "--porcelain").strip()),
            "packed_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "source_commit": src_manifest.get("commit")}
    with tarfile.open(out / "repo.tgz", "w:gz") as tar:
        for name in files:
            tar.add(repo / name, arcname=name)
        for p in sorted(staging.rglob("*")):
            ti = tar.gettarinfo(str(p), arcname=str(rel_source / p.relative_to(staging)))
            ti.mtime = OLD_MTIME
            if p.is_file():
                with open(p, "rb") as f:
                    tar.addfile(ti, f)
            else:
                tar.addfile(ti)
        for name, data in sorted(carried.items()):
            _add_bytes(tar, name, data)
        _add_bytes(tar, "node.json", (json.dumps(info, indent=2) + "\n").encode())
    shutil.rmtree(staging)
    whl = out / "whl"
    if whl.resolve() != wheels.resolve():
        shutil.rmtree(whl, ignore_errors=True)
        shutil.copytree(wheels, whl)
    (out / "node.sh").write_text(NODE_SH)
    shutil.copy2(Path(node_parts.__file__), out / "node_parts.py")
    return out


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    ti = tarfile.TarInfo(name)
    ti.size, ti.mtime = len(data), int(time.time())
    tar.addfile(ti, io.BytesIO(data))



def collect(root: Path, out: Path) -> list[str]:
    """Tar what the node made (:data:`COLLECT`) into ``out``, keeping mtimes; returns the names."""
    names = []
    with tarfile.open(out, "w:gz") as tar:
        for p in sorted(root.rglob("*")):
            rel = p.relative_to(root).as_posix()
            if p.is_file() and not p.is_symlink() and _matches(rel, COLLECT) and not rel.startswith(".snakemake"):
                tar.add(p, arcname=rel)
                names.append(rel)
    return names


def unpack(tarball: Path, root: Path, *, correct: bool = True) -> list[str]:
    """Extract node results under ``root`` (only :data:`COLLECT` paths), keeping the node's mtimes.

    ``correct``: where the doctor's findings show the run's config naming another GPU than the node's, the
    unpacked rows and the doctor's record name the node's (:func:`correct_unpacked`), so the summary and the
    pages made from them do too. ``record`` reads the tarball as the node wrote it (``correct=False``)."""
    names = []
    with tarfile.open(tarball) as tar:
        members = []
        for m in tar.getmembers():
            if m.isdir():
                continue
            if not m.isfile() or m.name.startswith("/") or ".." in Path(m.name).parts or not _matches(m.name, COLLECT):
                raise BakeoffError(f"{tarball}: {m.name!r} is not a node result path")
            members.append(m)
            names.append(m.name)
        tar.extractall(root, members=members, filter="data")
    if correct:
        correct_unpacked(root)
    return names


CELL_COLUMNS = [
    "hardware", "gpu_name", "gpu_count", "gpu_memory_bytes",
    "engine", "format", "concurrency", "prompt_len", "repeat", "block", "order", "requests", "warmup_requests",
    "completed", "status", "load_note", "output_throughput", "steady_output_throughput", "ramp_s", "tail_s",
    "tail_share", "p99_ttft_ms", "p99_tpot_ms", "median_ttft_ms", "median_tpot_ms", "server_median_tpot_ms",
    "energy_j", "joules_per_output_token", "avg_power_w", "gpu_util_pct", "peak_gpu_bytes", "kv_cache_peak_pct",
    "peak_waiting_requests", "peak_running_requests", "energy_source", "weight_bytes", "engine_settings",
    "spec_hash", "started_utc", "node_id", "gpu_driver", "gpu_power_limit_w", "gpu_sm_clock_start_mhz",
    "gpu_mem_clock_start_mhz", "gpu_temp_start_c", "gpu_sm_clock_mean_mhz", "gpu_sm_clock_min_mhz",
    "client_cpu_s", "client_cpu_share", "client_loop_lag_p99_ms", "client_saturated", "client_saturated_reason",
    "cell", "ended_utc", "server_start", "startup_s",
]
# The pipeline's tables a record may hold beside what `record` derives (made on the submit host from the same
# tarball); `record` corrects their hardware columns as it does the cells'.
PIPELINE_TABLES = ["summary.csv", "capacity.csv"]
GPU_COLUMNS = ["gpu_name", "gpu_count", "gpu_memory_bytes"]


def _csv(path: Path, rows: list[dict], columns: list[str]) -> None:
    import csv

    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: json.dumps(v, sort_keys=True) if isinstance(v, (dict, list)) else v for k, v in r.items()})


def hardware_correction(rec: dict) -> dict | None:
    """Where the doctor's record shows the run's config naming another GPU than the node's: the config
    ``hardware=auto`` picks from the doctor's findings (``name``, ``config``), the config as run and how it
    differs. None where the config describes the node."""
    from bakeoff.composition.compose import find_conf_dir, hardware_configs
    from bakeoff.config.schema import HardwareCfg
    from bakeoff.hardware.match import choose, mismatches

    as_run = rec["hardware_config"]
    wrong = mismatches(rec, as_run)
    if not wrong:
        return None
    configs = hardware_configs(find_conf_dir(Path(__file__).parent))
    name, made = choose(rec, configs)
    config = HardwareCfg.model_validate(made or configs[name]).model_dump(mode="json")
    return {"name": name, "config": config, "as_run": as_run, "mismatches": wrong}


def gpu_facts(rec: dict, node_id: str | None) -> dict:
    """``gpu_name``, ``gpu_count``, ``gpu_memory_bytes`` of a row's GPUs (its ``node_id``, ``gpu:<uuid,...>``)
    from the doctor's findings: for rows made before the telemetry recorded them."""
    gpus = rec.get("gpus") or []
    if node_id and str(node_id).startswith("gpu:"):
        used = str(node_id)[4:].split(",")
        gpus = [g for g in gpus if g.get("uuid") in used]
        if len(gpus) != len(used):
            return {}
    if not gpus:
        return {}
    return {"gpu_name": " + ".join(dict.fromkeys(str(g["name"]) for g in gpus)), "gpu_count": len(gpus),
            "gpu_memory_bytes": min(int(g["memory_total_mib"]) << 20 for g in gpus)}


def _correct_row(row: dict, rec: dict, fix: dict | None) -> dict:
    out = dict(row)
    if not all(out.get(k) not in (None, "") for k in GPU_COLUMNS):
        out.update(gpu_facts(rec, out.get("node_id")))
    if fix is not None and out.get("hardware") == fix["as_run"]["name"]:
        out["hardware"] = fix["name"]
    return out


def _correct_table(path: Path, rec: dict, fix: dict | None) -> None:
    """A pipeline table's ``hardware`` and GPU columns, corrected in place (other columns as they were)."""
    import csv

    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        columns, rows = list(reader.fieldnames or []), list(reader)
    if "hardware" not in columns:
        return
    at = columns.index("hardware") + 1
    columns[at:at] = [c for c in GPU_COLUMNS if c not in columns]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns, lineterminator="\n")
        w.writeheader()
        for r in rows:
            w.writerow(_correct_row(r, rec, fix))


def corrected_record(rec: dict, fix: dict, by: str) -> dict:
    """The doctor's record with the config ``hardware=auto`` picks as ``hardware_config``, the run's kept as
    ``hardware_config_as_run`` and a note saying how it differs from the node (``by``: the command that
    corrected it)."""
    return {**rec, "hardware_config": fix["config"], "hardware_config_as_run": fix["as_run"],
            "hardware_config_note": f"the run's config ({fix['as_run']['name']}) does not describe this node: "
            f"{'; '.join(fix['mismatches'])}. hardware_config is the config hardware=auto picks from gpus "
            f"({by})"}


# Where the serving stage's JSON files hold rows (a cell or probe each): the file itself (a cell), or these lists.
ROW_LISTS = ["cells", "capacity", "probes"]


def _correct_result(data: object, rec: dict, fix: dict) -> object:
    """A serving-stage JSON file's rows corrected (:func:`_correct_row`), and its ``variant``'s ``hardware``."""
    if not isinstance(data, dict):
        return data
    if "hardware" in data and "cell" in data:
        return _correct_row(data, rec, fix)
    out = dict(data)
    for key in ROW_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [_correct_row(r, rec, fix) if isinstance(r, dict) and "hardware" in r else r for r in out[key]]
    variant = out.get("variant")
    if isinstance(variant, dict) and variant.get("hardware") == fix["as_run"]["name"]:
        out["variant"] = {**variant, "hardware": fix["name"]}
    return out


def correct_unpacked(root: Path) -> dict | None:
    """Correct unpacked node results in place where the run's hardware config does not describe the node.

    Why: the summary and the pages take each row's ``hardware`` from the cells the node wrote, and the
    roofline and the environment page take the doctor's record's ``hardware_config``; a run made under another
    GPU's config (an H200 config on an H100) would name the wrong GPU on every page. As ``record`` does for a
    record's tables, rows name the config ``hardware=auto`` picks from the doctor's findings and gain
    ``gpu_name``, ``gpu_count``, ``gpu_memory_bytes``; ``results/hardware.json`` keeps the run's config as
    ``hardware_config_as_run`` (:func:`corrected_record`). Measured values are left as they are, and each
    rewritten file keeps its mtime (the node's). Returns the correction (None: nothing to correct, also once
    corrected).
    """
    from bakeoff.layout import HARDWARE

    path = root / HARDWARE
    if not path.is_file():
        return None
    rec = json.loads(path.read_text())
    fix = hardware_correction(rec)
    if fix is None:
        return None
    for p in [*sorted((root / "results/raw").rglob("*.json")), path]:
        data = json.loads(p.read_text())
        new = corrected_record(rec, fix, "bakeoff node unpack") if p == path else _correct_result(data, rec, fix)
        if new != data:
            st = p.stat()
            p.write_text(json.dumps(new, indent=2) + "\n")
            os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
    return fix


def record(tarball: Path, out: Path, log_lines: int = 3) -> dict[str, Path]:
    """Derive a run record from a node's results tarball: every cell, every kernel benchmark, log ends, and the
    README's numbers.

    Reads only what the node wrote (and the Snakemake log of each call, ``call<N>-snakemake.log`` in ``out``),
    so a committed record holds nothing typed by hand: ``cells.csv`` (every cell JSON, whichever invocation
    made it), ``kernel.csv`` (llama-bench), ``server-log-ends.txt`` (each server log's first and last lines),
    the doctor's ``hardware.json``, the build's manifest, and the README's generated section
    (bakeoff.stages.node_readme). Where the doctor's findings show the run's config naming another GPU,
    rows name the config ``hardware=auto`` picks from them and ``hardware.json`` keeps the run's config as
    ``hardware_config_as_run`` (:func:`hardware_correction`).
    """
    import tempfile

    from bakeoff.stages import node_readme

    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        unpack(tarball, root, correct=False)
        rec = json.loads((root / "results/hardware.json").read_text())
        fix = hardware_correction(rec)
        cells = [_correct_row(json.loads(p.read_text()), rec, fix)
                 for p in sorted(root.glob("results/raw/*/*/*/c[0-9]*-p*.json"))]
        _csv(out / "cells.csv", cells, CELL_COLUMNS)
        kernels = []
        for p in sorted(root.glob("results/kernel/*/*.json")):
            k = json.loads(p.read_text())
            kernels.append({"format": k["format"], "flash_attn": k["flash_attn"], "tg128_tok_s": k["tg_tok_s"],
                            "tg128_stddev": k["tg_stddev"], "pp512_tok_s": k["pp_tok_s"], "pp512_stddev": k["pp_stddev"],
                            "command": " ".join(Path(c).name if i == 0 else c for i, c in enumerate(k["command"]))})
        _csv(out / "kernel.csv", kernels, ["format", "flash_attn", "tg128_tok_s", "tg128_stddev", "pp512_tok_s",
                                           "pp512_stddev", "command"])
        ends = []
        for p in sorted(root.glob("results/raw/*/*/*/server.log")):
            lines = p.read_text(errors="replace").splitlines()
            ends += [f"== {p.relative_to(root / 'results/raw')} ({len(lines)} lines)", *lines[:log_lines], "...",
                     *lines[-log_lines:], ""]
        (out / "server-log-ends.txt").write_text("\n".join(ends))
        if fix is None:
            shutil.copy2(root / "results/hardware.json", out / "hardware.json")
        else:
            (out / "hardware.json").write_text(json.dumps(corrected_record(rec, fix, "bakeoff node record"), indent=2) + "\n")
        for m in root.glob("build/llamacpp/*-cuda*/manifest.json"):
            shutil.copy2(m, out / "build-manifest.json")
        for name in PIPELINE_TABLES:
            if (out / name).is_file():
                _correct_table(out / name, rec, fix)
        from bakeoff.results.derived import measured_bandwidth_gbs

        hw = rec["hardware_config"]
        bandwidth = measured_bandwidth_gbs(hw, rec) or hw["mem_bandwidth_gbs"]
        (out / "table.md").write_text(format_table(cells, kernels, bandwidth))
        capacity, probes = [], []
        for p in sorted(root.glob("results/raw/*/*/*/capacity.json")):
            found = json.loads(p.read_text())
            capacity += [_correct_row(r, rec, fix) for r in found.get("capacity", [])]
            probes += found.get("probes", [])
        # Probes of a search that never wrote its capacity.json (the call's time ran out mid-search).
        unfinished = [json.loads(p.read_text()) for d in sorted(root.glob("results/raw/*/*/*/"))
                      if not (d / "capacity.json").exists() for p in sorted(d.glob("cap-*.json"))]
        client_check = json.loads((out / "client_check.json").read_text()) if (out / "client_check.json").is_file() \
            else None
        section = node_readme.generated(rec, fix, cells, capacity, probes, node_readme.read_calls(out),
                                        unfinished, client_check)
        node_readme.write_readme(out / "README.md", section, out.name)
    return {n: out / n for n in ("cells.csv", "kernel.csv", "server-log-ends.txt", "hardware.json", "table.md",
                                 "README.md")}


def _config(c: dict) -> str:
    settings = c.get("engine_settings") or {}
    if isinstance(settings, str):
        settings = json.loads(settings)
    return f"{c['engine']} --parallel {settings['parallel']}" if settings.get("parallel") else c["engine"]


def _saturated(c: dict) -> str:
    """``yes: <reason>`` where the client was the ceiling of the cell, ``no`` where not, blank where not recorded."""
    if c.get("client_saturated") is None:
        return ""
    return f"yes: {c.get('client_saturated_reason')}" if c["client_saturated"] else "no"


def _num(v: float | None, f: str = ".1f") -> str:
    return format(v, f) if v is not None else "not run"


def format_table(cells: list[dict], kernels: list[dict], bandwidth_gbs: float) -> str:
    """Per engine config, format and prompt length: served c=1 tok/s, llama-bench tg128, the roofline, J/token;
    then every cell with its served, server and telemetry columns.

    Rows are per engine config and format: two configs of one engine (``--parallel 32`` and ``4``) are two
    rows, told apart by their recorded settings as well as their name.
    """
    from bakeoff.results.roofline import decode_ceiling

    tg = {k["format"]: k["tg128_tok_s"] for k in kernels}
    lines = ["| engine | format | prompt | requests (c=1) | served tok/s (c=1) | kernel tg128 tok/s | roofline tok/s "
             f"({bandwidth_gbs:g} GB/s) | served / kernel | kernel / roofline | J/token c=1 | J/token c=8 | J/token c=32 |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    keys = sorted(dict.fromkeys((_config(c), c["format"], int(c["prompt_len"])) for c in cells),
                  key=lambda k: (k[0], k[1], k[2]))
    for eng, fmt, prompt in keys:
        by_c = {int(c["concurrency"]): c for c in cells if (_config(c), c["format"], int(c["prompt_len"])) ==
                (eng, fmt, prompt) and c.get("status") == "ok"}
        one = by_c.get(1, {})
        roof = decode_ceiling(bandwidth_gbs, one.get("weight_bytes") or next(
            c["weight_bytes"] for c in cells if c["format"] == fmt))
        served, kern = one.get("output_throughput"), tg.get(fmt)
        jt = [_num(by_c.get(c, {}).get("joules_per_output_token"), ".2f") for c in (1, 8, 32)]
        lines.append(f"| {eng} | {fmt} | {prompt} | {one.get('requests', 'not run')} | {_num(served)} | {_num(kern)} | "
                     f"{roof:.1f} | {_num(served / kern if served and kern else None, '.2f')} | "
                     f"{_num(kern / roof if kern else None, '.2f')} | {' | '.join(jt)} |")
    lines += ["", "| engine | format | c | prompt | requests | status | output tok/s | median TTFT ms | "
              "median TPOT ms (client / server) | peak waiting | KV peak % | J/token | client CPU s | client saturated |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in sorted(cells, key=lambda c: (_config(c), c["format"], int(c["prompt_len"]), int(c["concurrency"]),
                                          str(c.get("started_utc")))):
        lines.append(f"| {_config(c)} | {c['format']} | {c['concurrency']} | {c['prompt_len']} | {c.get('requests')} | "
                     f"{c.get('status')} | {_num(c.get('output_throughput'))} | {_num(c.get('median_ttft_ms'), '.0f')} | "
                     f"{_num(c.get('median_tpot_ms'), '.3f')} / {_num(c.get('server_median_tpot_ms'), '.3f')} | "
                     f"{c.get('peak_waiting_requests', '')} | {_num(c.get('kv_cache_peak_pct'))} | "
                     f"{_num(c.get('joules_per_output_token'), '.2f')} | {_num(c.get('client_cpu_s'), '.2f')} | "
                     f"{_saturated(c)} |")
    return "\n".join(lines) + "\n"
