"""What one load cell sends: its requests, how many at once or at what rate, and how the load starts.

Why one typed value: the same description travels from the caller (bakeoff.loadgen.runner.run_cell) through
each worker's plan (bakeoff.loadgen.workers.Plan) to the requests; as loose arguments it was two dozen
parameters repeated at every step, in positions that had to agree.

**The start of a closed loop** (``start``):

* ``burst`` -- every slot sends its first request at the cell's start ``t0``, as ``vllm bench serve`` does.
  A closed loop with fixed lengths then stays in waves: the first wave of ``c`` prompts reaches the server in
  one instant, and a server that admits a bounded number of prompt tokens a step (vLLM's
  ``max_num_batched_tokens``) gives them their first tokens in groups, the last group near the TTFT bound.
* ``ramp`` -- slot ``j`` of ``c`` (numbered across all workers) sends its first request at
  ``t0 + j x ramp_s / c``, so the slots' phases stay spread and concurrency rises to ``c`` over the ramp.
  ``ramp_s`` left out is the median end-to-end latency of the cell's warm-up requests: one request cycle, over
  which every slot has started once. The requests sent before the ramp ends are marked (``RequestRecord.ramp``)
  and left out of the cell's latency statistics (bakeoff.loadgen.metrics.summarize), which are then the
  steady span's. How many the ramp sends depends on the server: each slot's first request, and again for each
  slot whose request ended before the ramp did (under the ramp's lighter load a request is quicker than the
  cycle that timed the ramp; an H100 probe at c=64 sent 76 in its ramp, at c=2 three). So the loop counts the
  requests it sends after the ramp and stops at ``steady`` of them: a caller that wants ``n`` measured requests
  gives ``steady=n`` and ``n + ramp_extra()`` prompts, the extra ones a supply the ramp draws on as it needs.
  Where the ramp took all its supply, fewer than ``n`` were sent after it (bakeoff.loadgen.runner.short_of_steady):
  the caller runs the cell again with more (bakeoff.serving.measure).

An open loop (``request_rate`` or ``offsets``) has its own arrival schedule, and multi-turn sessions their own
think times: both ignore ``start`` (the cell records it as ``burst``, with no ramp).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

Start = Literal["burst", "ramp"]
STARTS: tuple[Start, ...] = ("burst", "ramp")


RAMP_SUPPLY = 3  # prompts a slot may send during a ramp: its first, and refills of requests quicker than the ramp


def ramp_extra(start: str, concurrency: int, *, open_loop: bool, sessions: bool, supply: int = RAMP_SUPPLY) -> int:
    """The prompts a ramped cell holds beyond its ``n`` measured ones, for the ramp to draw on (module docstring):
    ``supply`` per slot, ``RAMP_SUPPLY`` by default, where a ramp of one request cycle (the automatic length)
    sends one to about one and a half; those it does not use are never sent. 0 where the start is not a ramp,
    or the loop ignores it (open loops, sessions). Callers that build the prompts before the CellLoad ask here."""
    return supply * concurrency if start == "ramp" and not open_loop and not sessions else 0


@dataclass(frozen=True)
class Sessions:
    """Closed-loop multi-turn sessions (bakeoff.loadgen.sessions states the rules).

    The shared counter hands out sessions, not requests: a slot runs session ``s``'s ``turns`` turns in order,
    turn ``k`` being request ``s x turns + k``, whose prompt is the previous turn's prompt, its answer, and
    ``prompts[s x turns + k]`` (the turn's new text). Turn ``k + 1`` is due ``think_s[s x turns + k]`` seconds
    after turn ``k``'s answer ended.
    """

    turns: int
    think_s: list[float]


@dataclass(frozen=True)
class CellLoad:
    """One cell's requests and how they are sent (module docstring: the start).

    ``prompts`` are the measured requests by index (text, or token ids for token-level workloads);
    ``prompt_lens``/``output_lens`` give each request its own lengths where they differ (else ``prompt_len``
    and ``output_len``); ``offsets`` sends them open loop on that schedule (seconds from the start),
    ``request_rate`` on a Poisson schedule drawn from ``seed``; neither: closed loop at ``concurrency``.
    ``sessions`` makes the closed loop multi-turn. ``warmup_prompts`` go before the measured window,
    ``warmup_concurrency`` at once (at least ``concurrency``). ``steady``: a ramped loop's requests after its
    ramp, the rest of ``prompts`` the ramp's supply (left out: all but ``ramp_extra()`` of them; ``steady_cap``).
    """

    prompts: list[Any]
    prompt_len: int
    output_len: int
    concurrency: int
    request_rate: float | None = None
    offsets: list[float] | None = None
    prompt_lens: list[int] | None = None
    output_lens: list[int] | None = None
    sessions: Sessions | None = None
    warmup_prompts: list[str] | None = None
    warmup_concurrency: int | None = None
    temperature: float = 0.0
    timeout_s: float = 600.0
    seed: int = 0
    start: Start = "burst"
    ramp_s: float | None = None
    steady: int | None = None

    def __post_init__(self) -> None:
        if self.start not in STARTS:
            raise ValueError(f"start must be one of {STARTS}, got {self.start!r}")
        if self.ramp_s is not None and not self.ramp_s >= 0:
            raise ValueError(f"ramp_s must be >= 0, got {self.ramp_s}")
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")
        if self.ramped and self.ramp_s is None and not self.warmup_prompts:
            raise ValueError("a ramp of automatic length is the warm-up's median latency: give warm-up prompts "
                             "or ramp_s")
        if self.steady is not None and not 1 <= self.steady <= len(self.prompts):
            raise ValueError(f"steady must be 1 .. {len(self.prompts)} (the prompts), got {self.steady}")

    @property
    def open_loop(self) -> bool:
        return self.request_rate is not None or self.offsets is not None

    @property
    def ramped(self) -> bool:
        """Whether the start is a ramp: asked for, and a closed loop of single requests (module docstring)."""
        return self.start == "ramp" and not self.open_loop and self.sessions is None

    @property
    def requests(self) -> int:
        """What the cell hands out: requests, or sessions of ``turns`` requests each."""
        return len(self.prompts) // self.sessions.turns if self.sessions is not None else len(self.prompts)

    def ramp_extra(self) -> int:
        """This cell's :func:`ramp_extra`."""
        return ramp_extra(self.start, self.concurrency, open_loop=self.open_loop, sessions=self.sessions is not None)

    @property
    def steady_cap(self) -> int | None:
        """The requests a ramped loop sends after its ramp before it stops (None: no cap, every prompt is sent)."""
        if not self.ramped:
            return None
        return self.steady if self.steady is not None else max(1, len(self.prompts) - self.ramp_extra())
