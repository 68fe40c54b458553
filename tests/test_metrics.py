"""The metric math, on hand-made records, and against vLLM's own `vllm bench serve` code."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from bakeoff.loadgen.metrics import RequestRecord, summarize


def _rec(i: int, ttft: float, e2el: float, itl: list[float], out: int, ok: bool = True, err: str = "") -> RequestRecord:
    return RequestRecord(index=i, prompt_len=100, output_len=out, start=0.1 * i, success=ok, ttft=ttft, e2el=e2el,
                         itl=itl, prompt_tokens=100, output_tokens=out if ok else 0, error=err)


RECORDS = [
    _rec(0, 0.10, 1.00, [0.30, 0.30, 0.30], 4),
    _rec(1, 0.20, 2.20, [0.50, 0.50, 0.50, 0.50], 5),
    _rec(2, 0.40, 0.40, [], 1),  # one token: no TPOT
    _rec(3, 0, 0, [], 4, ok=False, err="HTTP 500: boom"),
]


def test_hand_computed_values() -> None:
    m = summarize(RECORDS, duration_s=2.0, slos_ms={"ttft": 250, "tpot": 400})
    assert (m["completed"], m["failed"], m["errors"]) == (3, 1, {"HTTP 500: boom": 1})
    assert m["total_output_tokens"] == 10 and m["total_input_tokens"] == 300
    assert m["output_throughput"] == pytest.approx(5.0)
    assert m["request_throughput"] == pytest.approx(1.5)
    assert m["total_token_throughput"] == pytest.approx(155.0)
    # TPOT = (E2EL - TTFT) / (out - 1): 0.3 s and 0.5 s
    assert m["mean_tpot_ms"] == pytest.approx(400.0)
    assert m["median_tpot_ms"] == pytest.approx(400.0)
    assert m["median_ttft_ms"] == pytest.approx(200.0)
    assert m["mean_e2el_ms"] == pytest.approx(1200.0)
    # ITL pooled across requests: three 0.3 s gaps and four 0.5 s gaps
    assert m["mean_itl_ms"] == pytest.approx(1000 * (0.9 + 2.0) / 7)
    assert m["median_itl_ms"] == pytest.approx(500.0)
    assert m["p90_ttft_ms"] == pytest.approx(np.percentile([100, 200, 400], 90))
    # goodput: req0 (ttft 100, tpot 300) good; req1 (ttft 200, tpot 500) bad; req2 (ttft 400) bad
    assert m["request_goodput"] == pytest.approx(0.5)


def test_failed_requests_are_excluded_from_latency() -> None:
    only_failed = summarize([RECORDS[3]], duration_s=1.0)
    assert only_failed["completed"] == 0 and math.isnan(only_failed["median_ttft_ms"])


def test_matches_vllm_bench_serve_calculate_metrics() -> None:
    """Same inputs through vLLM's own calculate_metrics give the same numbers."""
    from vllm.benchmarks.datasets.datasets import SampleRequest
    from vllm.benchmarks.lib.endpoint_request_func import RequestFuncOutput
    from vllm.benchmarks.serve import calculate_metrics

    rng = np.random.default_rng(1)
    records = []
    for i in range(50):
        out = int(rng.integers(1, 40))
        itl = rng.uniform(0.01, 0.05, size=max(0, out - 1)).tolist()
        ttft = float(rng.uniform(0.05, 0.5))
        ok = i % 17 != 5
        records.append(_rec(i, ttft, ttft + sum(itl), itl, out, ok=ok, err="" if ok else "x"))
    outputs = [RequestFuncOutput(generated_text="", success=r.success, latency=r.e2el, output_tokens=r.output_tokens,
                                 ttft=r.ttft, itl=r.itl, prompt_len=r.prompt_len, error=r.error, start_time=r.start)
               for r in records]
    reqs = [SampleRequest(prompt="p", prompt_len=100, expected_output_len=r.output_len) for r in records]
    slo = {"ttft": 300.0, "tpot": 30.0}
    theirs, _ = calculate_metrics(reqs, outputs, 7.5, None, [90.0, 99.0], slo)
    ours = summarize(records, 7.5, slo)
    for key in ["completed", "failed"]:
        assert ours[key] == getattr(theirs, key)
    assert ours["total_output_tokens"] == theirs.total_output
    for key in ["request_throughput", "output_throughput", "total_token_throughput", "request_goodput"]:
        assert ours[key] == pytest.approx(getattr(theirs, key)), key
    for metric in ["ttft", "tpot", "itl", "e2el"]:
        for stat in ["mean", "median", "std"]:
            k = f"{stat}_{metric}_ms"
            assert ours[k] == pytest.approx(getattr(theirs, k)), k
        for p, v in getattr(theirs, f"percentiles_{metric}_ms"):
            assert ours[f"p{int(p)}_{metric}_ms"] == pytest.approx(v), (metric, p)


def test_the_plots_read_back_the_same_latencies_the_summary_uses(tmp_path: Path) -> None:
    from bakeoff.report.plots import request_latencies

    jsonl = tmp_path / "cell.jsonl"
    jsonl.write_text("".join(json.dumps(r.to_json()) + "\n" for r in RECORDS))
    ttft, tpot = request_latencies(jsonl)
    m = summarize(RECORDS, duration_s=2.0)
    assert ttft == pytest.approx([100.0, 200.0, 400.0])  # the failed request is left out
    assert tpot == pytest.approx([300.0, 500.0])  # the one-token request has no TPOT
    assert np.median(tpot) == pytest.approx(m["median_tpot_ms"])
    assert RequestRecord.from_json(RECORDS[0].to_json()) == RECORDS[0]


def test_the_summary_columns_are_the_metrics_a_cell_computes() -> None:
    from bakeoff.loadgen.metrics import SERVER_METRICS, SUMMARY_METRICS
    from bakeoff.stages.summary import COLUMNS

    recs = [_rec(i, ttft=0.1, e2el=0.5, out=4, itl=[0.1, 0.1, 0.2]) for i in range(3)]
    computed = summarize(recs, 2.0, slos_ms={"ttft": 150.0}, concurrency=1)
    assert set(SUMMARY_METRICS) | set(SERVER_METRICS) <= set(computed)
    # in the summary, in the metrics' own order
    at = [COLUMNS.index(k) for k in (*SUMMARY_METRICS, *SERVER_METRICS)]
    assert at == sorted(at) and len(set(COLUMNS)) == len(COLUMNS)


def test_tpot_divides_by_output_tokens_minus_one_not_by_chunk_gaps() -> None:
    """A server may stream several tokens a chunk: 8 tokens in 4 chunks (3 gaps) over 0.7 s after the first
    chunk is 0.1 s a token, not 0.233 s a gap."""
    r = _rec(0, ttft=0.2, e2el=0.9, itl=[0.2, 0.2, 0.3], out=8)
    assert r.tpot == pytest.approx(0.1)
    m = summarize([r], 1.0)
    assert m["median_tpot_ms"] == pytest.approx(100.0)
    assert m["median_itl_ms"] == pytest.approx(200.0)  # ITL stays the chunk gap, as in vLLM
