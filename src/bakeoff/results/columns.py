"""The data dictionary: every column of ``results/summary.csv``, ``results/capacity.csv`` and the answer table
(``results/report/answer.csv``), defined once.

Why a registry in code: the columns are written by a dozen modules, each adding its own, and a reader of
the CSV needs one place that says what a column means, in which unit, and which module to read for the
details. ``docs/columns.md`` is generated from here (``bakeoff columns --write``), and tests/test_columns.py
fails when a summary written by the real code has a column this registry lacks, or lists one it no longer
writes. Names are literal here, never built from the writers' own constants, so a column added in code
stays unregistered until someone defines it.

Columns come in families; each family states the naming convention its columns follow, so a name can be
read without the table: ``_share`` is a fraction (0-1), ``_pct`` a percentage (0-100), ``_ci_lo`` /
``_ci_hi`` are the two bounds of an interval, ``_ci95`` is a half-width. vLLM's own names
(``output_throughput``, ``p99_tpot_ms``) stay as ``vllm bench serve`` prints them, units and all.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from bakeoff.layout import ANSWER_TABLE, CAPACITY_TABLE
from bakeoff.layout import SUMMARY as SUMMARY_PATH

# Raised whenever a column is renamed or removed, or changes its unit or meaning; a new column leaves it.
# Every row of both tables carries it (``schema_version``), so a reader can tell which dictionary applies.
SCHEMA_VERSION = 1


@dataclass(frozen=True)
class Column:
    name: str
    unit: str  # "" where the value is a name, a flag or free text
    definition: str
    # The module that computes the value (read it for the details); several, comma-separated, where each
    # computes it for its own rows. tests/test_column_writers.py reads each one's source for the write.
    writer: str


@dataclass(frozen=True)
class Family:
    name: str
    convention: str  # how the family's names read: the rule a reader can apply without the table
    columns: tuple[Column, ...]


@dataclass(frozen=True)
class Table:
    name: str
    path: str  # where the pipeline writes it (bakeoff.layout)
    about: str
    families: tuple[Family, ...]

    def columns(self) -> list[Column]:
        return [c for f in self.families for c in f.columns]

    def names(self) -> list[str]:
        return [c.name for c in self.columns()]

    def get(self, name: str) -> Column | None:
        return next((c for c in self.columns() if c.name == name), None)


def _family(name: str, convention: str, writer: str, rows: Iterable[tuple[str, ...]]) -> Family:
    """A family whose columns are (name, unit, definition) rows written by ``writer``, or (..., writer) rows
    written by another."""
    return Family(name, convention, tuple(Column(*r[:3], r[3] if len(r) > 3 else writer) for r in rows))


def _mixed(name: str, convention: str, rows: Iterable[tuple[str, str, str, str]]) -> Family:
    """A family whose columns are (name, unit, definition, writer) rows."""
    return Family(name, convention, tuple(Column(*r) for r in rows))


# Units, spelled one way everywhere.
TOK_S, REQ_S, MS, S, BYTES, COUNT, TOKENS = "tok/s", "req/s", "ms", "s", "bytes", "count", "tokens"
FRACTION, PCT, RATIO = "fraction (0-1)", "% (0-100)", "ratio"

METRICS = "bakeoff.loadgen.metrics"
CELLS = "bakeoff.loadgen.cells"
MEASURE = "bakeoff.serving.measure"
LATENCY = "bakeoff.loadgen.server_latency"
CORES = "bakeoff.loadgen.core_watch"
DEPENDENCE = "bakeoff.loadgen.dependence"
SERVE = "bakeoff.serving.variant"
SUMMARY_STAGE = "bakeoff.stages.summary"
DERIVED = "bakeoff.results.derived"

IDENTITY = _mixed(
    "identity",
    "What a row measured and where: keys, not measurements. Together with `probe_of` and `slo` they name a "
    "row's group across repeats (`bakeoff.results.spread.GROUP_KEY`). Lengths count tokens of the model's "
    "own tokenizer.",
    [
        ("schema_version", "", f"Version of this dictionary the row follows (now {SCHEMA_VERSION}); raised when "
         "a column is renamed or removed or changes unit or meaning.", SUMMARY_STAGE),
        ("experiment", "", "Experiment (sweep point) name: `conf/experiment/<name>.yaml`, with a suffix per "
         "swept value (`smoke.parallel4`).", SERVE),
        ("model", "", "Model name (`conf/model/`).", SERVE),
        ("engine", "", "Engine config name (`engines.<name>`; two configs of one plugin stay two engines).", SERVE),
        ("engine_version", "", "The engine's version as it reports it (vLLM's package or image tag, "
         "`llama.cpp@<commit>`).", "bakeoff.engines.vllm, bakeoff.engines.llamacpp"),
        ("format", "", "Weight format (`formats.<name>`: fp16, fp8, q4_k_m ...).", SERVE),
        ("hardware", "", "Hardware config name (`conf/hardware/`; `hardware=auto` picks or composes it from the "
         "node's GPUs). The GPUs themselves: `gpu_name`, `gpu_count`, `gpu_memory_bytes`.", SERVE),
        ("concurrency", COUNT, "Requests kept in flight (closed loop); the cap on in-flight requests of an "
         "open-loop cell.", CELLS),
        ("prompt_len", TOKENS, "Prompt length of every request of the cell.", CELLS),
        ("output_len", TOKENS, "Requested output length (`max_tokens`, with `ignore_eos`).", SERVE),
        ("repeat", COUNT, "Repeat index, from 0 (`load.repeats`).", CELLS),
        ("block", COUNT, "Block the cell ran in: each block runs every variant once, on its own server "
         "(`bakeoff.loadgen.blocks`); equals `repeat`.", MEASURE),
        ("order", COUNT, "Position of this variant's job in its block's seeded order.", MEASURE),
        ("node_id", "", "The machine: `gpu:<uuid>[,...]` of the server's GPUs, else "
         "`host:<hostname>/<machine-id prefix>`; rows of different nodes are never paired.", MEASURE),
        ("request_rate", REQ_S, "Open-loop (Poisson) arrival rate, vLLM's `--request-rate`; empty for a "
         "closed loop.", SERVE),
        ("cell", "", "The cell's file stem under `results/raw/...` (`c8-p128`, a probe's own name).", CELLS),
        ("config_hash", "", "Hash (16 hex digits) of the experiment's resolved config when the row's variant "
         "was served: rows with equal hashes ran the same config, and the summary refuses an experiment whose "
         "rows carry two.", "bakeoff.stages.serve_load"),
        ("sweep", "", "The swept values of this sweep point (`--config sweep=...`); empty without a sweep.",
         DERIVED),
        ("overrides", "", "Hydra overrides of this point against the experiment's defaults.", DERIVED),
        ("engine_settings", "JSON", "The engine's `settings` as configured (one JSON object); in capacity mode "
         "llama.cpp's `parallel` and `ctx_size` as sized for the search (`parallel_set_by`).", SERVE),
        ("parallel_set_by", "", "Capacity mode, llama.cpp: what set its slot count: `experiment` (its setting "
         "already reached the search's maximum), `search maximum`, or `KV memory` (the GPU holds no more slots).",
         SERVE),
        ("synthetic", "bool", "The model has random weights (`model.source: synthetic`): speed is "
         "meaningful, quality is not.", DERIVED),
    ],
)

OUTCOME = _mixed(
    "outcome",
    "Whether the cell produced numbers. `status` is one of `ok`, `degraded` (some requests failed), "
    "`failed` and `unsupported` (the engine refused the format here); `reason` and `load_note` are free text. "
    "Counts are requests.",
    [
        ("requests", COUNT, "Measured requests sent (warm-up excluded).", CELLS),
        ("completed", COUNT, "Measured requests that finished successfully (vLLM's `completed`).", METRICS),
        ("failed", COUNT, "Measured requests that failed; excluded from every latency and throughput.", METRICS),
        ("status", "", "`ok`, `degraded`, `failed` or `unsupported`.", MEASURE),
        ("reason", "", "Why the status is not `ok` (the error or refusal, shortened).", MEASURE),
        ("warmup_requests", COUNT, "Uncounted warm-up requests sent at the cell's concurrency before it.", MEASURE),
        ("load_note", "", "What the load did beyond the defaults (warm-up, request counts, waves) and what "
         "the server or the client noticed.", MEASURE),
        ("predicted_status", "", "What the doctor's hardware record predicts for this variant "
         "(`supported` / `unsupported`); empty without a record.", DERIVED),
        ("predicted_reason", "", "Why the doctor predicts that status.", DERIVED),
    ],
)

VLLM = _family(
    "vllm",
    "Names and definitions of `vllm bench serve`, kept as that tool prints them so numbers compare with it "
    "(their units are fixed by the name, not always in it): `output_throughput` and `total_token_throughput` "
    "are tokens/s, `request_throughput` and `request_goodput` requests/s, and `<stat>_<latency>_ms` is a "
    "statistic (`mean`, `median`, `p99`: numpy's linear percentiles) of a latency in milliseconds over the "
    "cell's successful requests. TTFT: send to first token chunk; TPOT: (E2EL - TTFT) / (output tokens - 1) "
    "per request; ITL: gaps between token chunks, pooled over requests; E2EL: send to last token chunk.",
    METRICS,
    [
        ("output_throughput", TOK_S, "Output tokens of the successful requests over `duration_s`."),
        ("request_throughput", REQ_S, "Successful requests over `duration_s`."),
        ("total_token_throughput", TOK_S, "Prompt plus output tokens of the successful requests over "
         "`duration_s`."),
        ("duration_s", S, "First dispatch to last completion of the measured requests (warm-up excluded)."),
        ("median_ttft_ms", MS, "Median time to first token."),
        ("p99_ttft_ms", MS, "99th percentile of time to first token."),
        ("median_tpot_ms", MS, "Median time per output token (first token excluded)."),
        ("p99_tpot_ms", MS, "99th percentile of time per output token."),
        ("median_itl_ms", MS, "Median inter-token latency (gaps between token chunks, pooled)."),
        ("p99_itl_ms", MS, "99th percentile of inter-token latency."),
        ("median_e2el_ms", MS, "Median end-to-end latency of a request."),
        ("p99_e2el_ms", MS, "99th percentile of end-to-end latency."),
        ("mean_ttft_ms", MS, "Mean time to first token."),
        ("mean_tpot_ms", MS, "Mean time per output token."),
        ("request_goodput", REQ_S, "Successful requests a second that met every SLO of `load.slo_ms` "
         "(vLLM's `--goodput`)."),
    ],
)

STEADY = _family(
    "steady state",
    "bakeoff's own view of a closed loop: the steady span runs from the moment `concurrency` requests are "
    "first in flight to the moment fewer remain. `steady_output_throughput` is named after vLLM's "
    "`output_throughput` and in its unit (tokens/s); `_s` is seconds; `_share` is a fraction (0-1). Empty "
    "with fewer successful requests than the concurrency, and on open-loop cells.",
    METRICS,
    [
        ("steady_output_throughput", TOK_S, "Output tokens streamed inside the steady span, over its length."),
        ("ramp_s", S, "First dispatch to the start of the steady span."),
        ("tail_s", S, "End of the steady span to the last completion, while fewer than `concurrency` run."),
        ("tail_share", FRACTION, "`tail_s` over `duration_s`."),
    ],
)


START = _family(
    "start",
    "How a closed loop's users started (bakeoff.loadgen.cellload): `burst`, every slot's first request at the "
    "cell's start, as `vllm bench serve` sends; `ramp`, slot j of c at j x ramp / c, and then every latency "
    "statistic (the percentiles, their intervals, the shares over the SLO's bounds, the server's medians) is the "
    "steady span's: the requests sent after the ramp. Counts and throughput stay the whole cell's. Open loops and "
    "sessions are `burst`.",
    METRICS,
    [
        ("load_start", "", "`burst` or `ramp` (`load.start` for fixed cells, `load.capacity.start` for concurrency "
         "probes)."),
        ("load_ramp_s", S, "The ramp's length: `load.ramp_s`, or where that is null the median end-to-end latency "
         "of the cell's warm-up requests; 0 for a burst."),
        ("steady_requests", COUNT, "Completed requests the latency statistics read: after the ramp (every "
         "completed request of a burst)."),
        ("p99_ttft_ms_whole_cell", MS, "A ramped cell's p99 TTFT over every completed request, the ramp's "
         "included; empty for a burst, whose `p99_ttft_ms` already is the whole cell's."),
        ("mean_ttft_ms_whole_cell", MS, "A ramped cell's mean TTFT over every completed request, the ramp's "
         "included, the peer of the server's `server_mean_ttft_ms` over the same window; empty for a burst."),
    ],
)


def _interval_rows() -> list[tuple[str, str, str]]:
    latencies = {"ttft": "time to first token", "tpot": "time per output token", "itl": "inter-token latency"}
    ends = {"lo": "Lower", "hi": "Upper"}
    return [(f"{stat}_{m}_ms_ci_{end}", MS, f"{ends[end]} bound of the 95 % interval of the {stat} "
             f"{what} (`{stat}_{m}_ms`), from the cell's own requests.")
            for m, what in latencies.items() for stat in ("median", "p99") for end in ("lo", "hi")]


INTERVALS = _family(
    "per-cell intervals",
    "`<statistic>_ci_lo` and `<statistic>_ci_hi` are the two bounds, in the statistic's unit (ms), of a 95 % "
    "interval of that statistic from one cell's own requests (`bakeoff.loadgen.metrics` names the method). "
    "They are bounds, not a half-width (compare `_ci95` below). Empty where the cell's requests cannot bound "
    "the statistic (too few requests for a p99 has no upper bound). They assume the cell's requests are "
    "independent: `effective_requests` (bakeoff.loadgen.dependence) says how many independent ones they are "
    "worth, and where that is far below `steady_requests` the interval is too narrow.",
    METRICS,
    _interval_rows(),
)

MEMORY = _mixed(
    "memory and weights",
    "Sizes are bytes; `peak_` is the highest value seen while the cell ran (warm-up included). "
    "`bits_per_weight` is weight bits over parameters.",
    [
        ("peak_rss_bytes", BYTES, "Peak resident memory of the server's process tree (or its container).",
         MEASURE),
        ("memory_source", "", "Where `peak_rss_bytes` was read (`process tree RSS`, the container's cgroup).",
         MEASURE),
        ("peak_gpu_bytes", BYTES, "Peak GPU memory used on the server's own GPUs (empty on CPU).",
         "bakeoff.hardware.telemetry"),
        ("weight_bytes", BYTES, "Weight bytes the engine reads per decode step (vLLM in float32 reads 4 a "
         "weight; `Engine.served_weight_bytes`).", SERVE),
        ("bits_per_weight", "bits", "Bits a weight of the served artifact (its manifest).", SERVE),
        ("n_params", COUNT, "Parameters of the model (its manifest).", SERVE),
        ("slot_ctx", TOKENS, "Context of one llama-server slot as the server set it (llama.cpp only).",
         "bakeoff.engines.llamacpp"),
    ],
)

SERVER = _mixed(
    "server",
    "The server's own view. `server_<stat>_<metric>_ms` reads like vLLM's latency names, measured by the "
    "server; `peak` (`peak_waiting_requests`, `kv_cache_peak_pct`: that name stays as the committed records "
    "under runs/ have it) is a maximum over the measured window's scrapes of `/metrics`; `_pct` is a "
    "percentage (0-100). Empty where the engine does not report it.",
    [
        ("startup_s", S, "Launch to ready of the server the cell ran on.", CELLS),
        ("server_start", COUNT, "Which start of the variant's server ran the cell (1 = the first), counted within "
         "one job's process: a resumed job counts from 1 again.", MEASURE),
        ("server_start_id", "", "The server start that ran the cell: its UTC start time and the server's pid "
         "(`20261206T201530.123456Z-4242`), unique across processes, so a block's cells show which starts made "
         "them.", "bakeoff.engines.session"),
        ("server_median_tpot_ms", MS, "Median over requests of the server's own time per generated token "
         "(llama-server's `timings.predicted_per_token_ms`).", METRICS),
        ("server_median_prompt_ms", MS, "Median over requests of the server's own prompt-processing time.",
         METRICS),
        ("kv_cache_peak_pct", PCT, "Peak KV-cache occupancy (vLLM's `kv_cache_usage_perc`; llama-server's "
         "busy slots' tokens over their context).", "bakeoff.loadgen.scrape"),
        ("peak_waiting_requests", COUNT, "Peak requests waiting in the server's queue.", "bakeoff.loadgen.scrape"),
        ("peak_running_requests", COUNT, "Peak requests the server ran at once.", "bakeoff.loadgen.scrape"),
        ("metrics_scrapes", COUNT, "Successful scrapes of the server's metrics during the window.",
         "bakeoff.loadgen.scrape"),
        ("metrics_scrape_errors", COUNT, "Failed scrapes (never fatal).", "bakeoff.loadgen.scrape"),
        ("metrics_source", "", "Which endpoints were scraped, and why not where unavailable.",
         "bakeoff.loadgen.scrape"),
        ("server_mean_ttft_ms", MS, "Mean TTFT as the server timed it (vLLM's `time_to_first_token_seconds` "
         "histogram over the measured window, a ramp included): beside the client's, where the time went.",
         LATENCY),
        ("server_mean_itl_ms", MS, "Mean inter-token latency as the server timed it (vLLM's "
         "`inter_token_latency_seconds`), over the same window.", LATENCY),
        ("server_mean_queue_ms", MS, "Mean time from a request's arrival to its first scheduling (vLLM's "
         "`request_queue_time_seconds`), over the same window.", LATENCY),
        ("server_latency_requests", COUNT, "First tokens the server's histogram counted in the window.", LATENCY),
        ("server_latency_source", "", "Where the histograms were read, or why they could not be.", LATENCY),
        ("server_cpu_cores", "cores", "CPU time of the server's process tree over the measured window's wall time, "
         "in cores (the kernel's per-thread accounting, sampled every 0.5 s).", CORES),
        ("server_busiest_thread_cpu_share", FRACTION, "The server's busiest thread's CPU time over the window, as a "
         "share of one core: near 1, that one thread was the limit (vLLM's API server streams every token from "
         "one Python thread).", CORES),
        ("server_busiest_thread", "", "That thread, as `process[pid]/thread`.", CORES),
        ("core_watch_source", "", "Whose threads were watched, over how many intervals, or why not (a server in a "
         "container or in the measuring process).", CORES),
    ],
)

CLIENT = _mixed(
    "client",
    "The load generator's verdict on itself: was the client the bottleneck? `client_` columns describe the "
    "client, not the server; `_share` is a fraction of one core (0-1).",
    [
        ("client_workers", COUNT, "Worker processes that sent the cell's requests (`load.client.workers`; "
         "auto: bakeoff.loadgen.sizing).", "bakeoff.loadgen.health"),
        ("client_cpu_s", S, "Client CPU seconds over the measured window, all workers together.",
         "bakeoff.loadgen.health"),
        ("client_cpu_s_per_1k_tokens", S, "Client CPU seconds per 1000 streamed output tokens.",
         "bakeoff.loadgen.runner"),
        ("client_loop_lag_p99_ms", MS, "99th percentile of the event-loop lag of the worst worker.",
         "bakeoff.loadgen.health"),
        ("client_schedule_delay_p50_ms", MS, "Median of how late requests were sent against their intended time "
         "(open loop: the schedule; closed loop: the slot freeing), worst worker.", "bakeoff.loadgen.health"),
        ("client_schedule_delay_p99_ms", MS, "99th percentile of that delay, worst worker.",
         "bakeoff.loadgen.health"),
        ("client_cpu_share", FRACTION, "CPU time over the measured window's wall time of the busiest worker "
         "(1 = the one core its event loop can use).", "bakeoff.loadgen.health"),
        ("client_retried", COUNT, "Requests sent again on a fresh connection: the server had closed the "
         "kept-alive one before answering.", "bakeoff.loadgen.health"),
        ("client_slot_time_lost_share", FRACTION, "A closed loop's slot-time the client lost, worst worker: the "
         "sum of its requests' schedule delays over (slots x the measured window); above 0.02 the client held "
         "load back (bakeoff.loadgen.health). Empty for an open loop.", "bakeoff.loadgen.health"),
        ("client_server_core_overlap_share", FRACTION, "Share of the measured window's 0.5 s intervals in which a "
         "busy client thread (this process's or a worker's) ran on the physical core of a busy server thread, which "
         "slows the server's delivery without moving its own histograms.", CORES),
        ("client_saturated", "bool", "A worker's lag, schedule delay or CPU share passed its threshold "
         "(bakeoff.loadgen.health): the latencies are partly the client's.", "bakeoff.loadgen.health"),
        ("client_saturated_reason", "", "Which worker passed which threshold, by how much.",
         "bakeoff.loadgen.health"),
        ("client_worker_health", "JSON", "Each worker's health: requests, CPU seconds and share, lag p99, schedule "
         "delay p50 and p99, retries.", "bakeoff.loadgen.health"),
        ("client_rerun", "bool", "The client saturated, and the cell was run once more, on fresh prompts, with "
         "twice the workers; these are that run's numbers (`load_note` has the first run's reason).", MEASURE),
        ("client_shares_cores", "bool", "The client runs on the cores that serve (a CPU backend's server): a "
         "saturated client there is named, never re-run with more workers, which would take cores from the "
         "server (`load_note` says so).", MEASURE),
        ("stopped_early", "bool", "The client stopped sending: a capacity probe had certainly failed.",
         "bakeoff.loadgen.runner"),
    ],
)

WORKLOAD = _mixed(
    "workload",
    "What the cell sent (`load.workload`: fixed, trace, multiturn, shared_prefix; docs/methodology.md has a "
    "section for each) and what the server's prefix cache made of it. `prefix_cache_` columns are the server's "
    "counters over the measured window, in prompt tokens; `_hit_rate` columns are over the prompt tokens the "
    "cell sent; `_first_turn` / `_later_turns` split a multi-turn cell's requests by turn.",
    [
        ("workload", "", "The workload kind (`fixed`: distinct prompts of `prompt_len` tokens).", MEASURE),
        ("workload_detail", "", "What the cell replayed: the trace and its source, the sessions and their turns, or "
         "the groups and their system prompt; empty for `fixed`.", "bakeoff.loadgen.workload"),
        ("workload_build_s", S, "Client seconds spent making the cell's requests before it started (off the "
         "clock).", "bakeoff.loadgen.workload"),
        ("trace_time_scale", RATIO, "The factor the trace's arrival times were multiplied by (a rate probe's comes "
         "from its rate); empty where the trace was sent closed loop.", "bakeoff.loadgen.workload"),
        ("implied_prefix_hit_rate", FRACTION, "Prompt tokens a prefix cache without limit would reuse, over the "
         "prompt tokens sent: from the trace's `hash_ids`, the groups' system prompts, or each turn's history.",
         "bakeoff.loadgen.workload"),
        ("median_ttft_first_turn_ms", MS, "Median TTFT of first turns (multiturn).", "bakeoff.loadgen.sessions"),
        ("median_ttft_later_turns_ms", MS, "Median TTFT of the later turns, whose history the server may have "
         "cached (multiturn).", "bakeoff.loadgen.sessions"),
        ("p99_ttft_first_turn_ms", MS, "99th percentile TTFT of first turns (multiturn).",
         "bakeoff.loadgen.sessions"),
        ("p99_ttft_later_turns_ms", MS, "99th percentile TTFT of the later turns (multiturn).",
         "bakeoff.loadgen.sessions"),
        ("client_prompt_build_s", S, "Client seconds the workers spent assembling each turn's prompt (the history "
         "plus the new text) during the cell (multiturn).", "bakeoff.loadgen.runner"),
        ("prefix_caching", "", "What the engine's `prefix_caching` setting asked: `on`, `off`, or `engine "
         "default` (vLLM: on; llama.cpp: its slot's own prompt reuse, no host cache as conf/engine sets it).",
         "bakeoff.serving.measure"),
        ("prefix_cache_hits", TOKENS, "Prompt tokens the server reused from its prefix cache over the measured "
         "window (vLLM `prefix_cache_hits`, llama.cpp `prompt_tokens_cached`).", "bakeoff.loadgen.prefix_cache"),
        ("prefix_cache_queries", TOKENS, "Prompt tokens the server looked up in it (vLLM `prefix_cache_queries`, 0 "
         "with caching off; llama.cpp cached + computed).", "bakeoff.loadgen.prefix_cache"),
        ("prefix_cache_hit_rate", FRACTION, "`prefix_cache_hits` over the prompt tokens the cell sent "
         "(`total_input_tokens`): beside `implied_prefix_hit_rate`.", "bakeoff.loadgen.prefix_cache"),
        ("prefix_cache_source", "", "Where the counters were read, or why they could not be.",
         "bakeoff.loadgen.prefix_cache"),
    ],
)

TELEMETRY = _family(
    "GPU telemetry",
    "The server's own GPUs (its `CUDA_VISIBLE_DEVICES`, by UUID) over the measured window, warm-up "
    "excluded; empty on CPU. Units are in the names: `_pct` (0-100), `_w`, `_j`, `_s`, `_mhz`, `_c` "
    "(degrees Celsius); `_start_` is read as the cell starts, `_mean_`/`_min_` over the window (`avg_` in "
    "`avg_power_w` is such a mean: the name stays as the committed records under runs/ have it).",
    "bakeoff.hardware.telemetry",
    [
        ("gpu_util_pct", PCT, "Mean GPU utilization (NVML), averaged over the GPUs."),
        ("avg_power_w", "W", "`energy_j` over `telemetry_window_s`."),
        ("energy_j", "J", "Energy of the window: NVML's total-energy counter, or the integral of sampled power "
         "(`energy_source`)."),
        ("energy_source", "", "`nvml_total_energy_counter` or `sampled_power_integral`."),
        ("joules_per_output_token", "J/token", "`energy_j` over the cell's output tokens."),
        ("gpu_uuids", "JSON", "UUIDs of the GPUs the server used."),
        ("telemetry_window_s", S, "Length of the sampled window."),
        ("gpu_name", "", "The GPUs' name as NVML reports it (distinct names joined by ` + `): what the cell ran "
         "on, beside the config's name in `hardware`."),
        ("gpu_count", COUNT, "GPUs the server used."),
        ("gpu_memory_bytes", BYTES, "Memory of each GPU (NVML's total; the smallest where they differ)."),
        ("gpu_driver", "", "NVIDIA driver version."),
        ("gpu_power_limit_w", "W", "Enforced power limit (the lowest of the GPUs)."),
        ("gpu_sm_clock_start_mhz", "MHz", "SM clock at the start (the lowest of the GPUs)."),
        ("gpu_mem_clock_start_mhz", "MHz", "Memory clock at the start (the lowest of the GPUs)."),
        ("gpu_temp_start_c", "°C", "GPU temperature at the start (the highest of the GPUs)."),
        ("gpu_sm_clock_mean_mhz", "MHz", "Mean SM clock over the window."),
        ("gpu_sm_clock_min_mhz", "MHz", "Lowest SM clock over the window."),
    ],
)

PROBES = _family(
    "capacity probes",
    "Rows of a capacity search (`load.mode: capacity`); empty on the fixed cells. A probe is measured like "
    "any cell, so every other column applies to it too.",
    "bakeoff.serving.capacity",
    [
        ("probe_of", "", "What the probe searched: `concurrency` (closed loop) or `rate` (open loop)."),
        ("slo", "", "The SLO preset the probe was judged against (`bakeoff.config.slo`)."),
        ("probe_passed", "bool", "Every request succeeded and the p99 TTFT and TPOT met the SLO, under the "
         "search's rule (`capacity_verdict_rule` in the capacity table; `load_note` names it too)."),
        ("probe_exceeded", "", "The bounds the probe exceeded (`ttft+tpot`, `failed`, `early stop`); under the "
         "confident rule `too few requests` where it read fewer than the 299 with which it can pass."),
        ("probe_recheck", "bool", "The search's end re-ran this load to check its boundary (file stem ends in "
         "`-again`)."),
        ("peak_in_flight", COUNT, "Most measured requests in flight at once. For a rate probe this is also its "
         "`concurrency`: an open loop has no concurrency setting. Written on every cell.", METRICS),
        ("over_ttft_share", FRACTION, "Share (0-1) of the cell's completed requests whose TTFT exceeded the "
         "SLO's bound (`load.slo_ms` on fixed cells).", METRICS),
        ("over_ttft_share_ub95", FRACTION, "One-sided 95 % upper bound (Clopper-Pearson) on the true share "
         "over the TTFT bound: how sure a pass is.", METRICS),
        ("over_tpot_share", FRACTION, "As `over_ttft_share`, for TPOT.", METRICS),
        ("over_tpot_share_ub95", FRACTION, "As `over_ttft_share_ub95`, for TPOT.", METRICS),
        ("ttft_lag1_autocorr", RATIO, "Lag-1 autocorrelation of the log TTFT of the requests the latency "
         "statistics read, in the order sent: how much one request's TTFT tells of the next's. Written on every "
         "cell of 30 requests or more.", DEPENDENCE),
        ("tpot_lag1_autocorr", RATIO, "As `ttft_lag1_autocorr`, for TPOT.", DEPENDENCE),
        ("effective_requests", COUNT, "The independent requests those are worth, n (1 - r) / (1 + r) with r the "
         "larger of the two autocorrelations.", DEPENDENCE),
        ("confident_claim_holds", "bool", "Whether the 95 % of the share bounds (`over_*_share_ub95`, the confident "
         "rule) may be read as such: false where even the autocorrelation's 95 % lower bound leaves fewer than 299 "
         "effective requests.", DEPENDENCE),
    ],
)

QUALITY = _mixed(
    "quality",
    "Per variant (every row of a variant repeats them). `_vs_fp16` compares with the 16-bit variant of the "
    "same engine (`quality_ref`), so the format's effect is apart from the engine's. A `_rel_delta` is a "
    "fraction (variant / reference - 1); an `_abs_delta` a difference in the metric's own unit. `_n` counts "
    "the scored documents or questions.",
    [
        ("quality_status", "", "`ok`, `skipped`, `unsupported`, `failed`, or `missing` (no quality.json).",
         "bakeoff.quality.compare"),
        ("quality_reason", "", "Why the status is not `ok`.", "bakeoff.quality.compare"),
        ("ppl", "", "Word perplexity of the perplexity task (lm-eval's `word_perplexity`).",
         "bakeoff.quality.compare"),
        ("bits_per_byte", "bits/byte", "Bits per UTF-8 byte of the perplexity task.", "bakeoff.quality.compare"),
        ("ppl_task", "", "The task `ppl` comes from.", "bakeoff.quality.compare"),
        ("ppl_n", COUNT, "Documents scored for `ppl`.", "bakeoff.quality.compare"),
        ("accuracy", FRACTION, "Accuracy of the multiple-choice task (length-normalized where the task has it).",
         "bakeoff.quality.compare"),
        ("accuracy_task", "", "`<task>/<metric>` of `accuracy` (`acc` or `acc_norm`).", "bakeoff.quality.compare"),
        ("accuracy_n", COUNT, "Questions scored for `accuracy`.", "bakeoff.quality.compare"),
        ("ppl_rel_delta_vs_fp16", FRACTION, "`ppl` over the reference's `ppl`, minus 1 (0.05: 5 % worse).",
         "bakeoff.quality.compare"),
        ("ppl_abs_delta_vs_fp16", "", "`ppl` minus the same experiment and model's fp16 (else f16) `ppl`: "
         "the form published tables use.", "bakeoff.results.published"),
        ("kl_vs_fp16", "nats/token", "Mean over the reference positions of KL(reference || variant), top-k "
         "logprobs coarsened onto shared tokens (a lower bound).", "bakeoff.quality.compare"),
        ("quality_ref", "", "The reference variant (`<engine>-<format>`).", "bakeoff.quality.compare"),
        ("quality_route", "", "Where quality was scored: `load server` (the variant's own), or `<plugin> (same artifact)` "
         "(the engine's `eval_server`).",
         "bakeoff.quality.compare"),
    ],
)

KERNEL = _family(
    "kernel",
    "llama-bench on the same GGUF and build, with nothing around it (llama.cpp rows only). `_tok_s` is "
    "tokens/s; `served_over_kernel` is a ratio (served / kernel).",
    "bakeoff.stages.kernel_bench",
    [
        ("kernel_tg_tok_s", TOK_S, "llama-bench tg128: decode tokens/s of one sequence."),
        ("kernel_pp_tok_s", TOK_S, "llama-bench pp512: prompt tokens/s."),
        ("kernel_flash_attn", "", "Flash attention as llama-bench ran it (`on`, `off`, `auto`), as the server's."),
        ("served_over_kernel", RATIO, "The variant's concurrency-1 `output_throughput` at this prompt length "
         "over `kernel_tg_tok_s`."),
    ],
)

ROOFLINE = _mixed(
    "roofline",
    "How close decode comes to the memory-bandwidth bound (`bakeoff.results.roofline` defines it). "
    "`_tok_s` is tokens/s, `_gbs` GB/s (10^9 bytes/s), `_pct` a percentage (0-100).",
    [
        ("decode_tok_s", TOK_S, "1000 / `median_tpot_ms`: one sequence's decode rate.", "bakeoff.results.roofline"),
        ("mem_bandwidth_gbs", "GB/s", "Bandwidth feeding one decode step (per GPU times the GPUs reading "
         "disjoint shards).", "bakeoff.results.roofline"),
        ("decode_ceiling_tok_s", TOK_S, "Per-sequence ceiling: bandwidth / `weight_bytes`.",
         "bakeoff.results.roofline"),
        ("decode_ceiling_aggregate_tok_s", TOK_S, "Aggregate ceiling at this concurrency: min(c x bandwidth / "
         "weight bytes, peak FLOP/s / 2 n_params).", "bakeoff.results.roofline"),
        ("decode_efficiency_pct", PCT, "`decode_tok_s` over `decode_ceiling_tok_s`.", "bakeoff.results.roofline"),
        ("bandwidth_source", "", "`measured` (the doctor's probe on this node) or `config` (the hardware "
         "config's figure).", DERIVED),
    ],
)


def _spread_rows() -> list[tuple[str, str, str]]:
    metrics = {"output_throughput": TOK_S, "median_ttft_ms": MS, "median_tpot_ms": MS, "median_e2el_ms": MS}
    stats = {"mean": ("", "Mean over the group's ok repeats of"),
             "std": ("", "Sample standard deviation over the repeats of"),
             "cv_pct": (PCT, "Coefficient of variation (std / mean) of"),
             "ci95": ("", "Half-width of the 95 % Student-t interval of the mean of")}
    return [(f"{m}_{s}", unit or metrics[m], f"{what} `{m}`.") for m in metrics for s, (unit, what) in stats.items()]


SPREAD = Family(
    "spread across repeats",
    "Per group of rows that differ only by repeat (the same on each of its rows); empty with one repeat. "
    "`<metric>_ci95` is a half-width in the metric's unit: the interval is mean +- ci95 (unlike the bounds "
    "`_ci_lo`/`_ci_hi`). `_cv_pct` is a percentage (0-100).",
    (Column("repeats_ok", COUNT, "Repeats of the group with status `ok`.", "bakeoff.results.spread"),
     Column("repeat_server_starts", COUNT, "Distinct server starts among them (`server_start_id`).",
            "bakeoff.results.spread"),
     Column("block_server_starts", COUNT, "Distinct server starts (`server_start_id`) among the fixed cells of this "
            "variant's block on this node; empty where the rows record no start id, or on a capacity probe.",
            "bakeoff.results.spread"),
     Column("block_resumed", "bool", "The block's cells came from more than one server start (a job resumed, or a "
            "server restarted after it died): the block is left out of every paired verdict.",
            "bakeoff.results.spread"),
     *(Column(n, u, d, "bakeoff.results.spread") for n, u, d in _spread_rows())),
)


def _vs_ref_rows() -> list[tuple[str, str, str]]:
    metrics = ("output_throughput", "median_ttft_ms", "median_tpot_ms", "median_e2el_ms")
    return [row for m in metrics for row in (
        (f"{m}_vs_ref_pct", PCT, f"This variant's `{m}` against the reference's, in percent of the reference: paired, "
         "the mean of the blocks' 100 (this - ref) / ref; Welch, the difference of the means over the reference's."),
        (f"{m}_vs_ref_ci95_pct", PCT, f"Half-width of the 95 % interval of `{m}_vs_ref_pct`, in percentage points."),
        (f"{m}_vs_ref_ci90_pct", PCT, f"Half-width of the 90 % interval of `{m}_vs_ref_pct` (the equivalence "
         "test's), in percentage points."),
        (f"{m}_vs_ref_p", "p-value", f"p of the test on `{m}` (Welch's t, or a t on the blocks' differences)."),
        (f"{m}_vs_ref_significant", "bool", "p < 0.05; empty with fewer than two ok repeats a side."),
        (f"{m}_vs_ref_verdict", "", "`different` (the 95 % interval excludes 0), `equivalent` (the 90 % interval "
         "lies inside +-`equivalence_margin_pct`) or `no verdict`."),
        (f"{m}_vs_ref_blocks_needed", COUNT, "With `no verdict`: the blocks (Welch: repeats a side) at which, at the "
         "observed spread, a true difference of the margin is called different and a true 0 equivalent, each "
         "80 % of the time; empty: more than 1000, or another verdict."),
        (f"{m}_vs_ref_faster_blocks", COUNT, f"Paired: the blocks (of `vs_ref_blocks`) in which this variant's "
         f"`{m}` was faster than the reference's (higher throughput, lower latency)."),
    )]


VS_REF = Family(
    "difference from the reference",
    "Each variant against its engine's 16-bit variant in the same cell and on the same node (`ref_variant`). "
    "`_vs_ref_pct` is a relative difference in percent; `_vs_ref_ci95_pct` and `_vs_ref_ci90_pct` its "
    "half-widths in percentage points; `_vs_ref_p` a p-value; `_vs_ref_verdict` one of `different`, "
    "`equivalent`, `no verdict` (docs/methodology.md#statistics).",
    (Column("ref_variant", "", "The reference variant (`<engine>-<format>`).", "bakeoff.results.spread"),
     Column("vs_ref_pairing", "", "`blocks` (paired by block) or `welch` (independent repeats).",
            "bakeoff.results.spread"),
     Column("vs_ref_blocks", COUNT, "Blocks paired (resumed blocks left out); empty for Welch.",
            "bakeoff.results.spread"),
     Column("vs_ref_blocks_left_out", "", "Blocks left out of the pairing and why (`block 1: llamacpp-q4_k_m's "
            "cells came from 2 server starts`).", "bakeoff.results.spread"),
     Column("equivalence_margin_pct", PCT, "The equivalence margin m the verdicts used "
            "(`answer.equivalence_margin_pct`).", "bakeoff.results.spread"),
     *(Column(n, u, d, "bakeoff.results.spread") for n, u, d in _vs_ref_rows())),
)

# Summary columns that data/published_numbers.yaml publishes numbers for: each gets `published_<m>` and
# `<m>_vs_published` wherever the summary has <m>.
PUBLISHED_METRICS = ("output_throughput", "decode_tok_s", "weight_bytes", "ppl_abs_delta_vs_fp16", "bits_per_weight",
                     "ppl", "kl_vs_fp16", "decode_ceiling_tok_s")


def _published(units: dict[str, str]) -> Family:
    rows: list[Column] = []
    for m in PUBLISHED_METRICS:
        rows += [Column(f"published_{m}", units[m], f"The published value of `{m}` for this row's cell "
                        "(a range: its midpoint).", "bakeoff.results.published"),
                 Column(f"{m}_vs_published", RATIO, f"Measured `{m}` over `published_{m}` (1 = as published).",
                        "bakeoff.results.published")]
    rows += [Column("published_refs", "", "Ids of the published rows compared (data/published_numbers.yaml).",
                    "bakeoff.results.published"),
             Column("published_compared_as", "", "How they were compared: a stand-in format, or pooled cells "
                    "compared once by their mean.", "bakeoff.results.published")]
    return Family(
        "published",
        "Published numbers beside the measured ones (`data/published_numbers.yaml`). `published_<metric>` is "
        "in `<metric>`'s unit; `<metric>_vs_published` is measured / published, a ratio (1 = as published).",
        tuple(rows))


def _summary() -> Table:
    fams = [IDENTITY, OUTCOME, VLLM, STEADY, START, INTERVALS, MEMORY, SERVER, CLIENT, TELEMETRY, PROBES, WORKLOAD, QUALITY,
            KERNEL, ROOFLINE]
    units = {c.name: c.unit for f in fams for c in f.columns}
    return Table("summary", SUMMARY_PATH,
                 "One row per load cell of the experiment (engine x format x concurrency x prompt length x "
                 "repeat, and every capacity probe), unsupported and failed cells included.",
                 (*fams, _published(units), SPREAD, VS_REF))


CAPACITY_SEARCH = _family(
    "capacity search",
    "One row per variant, prompt length and SLO of a capacity search (`load.mode: capacity`; the table is a "
    "header alone otherwise). `capacity_<kind>` is the highest load that met the SLO; `<kind>_converged`, "
    "`<kind>_at_limit`, `<kind>_probes` and `binding_<kind>` describe that search, for `concurrency` (closed "
    "loop) and `rate` (open loop, req/s). `<metric>_at_capacity` is the metric of the probe at the closed-loop "
    "capacity, in `<metric>`'s unit (see the summary's table).",
    "bakeoff.serving.capacity",
    [
        ("experiment", "", "Experiment (sweep point) name."),
        ("model", "", "Model name."),
        ("engine", "", "Engine config name."),
        ("format", "", "Weight format."),
        ("hardware", "", "Hardware config name."),
        ("node_id", "", "The machine of the probe at capacity (as in the summary)."),
        ("prompt_len", TOKENS, "Prompt length of the probes."),
        ("output_len", TOKENS, "Requested output length of the probes."),
        ("slo", "", "SLO preset (`bakeoff.config.slo`)."),
        ("slo_ttft_ms", MS, "The preset's bound on p99 TTFT."),
        ("slo_tpot_ms", MS, "The preset's bound on p99 TPOT."),
        ("capacity_verdict_rule", "", "The rule that judged every probe of this row's searches "
         "(`load.capacity.verdict`, bakeoff.loadgen.capacity): `point` (both p99s within the bounds) or "
         "`confident` (also the one-sided 95 % upper bound on the share over each bound at most 1 %: at least 299 "
         "requests a probe)."),
        ("capacity_concurrency", COUNT, "Highest concurrency whose probe met the SLO (0: even the lowest "
         "failed)."),
        ("capacity_start", "", "How each concurrency probe's users started (`load.capacity.start`): `ramp` (slot "
         "j of c at j x ramp / c, the verdict over the steady span after the ramp) or `burst` (every slot at once)."),
        ("concurrency_resolution", FRACTION, "The search stops once its lowest fail is within this share of its "
         "highest pass, never closer than one user (`load.capacity.resolution`)."),
        ("concurrency_converged", "bool", "The concurrency search bracketed its capacity within its resolution: "
         "`concurrency_fail - capacity_concurrency <= max(1, floor(resolution x capacity_concurrency))`."),
        ("concurrency_fail", COUNT, "The lowest concurrency whose probe failed: the bracket's top (empty where "
         "none failed)."),
        ("concurrency_bracket", "", "The capacity as the search found it: `pass–fail` (e.g. `192–200`), or `at "
         "least N` where no load above the highest pass failed."),
        ("concurrency_at_limit", "bool", "The highest concurrency allowed passed: capacity is at least this (a "
         "lower bound; `concurrency_converged` is then False)."),
        ("concurrency_limit", "", "Where `concurrency_at_limit`: what set the highest concurrency allowed: `search "
         "maximum` (`load.capacity.max_concurrency`), `server max_num_seqs`, `vLLM KV cache (N tokens)` or "
         "`llama.cpp --parallel (set by the ...)`; empty where the search bracketed the capacity."),
        ("concurrency_probes", COUNT, "Probes the concurrency search ran, not counting the boundary re-checks "
                                       "(`concurrency_recheck`)."),
        ("binding_concurrency", "", "The bound the lowest failing concurrency probe exceeded (`ttft`, `tpot`, "
         "`failed`)."),
        ("concurrency_seeded", "JSON", "The bracket taken from the variant's fixed cells: `{\"pass\": c, "
         "\"fail\": c}` (empty when none applied)."),
        ("concurrency_uncertain", "bool", "A boundary re-check (the highest pass and the lowest fail, each run "
         "again) disagreed with the first result: the capacity is uncertain."),
        ("concurrency_recheck", "", "Each re-checked concurrency with its two results: `12: pass, pass; 13: fail, "
         "fail`."),
        ("capacity_rate", REQ_S, "Highest Poisson arrival rate whose probe met the SLO."),
        ("rate_converged", "bool", "The rate search bracketed its capacity within `rate_resolution`."),
        ("rate_at_limit", "bool", "The rate search stopped at its limit."),
        ("rate_probes", COUNT, "Probes the rate search ran."),
        ("binding_rate", "", "The bound the lowest failing rate probe exceeded."),
        ("output_throughput_at_capacity", TOK_S, "`output_throughput` of the probe at `capacity_concurrency`."),
        ("request_goodput_at_capacity", REQ_S, "`request_goodput` of that probe."),
        ("joules_per_output_token_at_capacity", "J/token", "`joules_per_output_token` of that probe (GPU)."),
        ("p99_ttft_ms_at_capacity", MS, "`p99_ttft_ms` of that probe."),
        ("p99_tpot_ms_at_capacity", MS, "`p99_tpot_ms` of that probe."),
        ("p99_ttft_ms_whole_cell_at_capacity", MS, "`p99_ttft_ms_whole_cell` of that probe: its TTFT with the "
         "ramp's requests (empty for a burst, whose `p99_ttft_ms` already is the whole cell's)."),
        ("steady_requests_at_capacity", COUNT, "`steady_requests` of that probe: the requests its verdict read."),
        ("load_ramp_s_at_capacity", S, "`load_ramp_s` of that probe."),
        ("output_throughput_at_capacity_rate", TOK_S, "`output_throughput` of the probe at `capacity_rate`."),
        ("client_cpu_s_at_capacity", S, "`client_cpu_s` of the probe at capacity."),
        ("client_cpu_share_at_capacity", FRACTION, "`client_cpu_share` of the probe at capacity."),
        ("client_workers_at_capacity", COUNT, "`client_workers` of the probe at capacity."),
        ("client_saturated_at_capacity", "bool", "`client_saturated` of the probe at capacity."),
        ("client_saturated_probes", "", "Every probe of the search (cell names) whose client saturated: there the "
         "client was measured as much as the server."),
        ("over_ttft_share_at_capacity", FRACTION, "`over_ttft_share` of the probe at capacity."),
        ("over_ttft_share_ub95_at_capacity", FRACTION, "`over_ttft_share_ub95` of the probe at capacity."),
        ("over_tpot_share_at_capacity", FRACTION, "`over_tpot_share` of the probe at capacity."),
        ("over_tpot_share_ub95_at_capacity", FRACTION, "`over_tpot_share_ub95` of the probe at capacity."),
        ("effective_requests_at_capacity", COUNT, "`effective_requests` of the probe at capacity."),
        ("confident_claim_holds_at_capacity", "bool", "`confident_claim_holds` of the probe at capacity: where "
         "false, a confident capacity's 95 % does not hold (bakeoff.loadgen.dependence)."),
    ],
)

CAPACITY_IDENTITY = Family(
    "version", "As in the summary.",
    (Column("schema_version", "", "Version of this dictionary the row follows.", SUMMARY_STAGE),))

ANSWER_FAMILY = _family(
    "answer",
    "One row per answer of the report's index page: per experiment, prompt length and node, the leader at each "
    "fixed concurrency (`load` `c=<n>`) and under each SLO (`load` the preset's name). At fixed load the leader "
    "is compared with the runner-up on `metric`: `diff_pct` and its interval bounds `_lo_pct`/`_hi_pct` are in "
    "percent of the runner-up (docs/methodology.md#statistics); under an SLO capacities are compared, and only "
    "`verdict_words` says how.",
    "bakeoff.report.answer",
    [
        ("experiment", "", "Experiment (sweep point) name."),
        ("prompt_len", TOKENS, "Prompt length."),
        ("node_id", "", "The node every number of the answer was measured on."),
        ("load", "", "`c=<concurrency>` (fixed load) or an SLO preset's name."),
        ("leader", "", "The leading variant: the highest mean `metric`, or the most concurrent users within the SLO."),
        ("leader_value", "", "Its mean `metric` (tok/s), or its capacity (concurrent users)."),
        ("leader_at_least", "bool", "The leader's capacity is a lower bound (its search did not converge)."),
        ("runner_up", "", "The runner-up variant (empty: the only variant)."),
        ("runner_up_value", "", "Its value, as `leader_value`."),
        ("runner_up_at_least", "bool", "The runner-up's capacity is a lower bound."),
        ("margin_pct", PCT, "(leader's value - runner-up's) / runner-up's, in percent, from the means."),
        ("metric", "", "The summary column compared at fixed load (`output_throughput`); empty under an SLO."),
        ("pairing", "", "`blocks` (paired by block) or `welch`."),
        ("blocks", COUNT, "Blocks paired (resumed blocks left out)."),
        ("diff_pct", PCT, "The leader against the runner-up: paired, the mean of the blocks' relative differences; "
         "Welch, the difference of the means, in percent of the runner-up."),
        ("ci95_lo_pct", PCT, "Lower bound of the 95 % interval of `diff_pct`."),
        ("ci95_hi_pct", PCT, "Upper bound of the 95 % interval of `diff_pct`."),
        ("ci90_lo_pct", PCT, "Lower bound of the 90 % interval of `diff_pct` (the equivalence test's)."),
        ("ci90_hi_pct", PCT, "Upper bound of the 90 % interval of `diff_pct`."),
        ("p", "p-value", "Two-sided p of the test on the difference."),
        ("equivalence_margin_pct", PCT, "The margin m of the equivalence test (`answer.equivalence_margin_pct`)."),
        ("verdict", "", "At fixed load: `different`, `equivalent` or `no verdict`; empty under an SLO and for an "
         "only variant."),
        ("blocks_needed", COUNT, "With `no verdict`: the blocks that would settle a difference of m at the observed "
         "spread (see the summary's `_vs_ref_blocks_needed`); empty: more than 1000, or another verdict."),
        ("leader_faster_blocks", COUNT, "Paired: blocks in which the leader was faster."),
        ("runner_up_faster_blocks", COUNT, "Paired: blocks in which the runner-up was faster."),
        ("blocks_left_out", "", "Resumed blocks left out of the pairing, and why."),
        ("verdict_words", "", "The verdict as the page says it: the interval, the blocks' directions, blocks left "
         "out, and the client's saturation where it bears on the numbers."),
    ],
)

SUMMARY = _summary()
CAPACITY = Table("capacity", CAPACITY_TABLE,
                 "The capacity searches' results: the highest load each variant served within each SLO.",
                 (CAPACITY_IDENTITY, CAPACITY_SEARCH))
ANSWER = Table("answer", ANSWER_TABLE, "The report's answer (results/report/index.html) as a table.",
               (ANSWER_FAMILY,))
TABLES = (SUMMARY, CAPACITY, ANSWER)
