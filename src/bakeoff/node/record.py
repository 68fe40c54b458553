"""A run record derived from a node's results tarball: every file of it made from what the node wrote.

Why: a committed record holds nothing typed by hand, so anyone can re-derive it from the tarball (and the
Snakemake log of each call) and get the same tables and the same README section.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

from bakeoff.node import readme
from bakeoff.node.bundle import unpack
from bakeoff.node.correct import (
    CELL_COLUMNS,
    PIPELINE_TABLES,
    correct_row,
    correct_table,
    corrected_record,
    hardware_correction,
    write_csv,
)
from bakeoff.node.table import format_table
from bakeoff.results.derived import measured_bandwidth_gbs


def record(tarball: Path, out: Path, log_lines: int = 3) -> dict[str, Path]:
    """Derive a run record from a node's results tarball: every cell, every kernel benchmark, log ends, and the
    README's numbers.

    Reads only what the node wrote (and the Snakemake log of each call, ``call<N>-snakemake.log`` in ``out``),
    so a committed record holds nothing typed by hand: ``cells.csv`` (every cell JSON, whichever invocation
    made it), ``kernel.csv`` (llama-bench), ``server-log-ends.txt`` (each server log's first and last lines),
    the doctor's ``hardware.json``, the build's manifest, and the README's generated section
    (bakeoff.node.readme). Where the doctor's findings show the run's config naming another GPU,
    rows name the config ``hardware=auto`` picks from them and ``hardware.json`` keeps the run's config as
    ``hardware_config_as_run`` (:func:`hardware_correction`).
    """


    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        unpack(tarball, root, correct=False)
        rec = json.loads((root / "results/hardware.json").read_text())
        fix = hardware_correction(rec)
        cells = [correct_row(json.loads(p.read_text()), rec, fix)
                 for p in sorted(root.glob("results/raw/*/*/*/c[0-9]*-p*.json"))]
        write_csv(out / "cells.csv", cells, CELL_COLUMNS)
        kernels = []
        for p in sorted(root.glob("results/kernel/*/*.json")):
            k = json.loads(p.read_text())
            kernels.append({"format": k["format"], "flash_attn": k["flash_attn"], "tg128_tok_s": k["tg_tok_s"],
                            "tg128_stddev": k["tg_stddev"], "pp512_tok_s": k["pp_tok_s"], "pp512_stddev": k["pp_stddev"],
                            "command": " ".join(Path(c).name if i == 0 else c for i, c in enumerate(k["command"]))})
        write_csv(out / "kernel.csv", kernels, ["format", "flash_attn", "tg128_tok_s", "tg128_stddev", "pp512_tok_s",
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
                correct_table(out / name, rec, fix)

        hw = rec["hardware_config"]
        bandwidth = measured_bandwidth_gbs(hw, rec) or hw["mem_bandwidth_gbs"]
        (out / "table.md").write_text(format_table(cells, kernels, bandwidth))
        capacity, probes = [], []
        for p in sorted(root.glob("results/raw/*/*/*/capacity.json")):
            found = json.loads(p.read_text())
            capacity += [correct_row(r, rec, fix) for r in found.get("capacity", [])]
            probes += found.get("probes", [])
        # Probes of a search that never wrote its capacity.json (the call's time ran out mid-search).
        unfinished = [json.loads(p.read_text()) for d in sorted(root.glob("results/raw/*/*/*/"))
                      if not (d / "capacity.json").exists() for p in sorted(d.glob("cap-*.json"))]
        client_check = json.loads((out / "client_check.json").read_text()) if (out / "client_check.json").is_file() \
            else None
        plan = json.loads((out / "plan.json").read_text()) if (out / "plan.json").is_file() else None
        section = readme.generated(rec, fix, cells, capacity, probes, readme.read_calls(out),
                                   unfinished, client_check, plan)
        readme.write_readme(out / "README.md", section, out.name)
    return {n: out / n for n in ("cells.csv", "kernel.csv", "server-log-ends.txt", "hardware.json", "table.md",
                                 "README.md")}
