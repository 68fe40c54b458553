"""The capacity search: it finds a known capacity through the real client, bounded, and stops a lost probe early.

The stand-in server is the echo server in its own process with a per-request delay: each token takes
``slot_delay x requests streaming``, so at concurrency c a request's TPOT is about ``10 ms x c``, and under
a 125 ms TPOT bound the capacity is 12 (120 ms; 13 gives 130 ms). The margin, 5 ms a token, is wide enough
for a loaded 2-core machine's timer slack.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest

from bakeoff.config.schema import CapacityCfg
from bakeoff.loadgen.capacity import (
    EarlyStop,
    Search,
    Slo,
    Verdict,
    bracket_from_cells,
    judge,
    probes_needed,
    search_concurrency,
    search_rate,
    violation_limit,
)
from bakeoff.loadgen.cellload import CellLoad
from bakeoff.loadgen.metrics import RequestRecord, summarize
from bakeoff.loadgen.runner import run_cell
from bakeoff.proc import ManagedProcess, free_port
from bakeoff.serving import capacity as serve_capacity

SLO = Slo("test", ttft_ms=1000.0, tpot_ms=125.0)
SLOT_DELAY_MS = 10.0
KNOWN_CAPACITY = 12


@pytest.fixture(scope="module")
def stand_in(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    log = tmp_path_factory.mktemp("echo") / "echo.log"
    proc = ManagedProcess([sys.executable, "-m", "bakeoff.loadgen.echo_server", "--port", str(port),
                           "--slot-delay-ms", str(SLOT_DELAY_MS)], log).start()
    try:
        proc.wait_healthy(f"http://127.0.0.1:{port}/health", 30)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.stop()


def _probe(url: str, n_of: int, sent: dict[int, int]):
    def probe(c: int) -> Verdict:
        n = max(n_of, 2 * c)
        stop = EarlyStop(n, SLO)
        res = run_cell(url, "m", CellLoad([f"p{i}" for i in range(n)], prompt_len=4, output_len=8, concurrency=c,
                                          warmup_prompts=["w"] * c), show_progress=False, stop_when=stop)
        sent[c] = len(res.records)
        return judge(summarize(res.records, res.duration_s), SLO, res.client["stopped_early"])
    return probe


def test_the_search_lands_on_the_known_capacity_within_one_step_in_at_most_8_probes(stand_in: str) -> None:
    sent: dict[int, int] = {}
    s = search_concurrency(_probe(stand_in, 16, sent), start=1, maximum=64, max_probes=8)
    assert len(s.probes) <= 8 and s.converged
    assert abs(s.capacity - KNOWN_CAPACITY) <= 1, s.probes
    assert [c for c, _ in s.probes[:5]] == [1, 2, 4, 8, 16]  # bracket by doubling, then bisect
    assert s.binding == "tpot"
    passed = [c for c, v in s.probes if v.passed]
    assert max(passed) == s.capacity and all(c <= s.capacity for c in passed)
    assert all(c > s.capacity for c, v in s.probes if not v.passed)
    # the probe at 16 was lost within its first wave: it stopped sending long before its 32 requests
    assert s.probes[4][1].stopped_early and sent[16] < 32


def test_a_probe_with_no_violations_runs_every_request(stand_in: str) -> None:
    sent: dict[int, int] = {}
    assert _probe(stand_in, 16, sent)(2).passed and sent[2] == 16


def _req(tpot_s: float) -> RequestRecord:  # against SLO: 125 ms a token
    return RequestRecord(0, 4, 8, success=True, ttft=0.01, e2el=0.01 + 7 * tpot_s, output_tokens=8)


def test_early_stop_is_exactly_when_the_p99_can_no_longer_pass() -> None:
    fast, barely_over, far_over = _req(0.050), _req(0.126), _req(10.0)
    for n in (10, 50, 100, 250):
        k = violation_limit(n)
        # k - 1 requests over the bound among n: the p99 can still pass (here it does)...
        assert judge(summarize([barely_over] * (k - 1) + [fast] * (n - k + 1), 1.0), SLO).passed, n
        # ...k over it, even barely and with the rest instant: it cannot
        assert not judge(summarize([barely_over] * k + [_req(0.0)] * (n - k), 1.0), SLO).passed, n
        stop = EarlyStop(n, SLO)
        assert [stop(far_over) for _ in range(k)] == [False] * (k - 1) + [True]
        assert not EarlyStop(n, SLO)(fast)
    assert violation_limit(100) == 2 and violation_limit(10) == 2 and violation_limit(1000) == 11


def test_the_rate_search_brackets_then_bisects_to_its_resolution() -> None:
    true_rate = 7.3
    s = search_rate(lambda r: Verdict(r <= true_rate, () if r <= true_rate else ("ttft",)), start=2.0, max_probes=10,
                    resolution=0.05)
    assert s.converged and true_rate / 1.05 <= s.capacity <= true_rate
    assert [round(r, 3) for r, _ in s.probes[:4]] == [2.0, 3.0, 4.5, 6.75]
    down = search_rate(lambda r: Verdict(r <= 0.4), start=2.0, max_probes=10, resolution=0.1)
    assert down.converged and 0.4 / 1.1 <= down.capacity <= 0.4
    bounded = search_rate(lambda r: Verdict(r <= 1000.0), start=1.0, max_probes=3)
    assert not bounded.converged and len(bounded.probes) == 3 and bounded.capacity == 2.25
    assert bounded.bracket == "at least 2.25" and s.bracket == f"{s.capacity:.4g}–{s.fail:.4g}"


def test_a_variant_that_fails_the_lowest_load_has_capacity_zero() -> None:
    s = search_concurrency(lambda c: Verdict(False, ("ttft",)), start=1, maximum=64, max_probes=8)
    assert s.capacity == 0 and s.converged and [c for c, _ in s.probes] == [1] and s.binding == "ttft"
    assert [c for c, _, _ in s.rechecks] == [1]  # the lowest fail is re-checked; there is no pass to re-check
    top = search_concurrency(lambda c: Verdict(True), start=4, maximum=32, max_probes=8)
    assert top.at_limit and top.capacity == 32 and [c for c, _ in top.probes] == [4, 8, 16, 32]
    assert not top.converged and top.limit == "search maximum"  # a lower bound is never converged


def _ttft_over() -> RequestRecord:
    return RequestRecord(0, 4, 8, success=True, ttft=1.01, e2el=1.01 + 7 * 0.05, output_tokens=8)


def test_the_early_stop_counts_each_bound_on_its_own_and_stops_at_a_failure() -> None:
    fast, tpot_over, ttft_over = _req(0.050), _req(0.130), _ttft_over()  # each just over its own bound
    failed = RequestRecord(0, 4, 8, success=False, error="boom")
    n = 100
    stop = EarlyStop(n, SLO)
    # one request over TTFT only and one over TPOT only: each bound's p99 can still pass, so no stop
    assert [stop(r) for r in (ttft_over, tpot_over, *[fast] * 98)] == [False] * 100
    recs = [ttft_over, tpot_over, *[fast] * 98]
    assert judge(summarize(recs, 1.0), SLO).passed  # and indeed both p99s pass
    two_ttft = EarlyStop(n, SLO)
    assert [two_ttft(r) for r in (ttft_over, fast, ttft_over)] == [False, False, True]
    assert EarlyStop(n, SLO)(failed)  # a failed request fails the probe: stop at once


def _ramped(record: RequestRecord) -> RequestRecord:
    record.ramp = True  # the load client's flag: sent while concurrency rose to c, outside the steady span
    return record


@pytest.mark.parametrize("rule", ["point", "confident"])
def test_the_early_stop_ignores_requests_sent_during_the_ramp(rule: str) -> None:
    n, far_over = 400, _req(10.0)
    limit = violation_limit(n, rule)
    stop = EarlyStop(n, SLO, rule)

    def failed() -> RequestRecord:
        return RequestRecord(0, 4, 8, success=False, error="boom")

    # a whole ramp of requests over both bounds, and failed ones: none counts, none stops the probe
    assert not any(stop(_ramped(r)) for r in [_req(10.0), _ttft_over(), failed()] * limit)
    assert not stop.violations
    # the same requests in the steady span: the limit-th over a bound stops it, as before
    assert [stop(far_over) for _ in range(limit)] == [False] * (limit - 1) + [True]
    assert EarlyStop(n, SLO, rule)(failed())


def _holds(s: Search, truth: int, resolution: float = CapacityCfg().resolution) -> bool:
    """The search's bracket holds ``truth`` and is no wider than ``max(1, floor(resolution x pass))``."""
    assert s.fail is not None, s.probes
    return s.capacity <= truth < s.fail and s.fail - s.capacity <= max(1, int(resolution * s.capacity + 1e-9))


@pytest.mark.parametrize("truth", [12, 28, 40, 150, 200, 700])
def test_the_schema_defaults_bracket_a_gpu_scale_capacity_within_the_resolution(truth: int) -> None:
    d = CapacityCfg()

    def probe(c: int) -> Verdict:
        return Verdict(c <= truth, () if c <= truth else ("tpot",))

    s = search_concurrency(probe, d.start_concurrency, d.max_concurrency, d.max_probes, resolution=d.resolution)
    assert s.converged and _holds(s, truth) and not s.uncertain, s.probes
    assert [c for c, _, _ in s.rechecks] == [s.capacity, s.fail]  # the bracket's two ends, re-checked
    assert s.bracket == f"{s.capacity:g}–{s.fail:g}"
    # below 40 users 5 % is under two users: the bracket is adjacent users, the capacity exact
    assert (s.capacity, s.fail) == (truth, truth + 1) if truth < 40 else s.fail - s.capacity > 1
    # seeded from fixed cells at c = 1, 8, 32 (the seed's loads): fewer probes, a bracket as good
    met = {c: c <= truth for c in (1, 8, 32)}
    seeded = search_concurrency(probe, d.start_concurrency, d.max_concurrency, d.max_probes,
                                *bracket_from_cells(met), resolution=d.resolution)
    assert seeded.converged and _holds(seeded, truth) and len(seeded.probes) < len(s.probes)
    assert all(8 < c < 32 for c, _ in seeded.probes) if truth < 32 else all(c > 32 for c, _ in seeded.probes)


def test_the_default_budget_converges_for_every_capacity_below_the_maximum() -> None:
    budget = probes_needed(1, 64)
    for truth in range(0, 64):
        s = search_concurrency(lambda c, t=truth: Verdict(c <= t), 1, 64, None, recheck=False)
        assert s.converged and _holds(s, truth) and len(s.probes) <= budget, truth
        exact = search_concurrency(lambda c, t=truth: Verdict(c <= t), 1, 64, None, recheck=False, resolution=0)
        assert exact.converged and (exact.capacity, exact.fail) == (truth, truth + 1), truth  # 0: adjacent users
    assert budget == 12  # 1..64 by doubling (7), then 5 bisections of a bracket of 32 (5 % of 32 is one user)
    # at the maximum itself (and past it) the search found a lower bound, never a converged capacity
    for truth in (64, 65, 10_000):
        s = search_concurrency(lambda c, t=truth: Verdict(c <= t), 1, 64, None, recheck=False)
        assert s.at_limit and not s.converged and s.capacity == 64 and s.bracket == "at least 64", truth
    d = CapacityCfg()
    # 1..1024: 11 doublings, then 5 bisections to within 5 % (9 to adjacent users)
    assert probes_needed(1, d.max_concurrency, d.resolution) == 16 and probes_needed(1, d.max_concurrency, 0) == 20


def test_a_search_stopped_by_the_servers_limit_is_a_lower_bound_that_names_it() -> None:
    # vLLM fp8 on an H100 passed interactive at 128 and failed at 256; a server that holds 100 stops it first
    s = search_concurrency(lambda c: Verdict(c <= 150), 1, 100, None, limit="vLLM KV cache (38400 tokens)")
    assert s.capacity == 100 and s.at_limit and not s.converged and s.limit == "vLLM KV cache (38400 tokens)"
    cols = serve_capacity._search_columns(s, "concurrency")
    assert cols["concurrency_converged"] is False and cols["concurrency_limit"] == "vLLM KV cache (38400 tokens)"
    found = search_concurrency(lambda c: Verdict(c <= 150), 1, 1024, None)
    cols = serve_capacity._search_columns(found, "concurrency")
    assert _holds(found, 150) and cols["capacity_concurrency"] == found.capacity
    assert cols["concurrency_converged"] and cols["concurrency_limit"] == ""


def test_a_noisy_boundary_is_reported_uncertain_with_both_results() -> None:
    runs: dict[int, int] = {}

    def flaky(c: int) -> Verdict:  # true capacity 20, but c = 20's first run fails by chance
        runs[c] = runs.get(c, 0) + 1
        return Verdict(c <= 20 and not (c == 20 and runs[c] == 1))

    s = search_concurrency(flaky, 1, 64)
    assert s.capacity == 19 and s.converged and s.uncertain
    assert s.recheck_note == "19: pass, pass; 20: fail, pass"
    steady = search_concurrency(lambda c: Verdict(c <= 20), 1, 64)
    assert not steady.uncertain and steady.recheck_note == "20: pass, pass; 21: fail, fail"


def test_a_bracket_from_cells_takes_the_lowest_fail_and_the_highest_pass_below_it() -> None:
    assert bracket_from_cells({1: True, 8: True, 32: False}) == (8, 32)
    assert bracket_from_cells({1: True, 8: False, 32: True}) == (1, 8)  # a pass above a fail is not trusted
    assert bracket_from_cells({1: True, 8: False, 32: False}) == (1, 8)  # the lowest fail bounds the search
    assert bracket_from_cells({1: True, 8: True}) == (8, None)
    assert bracket_from_cells({}) == (0, None)


def test_fixed_cells_give_a_verdict_per_concurrency_met_only_where_every_repeat_met_it() -> None:
    from bakeoff.serving.capacity import fixed_verdicts

    def cell(c: int, ttft: float, p: int = 128, **kw) -> dict:
        return {"concurrency": c, "prompt_len": p, "status": "ok", "p99_ttft_ms": ttft, "p99_tpot_ms": 50.0, **kw}

    cells = [cell(1, 100), cell(1, 200), cell(8, 1500), cell(8, 300),  # c=8: its first repeat over the TTFT bound
             cell(32, 100, status="failed"), cell(32, 100, p=1024),  # a cell that did not run; another prompt
             cell(16, 100, probe_of="concurrency")]  # a probe is not a fixed cell
    met = fixed_verdicts(cells, SLO, 128)
    assert met == {1: True, 8: False}
    assert bracket_from_cells(met) == (1, 8)
    assert fixed_verdicts([cell(8, 300, failed=1)], SLO, 128) == {8: False}  # a failed request fails the cell
