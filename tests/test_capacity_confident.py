"""The ``confident`` capacity rule: a probe passes only where each bound's 95 % upper bound on the share over it
is at most 1 %, tested by simulation against a known truth at the probe sizes the search chooses.

Latencies are drawn from a lognormal whose true p99 sits at a stated multiple of the bound (``SIGMA`` 0.25: a
request's TPOT and TTFT under steady load vary by tens of percent). Over the bound: TPOT's p99 5 % over it, TTFT's
at 70 % of its own (one bound decides). Within: both at 70 %. Each simulated probe is judged twice: run
through the early stop as the runner runs it (requests after the stop are never sent), and whole; both must
hold the stated rates, and they must agree probe by probe (the early stop only ever fails a probe that fails).
"""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np
import pytest

from bakeoff.config.schema import CapacityCfg
from bakeoff.loadgen.capacity import (
    MIN_CONFIDENT_REQUESTS,
    EarlyStop,
    Slo,
    allowance,
    judge,
    probe_requests,
    violation_limit,
)
from bakeoff.loadgen.metrics import RequestRecord, summarize
from bakeoff.loadgen.orderstats import share_upper_bound

SLO = Slo("interactive", ttft_ms=500.0, tpot_ms=30.0)
SIGMA = 0.25
Z99 = NormalDist().inv_cdf(0.99)
OUTPUT = 16
SIMS = 300
# A probe at c = 1, 128 and 256 under the schema's defaults: 299, 512 and 1024 requests.
CONCURRENCIES = (1, 128, 256)


def _sizes() -> list[int]:
    d = CapacityCfg()
    return [probe_requests(c, d.min_requests, d.waves, "confident") for c in CONCURRENCIES]


def _latencies(rng: np.random.Generator, n: int, bound_ms: float, p99_at: float) -> np.ndarray:
    """``n`` latencies in seconds whose true p99 is ``p99_at`` x ``bound_ms``."""
    mu = math.log(p99_at * bound_ms / 1000.0) - Z99 * SIGMA
    return rng.lognormal(mu, SIGMA, n)


def _probe(rng: np.random.Generator, n: int, tpot_at: float, ttft_at: float = 0.70) -> list[RequestRecord]:
    ttft, tpot = _latencies(rng, n, SLO.ttft_ms, ttft_at), _latencies(rng, n, SLO.tpot_ms, tpot_at)
    return [RequestRecord(i, 128, OUTPUT, success=True, ttft=float(a), e2el=float(a + (OUTPUT - 1) * b),
                          output_tokens=OUTPUT) for i, (a, b) in enumerate(zip(ttft, tpot, strict=True))]


def _verdicts(records: list[RequestRecord], rule: str = "confident") -> tuple[bool, bool]:
    """(run through the early stop as the runner runs it, judged whole)."""
    stop, sent, stopped = EarlyStop(len(records), SLO, rule), [], False
    for r in records:
        sent.append(r)
        if stop(r):
            stopped = True
            break
    early = judge(summarize(sent, 1.0, SLO.bounds()), SLO, stopped, rule).passed
    whole = judge(summarize(records, 1.0, SLO.bounds()), SLO, False, rule).passed
    return early, whole


def _runs(n: int, tpot_at: float, seed: int) -> list[tuple[bool, bool]]:
    rng = np.random.default_rng(seed)
    return [_verdicts(_probe(rng, n, tpot_at)) for _ in range(SIMS)]


def _rates(runs: list[tuple[bool, bool]]) -> tuple[float, float]:
    return sum(e for e, _ in runs) / len(runs), sum(w for _, w in runs) / len(runs)


def test_the_probe_sizes_are_the_fewest_that_can_pass_and_grow_with_the_load() -> None:
    assert MIN_CONFIDENT_REQUESTS == 299  # 0.99^299 <= 0.05 < 0.99^298
    assert _sizes() == [299, 512, 1024]
    d = CapacityCfg()
    assert probe_requests(1, d.min_requests, d.waves, "point") == 50  # the point rule's probes are unchanged
    with pytest.raises(ValueError, match="at least 299"):
        EarlyStop(298, SLO, "confident")  # a probe that can never pass is refused, not run


def test_the_allowance_is_where_the_clopper_pearson_bound_reaches_one_percent() -> None:
    # MLPerf's early-stopping table for a p99 at 95 %: 299 requests with none over, 473 with one, 628 with two
    assert [allowance(n) for n in (298, 299, 472, 473, 627, 628)] == [-1, 0, 0, 1, 1, 2]
    for n in (1, 50, 298, 299, 300, 400, 512, 777, 1024, 1500):
        for k in range(0, max(allowance(n), 0) + 3):
            ub = share_upper_bound(k, n)
            assert ub is not None and (ub <= 0.01) == (k <= allowance(n)), (n, k, ub)


def _req(ttft_s: float, tpot_s: float) -> RequestRecord:
    return RequestRecord(0, 128, OUTPUT, success=True, ttft=ttft_s, e2el=ttft_s + (OUTPUT - 1) * tpot_s,
                         output_tokens=OUTPUT)


@pytest.mark.parametrize("n", [299, 512, 1024, 2000])
def test_the_confident_early_stop_fires_exactly_when_the_upper_bound_can_no_longer_pass(n: int) -> None:
    fast, barely_over, far_over = _req(0.1, 0.010), _req(0.1, 0.0301), _req(0.1, 1.0)
    k = violation_limit(n, "confident")
    assert k == allowance(n) + 1
    # k - 1 requests over the bound among n: the rule can still pass (here it does)...
    recs = [barely_over] * (k - 1) + [fast] * (n - k + 1)
    assert judge(summarize(recs, 1.0, SLO.bounds()), SLO, rule="confident").passed
    # ...k over it, with every other request instant: it cannot
    recs = [barely_over] * k + [_req(0.0, 0.0)] * (n - k)
    assert not judge(summarize(recs, 1.0, SLO.bounds()), SLO, rule="confident").passed
    # and the early stop fires at the k-th violation, not before, not after
    stop = EarlyStop(n, SLO, "confident")
    assert [stop(far_over) for _ in range(k)] == [False] * (k - 1) + [True]
    assert k < violation_limit(n, "point")  # sooner than the point rule's, which would waste requests


def test_confident_passes_at_most_5_percent_of_probes_whose_true_p99_is_5_percent_over_the_bound() -> None:
    for n, seed in zip(_sizes(), (1, 2, 3), strict=True):
        runs = _runs(n, 1.05, seed)
        early, whole = _rates(runs)
        assert early <= 0.05 and whole <= 0.05, (n, early, whole)
        assert all(e == w for e, w in runs), "the early stop changed a verdict"


def test_confident_passes_at_least_90_percent_of_probes_whose_true_p99_is_70_percent_of_the_bound() -> None:
    for n, seed in zip(_sizes(), (4, 5, 6), strict=True):
        runs = _runs(n, 0.70, seed)
        early, whole = _rates(runs)
        assert early >= 0.90 and whole >= 0.90, (n, early, whole)
        assert all(e == w for e, w in runs), "the early stop changed a verdict"


def test_the_point_rule_passes_the_same_over_the_bound_probes_far_more_often() -> None:
    """Why ``confident`` exists: at its own probe sizes, the point rule passes a p99 5 % over its bound often."""
    rng = np.random.default_rng(7)
    passed = sum(judge(summarize(_probe(rng, 299, 1.05), 1.0, SLO.bounds()), SLO, rule="point").passed
                 for _ in range(SIMS))
    assert passed / SIMS > 0.15


def test_gpu_experiments_default_to_confident_and_cpu_ones_to_point_unless_set() -> None:
    from bakeoff.composition.compose import load_config

    for experiment, rule in (("h100_capacity", "confident"), ("h200_seed", "confident"), ("blog_v100", "confident"),
                             ("cpu_capacity", "point"), ("smoke", "point")):
        assert load_config([f"experiment={experiment}"]).load.capacity.verdict == rule, experiment
    assert load_config(["experiment=h100_capacity", "load.capacity.verdict=point"]).load.capacity.verdict == "point"
    assert load_config(["experiment=cpu_capacity", "load.capacity.verdict=confident"]).load.capacity.verdict == "confident"


def test_under_confident_the_fixed_cells_seed_only_their_fails() -> None:
    from bakeoff.loadgen.capacity import bracket_from_cells
    from bakeoff.serving.capacity import fixed_verdicts

    def cell(c: int, tpot_ms: float) -> dict:  # 100 requests: too few for the confident rule to pass
        return {"concurrency": c, "prompt_len": 128, "status": "ok", "completed": 100, "failed": 0,
                "p99_ttft_ms": 100.0, "p99_tpot_ms": tpot_ms}

    cells = [cell(1, 10.0), cell(8, 20.0), cell(32, 40.0)]
    assert fixed_verdicts(cells, SLO, 128, "point") == {1: True, 8: True, 32: False}
    assert fixed_verdicts(cells, SLO, 128, "confident") == {32: False}
    assert bracket_from_cells(fixed_verdicts(cells, SLO, 128, "confident")) == (0, 32)


def _cap_row(variant: str, c: int, rule: str | None) -> dict[str, str]:
    engine, fmt = variant.split("-")
    return {"experiment": "e", "node_id": "n", "engine": engine, "format": fmt, "prompt_len": "128",
            "slo": "interactive", "capacity_concurrency": str(c), "concurrency_converged": "True",
            "concurrency_at_limit": "False", "capacity_rate": "",
            **({"capacity_verdict_rule": rule} if rule is not None else {})}


def test_the_answer_page_names_the_rule_of_each_capacity_and_never_compares_two_rules(tmp_path) -> None:
    from bakeoff.report.answer import slo_leaders
    from bakeoff.report.index import index_html
    from bakeoff.stages.summary import CAPACITY_COLUMNS

    assert "capacity_verdict_rule" in CAPACITY_COLUMNS
    same = slo_leaders([], [_cap_row("vllm-fp8", 200, "confident"), _cap_row("vllm-fp16", 150, "confident")])[0]
    assert same.rule == "confident"
    assert same.verdict.startswith("different: vllm-fp8 passed 200 users, where vllm-fp16 failed at 151")
    mixed = slo_leaders([], [_cap_row("vllm-fp8", 200, "point"), _cap_row("vllm-fp16", 150, "confident")])[0]
    assert mixed.verdict.startswith("no verdict: capacities made by different rules") and mixed.rule == "point / confident"
    assert slo_leaders([], [_cap_row("vllm-fp8", 64, None)])[0].rule == "point"  # before the rule was recorded
    caps = [_cap_row("vllm-fp8", 200, "confident"), _cap_row("vllm-fp16", 150, "confident")]
    cap_csv, summary, out = tmp_path / "capacity.csv", tmp_path / "summary.csv", tmp_path / "index.html"
    cap_csv.write_text(",".join(caps[0]) + "\n" + "".join(",".join(r.values()) + "\n" for r in caps))
    summary.write_text("experiment,engine,format,status\n")
    index_html(summary, cap_csv, [], out)
    page = out.read_text()
    assert "data-rule='confident'" in page and "confident rule</small>" in page
    assert "<th>capacity_verdict_rule</th>" in page  # the capacity table shows the column too


def test_a_ramped_probe_is_judged_on_its_steady_requests_not_the_whole_cell() -> None:
    """After a ramp the over-bound shares are of the steady span's requests: counting the ramp's requests in
    ``n`` would let one violation in 299 pass (the allowance of 600 is larger than that of 299)."""
    from bakeoff.loadgen.capacity import allowance, confident_within

    assert allowance(299) == 0 < allowance(600)
    steady = {"completed": 600, "steady_requests": 299, "over_ttft_share": 1 / 299, "p99_ttft_ms": 1.0}
    assert not confident_within(steady, "ttft")
    burst = {"completed": 600, "over_ttft_share": 1 / 600, "p99_ttft_ms": 1.0}
    assert confident_within(burst, "ttft")


def test_a_confident_probe_of_too_few_requests_says_so_not_the_bounds_it_met() -> None:
    """The H100 probe at c=2 (2026-12-07) read 298 requests after its ramp, p99 TTFT 15 ms and TPOT 3.9 ms under
    `interactive`'s 500 and 30, and was logged as exceeding both: what kept it from passing was its size."""
    from bakeoff.loadgen.capacity import MIN_CONFIDENT_REQUESTS, TOO_FEW, Slo, judge

    slo = Slo("interactive", ttft_ms=500.0, tpot_ms=30.0)
    probe = {"completed": 301, "steady_requests": MIN_CONFIDENT_REQUESTS - 1, "failed": 0, "p99_ttft_ms": 15.0,
             "p99_tpot_ms": 3.9, "over_ttft_share": 0.0, "over_tpot_share": 0.0}
    short = judge(probe, slo, rule="confident")
    assert not short.passed and short.exceeded == (TOO_FEW,)
    assert judge({**probe, "steady_requests": MIN_CONFIDENT_REQUESTS}, slo, rule="confident").passed
    assert judge({**probe, "p99_ttft_ms": 600.0}, slo, rule="confident").exceeded == ("ttft", TOO_FEW)
    assert judge(probe, slo, rule="point").passed  # the point rule has no minimum
    over = {**probe, "steady_requests": 473, "over_tpot_share": 2 / 473}  # allowance(473) is 1
    assert judge(over, slo, rule="confident").exceeded == ("tpot",)
