"""Stage: the seed's single-card benchmark, run when a GPU has historical uncorrectable ECC errors.

Why: an aggregate (lifetime) uncorrectable count with none since boot is
history, not proof of a bad card (bakeoff.hardware.ecc). The seed settled it by
benchmarking each card alone; so does this, before any server starts: a short
llama-bench per GPU, pinned to that GPU by UUID, judged against its twin.
A card that fails or is slower than its twin stops the run (unless
``doctor.allow_uncorrected_ecc``); without ECC history nothing runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from bakeoff.config.schema import DoctorCfg
from bakeoff.config.stageargs import StageArgs
from bakeoff.engines.base import THREAD_CAPS
from bakeoff.engines.toolchain import toolchain_bin
from bakeoff.hardware.doctor import DoctorError
from bakeoff.hardware.ecc import BENCH_GEN, SLOWER_THAN_TWIN, flagged, judge, plan_single_gpu_bench, single_gpu_check_needed
from bakeoff.hardware.gpu import MULTICAST_OFF
from bakeoff.layout import GGUF_NAME
from bakeoff.models.artifacts import atomic_write_text
from bakeoff.results.llamabench import parse_records


def _tg(stdout: str) -> float | None:
    try:
        tests = {m["test"]: m for m in parse_records(json.loads(stdout))}
    except (json.JSONDecodeError, KeyError, TypeError, ValueError):
        return None
    return tests.get(f"tg{BENCH_GEN}", {}).get("tok_s")


def run(*, record: Path, model_dir: Path | None, toolchain_dir: Path | None, out: Path,
        allow: bool = False) -> dict[str, Any]:
    """Benchmark each GPU alone when the record shows ECC history; the DAG gives the GGUF and tools only then."""
    facts = json.loads(Path(record).read_text())
    if not single_gpu_check_needed(facts):
        rep: dict[str, Any] = {"needed": False, "reason": "no GPU has historical uncorrectable ECC errors"}
        atomic_write_text(out, json.dumps(rep, indent=2) + "\n")
        return rep
    history = facts["ecc_history"]
    if model_dir is None or toolchain_dir is None:
        raise DoctorError(f"{record} shows ECC history on {sorted(history)}: the single-card check needs a GGUF "
                          "(--input) and the llama.cpp tools (--toolchain), and was given "
                          f"{'neither' if model_dir is None and toolchain_dir is None else 'only one'}")
    plan = plan_single_gpu_bench(facts, str(toolchain_bin(toolchain_dir, "llama-bench")), str(model_dir / GGUF_NAME))
    results = []
    for p in plan:
        env = {k: v for k, v in os.environ.items() if k not in THREAD_CAPS} | MULTICAST_OFF | p["env"]
        print(f"$ CUDA_VISIBLE_DEVICES={p['uuid']} " + " ".join(p["command"]), file=sys.stderr, flush=True)
        proc = subprocess.run(p["command"], capture_output=True, text=True, env=env, timeout=1800)
        sys.stderr.write(proc.stderr[-3000:])
        results.append({**p, "returncode": proc.returncode, "tg_tok_s": _tg(proc.stdout)})
    verdicts = judge(results)
    rep = {"needed": True, "history": history, "tolerance": SLOWER_THAN_TWIN, "cards": verdicts}
    atomic_write_text(out, json.dumps(rep, indent=2) + "\n")
    bad = flagged(verdicts)
    if bad and not allow:
        raise DoctorError("the single-card check flags " + "; ".join(bad) + ". Drain that GPU (or pin "
                          "hardware.visible_devices to the others), or override with doctor.allow_uncorrected_ecc=true")
    return rep


def run_stage(a: StageArgs) -> None:
    """``bakeoff stage gpu-check``: ``--spec`` is ``{"record": results/hardware.json, "doctor": {...}}``."""
    spec = a.spec_json()
    run(record=Path(spec["record"]), model_dir=a.dir("input") if a.input else None,
        toolchain_dir=a.dir("toolchain") if a.toolchain else None, out=Path(a.out),
        allow=DoctorCfg.model_validate(spec.get("doctor", {})).allow_uncorrected_ecc)
