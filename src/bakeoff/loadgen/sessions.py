"""Multi-turn chat sessions: how a session's prompts grow, its think times, and TTFT by turn.

The rules, stated once:

* **Growth.** A session has ``turns`` turns. Turn 0's prompt is its new text; turn ``k + 1``'s prompt is turn
  ``k``'s prompt, then turn ``k``'s answer exactly as streamed back, then turn ``k + 1``'s new text. So every
  turn's prompt grows by exactly the previous turn (prompt and answer) plus the new text, and a server that
  caches prefixes can reuse all of the previous turn. The new texts are exact-length prompts of the cell's
  ``prompt_len`` (bakeoff.loadgen.prompts), each with its own marker, so no two sessions share a prefix.
* **Think time.** Between a turn's answer and the next turn the user thinks: a pause drawn from an
  exponential distribution with mean ``think_time_s`` (memoryless, as the classic closed-loop user model
  has it), or a constant ``think_time_s``; seeded per cell, so a re-run draws the same pauses.
* **Closed loop over sessions.** ``c`` sessions run at once: a slot runs one session's turns in order, then
  takes the next session (bakeoff.loadgen.workers). A turn that fails ends its session.
* **Per-turn TTFT.** First turns (whole prompt new) against later turns (the history is a prefix the server
  may have cached): median and p99 of each.
* **The client's cost** of building prompts is measured where it is paid, in the workers (the string
  concatenation of each turn, ``client_prompt_build_s``), beside the new texts made before the cell
  (``workload_build_s``).
* **Implied hit rate.** A perfect cache reuses, for each later turn, the previous turn's prompt and answer:
  their tokens as the server counted them (``prompt_tokens`` + ``output_tokens``), at most the turn's own prompt.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from bakeoff.loadgen.metrics import RequestRecord


def session_count(turns: int, requests: int, concurrency: int) -> int:
    """Sessions of a cell: enough for ``requests`` requests, and at least one for each of ``concurrency`` slots."""
    return max(concurrency, -(-requests // turns))


def think_times(sessions: int, turns: int, mean_s: float, distribution: str, seed: int) -> list[float]:
    """The pause after each turn, by request index (``session x turns + turn``); the last turn's is unused."""
    if distribution == "constant":
        return [float(mean_s)] * (sessions * turns)
    if distribution == "exponential":
        return np.random.default_rng(seed).exponential(mean_s, size=sessions * turns).tolist() if mean_s else \
            [0.0] * (sessions * turns)
    raise ValueError(f"unknown think-time distribution {distribution!r}")


def turn_of(index: int, turns: int) -> int:
    return index % turns


def grows_by(prompts: Sequence[str], answers: Sequence[str], new_texts: Sequence[str]) -> bool:
    """Whether a session's prompts follow the growth rule (module docstring): a check, for tests and replays."""
    return all(prompts[k + 1] == prompts[k] + answers[k] + new_texts[k + 1] for k in range(len(prompts) - 1)) \
        and bool(prompts) and prompts[0] == new_texts[0]


def turn_columns(records: Sequence[RequestRecord], turns: int) -> dict[str, Any]:
    """Median and p99 TTFT (ms) of first turns and of later turns."""
    out: dict[str, Any] = {}
    for name, pick in (("first_turn", lambda k: k == 0), ("later_turns", lambda k: k > 0)):
        ttft = [1000.0 * r.ttft for r in records if r.success and pick(turn_of(r.index, turns))]
        out[f"median_ttft_{name}_ms"] = float(np.median(ttft)) if ttft else None
        out[f"p99_ttft_{name}_ms"] = float(np.percentile(ttft, 99)) if ttft else None
    return out


def implied_hits(records: Sequence[RequestRecord], turns: int) -> tuple[int, int]:
    """(prompt tokens a perfect cache reuses, all prompt tokens) of a cell's sessions (module docstring)."""
    by_index = {r.index: r for r in records if r.success}
    hit = total = 0
    for i, r in by_index.items():
        own = r.prompt_tokens if r.prompt_tokens is not None else r.prompt_len
        total += own
        prev = by_index.get(i - 1) if turn_of(i, turns) > 0 else None
        if prev is not None:
            prev_prompt = prev.prompt_tokens if prev.prompt_tokens is not None else prev.prompt_len
            hit += min(own, prev_prompt + prev.output_tokens)
    return hit, total
