"""The server's own view of a load cell: its Prometheus metrics, polled while the cell runs.

Why: the client sees latency, not its cause. Whether requests queued in the
server (waiting / deferred) or the KV cache filled up explains a TTFT or a
throughput plateau, and only the server knows. Each engine exposes this under
its own names, so the names live here, per engine plugin:

* **vLLM** ``/metrics``: ``vllm:kv_cache_usage_perc`` (``vllm:gpu_cache_usage_perc``
  before v0.7), 0..1; ``vllm:num_requests_waiting``; ``vllm:num_requests_running``.
* **llama-server** ``/metrics`` (``--metrics``): ``llamacpp:requests_deferred``
  (requests waiting for a free slot) and ``llamacpp:requests_processing``. The
  pinned llama.cpp exports no KV-cache gauge there, so the KV occupancy is read
  from ``/slots``: the tokens cached by busy slots (their ``n_prompt_tokens``,
  which counts the generated tokens too) over the slots' total context.

Parsing uses ``prometheus_client.parser`` (the text exposition format). The
peaks are over the polls of the measured window; a poll that fails is counted,
not fatal, since a scrape must never break a measurement.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import requests

COLUMNS = ["kv_cache_peak_pct", "peak_waiting_requests", "peak_running_requests", "metrics_scrapes",
           "metrics_scrape_errors", "metrics_source"]


@dataclass(frozen=True)
class MetricNames:
    kv_usage: tuple[str, ...]  # gauges in 0..1, first found wins
    waiting: tuple[str, ...]
    running: tuple[str, ...]
    slots_kv: bool = False  # KV occupancy from llama-server's /slots


def gauges(text: str) -> dict[str, float]:
    """Every sample of a Prometheus text page, summed over label sets, by sample name."""
    from prometheus_client.parser import text_string_to_metric_families  # only where a cell scrapes

    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[s.name] = out.get(s.name, 0.0) + float(s.value)
    return out


def metrics_page(base_url: str, api_key: str | None = None) -> tuple[dict[str, float] | None, str]:
    """One read of a server's ``/metrics`` (:func:`gauges` of it), or None and why not: never raises."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    try:
        r = requests.get(base_url.rstrip("/") + "/metrics", headers=headers, timeout=5)
        r.raise_for_status()
        return gauges(r.text), ""
    except (requests.RequestException, ValueError) as e:
        return None, f"{type(e).__name__}: {e}"[:200]


def first(values: dict[str, float], names: Iterable[str]) -> float | None:
    for n in names:
        if n in values:
            return values[n]
    return None


def slots_kv_fraction(slots: list[dict[str, Any]]) -> float | None:
    """Tokens held by busy llama-server slots over the slots' total context, 0..1."""
    capacity = sum(int(s.get("n_ctx") or 0) for s in slots)
    if not capacity:
        return None
    # A slot's n_prompt_tokens is the size of its token cache, generated tokens included (it grows with
    # n_decoded), so it alone is what the slot holds in the KV cache.
    used = sum(int(s.get("n_prompt_tokens") or 0) for s in slots if s.get("is_processing"))
    return used / capacity


@dataclass
class MetricsScraper:
    """Polls one server's metrics every ``interval_s`` between ``start()`` and ``stop()``."""

    base_url: str
    names: MetricNames | None  # the engine's own (Engine.metric_names); None: it exposes none
    api_key: str | None = None
    label: str = ""  # who answers (the engine's name), for metrics_source
    interval_s: float = 0.5
    kv_peak: float | None = None
    waiting_peak: float | None = None
    running_peak: float | None = None
    scrapes: int = 0
    errors: int = 0
    last_error: str = ""
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def _get(self, path: str) -> requests.Response:
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else None
        r = requests.get(self.base_url.rstrip("/") + path, headers=headers, timeout=5)
        r.raise_for_status()
        return r

    @staticmethod
    def _max(old: float | None, new: float | None) -> float | None:
        return new if old is None else old if new is None else max(old, new)

    def poll(self) -> None:
        """One scrape; updates the peaks."""
        names = self.names
        if names is None:
            return
        try:
            values = gauges(self._get("/metrics").text)
            kv = first(values, names.kv_usage)
            if names.slots_kv:
                kv = slots_kv_fraction(self._get("/slots").json())
        except (requests.RequestException, ValueError) as e:
            self.errors += 1
            self.last_error = f"{type(e).__name__}: {e}"[:200]
            return
        self.scrapes += 1
        self.kv_peak = self._max(self.kv_peak, kv)
        self.waiting_peak = self._max(self.waiting_peak, first(values, names.waiting))
        self.running_peak = self._max(self.running_peak, first(values, names.running))

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.poll()

    def start(self) -> MetricsScraper:
        if self.names is not None:
            self.poll()
            self._thread = threading.Thread(target=self._loop, daemon=True, name="metrics-scrape")
            self._thread.start()
        return self

    def stop(self) -> MetricsScraper:
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=10)
            self.poll()
        return self

    def columns(self) -> dict[str, Any]:
        if self.names is None:
            return {}
        src = f"{self.label} /metrics".lstrip() + (" + /slots" if self.names.slots_kv else "")
        if self.errors and not self.scrapes:
            src += f" (unavailable: {self.last_error})"
        return {
            "kv_cache_peak_pct": None if self.kv_peak is None else 100.0 * self.kv_peak,
            "peak_waiting_requests": self.waiting_peak,
            "peak_running_requests": self.running_peak,
            "metrics_scrapes": self.scrapes,
            "metrics_scrape_errors": self.errors,
            "metrics_source": src,
        }
