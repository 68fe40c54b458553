"""The warm-up a cell sends, and the steady-state view of its timeline beside vLLM's throughput.

The steady span is checked on a constructed closed loop whose every token time is known: two slots, five
requests, a ramp (the second slot fills 1 s late), waves, and a tail in which one request decodes alone.
"""

from __future__ import annotations

import json
import threading

import pytest
from aiohttp import web

from bakeoff.config.schema import LoadCfg
from bakeoff.loadgen import echo_server
from bakeoff.loadgen.cellload import CellLoad
from bakeoff.loadgen.cells import cell_note, requests_for, warmup_for
from bakeoff.loadgen.metrics import RequestRecord, steady_state, summarize
from bakeoff.loadgen.runner import run_cell


def _rec(i: int, start: float, ttft: float, itl: list[float], tokens: int) -> RequestRecord:
    return RequestRecord(i, 8, tokens, start=start, success=True, ttft=ttft, e2el=ttft + sum(itl), itl=itl,
                         output_tokens=tokens)


# c=2. Token (chunk) times: r0 1,2,3,4 | r1 2..7 | r2 5..8 | r3 7..10 | r4 10,12 (two chunks of two tokens).
TIMELINE = [
    _rec(0, 0.0, 1.0, [1.0] * 3, 4),
    _rec(1, 1.0, 1.0, [1.0] * 5, 6),  # dispatched 1 s after the first: the ramp
    _rec(2, 4.0, 1.0, [1.0] * 3, 4),  # refills r0's slot
    _rec(3, 6.0, 1.0, [1.0] * 3, 4),  # dispatched at 6, ends at 10
    _rec(4, 8.0, 2.0, [2.0], 4),
]


def test_steady_span_ramp_and_tail_on_a_constructed_timeline() -> None:
    s = steady_state(TIMELINE, concurrency=2)
    # span: the 2nd dispatch (t=1) to the (5-2+1)=4th completion (ends 4, 7, 8, 10, 12 -> t=10)
    assert s["ramp_s"] == pytest.approx(1.0)
    assert s["tail_s"] == pytest.approx(2.0)  # r4 alone from 10 to 12
    assert s["tail_share"] == pytest.approx(2.0 / 12.0)
    # tokens in [1, 10]: r0 4 + r1 6 + r2 4 + r3 4 + r4's chunk at t=10 (2 tokens; its t=12 chunk is the tail)
    assert s["steady_output_throughput"] == pytest.approx(20.0 / 9.0)
    m = summarize(TIMELINE, 12.0, concurrency=2)
    assert m["output_throughput"] == pytest.approx(22.0 / 12.0)  # vLLM's definition, unchanged
    assert m["steady_output_throughput"] == pytest.approx(20.0 / 9.0)


def test_no_steady_span_without_enough_requests_or_with_failures_left_out() -> None:
    assert steady_state(TIMELINE[:1], concurrency=2)["steady_output_throughput"] is None
    failed = [*TIMELINE, RequestRecord(9, 8, 4, start=0.0, success=False, error="boom")]
    assert steady_state(failed, 2) == steady_state(TIMELINE, 2)
    assert "steady_output_throughput" not in summarize(TIMELINE, 12.0)  # no concurrency: vLLM's keys only


def test_warm_up_fills_every_slot_and_whole_waves_are_explained() -> None:
    load = LoadCfg(concurrency=[1, 8, 32], prompt_len=[128], output_len=16, num_requests=100, warmup_requests=2,
                   num_requests_by_concurrency={1: 30})
    assert [warmup_for(load, c) for c in (1, 8, 32)] == [2, 8, 32]
    assert warmup_for(load.model_copy(update={"warmup_per_slot": 0}), 32) == 2
    assert [requests_for(load, c) for c in (1, 8, 32)] == [30, 100, 100]
    assert cell_note(load, 32) == ("warm-up: 32 requests at concurrency 32, uncounted; "
                                   "100 requests = 3 waves of 32 + a tail of 4")
    assert "30 requests at c=1 (load.num_requests_by_concurrency)" in cell_note(load, 1)
    waves = load.model_copy(update={"num_requests": 1, "requests_per_concurrency": 3})
    assert requests_for(waves, 32) == 96 and "tail" not in cell_note(waves, 32)


def test_the_runner_sends_the_warm_up_at_the_cells_concurrency_before_any_measured_request() -> None:
    """Against the echo server: every warm-up request is in flight at once (all c slots), and all of them end
    before the first measured request arrives."""
    lock = threading.Lock()
    state = {"in_flight": 0, "peak_warm": 0, "warm_done": 0, "first_measured_after_warm": None}

    @web.middleware
    async def count(request: web.Request, handler):  # type: ignore[no-untyped-def]
        prompt = json.loads(await request.read())["prompt"]
        warm = prompt.startswith("warm")
        with lock:
            state["in_flight"] += 1
            if warm:
                state["peak_warm"] = max(state["peak_warm"], state["in_flight"])
            elif state["first_measured_after_warm"] is None:
                state["first_measured_after_warm"] = state["warm_done"]
        try:
            return await handler(request)
        finally:
            with lock:
                state["in_flight"] -= 1
                state["warm_done"] += warm

    with echo_server.serving(token_delay_s=0.01, middlewares=[count]) as url:
        res = run_cell(url, "m", CellLoad([f"measured {i}" for i in range(8)], prompt_len=4, output_len=8,
                                          concurrency=4, warmup_prompts=[f"warm {i}" for i in range(4)]),
                       show_progress=False)
    assert all(r.success for r in res.records)
    assert state["peak_warm"] == 4
    assert state["first_measured_after_warm"] == 4
