"""A ramped start against a server that admits a bounded number of prompts a step (bakeoff.loadgen.cellload).

The stand-in (bakeoff.loadgen.echo_server with ``Steps``) admits at most K = 4 prompts every 50 ms and streams
40 tokens 10 ms apart; c = 16 users is four times what one step admits. A burst of 16 gets its first tokens in
four groups, the last about 200 ms late; users started over one request cycle never queue. What the server
saw in flight is counted by its own middleware, not taken from the client.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, replace

import numpy as np
import pytest

from bakeoff.loadgen.capacity import EarlyStop, Slo, judge, probe_requests
from bakeoff.loadgen.cellload import RAMP_SUPPLY, CellLoad
from bakeoff.loadgen.echo_server import InFlight, Steps, serving
from bakeoff.loadgen.metrics import START_METRICS, RequestRecord, summarize
from bakeoff.loadgen.runner import CellResult, run_cell, short_of_steady

K, STEP_S, C, OUT, TOKEN_S = 4, 0.05, 16, 40, 0.01
TTFT_BOUND_MS = 120.0  # above any steady TTFT here (one step and jitter), under the burst's last group (~150-200 ms)
N = 48  # measured requests after the ramp


@dataclass
class Cell:
    result: CellResult
    metrics: dict
    server: InFlight
    t0: float  # the cell's start on the server's clock (time.perf_counter)


def _run(start: str, ramp_s: float | None = None, workers: int = 1) -> Cell:
    load = CellLoad([f"p {i}" for i in range(N)], prompt_len=2, output_len=OUT, concurrency=C,
                    warmup_prompts=[f"w {i}" for i in range(C)], start=start, ramp_s=ramp_s)  # type: ignore[arg-type]
    if load.ramp_extra():
        load = CellLoad([f"p {i}" for i in range(N + load.ramp_extra())], prompt_len=2, output_len=OUT,
                        concurrency=C, warmup_prompts=load.warmup_prompts, start=load.start, ramp_s=ramp_s, steady=N)
    server = InFlight()
    arrived: dict[str, float] = {}
    counting = server.middleware()

    async def arrivals(request, handler):  # noqa: ANN001, ANN202 - the measured requests' arrival, by prompt
        if request.path == "/v1/completions":
            arrived[(await request.json())["prompt"]] = time.perf_counter()
        return await counting(request, handler)

    from aiohttp import web

    with serving(token_delay_s=TOKEN_S, middlewares=[web.middleware(arrivals)], steps=Steps(K, STEP_S)) as url:
        res = run_cell(url, "m", load, show_progress=False, workers=workers)
    assert all(r.success for r in res.records) and len(res.records) <= len(load.prompts)
    assert load.ramped or len(res.records) == len(load.prompts)  # a burst sends every prompt
    # the server's clock against the cell's: each request arrived a fraction of a millisecond after it was sent
    t0 = float(np.median([arrived[f"p {r.index}"] - r.start for r in res.records]))
    return Cell(res, res.summary({"ttft": TTFT_BOUND_MS}, concurrency=C), server, t0)


@pytest.fixture(scope="module")
def burst() -> Cell:
    return _run("burst")


@pytest.fixture(scope="module")
def ramped() -> Iterator[Cell]:
    yield _run("ramp", workers=2)  # two workers: the slots are numbered across the cell


def _intended(r: RequestRecord) -> float:
    assert r.schedule_delay is not None
    return r.start - r.schedule_delay


def test_a_burst_fails_the_ttft_bound_that_the_ramped_steady_span_passes(burst: Cell, ramped: Cell) -> None:
    b, r = burst.metrics, ramped.metrics
    assert b["load_start"] == "burst" and b["load_ramp_s"] == 0.0 and b["steady_requests"] == N
    assert "p99_ttft_ms_whole_cell" not in b and not any(x.ramp for x in burst.result.records)
    assert b["p99_ttft_ms"] > TTFT_BOUND_MS, b["p99_ttft_ms"]  # the first wave's last group
    first_wave = sorted(x.ttft for x in burst.result.records if x.start < 0.01)
    assert len(first_wave) == C and 1000.0 * first_wave[-1] > 2.5 * 1000.0 * STEP_S  # admitted in >= 3 steps
    # ramped: the same users, started over one request cycle; the steady span passes with room
    assert r["load_start"] == "ramp" and r["p99_ttft_ms"] <= TTFT_BOUND_MS, r["p99_ttft_ms"]
    assert r["over_ttft_share"] == 0.0
    # the ramp was the warm-up's median end-to-end latency: 40 tokens at 10 ms and the queue of a burst of 16
    assert 0.39 + STEP_S * 0.5 < r["load_ramp_s"] < 0.39 + 5 * STEP_S and ramped.result.ramp_s == r["load_ramp_s"]
    steady = [x for x in ramped.result.records if not x.ramp]
    assert r["steady_requests"] == len(steady) == r["completed"] - sum(x.ramp for x in ramped.result.records)
    # exactly n after the ramp, whatever the ramp sent: c first sends, and the refills of slots whose first
    # request ended before the ramp did (the warm-up's queue made its median latency longer than a steady cycle)
    assert len(steady) == N
    ramp, cycle = r["load_ramp_s"], float(np.median([x.e2el for x in steady]))
    refills = sum(max(0, int(np.ceil((ramp - j * ramp / C) / cycle)) - 1) for j in range(C))
    assert abs(len(ramped.result.records) - N - (C + refills)) <= 2, (len(ramped.result.records), refills)
    assert all(x.start >= r["load_ramp_s"] or _intended(x) >= r["load_ramp_s"] for x in steady)
    assert all(min(x.start, _intended(x)) < r["load_ramp_s"] for x in ramped.result.records if x.ramp)


def test_the_server_holds_c_in_flight_once_the_ramp_has_reached_c(ramped: Cell) -> None:
    res, ramp = ramped.result, ramped.metrics["load_ramp_s"]
    # every slot started once, at j x ramp / c: 16 first sends spread evenly over the ramp, across both workers
    due = sorted(_intended(x) for x in res.records if x.ramp)
    for j in range(C):
        assert min(abs(d - j * ramp / C) for d in due) < 0.002, (j, due)
    assert {x.worker for x in res.records if x.start < ramp / C} == {0}  # slot 0 is worker 0's ...
    assert {x.worker for x in res.records if ramp / C <= _intended(x) < 2 * ramp / C} == {1}  # ... slot 1 worker 1's
    assert ramped.server.peak == C  # never more than c (the warm-up's c included) ...
    # ... and exactly c on average over the steady span: from the ramp's end to the last request sent
    last_sent = max(x.start for x in res.records)
    mean = ramped.server.mean(ramped.t0 + ramp, ramped.t0 + last_sent)
    assert mean == pytest.approx(C, rel=0.02), mean


def test_the_slo_judged_over_the_whole_cell_would_fail_where_the_steady_span_passes() -> None:
    """A ramp of one step for 16 users queues its own first wave: the whole cell's p99 is over the bound, and a
    summary that kept the ramp's requests would fail the cell; the steady span after it passes."""
    short = _run("ramp", ramp_s=STEP_S)
    m = short.metrics
    assert m["load_ramp_s"] == pytest.approx(STEP_S)
    assert m["p99_ttft_ms_whole_cell"] > TTFT_BOUND_MS >= m["p99_ttft_ms"], m
    assert m["steady_requests"] == sum(not x.ramp for x in short.result.records) < m["completed"]
    assert short.server.peak == C


def _rec(i: int, start: float, ttft: float, ramp: bool = False) -> RequestRecord:
    return RequestRecord(i, 8, 8, start=start, success=True, ttft=ttft, e2el=ttft + 0.14, itl=[0.02] * 7,
                         output_tokens=8, prompt_tokens=8, ramp=ramp)


def test_a_ramped_summary_reads_latency_from_the_steady_span_and_counts_from_the_whole_cell() -> None:
    ramp = [_rec(i, 0.01 * i, 0.5 + 0.01 * i, ramp=True) for i in range(10)]  # a slow first wave
    steady = [_rec(10 + i, 0.2 + 0.01 * i, 0.05 + 0.0001 * i) for i in range(200)]
    slos = {"ttft": 100.0, "tpot": 50.0}
    m = RampCell(ramp + steady).summary(slos, concurrency=10)
    alone = summarize(steady, 3.0, slos)
    latency = [k for k in alone if k.split("_")[0] in ("mean", "median", "std", "p90", "p99") or "_ms_ci_" in k
               or k.startswith("over_") or k.startswith("server_")]
    assert len(latency) >= 30 and {k: m[k] for k in latency} == {k: alone[k] for k in latency}
    whole = summarize([replace(r, ramp=False) for r in ramp + steady], 3.0)  # the summary that ignored the ramp
    assert m["p99_ttft_ms"] < 100.0 < m["p99_ttft_ms_whole_cell"] == whole["p99_ttft_ms"]
    assert m["mean_ttft_ms"] < m["mean_ttft_ms_whole_cell"] == pytest.approx(whole["mean_ttft_ms"])
    assert (m["completed"], m["total_output_tokens"], m["load_start"], m["load_ramp_s"], m["steady_requests"]) == \
        (210, 8 * 210, "ramp", 0.3, 200)
    assert m["request_throughput"] == pytest.approx(210 / 3.0) and m["request_goodput"] == pytest.approx(200 / 3.0)
    # a burst marks nothing: every request is read, and only the start's columns are new
    burst = summarize(steady, 3.0, slos)
    assert (burst["load_start"], burst["load_ramp_s"], burst["steady_requests"]) == ("burst", 0.0, 200)
    assert set(burst) - set(START_METRICS) == set(alone) - set(START_METRICS) and "p99_ttft_ms_whole_cell" not in burst
    assert "mean_ttft_ms_whole_cell" not in burst


def RampCell(records: list[RequestRecord]) -> CellResult:  # noqa: N802 - a cell as the runner returns it
    return CellResult(records, 3.0, {}, "ramp", 0.3)


def test_the_ramp_flag_is_written_with_the_request() -> None:
    row = _rec(0, 0.0, 0.1, ramp=True).to_json()
    assert row["ramp"] is True and RequestRecord.from_json(row).ramp is True
    assert RequestRecord.from_json({k: v for k, v in row.items() if k != "ramp"}).ramp is False


def test_a_ramp_is_a_closed_loops_and_its_extra_prompts_are_the_callers_to_send() -> None:
    closed = CellLoad(["p"] * 20, 2, 4, concurrency=4, start="ramp", ramp_s=1.0)
    assert closed.ramped and closed.ramp_extra() == RAMP_SUPPLY * 4 and closed.steady_cap == 20 - RAMP_SUPPLY * 4
    assert CellLoad(["p"] * 20, 2, 4, concurrency=4, start="ramp", ramp_s=1.0, steady=5).steady_cap == 5
    burst = CellLoad(["p"] * 10, 2, 4, concurrency=4)
    assert burst.ramp_extra() == 0 and burst.steady_cap is None
    with pytest.raises(ValueError, match="steady"):
        CellLoad(["p"] * 10, 2, 4, concurrency=4, start="ramp", ramp_s=1.0, steady=11)
    rate = CellLoad(["p"] * 10, 2, 4, concurrency=4, request_rate=5.0, start="ramp", ramp_s=1.0)
    assert not rate.ramped and rate.ramp_extra() == 0  # an open loop keeps its own schedule
    with pytest.raises(ValueError, match="warm-up"):
        CellLoad(["p"] * 10, 2, 4, concurrency=4, start="ramp")  # an automatic ramp needs a warm-up to time
    with pytest.raises(ValueError, match="start"):
        CellLoad(["p"] * 10, 2, 4, concurrency=4, start="staggered")  # type: ignore[arg-type]


def test_slots_are_numbered_across_the_cell_each_worker_holding_its_split_share() -> None:
    from bakeoff.loadgen.runner import plans
    from bakeoff.loadgen.workers import split

    for c, w in ((7, 3), (16, 2), (5, 5), (1, 1)):
        ps = plans("u", "m", CellLoad(["p"] * 20, 2, 4, concurrency=c), w)
        assert sorted(j for p in ps for j in p.slots) == list(range(c))
        assert [len(p.slots) for p in ps] == split(c, w)
        assert all(p.slots == tuple(range(p.worker, c, w)) for p in ps)  # interleaved: a ramp starts them in turn


def _quick_ramp(n: int, c: int, workers: int, ramp_s: float | None = None) -> tuple[CellLoad, CellResult]:
    """A ramped cell on a server whose TPOT grows with the requests it serves (10 ms + 1 ms each): a request sent
    while the ramp is still rising is quicker than the cycle that timed the ramp, so slots refill in the ramp."""
    load = CellLoad([f"q {i}" for i in range(n + RAMP_SUPPLY * c)], prompt_len=2, output_len=8, concurrency=c,
                    warmup_prompts=[f"w {i}" for i in range(c)], start="ramp", ramp_s=ramp_s, steady=n)
    with serving(token_delay_s=0.01, slot_delay_s=0.001) as url:
        return load, run_cell(url, "m", load, show_progress=False, workers=workers,
                              stop_when=EarlyStop(n, Slo("t", ttft_ms=1000.0, tpot_ms=100.0), "point"))


@pytest.mark.parametrize("workers", [1, 2])
def test_a_confident_probe_within_its_bounds_sends_exactly_its_requests_after_the_ramp_and_passes(workers: int) -> None:
    """An H100 probe at c=64 sent 76 requests in its ramp, 12 more than one a slot, and the 299 + c prompts it was
    given left 287 after it: under the 299 with which the confident rule can pass, so every ramped probe failed,
    whatever its latencies. The loop counts the requests it sends after the ramp and stops at n."""
    c, n = 16, probe_requests(16, 0, 1, "confident")
    slo = Slo("t", ttft_ms=1000.0, tpot_ms=100.0)  # every request is far within: ~26 ms a token at c = 16
    load, res = _run_checked(*_quick_ramp(n, c, workers))
    in_ramp = sum(r.ramp for r in res.records)
    assert in_ramp > c, in_ramp  # the premise: slots refilled during the ramp
    m = res.summary({"ttft": slo.ttft_ms, "tpot": slo.tpot_ms}, concurrency=c)
    assert m["steady_requests"] == n == 299 and not short_of_steady(res, load)
    assert len(res.records) == n + in_ramp < len(load.prompts)  # the supply the ramp did not use was not sent
    assert judge(m, slo, res.client["stopped_early"], "confident").passed, m


def _run_checked(load: CellLoad, res: CellResult) -> tuple[CellLoad, CellResult]:
    assert all(r.success for r in res.records) and not res.client["stopped_early"]
    return load, res


def test_a_ramp_that_draws_its_whole_supply_is_found_short() -> None:
    """A ramp ten request cycles long refills each slot about ten times: three prompts a slot run out, fewer than n
    are sent after it, and the caller is told (bakeoff.serving.measure runs such a cell again with more)."""
    from bakeoff.serving.measure import MAX_REFILLS, ramp_short

    load, res = _run_checked(*_quick_ramp(20, 4, 1, ramp_s=1.0))
    after = sum(not r.ramp for r in res.records)
    assert len(res.records) == len(load.prompts) and after < 20 and short_of_steady(res, load)
    again, note = ramp_short(res, load, 0) or (None, "")
    assert again is True and f"leaving {after} of 20" in note
    assert ramp_short(res, load, MAX_REFILLS) == (False, f"short of its steady span: {after} of 20 requests after the "
                                                         f"ramp, which drew all {RAMP_SUPPLY * 4} prompts of its supply")
