"""Stage: the doctor records the node (``results/hardware.json``) before any job; and its re-check before serving.

Why a rule: every row names the hardware it ran on, and a node with uncorrectable ECC errors must stop the run
before a server starts (bakeoff.hardware.doctor does the probing and judging). ``bakeoff doctor`` runs the same
on the config composed from the command line, and says what each variant can expect of this node.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bakeoff.composition.compose import load_config
from bakeoff.config.schema import DoctorCfg, HardwareCfg
from bakeoff.config.stageargs import StageArgs
from bakeoff.engines.support import predict, variants_of
from bakeoff.errors import BakeoffError
from bakeoff.hardware.doctor import recheck, run, summary_text


def run_stage(a: StageArgs) -> None:
    """``bakeoff stage doctor``: ``--spec`` is ``{"hardware": {...}, "doctor": {...}}``."""
    spec = a.spec_json()
    report = run(HardwareCfg.model_validate(spec["hardware"]), DoctorCfg.model_validate(spec.get("doctor", {})),
                 Path(a.out))
    print(summary_text(report), file=sys.stderr)


def run_recheck(a: StageArgs) -> None:
    """``bakeoff stage ecc-recheck``: ``--input`` is the doctor's record made before the first server."""
    if a.input is None:
        raise BakeoffError("ecc-recheck needs --input (results/hardware.json)")
    recheck(Path(a.input), Path(a.out))


def run_command(a: argparse.Namespace) -> None:
    """``bakeoff doctor [overrides]``: the doctor on this machine (or on recorded ``--facts``), with what each
    variant of the composed config can expect here."""
    cfg = load_config(a.overrides)
    facts = json.loads(Path(a.facts).read_text()) if a.facts else None
    report = run(cfg.hardware, cfg.doctor, Path(a.out), facts=facts)
    print(summary_text(report, predict(report, variants_of(cfg))))
    print(f"wrote {a.out}")
