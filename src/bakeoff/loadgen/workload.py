"""What a cell sends under each workload (``load.workload``), and what the row says it replayed.

Why one module: the same client, metric definitions and statuses serve every workload (bakeoff.loadgen.runner,
bakeoff.loadgen.metrics); what differs is only which requests a cell sends, when, and what a perfect prefix
cache would have made of them. Each kind, its rules stated where they live:

* ``fixed`` -- the cells as they always were: ``n`` distinct prompts of exactly ``prompt_len`` tokens
  (bakeoff.loadgen.prompts). Its cells keep their spec hashes (bakeoff.loadgen.cells.cell_spec_hash).
* ``trace`` -- a Mooncake-format trace replayed in its order at its own arrival times x ``time_scale``, open
  loop (bakeoff.loadgen.trace); every request of the trace, with the trace's input and output lengths. A rate
  probe of the capacity search (``request_rate`` given) scales the times so the trace's mean rate is that rate;
  a concurrency probe sends the trace's requests in order at that concurrency, closed loop.
* ``multiturn`` -- ``c`` sessions at once of ``turns`` turns (bakeoff.loadgen.sessions), closed loop.
* ``shared_prefix`` -- ``G`` groups, each with its system prompt of ``system_prompt_len`` tokens; each request
  is its group's system prompt followed by a question of its own of ``prompt_len`` tokens. A cell sends
  ``G x P'`` requests, ``P' = max(prompts_per_group, ceil(n / G))`` (at least the configured ``P`` a group,
  more when the load asks more), in an order shuffled by the cell's seed, so groups interleave as users would.
  A perfect cache reuses every group's system prompt from its second request on.

Token-level workloads (trace, shared_prefix) send prompts as token ids, so their shared prefixes are exactly
shared tokens; ``multiturn`` sends text, since each turn carries the previous answer as the server wrote it.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bakeoff.config.schema import LoadCfg, TraceCfg
from bakeoff.errors import BakeoffError
from bakeoff.loadgen import sessions as sess
from bakeoff.loadgen import trace as tr
from bakeoff.loadgen.metrics import RequestRecord
from bakeoff.loadgen.prompts import make_prompts, vocab_ids
from bakeoff.loadgen.workers import Sessions

COLUMNS = ["workload", "workload_detail", "workload_build_s", "trace_time_scale", "implied_prefix_hit_rate",
           "median_ttft_first_turn_ms", "median_ttft_later_turns_ms", "p99_ttft_first_turn_ms",
           "p99_ttft_later_turns_ms", "client_prompt_build_s"]
# Seeds of what is the same in every cell (a trace's blocks, a group's system prompt), apart from the cells' own.
BLOCK_SEED, SYSTEM_SEED = 40, 41


@dataclass
class CellWork:
    """One cell's measured requests under its workload, in the runner's terms (bakeoff.loadgen.runner.run_cell)."""

    prompts: list[Any]  # by request index: text, or token ids; multiturn: each turn's new text
    prompt_lens: list[int] | None = None
    output_lens: list[int] | None = None
    offsets: list[float] | None = None  # an open loop on this schedule (seconds from the cell's start)
    sessions: Sessions | None = None
    implied: tuple[int, int] | None = None  # (hit tokens, prompt tokens) of a perfect cache; multiturn: after
    columns: dict[str, Any] = field(default_factory=dict)

    def run_kwargs(self) -> dict[str, Any]:
        return {"prompts": self.prompts, "prompt_lens": self.prompt_lens, "output_lens": self.output_lens,
                "offsets": self.offsets, "sessions": self.sessions}


def _path(p: str) -> Path:
    path = Path(p)
    if not path.exists():
        raise BakeoffError(f"{p}: no such file (a workload's files are named from the project root)")
    return path


@functools.lru_cache(maxsize=8)
def _trace(cfg: TraceCfg) -> tuple[tr.TraceRequest, ...]:
    if cfg.path is not None:
        rows = tr.read(_path(cfg.path), cfg.block_tokens)
    else:
        g = cfg.generator
        rows = tr.generate(tr.load_stats(_path(g.stats)), g.requests, cfg.block_tokens, g.seed, g.max_input_len,
                           g.max_output_len)
    return tuple(rows[:cfg.requests] if cfg.requests else rows)


def trace_rows(load: LoadCfg) -> list[tr.TraceRequest]:
    """The trace a ``trace`` workload replays (its first ``requests``, where set)."""
    assert load.workload.trace is not None
    return list(_trace(load.workload.trace))


def source_digest(load: LoadCfg) -> dict[str, str]:
    """The sha256 of the files a workload reads (a trace, or the statistics it is drawn from): a changed file
    is a changed workload (bakeoff.loadgen.cells.cell_spec_hash)."""
    t = load.workload.trace
    if load.workload.kind != "trace" or t is None:
        return {}
    p = t.path or t.generator.stats
    return {p: tr.file_sha256(_path(p))}


def requests(load: LoadCfg, n: int, concurrency: int) -> int:
    """The requests a cell of this workload sends when its load asks ``n`` (module docstring, per kind)."""
    w = load.workload
    if w.kind == "trace":
        return len(trace_rows(load))
    if w.kind == "multiturn":
        assert w.multiturn is not None
        return w.multiturn.turns * sess.session_count(w.multiturn.turns, n, concurrency)
    if w.kind == "shared_prefix":
        assert w.shared_prefix is not None
        g = w.shared_prefix.groups
        return g * max(w.shared_prefix.prompts_per_group, math.ceil(n / g))
    return n


def longest_request(load: LoadCfg) -> tuple[int, str]:
    """The most tokens (prompt + output) one request of this workload holds, and what it is, for the context check."""
    w, p, out = load.workload, max(load.prompt_len), load.output_len
    if w.kind == "trace":
        rows = trace_rows(load)
        worst = max(rows, key=lambda r: r.input_length + r.output_length)
        return worst.input_length + worst.output_length, "the trace's longest request"
    if w.kind == "multiturn":
        assert w.multiturn is not None
        return w.multiturn.turns * (p + out), f"turn {w.multiturn.turns} of a session"
    if w.kind == "shared_prefix":
        assert w.shared_prefix is not None
        return w.shared_prefix.system_prompt_len + p + out, "system prompt + question + output"
    return p + out, "prompt + output"


def build(load: LoadCfg, tokenizer: Any, cell_name: str, prompt_len: int, n: int, concurrency: int, seed: int,
          request_rate: float | None = None, closed: bool = False) -> CellWork:
    """The measured requests of one cell (``n``: from :func:`requests`); ``closed``: a concurrency probe."""
    t0 = time.perf_counter()
    w = load.workload
    if w.kind == "trace":
        work = _build_trace(load, tokenizer, request_rate, closed)
    elif w.kind == "multiturn":
        work = _build_multiturn(load, tokenizer, cell_name, prompt_len, n, seed, request_rate)
    elif w.kind == "shared_prefix":
        work = _build_shared_prefix(load, tokenizer, prompt_len, n, seed)
    else:
        raise BakeoffError(f"workload {w.kind!r} has no builder: fixed cells are built by bakeoff.loadgen.prompts")
    work.columns = {"workload": w.kind, **work.columns, "workload_build_s": time.perf_counter() - t0}
    if work.implied is not None:
        hit, total = work.implied
        work.columns["implied_prefix_hit_rate"] = hit / total if total else None
    return work


def _build_trace(load: LoadCfg, tokenizer: Any, request_rate: float | None, closed: bool) -> CellWork:
    cfg = load.workload.trace
    assert cfg is not None
    rows = trace_rows(load)
    vocab = vocab_ids(tokenizer)
    cache: dict[int, list[int]] = {}
    prompts = [tr.prompt_ids(r, cfg.block_tokens, vocab, BLOCK_SEED, cache) for r in rows]
    scale = cfg.time_scale
    if request_rate is not None:
        natural = tr.natural_rate(rows)
        if natural is None:
            raise BakeoffError("the trace's requests all arrive at once: it has no rate to scale to "
                               f"request_rate {request_rate:g}")
        scale = natural / request_rate
    source = cfg.path or f"drawn from {cfg.generator.stats} (seed {cfg.generator.seed})"
    how = "closed loop, in the trace's order" if closed else f"at its arrival times x {scale:.4g}"
    work = CellWork(prompts=prompts, prompt_lens=[r.input_length for r in rows],
                    output_lens=[r.output_length for r in rows],
                    offsets=None if closed else tr.offsets(rows, scale),
                    implied=tr.implied_hits(rows, cfg.block_tokens))
    work.columns = {"workload_detail": f"trace {source}: {len(rows)} requests, blocks of {cfg.block_tokens} tokens, "
                                       f"{how}",
                    "trace_time_scale": None if closed else scale}
    return work


def _build_multiturn(load: LoadCfg, tokenizer: Any, cell_name: str, prompt_len: int, n: int, seed: int,
                     request_rate: float | None) -> CellWork:
    cfg = load.workload.multiturn
    assert cfg is not None
    if request_rate is not None:
        raise BakeoffError("multiturn sessions run closed loop: no request_rate (a rate search does not apply)")
    if n % cfg.turns:
        raise BakeoffError(f"{n} requests are not whole sessions of {cfg.turns} turns")
    count = n // cfg.turns
    texts = make_prompts(tokenizer, prompt_len, n, seed=seed, tag=f"{cell_name}-s")
    think = sess.think_times(count, cfg.turns, cfg.think_time_s, cfg.think_distribution, seed)
    work = CellWork(prompts=texts, sessions=Sessions(cfg.turns, think))
    work.columns = {"workload_detail": f"multiturn: {count} sessions of {cfg.turns} turns, {prompt_len} new tokens "
                                       f"a turn, think time {cfg.think_distribution} mean {cfg.think_time_s:g} s"}
    return work


def _build_shared_prefix(load: LoadCfg, tokenizer: Any, prompt_len: int, n: int, seed: int) -> CellWork:
    cfg = load.workload.shared_prefix
    assert cfg is not None
    vocab = vocab_ids(tokenizer)
    system = [np.random.default_rng([SYSTEM_SEED, g]).choice(vocab, size=cfg.system_prompt_len).tolist()
              for g in range(cfg.groups)]
    rng = np.random.default_rng(seed)
    groups = rng.permutation(np.arange(n) % cfg.groups).tolist()
    prompts = [system[g] + rng.choice(vocab, size=prompt_len).tolist() for g in groups]
    counts = np.bincount(groups, minlength=cfg.groups)
    hit = int(sum(max(0, c - 1) for c in counts)) * cfg.system_prompt_len
    work = CellWork(prompts=prompts, prompt_lens=[cfg.system_prompt_len + prompt_len] * n,
                    implied=(hit, n * (cfg.system_prompt_len + prompt_len)))
    work.columns = {"workload_detail": f"shared_prefix: {cfg.groups} groups x {n // cfg.groups} prompts, system "
                                       f"prompt {cfg.system_prompt_len} tokens + question {prompt_len} tokens"}
    return work


def after(load: LoadCfg, work: CellWork, records: Sequence[RequestRecord]) -> dict[str, Any]:
    """The workload's columns once the cell ran: what needs the answers (multi-turn's per-turn TTFT, its implied
    hit rate)."""
    out = dict(work.columns)
    if work.sessions is not None:
        out.update(sess.turn_columns(records, work.sessions.turns))
        hit, total = sess.implied_hits(records, work.sessions.turns)
        out["implied_prefix_hit_rate"] = hit / total if total else None
    return out
