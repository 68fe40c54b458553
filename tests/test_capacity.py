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

from bakeoff.loadgen.capacity import EarlyStop, Slo, Verdict, judge, search_concurrency, search_rate, violation_limit
from bakeoff.loadgen.metrics import RequestRecord, summarize
from bakeoff.loadgen.runner import run_cell
from bakeoff.proc import ManagedProcess, free_port

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
        res = run_cell(base_url=url, model="m", prompts=[f"p{i}" for i in range(n)], prompt_len=4, output_len=8,
                       concurrency=c, warmup_prompts=["w"] * c, show_progress=False, stop_when=stop)
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


def test_a_variant_that_fails_the_lowest_load_has_capacity_zero() -> None:
    s = search_concurrency(lambda c: Verdict(False, ("ttft",)), start=1, maximum=64, max_probes=8)
    assert s.capacity == 0 and s.converged and [c for c, _ in s.probes] == [1] and s.binding == "ttft"
    top = search_concurrency(lambda c: Verdict(True), start=4, maximum=32, max_probes=8)
    assert top.at_limit and top.capacity == 32 and [c for c, _ in top.probes] == [4, 8, 16, 32]
