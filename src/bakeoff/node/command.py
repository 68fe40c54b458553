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
from bakeoff.layout import NODE_VLLM_DIR, cache_root
from bakeoff.node import bundle
from bakeoff.node.correct import correct_unpacked
from bakeoff.node.payload import MIB, PART_EXTRA_BYTES, default_part_bytes
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
    if a.part_mib:
        part, why = int(a.part_mib * MIB), f"--part-mib {a.part_mib:g}"
    else:
        part, why = default_part_bytes(Path(a.repo), extra_bytes=PART_EXTRA_BYTES)
    m = pack_vllm(version=a.vllm, wheels=wheels, out=out, part_bytes=part, part_bytes_why=why, fetch=not a.offline)
    for p in m["parts"]:
        print(f"{out / p['name']}  {p['bytes']} bytes  sha256 {p['sha256']}")
    n = len(m["parts"])
    print(f"{n} parts of {m['payload']['bytes']} bytes; on the node, one call each (carry {out}/node.sh, "
          f"node_parts.py, manifest.json and the part): bash {out}/node.sh --part {out}/part-01 ... part-{n:02d}")


def run_command(a: argparse.Namespace) -> None:
    if a.action == "plan":
        from bakeoff.node.plan_check import plan_command  # composes a config and reads every record: only here

        plan_command(a)
    elif a.action == "pack" and a.vllm:
        pack_vllm_command(a)
    elif a.action == "pack":
        if not a.source or not a.wheels:
            raise BakeoffError("node pack needs --source (the fetch_llamacpp output) and --wheels")
        out = bundle.pack(repo=Path(a.repo), source=artifact_dir(a.source), wheels=Path(a.wheels),
                          out=Path(a.out or "node-bundle"), resume=[Path(t) for t in a.resume])
        print(f"bundle in {out}: run `bash {out}/node.sh experiment=...` on the node")
    elif a.action == "record":
        if not a.out:
            raise BakeoffError("node record needs --out (the run record's folder)")
        paths = record(Path(a.tarball), Path(a.out))
        print("\n".join(str(p) for p in paths.values()))
    elif a.action == "collect":
        if not a.out:
            raise BakeoffError("node collect needs --out (the tarball to write)")
        names = bundle.collect(Path(a.repo), Path(a.out))
        print(f"{len(names)} node results in {a.out}")
    else:
        names = bundle.unpack(Path(a.tarball), Path(a.repo), correct=False)
        print(f"{len(names)} node results unpacked under {a.repo}")
        if fix := correct_unpacked(Path(a.repo)):
            print(f"the run's hardware config ({fix['as_run']['name']}) does not describe the node "
                  f"({'; '.join(fix['mismatches'])}): rows and results/hardware.json now name hardware={fix['name']}, "
                  "the run's config kept as hardware_config_as_run")
        print("next: snakemake --touch node --config ... hardware=auto")
