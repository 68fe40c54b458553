"""The run's baselines must have measured something, or the run failed.

Every comparison in the summary is against an engine's 16-bit variant (the
quality reference, and the row the format effect is read from). A run whose
baseline has no ``ok`` cell has measured nothing comparable, whatever else it
wrote, so it must not end as a success. The summary itself stays on disk.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from bakeoff.errors import BakeoffError
from bakeoff.models.artifacts import atomic_write_text

SIXTEEN_BITS = 15.5  # bits per weight of a 16-bit format (the quality reference's threshold too)


class BaselineError(BakeoffError):
    """An engine's 16-bit variant has no ok cell."""


def _bits(row: dict[str, str]) -> float:
    try:
        return float(row.get("bits_per_weight") or 0)
    except ValueError:
        return 0.0


def baselines(rows: list[dict[str, str]]) -> dict[str, dict[str, Any]]:
    """Per (experiment, engine): its 16-bit formats and their ok cells."""
    groups: dict[tuple[str, str], list[dict[str, str]]] = defaultdict(list)
    for r in rows:
        groups[(r["experiment"], r["engine"])].append(r)
    out: dict[str, dict[str, Any]] = {}
    for (experiment, engine), group in sorted(groups.items()):
        top = max(_bits(r) for r in group)
        if top < SIXTEEN_BITS:
            continue  # this engine serves no 16-bit format in this experiment: nothing to hold it to
        base = [r for r in group if _bits(r) == top]
        out[f"{experiment}/{engine}"] = {
            "formats": sorted({r["format"] for r in base}),
            "cells": len(base),
            "ok": sum(r["status"] == "ok" for r in base),
            "reasons": sorted({f"{r['status']}: {r['reason']}" for r in base if r["status"] != "ok"})[:3],
        }
    return out


def check(summary_csv: Path, out: Path) -> dict[str, dict[str, Any]]:
    """Write the baselines record; raise naming every baseline without an ok cell."""
    import csv

    with open(summary_csv, newline="") as f:
        found = baselines(list(csv.DictReader(f)))
    bad = {k: v for k, v in found.items() if v["ok"] == 0}
    if bad:
        lines = [f"{k} ({', '.join(v['formats'])}): 0 of {v['cells']} cells ok; {'; '.join(v['reasons'])[:400]}"
                 for k, v in bad.items()]
        raise BaselineError("baseline variants measured nothing (the summary is kept in "
                            f"{summary_csv}):\n  " + "\n  ".join(lines))
    atomic_write_text(out, json.dumps(found, indent=2) + "\n")
    return found


def run_command(a: argparse.Namespace) -> None:
    """``bakeoff check-baselines SUMMARY``: fail unless every engine's 16-bit variant has an ok cell."""
    for name, b in check(Path(a.summary), Path(a.out)).items():
        print(f"baseline {name} ({', '.join(b['formats'])}): {b['ok']} of {b['cells']} cells ok", file=sys.stderr)
