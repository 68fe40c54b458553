"""``bakeoff node``: plan a node's minutes, pack a bundle for it, collect its results there, unpack them here,
derive a record.

Why one command: each action is one step of the node route (bakeoff.node.bundle says the route); the command
names the step and passes the paths.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from bakeoff.config.stageargs import artifact_dir
from bakeoff.errors import BakeoffError
from bakeoff.layout import LLAMACPP_SRC, NODE_BUILD_DIR, NODE_QUALITY_DIR, NODE_VLLM_DIR, cache_root
from bakeoff.node import bundle
from bakeoff.node.correct import correct_unpacked
from bakeoff.node.payload import MIB, PART_EXTRA_BYTES, default_part_bytes
from bakeoff.node.quality import pack_quality
from bakeoff.node.record import record
from bakeoff.node.vllm import pack_vllm


def pack_vllm_command(a: argparse.Namespace) -> None:
    """``node pack --vllm V``: vLLM's trimmed wheel and the wheels the node lacks, as parts with one manifest."""
    out = Path(a.out or Path(a.repo) / NODE_VLLM_DIR)
    if a.vllm_wheels:
        wheels = Path(a.vllm_wheels)
    elif (cache := cache_root()) is not None:
        wheels = cache / "wheels" / f"vllm-{a.vllm}"
    else:
        raise BakeoffError("BAKEOFF_CACHE_DIR=off: give --vllm-wheels (a folder outside the checkout)")
    part, why = _part_size(a)
    m = pack_vllm(version=a.vllm, wheels=wheels, out=out, part_bytes=part, part_bytes_why=why, fetch=not a.offline)
    _print_parts(out, m)


def _part_size(a: argparse.Namespace) -> tuple[int, str]:
    if a.part_mib:
        return int(a.part_mib * MIB), f"--part-mib {a.part_mib:g}"
    return default_part_bytes(Path(a.repo), extra_bytes=PART_EXTRA_BYTES)


def _print_parts(out: Path, m: dict) -> None:
    for p in m["parts"]:
        print(f"{out / p['name']}  {p['bytes']} bytes  sha256 {p['sha256']}")
    n = len(m["parts"])
    print(f"{n} parts of {m['payload']['bytes']} bytes; on the node, one call each (carry {out}/node.sh, "
          f"node_parts.py, manifest.json and the part): bash {out}/node.sh --part {out}/part-01 ... part-{n:02d}")


def default_source(repo: Path) -> Path:
    """The pinned llama.cpp source tree of ``conf/engine/llamacpp.yaml``'s toolchain: build/llamacpp/src-<commit>."""
    import yaml

    commit = yaml.safe_load((repo / "conf" / "engine" / "llamacpp.yaml").read_text())["toolchain"]["commit"]
    return repo / Path(LLAMACPP_SRC.format(commit=commit)).parent


def pack_quality_command(a: argparse.Namespace) -> None:
    """``node pack --quality``: the embedded model, lm-eval's and compressed-tensors' wheels the node lacks and the
    binding wheel, as parts with one manifest (bakeoff.node.quality)."""
    repo = Path(a.repo)
    out = Path(a.out or repo / NODE_QUALITY_DIR)
    if a.wheels:
        wheels = Path(a.wheels)
    elif (cache := cache_root()) is not None:
        wheels = cache / "wheels" / "quality"
    else:
        raise BakeoffError("BAKEOFF_CACHE_DIR=off: give --wheels (a folder outside the checkout)")
    source = artifact_dir(a.source) if a.source else default_source(repo)
    part, why = _part_size(a)
    m = pack_quality(wheels=wheels, out=out, source=source, part_bytes=part, part_bytes_why=why, fetch=not a.offline)
    _print_parts(out, m)


def pack_build_command(a: argparse.Namespace) -> None:
    """``node pack --build ARCHIVE``: a llama.cpp build a node returned, as parts the next node installs into its
    build cache (bakeoff.node.build_carry)."""
    from bakeoff.node.build_carry import pack_build

    out = Path(a.out or Path(a.repo) / NODE_BUILD_DIR)
    part, why = _part_size(a)
    m = pack_build(Path(a.build), out, part, why)
    print(f"llama.cpp build {m['cache_key']} (commit {m['version']}, {m['archive_bytes']} bytes)")
    _print_parts(out, m)


def return_build_command(a: argparse.Namespace) -> None:
    """``node return-build --out DIR`` (node.sh --return-build, on the node): each llama.cpp build made there."""
    from bakeoff.node.build_carry import return_builds

    root = cache_root()
    if root is None:
        raise BakeoffError("BAKEOFF_CACHE_DIR=off: no build cache to return a build from")
    if not a.out:
        raise BakeoffError("node return-build needs --out (the folder that comes back)")
    for f in return_builds(root, Path(a.out)):
        print(f"{f}  {f.stat().st_size} bytes")
    print("here: bakeoff node pack --build <the first of them> (build/node-build), carried to the next node")


def run_command(a: argparse.Namespace) -> None:
    if a.action == "plan":
        from bakeoff.node.plan_check import plan_command  # composes a config and reads every record: only here

        plan_command(a)
    elif a.action == "pack" and sum(map(bool, (a.vllm, a.quality, a.build))) > 1:
        raise BakeoffError("node pack: --vllm, --quality or --build, one payload a pack")
    elif a.action == "pack" and a.build:
        pack_build_command(a)
    elif a.action == "return-build":
        return_build_command(a)
    elif a.action == "pack" and a.vllm:
        pack_vllm_command(a)
    elif a.action == "pack" and a.quality:
        pack_quality_command(a)
    elif a.action == "pack":
        if not a.source or not a.wheels:
            raise BakeoffError("node pack needs --source (the fetch_llamacpp output) and --wheels")
        out = bundle.pack(repo=Path(a.repo), source=artifact_dir(a.source), wheels=Path(a.wheels),
                          out=Path(a.out or "node-bundle"), resume=[Path(t) for t in a.resume])
        print(f"bundle in {out}: run `bash {out}/node.sh experiment=...` on the node")
    elif a.action == "record":
        if not a.out:
            raise BakeoffError("node record needs --out (the run record's folder)")
        paths = record(bundle.whole(Path(a.tarball)), Path(a.out))
        print("\n".join(str(p) for p in paths.values()))
    elif a.action == "collect":
        if not a.out:
            raise BakeoffError("node collect needs --out (the tarball to write)")
        names = bundle.collect(Path(a.repo), Path(a.out))
        print(f"{len(names)} node results in {a.out}")
    else:
        names = bundle.unpack(bundle.whole(Path(a.tarball)), Path(a.repo), correct=False)
        print(f"{len(names)} node results unpacked under {a.repo}")
        if fix := correct_unpacked(Path(a.repo)):
            print(f"the run's hardware config ({fix['as_run']['name']}) does not describe the node "
                  f"({'; '.join(fix['mismatches'])}): rows and results/hardware.json now name hardware={fix['name']}, "
                  "the run's config kept as hardware_config_as_run")
        print("next: snakemake --touch node --config ... hardware=auto")
