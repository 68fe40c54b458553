"""ECC the seed's way: what stops a run, what only warns, and the single-card check.

Why not "any uncorrectable error stops": NVML keeps two counters per GPU.
*Volatile* counts errors since the driver loaded; *aggregate* counts them over
the card's life. The seed's node had one card with a single historical
uncorrectable error that never grew; its author benchmarked each card alone,
found them equal, and went on. So:

* a **volatile** uncorrectable count (an error since boot) stops the run;
* an **aggregate-only** count is history: a warning, plus a per-GPU check
  (:func:`plan_single_gpu_bench`, :func:`judge`) that runs a short llama-bench
  on each GPU alone and flags a card that fails or is slower than its twin
  (the median of the other cards of the same model);
* any uncorrectable count that **grows** between the doctor's check (before
  the first server) and the re-check after the last one (:func:`growth`)
  stops the run: that is the danger the seed names, errors appearing while we
  measure.

Counts come as the doctor's probe records them (``gpus[].ecc.{volatile,aggregate}.uncorrected``, read
with NVML's ``nvmlDeviceGetTotalEccErrors``), so tests use NVML-shaped fixtures.
"""

from __future__ import annotations

import statistics
from typing import Any

SLOWER_THAN_TWIN = 0.10  # a card this much below its twin's tg speed is flagged (llama-bench's run-to-run spread is ~1-2 %)
BENCH_PROMPT, BENCH_GEN, BENCH_REPS = 128, 64, 3  # short: seconds per card for a 7B model


def gpu_label(g: dict[str, Any]) -> str:
    return f"GPU{g['index']} ({g.get('name')}, {g.get('bus_id')})"


def _uncorrected(g: dict[str, Any], counter: str) -> int:
    return int(((g.get("ecc") or {}).get(counter) or {}).get("uncorrected") or 0)


def volatile_uncorrected(facts: dict[str, Any]) -> dict[str, int]:
    """GPU -> uncorrectable errors since the driver loaded (these stop the run)."""
    return {gpu_label(g): n for g in facts.get("gpus", []) if (n := _uncorrected(g, "volatile"))}


def historical_uncorrected(facts: dict[str, Any]) -> dict[str, int]:
    """GPU -> lifetime uncorrectable errors on cards with none since boot (a warning and the single-card check)."""
    return {gpu_label(g): n for g in facts.get("gpus", [])
            if not _uncorrected(g, "volatile") and (n := _uncorrected(g, "aggregate"))}


def single_gpu_check_needed(record: dict[str, Any]) -> bool:
    """Whether the doctor's record calls for the single-card benchmark: some GPU has ECC history."""
    return bool(record.get("ecc_history"))


def growth(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """Every uncorrectable counter that grew between two probes, matched by GPU UUID; a vanished GPU counts too."""
    now = {g["uuid"]: g for g in after.get("gpus", [])}
    grew = []
    for g in before.get("gpus", []):
        h = now.get(g["uuid"])
        if h is None:
            grew.append(f"{gpu_label(g)} is no longer visible to NVML")
            continue
        for counter in ("volatile", "aggregate"):
            a, b = _uncorrected(g, counter), _uncorrected(h, counter)
            if b > a:
                grew.append(f"{gpu_label(g)} {counter} uncorrectable ECC errors grew from {a} to {b}")
    return grew


# --------------------------------------------------------------------------- the single-card check
def plan_single_gpu_bench(facts: dict[str, Any], llama_bench: str, gguf: str) -> list[dict[str, Any]]:
    """One short llama-bench per GPU, each pinned to that GPU alone (by UUID, whatever CUDA's order)."""
    return [{"gpu": gpu_label(g), "uuid": g["uuid"], "name": g.get("name"),
             "env": {"CUDA_VISIBLE_DEVICES": g["uuid"], "CUDA_DEVICE_ORDER": "PCI_BUS_ID"},
             "command": [llama_bench, "-m", gguf, "-p", str(BENCH_PROMPT), "-n", str(BENCH_GEN), "-ngl", "99",
                         "-r", str(BENCH_REPS), "-o", "json"]}
            for g in facts.get("gpus", [])]


def judge(results: list[dict[str, Any]], tolerance: float = SLOWER_THAN_TWIN) -> list[dict[str, Any]]:
    """Each card's verdict: ``failed`` (no speed), ``slower`` (below its twins' median by > tolerance), or ``ok``.

    ``results``: the plan's entries with ``returncode`` and ``tg_tok_s`` added. Twins are the other cards
    of the same model that produced a speed; a card without one is ``no twin`` (not judged on speed).
    """
    out = []
    for r in results:
        v = dict(r)
        speed = r.get("tg_tok_s")
        twins = [t["tg_tok_s"] for t in results if t is not r and t.get("name") == r.get("name") and t.get("tg_tok_s")]
        if r.get("returncode") != 0 or not speed:
            v["verdict"], v["reason"] = "failed", f"llama-bench exit {r.get('returncode')}, no tg speed"
        elif not twins:
            v["verdict"], v["reason"] = "no twin", "no other card of this model to compare with"
        else:
            ref = statistics.median(twins)
            v["ratio_to_twin"] = speed / ref
            slow = speed < (1 - tolerance) * ref
            v["verdict"] = "slower" if slow else "ok"
            v["reason"] = f"tg {speed:.1f} tok/s vs twin {ref:.1f} ({speed / ref:.2f}x)"
        out.append(v)
    return out


def flagged(verdicts: list[dict[str, Any]]) -> list[str]:
    return [f"{v['gpu']}: {v['verdict']} ({v['reason']})" for v in verdicts if v["verdict"] in ("failed", "slower")]
