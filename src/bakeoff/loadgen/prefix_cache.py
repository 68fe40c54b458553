"""The server's prefix cache over a cell's measured window: the prompt tokens it reused, against those it looked up.

Why the server's own counters: whether a prefix cache hit is the server's business (its block size, its
eviction, which slot a request landed on), and a client cannot see it. Each engine plugin names its
counters (``Engine.prefix_cache_counters``), read from its Prometheus page at the window's start and end:

* **vLLM** ``vllm:prefix_cache_hits`` and ``vllm:prefix_cache_queries`` (counters, in tokens): prompt tokens
  found in the cache, and prompt tokens looked up. With prefix caching off it looks nothing up: both stay 0.
* **llama-server** ``llamacpp:prompt_tokens_cached_total`` (prompt tokens reused from a slot's cache or the
  host prompt cache) and ``llamacpp:prompt_tokens_total`` (prompt tokens computed, excluding cached ones):
  what it looked up is their sum.

The cell's **hit rate** is the hits over the prompt tokens the cell sent (``total_input_tokens``), not over
the server's queries: a server that looks nothing up then reports 0, and the rate reads against the
workload's implied hit rate (bakeoff.loadgen.workload), which has the same denominator.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bakeoff.loadgen.scrape import gauges, metrics_page

COLUMNS = ["prefix_cache_hits", "prefix_cache_queries", "prefix_cache_hit_rate", "prefix_cache_source"]


@dataclass(frozen=True)
class PrefixCacheCounters:
    """An engine's Prometheus sample names (with ``_total``) for its prefix cache, in prompt tokens."""

    hits: str
    queries: str | None = None  # looked up (vLLM)
    computed: str | None = None  # computed, not reused (llama.cpp): looked up = hits + computed

    def read(self, text: str) -> tuple[float, float] | None:
        """(hits, queries) from one ``/metrics`` page; None where the page lacks the counters."""
        return self.read_values(gauges(text))

    def read_values(self, values: dict[str, float]) -> tuple[float, float] | None:
        """(hits, queries) from a page's samples (:func:`bakeoff.loadgen.scrape.gauges`)."""
        if self.hits not in values:
            return None
        hits = values[self.hits]
        if self.queries is not None:
            return (hits, values[self.queries]) if self.queries in values else None
        if self.computed is not None and self.computed in values:
            return hits, hits + values[self.computed]
        return None


@dataclass
class PrefixCacheWindow:
    """The counters read at the window's start and end; a read that fails is said, never fatal."""

    base_url: str
    counters: PrefixCacheCounters | None
    api_key: str | None = None
    label: str = ""
    start: tuple[float, float] | None = None
    end: tuple[float, float] | None = None
    error: str = ""

    def _read(self) -> tuple[float, float] | None:
        assert self.counters is not None
        page, err = metrics_page(self.base_url, self.api_key)
        self.error = err or self.error  # a failed read's reason outlives a later read that worked
        if page is None:
            return None
        got = self.counters.read_values(page)
        if got is None:
            self.error = f"no {self.counters.hits} on /metrics"
        return got

    def open(self) -> None:
        if self.counters is not None:
            self.start = self._read()

    def close(self) -> None:
        if self.counters is not None:
            self.end = self._read()

    def columns(self, prompt_tokens: int | None) -> dict[str, Any]:
        """The cell's prefix-cache columns (empty for an engine that names no counters)."""
        if self.counters is None:
            return {}
        if self.start is None or self.end is None:
            return {"prefix_cache_hits": None, "prefix_cache_queries": None, "prefix_cache_hit_rate": None,
                    "prefix_cache_source": f"{self.label} /metrics (unavailable: {self.error})".lstrip()}
        hits, queries = self.end[0] - self.start[0], self.end[1] - self.start[1]
        return {"prefix_cache_hits": int(hits), "prefix_cache_queries": int(queries),
                "prefix_cache_hit_rate": hits / prompt_tokens if prompt_tokens else None,
                "prefix_cache_source": f"{self.label} /metrics".lstrip()}
