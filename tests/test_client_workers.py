"""The load client's workers (bakeoff.loadgen.workers): the split, one start, the merge, and each worker's health.

Against the echo server (bakeoff.loadgen.echo_server): a real HTTP server streaming real SSE, whose middleware
counts the requests it is serving at each arrival, so what the server saw is checked, not what the client says.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import fields

import pytest

from bakeoff.engines.llamacpp import LlamaCppEngine
from bakeoff.loadgen import sizing
from bakeoff.loadgen.cellload import CellLoad
from bakeoff.loadgen.echo_server import InFlight, serving
from bakeoff.loadgen.metrics import RequestRecord, summarize
from bakeoff.loadgen.runner import plans, run_cell, schedule
from bakeoff.loadgen.workers import deal, split


@pytest.fixture
def echo() -> Iterator[tuple[str, InFlight]]:
    counter = InFlight()
    with serving(token_delay_s=0.004, middlewares=[counter.middleware()]) as url:
        yield url, counter


def test_the_split_gives_every_worker_a_share_and_keeps_the_total() -> None:
    assert split(7, 3) == [3, 2, 2] and split(64, 4) == [16] * 4 and split(1, 1) == [1]
    for c in range(1, 40):
        for w in range(1, c + 1):
            parts = split(c, w)
            assert sum(parts) == c and min(parts) >= 1 and max(parts) - min(parts) <= 1
    with pytest.raises(ValueError, match="cannot split 2 over 3"):
        split(2, 3)


def test_the_open_loop_schedule_is_the_same_with_one_and_four_workers() -> None:
    offsets = schedule(20.0, 50, seed=7)
    assert offsets[0] == 0.0 and all(b > a for a, b in zip(offsets, offsets[1:], strict=False))
    one = [x for part in deal(offsets, 1) for x in part]
    four = sorted(x for part in deal(offsets, 4) for x in part)
    assert one == four == list(enumerate(offsets))
    for w in (1, 4):  # the workers' plans carry that one schedule, dealt round-robin
        ps = plans("u", "m", CellLoad(["p"] * 50, 2, 8, 50, request_rate=20.0, seed=7), w)
        assert sorted(x for p in ps for x in (p.schedule or [])) == list(enumerate(offsets))
        assert [len(p.schedule or []) for p in ps] == [len(range(k, 50, w)) for k in range(w)]


@pytest.mark.parametrize("workers", [1, 4])
def test_the_closed_loop_keeps_exactly_c_in_flight_and_merges_into_one_cell(echo: tuple[str, InFlight],
                                                                            workers: int) -> None:
    url, counter = echo
    c, n = 8, 40
    res = run_cell(url, "m", CellLoad([f"p {i}" for i in range(n)], prompt_len=2, output_len=16, concurrency=c,
                                      warmup_prompts=["w"] * c), show_progress=False, workers=workers)
    assert res.client["client_workers"] == workers
    assert counter.peak == c  # the server never saw more than c at once (warm-ups included) ...
    m = summarize(res.records, res.duration_s, concurrency=c)
    assert m["peak_in_flight"] == c  # ... and the client had c in flight
    # every measured request exactly once, each with every field of a record, on one clock
    assert sorted(r.index for r in res.records) == list(range(n)) and m["completed"] == n
    assert {r.worker for r in res.records} == set(range(workers))
    assert all(set(r.to_json()) == {f.name for f in fields(RequestRecord)} - {"raw"} for r in res.records)
    assert all(r.raw is None and len(r.itl) == 15 for r in res.records)  # every stream decoded after the cell
    assert min(r.start for r in res.records) >= 0 and res.duration_s >= max(r.start + r.e2el for r in res.records)
    assert res.duration_s < 30 and m["total_output_tokens"] == 16 * n
    # between the c-th send and the (n-c+1)-th response's end, every slot holds a request: the requests in
    # flight (sent, response not yet ended), averaged over that span, are c; a slot refills within microseconds
    assert all(r.done is not None and r.done >= r.start + r.e2el for r in res.records)
    starts = sorted(r.start for r in res.records)
    dones = sorted(r.done for r in res.records if r.done is not None)
    lo, hi = starts[c - 1], dones[n - c]
    edges = sorted({lo, hi, *[x for r in res.records for x in (r.start, r.done) if x is not None and lo < x < hi]})
    busy = sum((b - a) * sum(r.start <= a and r.done is not None and r.done >= b for r in res.records)
               for a, b in zip(edges, edges[1:], strict=False))
    assert busy / (hi - lo) == pytest.approx(c, rel=0.01)


def test_the_open_loop_sends_each_request_at_its_scheduled_time_on_the_shared_clock(echo: tuple[str, InFlight]) -> None:
    url, _ = echo
    n, rate = 30, 40.0
    res = run_cell(url, "m", CellLoad([f"p {i}" for i in range(n)], prompt_len=2, output_len=4, concurrency=n,
                                      request_rate=rate, seed=3), show_progress=False, workers=3)
    offsets = schedule(rate, n, seed=3)
    assert sorted(r.index for r in res.records) == list(range(n))
    for r in res.records:
        assert r.schedule_delay is not None and r.worker == r.index % 3
        assert r.start == pytest.approx(offsets[r.index] + r.schedule_delay, abs=1e-9)
        assert 0 <= r.schedule_delay < 0.05  # sent within 50 ms of its time
    # the schedule's order is kept across the workers, wherever its times are more than 10 ms apart
    start = {r.index: r.start for r in res.records}
    assert all(start[i] < start[j] for i in range(n) for j in range(i + 1, n) if offsets[j] - offsets[i] > 0.01)


def test_an_early_stop_seen_by_the_caller_stops_every_worker(echo: tuple[str, InFlight]) -> None:
    url, _ = echo
    seen: list[int] = []

    def stop(record: RequestRecord) -> bool:
        seen.append(record.index)
        return len(seen) >= 5

    res = run_cell(url, "m", CellLoad([f"p {i}" for i in range(200)], prompt_len=2, output_len=8, concurrency=4),
                   show_progress=False, workers=2, stop_when=stop)
    assert res.client["stopped_early"] and 5 <= len(res.records) < 40


@pytest.mark.slow
def test_two_workers_against_the_echo_server_give_a_complete_cell_with_each_workers_health(
        echo: tuple[str, InFlight]) -> None:
    import json

    url, _ = echo
    res = run_cell(url, "m", CellLoad([f"p {i}" for i in range(64)], prompt_len=2, output_len=32, concurrency=16,
                                      warmup_prompts=["w"] * 16), show_progress=False, workers=2)
    assert len(res.records) == 64 and all(r.success for r in res.records)
    per_worker = json.loads(res.client["client_worker_health"])
    assert [h["worker"] for h in per_worker] == [0, 1] and sum(h["requests"] for h in per_worker) == 64
    for h in per_worker:
        assert h["cpu_s"] > 0 and 0 < h["cpu_share"] < 1.5 and h["loop_lag_p99_ms"] >= 0
        assert h["schedule_delay_p99_ms"] >= h["schedule_delay_p50_ms"] >= 0
    # client_worker_health holds each worker's figures rounded to 4 decimals (bakeoff.loadgen.health), so their sum
    # may differ from the unrounded total by half a unit of the 4th decimal a worker.
    assert res.client["client_cpu_s"] == pytest.approx(sum(h["cpu_s"] for h in per_worker), rel=1e-3,
                                                       abs=0.5e-4 * len(per_worker))
    assert res.client["client_saturated"] is False, res.client["client_saturated_reason"]


def test_auto_starts_at_one_worker_and_sizes_from_the_tightest_rate_bound_the_server_showed() -> None:
    s = sizing.ClientSizer()
    assert s.workers(1, 16) == 1 and s.workers(256, 16) == 1  # nothing measured: one worker, its health decides
    # measured on an H100 (2026-12-06): 5150 tok/s at c = 32, 0.035 CPU-s per 1k tokens
    s.observe(32, 5150.0, 0.035)
    assert s.expected_tok_s(256) == pytest.approx(5150.0 * 8)  # at most proportional to c
    assert s.workers(256, 16) == 3  # 41.2k tok/s x 0.035 / 1000 / 0.5 = 2.9
    assert s.workers(256, 2) == 2 and s.workers(32, 16) == 1 and s.workers(8, 16) == 1
    # c = 256 then read 12.2k tok/s (runs/h100-capacity-steady-2026-12-07): every cell bounds the rate, the tightest wins
    s.observe(256, 12200.0, 0.035)
    assert s.expected_tok_s(256) == pytest.approx(12200.0) and s.expected_tok_s(512) == pytest.approx(24400.0)
    assert s.expected_tok_s(128) == pytest.approx(12200.0)  # a higher c's rate bounds a lower one's too (20.6k from c=32)
    assert s.workers(256, 16) == 1  # 12.2k x 0.035 / 1000 / 0.5 = 0.85
    assert s.workers(512, 16) == 2  # 24.4k: 1.7
    assert sizing.ClientSizer([sizing.Seen(3, 1e6, 0.04)]).workers(3, 16) == 3  # never more than in flight
    s.observe(1, float("nan"), 0.03)  # a cell with no throughput teaches nothing
    assert len(s.seen) == 2


def test_auto_never_starts_a_cell_with_fewer_workers_than_a_lower_one_needed() -> None:
    """A client still short after its re-run measured its own rate: the rate bound would start the next cell short
    again, so the next starts from twice its workers; one that was not short sets the floor at its own."""
    s = sizing.ClientSizer()
    s.observe(64, 3000.0, 0.035, workers=4)  # a count that was set, not shown to be needed: no floor
    assert s.workers(64, 16) == 1
    s.observe(64, 3000.0, 0.035, needed=2, workers=2)  # re-run with 2 after one was short: the rate would say 1
    assert s.workers(64, 16) == 2 and s.workers(128, 16) == 2 and s.workers(32, 16) == 1
    s.observe(128, 3100.0, 0.035, needed=2, workers=2, saturated=True)
    assert s.workers(128, 16) == 4 and s.workers(512, 16) == 4 and s.workers(512, 3) == 3 and s.workers(100, 16) == 2


def test_llamacpp_slots_follow_the_search_maximum_within_the_kv_memory() -> None:
    base = {"parallel": 32, "ctx_size": 49152, "flash_attn": "on"}
    # room for every slot: parallel is the search's maximum, each slot keeps its context
    roomy, why = LlamaCppEngine.sized_for_search(base, 64, 385, 524288, 80e9)
    assert roomy["parallel"] == 64 and roomy["ctx_size"] == 64 * 1536 and why == "search maximum"
    assert roomy["flash_attn"] == "on"
    # Llama-2-7B (512 KiB a token) on an H100: 1024 slots of 385 tokens need 206 GB; 40 GB hold 198
    big, why = LlamaCppEngine.sized_for_search({"parallel": 32, "ctx_size": 12320}, 1024, 385, 524288, 40e9)
    assert why == "KV memory" and big["parallel"] == int(40e9 // (524288 * 385)) == 198
    assert big["ctx_size"] == 198 * 385
    # more memory than llama.cpp has sequences: its own maximum, named
    most, why = LlamaCppEngine.sized_for_search({"parallel": 32, "ctx_size": 12320}, 1024, 385, 524288, 66e9)
    assert most["parallel"] == LlamaCppEngine.MAX_SLOTS == 256 and why == "llama.cpp maximum (256 sequences)"
    # already enough: the experiment's own setting stands
    same, why = LlamaCppEngine.sized_for_search(base, 16, 385, None, None)
    assert same == base and why == "experiment"
    # on CPU memory does not bound it
    cpu, why = LlamaCppEngine.sized_for_search({"parallel": 4, "ctx_size": 8192}, 32, 65, None, None)
    assert cpu["parallel"] == 32 and cpu["ctx_size"] == 32 * 2048 and why == "search maximum"


def test_the_quick_read_at_a_requests_end_agrees_with_the_full_decoding_after_the_cell() -> None:
    import orjson

    from bakeoff.loadgen.client import finish_deferred, quick

    def event(msg: dict) -> bytes:
        return b"data: " + orjson.dumps(msg) + b"\n\n"

    token = {"id": "c", "object": "text_completion", "choices": [{"index": 0, "text": " t", "finish_reason": None}]}
    reads = [event(token) for _ in range(5)] + [event({"choices": [], "usage": {"prompt_tokens": 3,
                                                                               "completion_tokens": 5}})
                                                + b"data: [DONE]\n\n"]
    stamps = [1.0 + 0.01 * i for i in range(len(reads))]
    rec = RequestRecord(0, 3, 5)
    rec.raw = (reads, stamps, 0.9)
    quick(rec)
    early = (rec.success, rec.ttft, rec.e2el, rec.output_tokens)
    assert early == (True, pytest.approx(0.1), pytest.approx(0.14), 5) and rec.tpot == pytest.approx(0.01)
    finish_deferred(rec)
    assert rec.raw is None and (rec.success, rec.ttft, rec.e2el, rec.output_tokens) == early
    assert rec.itl == pytest.approx([0.01] * 4) and rec.generated_text == " t" * 5
    empty = RequestRecord(1, 3, 5)
    empty.raw = ([event({"choices": [], "usage": {"completion_tokens": 0}})], [1.0], 0.9)
    quick(empty)
    assert not empty.success and empty.error == "stream ended without a token chunk"
