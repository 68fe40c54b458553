"""Different, equivalent within the margin, or no verdict: the paired verdicts, simulated against a known truth.

Simulated at the block counts the project runs (2, 3 and 5), with drift between blocks that both variants share
(±10 %, lognormal) and each server start's own noise (0.5 %, 2 % and 5 %, lognormal) on top: the spread the
records show. The limits are the tests' levels (5 %), with room for the simulation's own noise: at most the
binomial 99.9th percentile of 2000 draws at 5 % (6.5 %), so a seeded run passes only where the rule holds.
"""

from __future__ import annotations

import csv
import math
import re
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from bakeoff.report.answer import answer_rows, fixed_leaders
from bakeoff.results import spread

from conftest import ROOT

DRAWS = 2000
NOISES = (0.005, 0.02, 0.05)  # one server start's own noise (sd of its log throughput)
MARGIN = 3.0
# The most a 5 % rule lets through in DRAWS draws, but for a 1-in-1000 simulation.
MOST = int(stats.binom.ppf(0.999, DRAWS, 0.05))


def _verdicts(blocks: int, true_pct: float, noise: float, seed: int, margin: float = MARGIN) -> Counter:
    """Verdicts of DRAWS simulated experiments of ``blocks`` blocks in which b is truly ``true_pct`` % faster."""
    rng = np.random.default_rng(seed)
    out: Counter = Counter()
    for _ in range(DRAWS):
        drift = np.exp(rng.normal(0.0, 0.1, blocks))
        a = 100.0 * drift * np.exp(rng.normal(0.0, noise, blocks))
        b = 100.0 * (1 + true_pct / 100.0) * drift * np.exp(rng.normal(0.0, noise, blocks))
        out[spread.verdict(spread.compare_paired(a.tolist(), b.tolist()), margin).kind] += 1
    return out


@pytest.mark.parametrize("blocks", [2, 3, 5])
def test_no_true_difference_is_called_different_at_most_5_percent_of_the_time(blocks: int) -> None:
    for i, noise in enumerate(NOISES):
        found = _verdicts(blocks, 0.0, noise, seed=100 * blocks + i)
        assert found[spread.DIFFERENT] <= MOST, (blocks, noise, found)


@pytest.mark.parametrize("blocks", [2, 3, 5])
def test_a_true_5_percent_is_called_equivalent_within_3_at_most_5_percent_of_the_time(blocks: int) -> None:
    """The rule that fails here: "the 95 % interval holds 0, so they are the same" (with 2 blocks it nearly always
    holds 0)."""
    for i, noise in enumerate(NOISES):
        found = _verdicts(blocks, 5.0, noise, seed=200 * blocks + i)
        assert found[spread.EQUIVALENT] <= MOST, (blocks, noise, found)


@pytest.mark.parametrize("sd_pct", [1.0, 2.0])
def test_the_blocks_said_to_settle_it_do(sd_pct: float) -> None:
    """At the blocks ``blocks_needed`` names, a true difference of the margin comes out "different" and a true 0
    "equivalent", each about 80 % of the time (at least 70 % here: the count rests on t approximations)."""
    n = spread.blocks_needed(sd_pct, MARGIN)
    assert n is not None and 3 <= n <= 10
    noise = sd_pct / 100.0 / math.sqrt(2)  # two starts' noise make one block's difference
    assert _verdicts(n, MARGIN, noise, seed=7)[spread.DIFFERENT] >= 0.7 * DRAWS
    assert _verdicts(n, 0.0, noise, seed=8)[spread.EQUIVALENT] >= 0.7 * DRAWS
    assert spread.blocks_needed(sd_pct * 2, MARGIN) > n  # more spread, more blocks
    assert spread.blocks_needed(100.0, MARGIN) is None  # more than the most it looks at


def test_each_verdict_with_its_interval_and_the_blocks_directions() -> None:
    same = spread.compare_paired([100.0, 120.0, 90.0, 110.0, 105.0], [100.5, 119.5, 90.4, 109.8, 105.3])
    v = spread.verdict(same, MARGIN)
    assert v.kind == spread.EQUIVALENT and v.words(same).startswith("equivalent within ±3%: +0.1% (90% interval")
    assert spread.directions(same, "a", "b") == "b faster in 3 of 5 blocks, a in 2"
    apart = spread.compare_paired([100.0, 120.0], [110.0, 132.5])
    assert spread.verdict(apart, MARGIN).kind == spread.DIFFERENT and apart.b_faster == 2
    assert spread.directions(apart, "vllm-fp8", "llamacpp-q4_k_m") == "llamacpp-q4_k_m faster in 2 of 2 blocks"
    # A latency is faster lower: b's lower TPOT in both blocks is b faster.
    tpot = spread.compare_paired([3.8, 3.8], [3.7, 3.6], higher_is_faster=False)
    assert (tpot.b_faster, tpot.a_faster) == (2, 0)
    wide = spread.compare_paired([100.0, 100.0], [101.0, 104.0])
    v = spread.verdict(wide, MARGIN)
    assert v.kind == spread.NO_VERDICT and v.needed is not None and v.needed > 2
    assert f"about {v.needed} blocks would settle a difference of 3%" in v.words(wide)
    assert spread.verdict(spread.compare_paired([100.0], [101.0]), MARGIN).words(wide) == "no verdict: fewer than 2 blocks"
    with pytest.raises(ValueError, match="equivalence_margin_pct must be positive"):
        spread.verdict(wide, 0.0)


def _row(fmt: str, block: int, tput: float, start: str, c: int = 1) -> dict[str, str]:
    return {"experiment": "e", "model": "m", "engine": "llamacpp", "format": fmt, "hardware": "h100",
            "node_id": "gpu:GPU-a", "concurrency": str(c), "prompt_len": "128", "output_len": "256",
            "request_rate": "", "bits_per_weight": {"f16": "16", "q4_k_m": "4.9"}[fmt], "status": "ok",
            "block": str(block), "repeat": str(block), "server_start_id": start, "output_throughput": str(tput),
            "median_ttft_ms": "100", "median_tpot_ms": "10", "median_e2el_ms": "2000", "p99_ttft_ms": "100",
            "p99_tpot_ms": "20"}


def _blocks(resumed_q4_block: int | None, blocks: int = 3) -> list[dict[str, str]]:
    """f16 and q4_k_m, c=1 and c=8, over ``blocks`` blocks; q4_k_m is 2 % faster in every block but one: its
    ``resumed_q4_block``, whose c=8 cell ran on a second server start (a resumed job) and reads +12 %."""
    rows = []
    for b in range(blocks):
        drift = 1.0 + 0.05 * b
        for c in (1, 8):
            rows.append(_row("f16", b, 100.0 * c * drift, f"f16-b{b}", c))
            resumed = b == resumed_q4_block
            gap = 1.12 if resumed and c == 1 else 1.02 + 0.001 * b
            rows.append(_row("q4_k_m", b, 100.0 * c * drift * gap, f"q4-b{b}" + ("-again" if resumed and c == 8 else ""), c))
    return rows


def test_a_resumed_block_is_flagged_and_left_out_of_every_paired_verdict() -> None:
    rows = _blocks(resumed_q4_block=1)
    assert spread.resumed_blocks(rows) == {("e", "m", "llamacpp", "q4_k_m", "h100", "gpu:GPU-a", "1"): 2}
    (c,) = [c for c in spread.comparisons(rows) if c.metric == "output_throughput" and c.cell.endswith("c=1 p=128")]
    assert c.n_b == 2 and c.left_out == ("block 1: llamacpp-q4_k_m's cells came from 2 server starts",)
    assert c.verdict(MARGIN).kind == spread.DIFFERENT and c.diff.rel_pct == pytest.approx(2.1, abs=0.01)
    spread.extend(rows)
    flags = {(r["format"], r["block"]): (r["block_resumed"], r["block_server_starts"]) for r in rows}
    assert flags[("q4_k_m", "1")] == (True, 2) and flags[("q4_k_m", "0")] == (False, 1)
    assert flags[("f16", "1")] == (False, 1)  # the other variant's block is sound; the pair is left out for both
    q4 = next(r for r in rows if r["format"] == "q4_k_m" and r["concurrency"] == "1")
    assert q4["vs_ref_blocks"] == 2 and "block 1" in q4["vs_ref_blocks_left_out"]
    assert q4["output_throughput_vs_ref_verdict"] == "different" and q4["output_throughput_vs_ref_faster_blocks"] == 2
    # the page and the answer table say why
    lead = next(x for x in fixed_leaders(rows) if x.load == "c=1")
    assert lead.leader == "llamacpp-q4_k_m" and lead.kind == spread.DIFFERENT
    assert lead.verdict.endswith("left out as resumed: block 1: llamacpp-q4_k_m's cells came from 2 server starts")
    row = next(r for r in answer_rows(rows, []) if r["load"] == "c=1")
    assert (row["verdict"], row["blocks"], row["leader_faster_blocks"]) == ("different", "2", "2")
    assert row["blocks_left_out"] == "block 1: llamacpp-q4_k_m's cells came from 2 server starts"
    # Kept, the resumed block's +12 % would have widened the interval to no verdict.
    kept = spread.compare_paired([100.0, 105.0, 110.0], [102.0, 117.6, 112.42])
    assert spread.verdict(kept, MARGIN).kind == spread.NO_VERDICT


def test_with_two_blocks_one_resumed_there_is_no_verdict_and_it_says_why() -> None:
    lead = next(x for x in fixed_leaders(_blocks(resumed_q4_block=0, blocks=2)) if x.load == "c=1")
    assert lead.kind == spread.NO_VERDICT
    assert lead.verdict.startswith("no verdict: fewer than 2 blocks once resumed blocks are left out "
                                   "(block 0: llamacpp-q4_k_m's cells came from 2 server starts)")
    clean = next(x for x in fixed_leaders(_blocks(resumed_q4_block=None, blocks=2)) if x.load == "c=1")
    assert clean.kind == spread.DIFFERENT  # the same blocks, none resumed: a verdict


def test_rows_without_start_ids_are_not_flagged() -> None:
    rows = [{**r, "server_start_id": ""} for r in _blocks(resumed_q4_block=1)]
    assert spread.resumed_blocks(rows) == {}
    spread.extend(rows)
    assert {r["block_resumed"] for r in rows} == {""}


RECORD = ROOT / "runs" / "h100-seed-2026-12-06"


def _csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_the_h100_seed_record_shows_no_equivalence_at_c1() -> None:
    """llama.cpp q4_k_m against vLLM fp8-online at c=1: +2.6 % in two blocks, 95 % interval about -9 % to +14 %.
    Nothing is shown either way; the record's summary and its cells both say so."""
    lead = next(x for x in fixed_leaders(_csv(RECORD / "summary.csv")) if x.load == "c=1")
    assert (lead.leader, lead.runner_up) == ("llamacpp-q4_k_m", "vllm-fp8-online")
    assert lead.kind in (spread.NO_VERDICT, spread.DIFFERENT), lead.verdict
    assert "llamacpp-q4_k_m faster in 2 of 2 blocks" in lead.verdict
    assert lead.paired is not None and lead.paired.diff.ci95[0] < 0 < lead.paired.diff.ci95[1]
    cells = [r for r in _csv(RECORD / "cells.csv") if r["concurrency"] == "1"]
    by = {f: [r for r in cells if r["format"] == f] for f in ("fp8-online", "q4_k_m")}
    for metric in ("output_throughput", "median_tpot_ms"):
        found = spread.pair(by["fp8-online"], by["q4_k_m"], metric)
        assert found is not None and found.diff.pairing == "blocks" and found.n_b == 2
        assert found.verdict().kind != spread.EQUIVALENT, (metric, found.verdict().words(found.diff))
        assert found.diff.b_faster == 2  # q4_k_m faster in both blocks, on throughput and on TPOT


# Words that claim sameness without a test of it. Built from parts, so this file does not match itself.
CLAIMS = re.compile(r"within the " + "noise|" + r"\bti" + r"(e|es|ed|ing)\b", re.IGNORECASE)


def test_no_page_doc_or_code_claims_sameness_without_equivalence() -> None:
    files = [ROOT / "README.md", ROOT / "Snakefile"]
    for top in ("src", "docs", "workflow", "conf", "tests"):
        files += [p for p in (ROOT / top).rglob("*") if p.is_file() and p.suffix in (".py", ".md", ".rst", ".smk",
                                                                                         ".yaml", ".html", ".j2")]
    hits = [f"{p.relative_to(ROOT)}:{i}: {line.strip()}" for p in files
            for i, line in enumerate(p.read_text(errors="replace").splitlines(), 1) if CLAIMS.search(line)]
    assert hits == []
