"""Workloads (bakeoff.loadgen.workload, trace, sessions): the requests they make and how the client sends them.

Against the real tokenizer of the embedded model (its fp16 directory's, when present) or a tokenizer built here,
and the echo server (bakeoff.loadgen.echo_server): a real HTTP server whose middleware records what arrived and
when, so what the server saw is checked, not what the client says it sent.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from aiohttp import web

from bakeoff.composition.compose import load_config
from bakeoff.config.schema import LoadCfg
from bakeoff.errors import BakeoffError
from bakeoff.loadgen import sessions, trace, workload
from bakeoff.loadgen.cellload import CellLoad, Sessions
from bakeoff.loadgen.cells import cell_spec_hash, requests_for
from bakeoff.loadgen.echo_server import serving
from bakeoff.loadgen.prefix_cache import PrefixCacheCounters
from bakeoff.loadgen.runner import run_cell

from conftest import ROOT

STATS = ROOT / "data" / "traces" / "mooncake_conversation.yaml"
VOCAB = np.arange(100, 30000)


class Arrivals:
    """Middleware: each completion request's body and arrival time, in arrival order."""

    def __init__(self) -> None:
        self.seen: list[tuple[float, Any]] = []
        self.lock = threading.Lock()

    def middleware(self) -> object:
        @web.middleware
        async def record(request: web.Request, handler):  # noqa: ANN001, ANN202
            if request.path == "/v1/completions":
                body = await request.json()
                with self.lock:
                    self.seen.append((time.perf_counter(), body["prompt"]))
            return await handler(request)

        return record


@pytest.fixture
def echo() -> Iterator[tuple[str, Arrivals]]:
    arrivals = Arrivals()
    with serving(token_delay_s=0.002, middlewares=[arrivals.middleware()]) as url:
        yield url, arrivals


def _load(**workload: Any) -> LoadCfg:
    return LoadCfg(concurrency=[2], prompt_len=[16], output_len=4, num_requests=8, workload=workload)


# --- trace -------------------------------------------------------------------------------------------------------


def _line(ts: int, n_in: int, ids: list[int], n_out: int = 4) -> str:
    return json.dumps({"timestamp": ts, "input_length": n_in, "output_length": n_out, "hash_ids": ids})


def test_shared_hash_ids_give_identical_token_prefixes_and_distinct_ones_differ() -> None:
    rows = trace.parse([_line(0, 40, [0, 1, 2]), _line(5, 44, [0, 1, 3]), _line(9, 30, [0, 4])], block_tokens=16)
    cache: dict[int, list[int]] = {}
    a, b, c = (trace.prompt_ids(r, 16, VOCAB, seed=7, cache=cache) for r in rows)
    assert [len(a), len(b), len(c)] == [40, 44, 30]  # each cut to its input_length
    assert a[:32] == b[:32]  # two shared blocks: identical tokens
    assert a[32:40] != b[32:40]  # block 2 against block 3
    assert a[:16] == c[:16] and a[16:30] != c[16:30]  # one shared block, then 1 against 4
    # The same id gives the same tokens in another process's cache; another seed gives others.
    assert trace.prompt_ids(rows[0], 16, VOCAB, seed=7) == a
    assert trace.prompt_ids(rows[0], 16, VOCAB, seed=8) != a
    assert trace.implied_hits(rows, 16) == (32 + 16, 40 + 44 + 30)


@pytest.mark.parametrize(("line", "says"), [
    (_line(0, 40, [0, 1]), "2 hash_ids for input_length 40"),
    ('{"timestamp": 0, "input_length": 4}', "missing ['output_length', 'hash_ids']"),
    (_line(0, 0, []), "integers >= 1"),
])
def test_a_bad_trace_line_is_refused_naming_it(line: str, says: str) -> None:
    with pytest.raises(BakeoffError, match=r"t\.jsonl:2: " + r".*" + says.replace("[", r"\[").replace("]", r"\]")):
        trace.parse([_line(0, 10, [9]), line], block_tokens=16, source="t.jsonl")


def test_a_trace_whose_timestamps_go_back_is_refused() -> None:
    with pytest.raises(BakeoffError, match="t:2: timestamp 5 is before the previous line's 9"):
        trace.parse([_line(9, 10, [1]), _line(5, 10, [2])], 16, "t")


def test_the_replay_keeps_the_order_and_the_scaled_gaps(echo: tuple[str, Arrivals]) -> None:
    url, arrivals = echo
    stamps = [0, 0, 150, 200, 600, 680, 1000]  # ms: a burst, then gaps of 150, 50, 400, 80 and 320 ms
    rows = trace.parse([_line(t, 8 + i, [i]) for i, t in enumerate(stamps)], block_tokens=16)
    prompts = [trace.prompt_ids(r, 16, VOCAB, seed=1) for r in rows]
    scale = 0.5
    t_start = time.perf_counter()
    res = run_cell(url, "m", CellLoad(prompts, 16, 4, concurrency=1, offsets=trace.offsets(rows, scale),
                                      prompt_lens=[r.input_length for r in rows],
                                      output_lens=[2 + i for i in range(len(rows))]),
                   show_progress=False, workers=2)
    # The server saw them in the trace's order (requests of one timestamp, a burst, in any order among themselves).
    seen = [tuple(p) for _, p in sorted(arrivals.seen)]
    assert len(seen) == len(prompts)
    for ts in sorted(set(stamps)):
        at = [i for i, t in enumerate(stamps) if t == ts]
        assert set(seen[at[0]:at[-1] + 1]) == {tuple(prompts[i]) for i in at}
    by_index = sorted(res.records, key=lambda r: r.index)
    for r, ts in zip(by_index, stamps, strict=True):
        assert r.success and r.schedule_delay is not None and 0.0 <= r.schedule_delay < 0.03, r.schedule_delay
        assert r.start == pytest.approx(ts / 1000.0 * scale, abs=0.03)  # sent at its scaled time
        assert r.output_tokens == r.output_len  # each request's own output length
    arrived = [t - t_start for t, _ in sorted(arrivals.seen)]
    gaps = np.diff(arrived)
    assert gaps == pytest.approx(np.diff(stamps) / 1000.0 * scale, abs=0.03)
    assert res.client["client_schedule_delay_p99_ms"] < 30.0


def test_the_generator_reproduces_the_statistics_it_was_drawn_from() -> None:
    """At the trace's own size the drawn trace has the source's means, burst shape, share of continued requests
    and, within 15 %, its implied hit rate (0.35 against 0.374: docs/methodology.md); its reuse distances are
    tests/test_trace_reuse.py's. Without continuations the implied hit rate falls to the shared first block's."""
    stats = trace.load_stats(STATS)
    drawn = trace.trace_stats(trace.generate(stats, stats["requests"], 512, seed=3), 512)
    assert drawn["mean_input_length"] == pytest.approx(stats["published"]["mean_input_length"], rel=0.03)
    assert drawn["mean_output_length"] == pytest.approx(stats["published"]["mean_output_length"], rel=0.03)
    assert drawn["arrival"]["tick_s"] == stats["arrival"]["tick_s"]
    # The rate is held per 5-minute window (CV 0.079 a window): over ~12 windows the mean burst varies by 2.3 %.
    assert drawn["arrival"]["batch_mean"] == pytest.approx(stats["arrival"]["batch_mean"], rel=0.07)
    assert drawn["continuation_share"] == pytest.approx(stats["continuation_share"], abs=0.02)
    assert drawn["implied_hit_rate"] == pytest.approx(stats["implied_hit_rate"], rel=0.15)
    never = {**stats, "continued_chance": {"opening": 0.0, "continuation": 0.0}}
    alone = trace.trace_stats(trace.generate(never, 2000, 512, seed=3), 512)
    assert alone["implied_hit_rate"] < 0.1


def test_a_drawn_trace_at_a_cpus_size_scales_its_lengths_with_its_blocks() -> None:
    stats = trace.load_stats(STATS)
    rows = trace.generate(stats, 400, 32, seed=0, max_input_len=1024, max_output_len=32)
    assert max(r.input_length for r in rows) == 1024 and max(r.output_length for r in rows) <= 32
    assert all(len(r.hash_ids) == -(-r.input_length // 32) for r in rows)  # Mooncake's rule holds
    assert np.median([r.input_length for r in rows]) == pytest.approx(5264 / 16, rel=0.5)


# --- multiturn ---------------------------------------------------------------------------------------------------


def test_a_sessions_prompts_grow_by_exactly_the_previous_turn_and_the_new_text(echo: tuple[str, Arrivals]) -> None:
    url, arrivals = echo
    turns, count = 3, 4
    new = [f"<s{s}t{k}> new text {s}.{k}" for s in range(count) for k in range(turns)]
    res = run_cell(url, "m", CellLoad(new, 8, 5, concurrency=2, sessions=Sessions(turns, [0.01] * len(new))),
                   workers=2, show_progress=False)
    assert len(res.records) == count * turns and all(r.success for r in res.records)
    got = {p for _, p in arrivals.seen}
    answer = " t" * 5  # the echo server's answer to max_tokens=5
    for s in range(count):
        prompts = [p for p in got if p.startswith(f"<s{s}t0>")]
        prompts.sort(key=len)
        assert len(prompts) == turns
        assert sessions.grows_by(prompts, [answer] * turns, new[s * turns:(s + 1) * turns])
        for k in range(1, turns):  # the rule, spelled out
            assert prompts[k] == prompts[k - 1] + answer + new[s * turns + k]
    assert res.client["client_prompt_build_s"] >= 0.0 and "client_prompt_build_s" in res.client


def test_think_time_separates_a_sessions_turns(echo: tuple[str, Arrivals]) -> None:
    url, arrivals = echo
    new = [f"<t{k}>" for k in range(3)]
    res = run_cell(url, "m", CellLoad(new, 8, 2, concurrency=1, sessions=Sessions(3, [0.2, 0.2, 0.2])),
                   show_progress=False)
    recs = sorted(res.records, key=lambda r: r.index)
    for a, b in zip(recs, recs[1:], strict=False):
        assert b.start - a.done == pytest.approx(0.2, abs=0.03)  # sent a think time after the answer ended
        assert b.schedule_delay is not None and b.schedule_delay < 0.03


def test_exponential_think_times_have_their_mean() -> None:
    draws = sessions.think_times(2000, 5, 1.5, "exponential", seed=1)
    assert np.mean(draws) == pytest.approx(1.5, rel=0.05) and np.std(draws) == pytest.approx(1.5, rel=0.1)
    assert sessions.think_times(2, 2, 0.3, "constant", seed=1) == [0.3] * 4


def test_turn_columns_split_first_and_later_turns() -> None:
    from bakeoff.loadgen.metrics import RequestRecord

    recs = [RequestRecord(i, 8, 4, success=True, ttft=0.1 if i % 3 == 0 else 0.02, prompt_tokens=8 + 12 * (i % 3),
                          output_tokens=4) for i in range(9)]
    cols = sessions.turn_columns(recs, 3)
    assert cols["median_ttft_first_turn_ms"] == pytest.approx(100.0)
    assert cols["median_ttft_later_turns_ms"] == pytest.approx(20.0)
    hit, total = sessions.implied_hits(recs, 3)
    assert (hit, total) == (3 * ((8 + 4) + (20 + 4)), 3 * (8 + 20 + 32))


# --- shared prefix, sizes, hashes, counters ----------------------------------------------------------------------


class _Tokenizer:
    """The least a builder needs of a tokenizer for token-id workloads."""

    all_special_ids = [0]

    def __len__(self) -> int:
        return 1000


def test_shared_prefix_groups_share_their_system_prompt_and_nothing_else() -> None:
    load = _load(kind="shared_prefix", shared_prefix={"groups": 3, "prompts_per_group": 4, "system_prompt_len": 20})
    n = workload.requests(load, 8, 2)
    assert n == 12  # 3 x max(4, ceil(8 / 3))
    work = workload.build(load, _Tokenizer(), "c2-p16", 16, n, 2, seed=5)
    prompts = work.prompts
    assert all(len(p) == 36 for p in prompts) and work.prompt_lens == [36] * 12
    groups: dict[tuple[int, ...], list[list[int]]] = {}
    for p in prompts:
        groups.setdefault(tuple(p[:20]), []).append(p)
    assert sorted(len(g) for g in groups.values()) == [4, 4, 4]
    assert len({tuple(p[20:]) for p in prompts}) == 12  # every question its own
    assert work.columns["implied_prefix_hit_rate"] == pytest.approx(3 * 3 * 20 / (12 * 36))


def test_cells_of_a_workload_are_sized_by_it() -> None:
    load = _load(kind="multiturn", multiturn={"turns": 3})
    assert requests_for(load, 2) == 9  # 8 requests round up to 3 whole sessions
    assert requests_for(load.model_copy(update={"concurrency": [8]}), 8) == 24  # at least a session a slot


def test_the_fixed_workload_keeps_every_cells_hash_and_another_changes_it() -> None:
    cfg = load_config([])
    base = {"engine": "vllm"}
    fixed = cfg.load
    legacy = LoadCfg.model_validate(fixed.model_dump(exclude={"workload"}))
    assert cell_spec_hash(base, fixed) == cell_spec_hash(base, legacy)
    # The hash from before workloads existed (bakeoff.loadgen.cells), for this exact input.
    import hashlib

    exclude = {"concurrency", "prompt_len", "num_requests_by_format", "num_requests_by_concurrency", "block_seed",
               "mode", "capacity", "client", "workload"}
    old = hashlib.sha256(json.dumps([base, fixed.model_dump(mode="json", exclude=exclude)], sort_keys=True,
                                    default=str).encode()).hexdigest()[:16]
    assert cell_spec_hash(base, fixed) == old
    shared = LoadCfg.model_validate({**fixed.model_dump(), "workload": {"kind": "shared_prefix"}})
    assert cell_spec_hash(base, shared) != old


def test_workload_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="kind='multiturn' but settings for \\['trace'\\]"):
        _load(kind="multiturn", trace={})
    with pytest.raises(ValueError, match="load.prompt_len names one length"):
        LoadCfg(concurrency=[1], prompt_len=[16, 32], output_len=4, num_requests=2, workload={"kind": "trace"})
    with pytest.raises(ValueError, match="request_rate must be null"):
        LoadCfg(concurrency=[1], prompt_len=[16], output_len=4, num_requests=2, request_rate=1.0,
                workload={"kind": "multiturn"})


def test_every_workload_composes_from_its_config_group() -> None:
    for kind in ("fixed", "multiturn", "shared_prefix"):
        assert load_config([f"workload={kind}"]).load.workload.kind == kind
    trace_cfg = load_config(["workload=trace", "load.concurrency=[1]", "load.prompt_len=[16]",
                             "load.workload.trace.block_tokens=16", "load.workload.trace.generator.max_input_len=256",
                             "load.workload.trace.generator.max_output_len=16"])
    assert trace_cfg.load.workload.trace is not None and trace_cfg.load.workload.trace.block_tokens == 16


def test_a_trace_too_long_for_the_context_is_refused_when_the_config_is_composed() -> None:
    from bakeoff.errors import ConfigError

    with pytest.raises(ConfigError, match="the trace's longest request needs"):
        load_config(["workload=trace", "load.concurrency=[1]", "load.prompt_len=[16]"])


def test_prefix_cache_counters_read_each_engines_page() -> None:
    vllm = PrefixCacheCounters(hits="vllm:prefix_cache_hits_total", queries="vllm:prefix_cache_queries_total")
    page = ('# TYPE vllm:prefix_cache_hits counter\nvllm:prefix_cache_hits_total{engine="0"} 96.0\n'
            '# TYPE vllm:prefix_cache_queries counter\nvllm:prefix_cache_queries_total{engine="0"} 160.0\n')
    assert vllm.read(page) == (96.0, 160.0)
    llama = PrefixCacheCounters(hits="llamacpp:prompt_tokens_cached_total", computed="llamacpp:prompt_tokens_total")
    page = ('# TYPE llamacpp:prompt_tokens_total counter\nllamacpp:prompt_tokens_total 70\n'
            '# TYPE llamacpp:prompt_tokens_cached_total counter\nllamacpp:prompt_tokens_cached_total 30\n')
    assert llama.read(page) == (30.0, 100.0)
    assert llama.read("# TYPE x counter\nx_total 1\n") is None


def test_the_prefix_caching_switch_becomes_each_engines_flags() -> None:
    from bakeoff.engines.llamacpp import LlamaCppEngine
    from bakeoff.engines.vllm import VllmEngine

    assert VllmEngine.prefix_caching_flags(True, {})[0] == ["--enable-prefix-caching"]
    assert VllmEngine.prefix_caching_flags(False, {})[0] == ["--no-enable-prefix-caching"]
    on, taken = LlamaCppEngine.prefix_caching_flags(True, {"cache_ram": 0})
    assert on == ["--cache-prompt", "--cache-reuse", "256", "--cache-ram", "8192"] and "cache_ram" in taken
    off, _ = LlamaCppEngine.prefix_caching_flags(False, {"cache_ram": 4096})
    assert off == ["--no-cache-prompt", "--cache-reuse", "0", "--cache-ram", "0"]
    assert LlamaCppEngine.prefix_caching_state({"prefix_caching": False}) == "off"
    assert VllmEngine.prefix_caching_state({}) == "engine default"


def test_the_trace_stats_file_cites_its_source() -> None:
    stats = trace.load_stats(STATS)
    assert "github.com/kvcache-ai/Mooncake" in stats["source"] and stats["licence"] == "Apache-2.0"


def test_stats_of_a_trace_file_are_computed_the_way_the_shipped_ones_were(tmp_path: Path) -> None:
    lines = [_line(0, 40, [0, 1, 2]), _line(0, 44, [0, 1, 3]), _line(3000, 30, [0, 4]), _line(3000, 50, [0, 5, 6, 7])]
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(lines) + "\n")
    st = trace.trace_stats(trace.read(path, 16), 16)
    assert st["root_blocks"] == 1 and st["continuation_share"] == 0.25  # only the second continues the first
    assert st["arrival"] == {"tick_s": 3.0, "batch_mean": 2.0, "batch_variance_over_mean": 0.0, "window_s": 300.0,
                             "windows": 0, "window_count_cv": None, "window_count_range": None}  # 3 s: no whole window
    assert st["reuse_distance_quantiles"][50] == 1.0
    assert st["implied_hit_rate"] == pytest.approx((32 + 16 + 16) / (40 + 44 + 30 + 50))
