"""Stage: ``results/summary.csv``, one row per load cell of the experiment.

Rows come from each variant's ``cells.json`` (written by the serve-load
stage), unsupported and failed cells included, with their reasons; the
variant's quality columns (``quality.json``, see bakeoff.quality.compare) are
joined onto each of its rows. Every row of both tables carries ``schema_version``: which version of
the data dictionary (bakeoff.results.columns, docs/columns.md) it follows. Written atomically (temp
file + rename) so a reader never sees half a CSV.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bakeoff.errors import BakeoffError
from bakeoff.hardware.telemetry import COLUMNS as TELEMETRY_COLUMNS
from bakeoff.hardware.telemetry import FINGERPRINT_COLUMNS
from bakeoff.loadgen.core_watch import COLUMNS as CORE_WATCH_COLUMNS
from bakeoff.loadgen.dependence import COLUMNS as DEPENDENCE_COLUMNS
from bakeoff.loadgen.health import COLUMNS as CLIENT_HEALTH_COLUMNS
from bakeoff.loadgen.metrics import SERVER_METRICS, START_METRICS, SUMMARY_METRICS
from bakeoff.loadgen.prefix_cache import COLUMNS as PREFIX_CACHE_COLUMNS
from bakeoff.loadgen.scrape import COLUMNS as SCRAPE_COLUMNS
from bakeoff.loadgen.server_latency import COLUMNS as SERVER_LATENCY_COLUMNS
from bakeoff.loadgen.workload import COLUMNS as WORKLOAD_COLUMNS
from bakeoff.models.artifacts import atomic_write_text
from bakeoff.quality.compare import QUALITY_COLUMNS, quality_columns
from bakeoff.results.columns import SCHEMA_VERSION

COLUMNS = [
    "schema_version", "experiment", "model", "engine", "engine_version", "format", "hardware",
    "concurrency", "prompt_len", "output_len", "repeat", "block", "order", "node_id", "request_rate",
    "requests", "completed", "failed", "status", "reason",
    *SUMMARY_METRICS, *START_METRICS,
    "peak_rss_bytes", "memory_source", "peak_gpu_bytes", "weight_bytes", "bits_per_weight", "n_params",
    "startup_s", "server_start", "server_start_id", "slot_ctx", "warmup_requests",
    "client_cpu_s", "client_cpu_s_per_1k_tokens",
    *CLIENT_HEALTH_COLUMNS, "client_rerun", "client_shares_cores",
    *SERVER_METRICS,
    *[c for c in TELEMETRY_COLUMNS if c != "peak_gpu_bytes"], *FINGERPRINT_COLUMNS, *SCRAPE_COLUMNS,
    *SERVER_LATENCY_COLUMNS, *CORE_WATCH_COLUMNS,
    "engine_settings", "parallel_set_by", "config_hash", "load_note",
    # capacity probes (load.mode: capacity): which search, which SLO, its verdict; empty on the fixed cells
    "cell", "probe_of", "slo", "probe_passed", "probe_exceeded", "probe_recheck", "stopped_early", "peak_in_flight",
    "over_ttft_share", "over_ttft_share_ub95", "over_tpot_share", "over_tpot_share_ub95", *DEPENDENCE_COLUMNS,
    # the workload (load.workload): what the cell replayed, and what the server's prefix cache made of it
    *WORKLOAD_COLUMNS, "prefix_caching", *PREFIX_CACHE_COLUMNS,
    *QUALITY_COLUMNS,
]
# results/capacity.csv: one row per variant, prompt length and SLO (bakeoff.serving.capacity).
CAPACITY_COLUMNS = [
    "schema_version", "experiment", "model", "engine", "format", "hardware", "node_id", "prompt_len", "output_len",
    "slo", "slo_ttft_ms", "slo_tpot_ms", "capacity_verdict_rule", "capacity_start", "concurrency_resolution",
    "capacity_concurrency", "concurrency_fail", "concurrency_bracket", "concurrency_converged", "concurrency_at_limit",
    "concurrency_limit", "concurrency_probes",
    "binding_concurrency",
    "concurrency_seeded", "concurrency_uncertain", "concurrency_recheck",
    "capacity_rate", "rate_converged", "rate_at_limit", "rate_probes", "binding_rate",
    "output_throughput_at_capacity", "request_goodput_at_capacity", "joules_per_output_token_at_capacity",
    "p99_ttft_ms_at_capacity", "p99_tpot_ms_at_capacity", "p99_ttft_ms_whole_cell_at_capacity",
    "steady_requests_at_capacity", "load_ramp_s_at_capacity", "output_throughput_at_capacity_rate",
    "over_ttft_share_at_capacity", "over_ttft_share_ub95_at_capacity", "over_tpot_share_at_capacity",
    "over_tpot_share_ub95_at_capacity", "effective_requests_at_capacity", "confident_claim_holds_at_capacity",
    # the client beside the server's limit: its CPU at capacity, and every probe of the search where it saturated
    "client_cpu_s_at_capacity", "client_cpu_share_at_capacity", "client_workers_at_capacity",
    "client_saturated_at_capacity", "client_saturated_probes",
]


def _fmt(v: Any) -> Any:
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, (dict, list)):
        return json.dumps(v, sort_keys=True)
    return "" if v is None else v


def check_one_config(indexes: list[tuple[Path, dict[str, Any]]], expected: Mapping[str, str]) -> None:
    """Refuse a summary whose experiment mixes rows of two configs, naming the variants made under another.

    ``expected``: each experiment's current config hash. A variant's index carries the hash it was served
    under; one that differs was not re-measured after a config change (or came from elsewhere).
    """
    stale: dict[str, list[str]] = {}
    for d, idx in indexes:
        v = idx.get("variant", {})
        want = expected.get(str(v.get("experiment")))
        if want is not None and idx.get("config_hash") != want:
            stale.setdefault(str(v["experiment"]), []).append(
                f"{v['engine']}-{v['format']} (made under {idx.get('config_hash') or 'no recorded config'}, {d})")
    if stale:
        raise BakeoffError("the summary would mix rows of two configurations; stale variants: " + "; ".join(
            f"experiment {e} (config {expected[e]}): {', '.join(vs)}" for e, vs in sorted(stale.items()))
            + ". Re-run their serving jobs (snakemake re-runs them when its config changes; "
              "`--forcerun serve_load` forces it); for a GPU node's record served under an earlier config, "
              "name its one hash with `--config served_config_hash=<hash>`.")


def rows(index_paths: list[Path], expected: Mapping[str, str]) -> list[dict[str, Any]]:
    """One row per cell and capacity probe; the variant's quality columns (quality.json beside cells.json) are
    joined on. Every experiment's rows must come from its ``expected`` config hash (:func:`check_one_config`)."""
    indexes = [(Path(p).parent, json.loads(Path(p).read_text())) for p in index_paths]
    check_one_config(indexes, expected)
    quality = quality_columns([(d, idx["variant"]) for d, idx in indexes])
    out = []
    for d, idx in indexes:
        for cell in idx["cells"]:
            row = {k: _fmt(cell.get(k)) for k in COLUMNS}
            row.update({k: _fmt(v) for k, v in quality[d].items()})
            row["config_hash"] = _fmt(idx.get("config_hash"))
            row["schema_version"] = SCHEMA_VERSION
            out.append(row)
    return out


def capacity_rows(index_paths: list[Path]) -> list[dict[str, Any]]:
    """Every variant's capacity results (empty where no search ran)."""
    return [{k: _fmt(r.get(k)) for k in CAPACITY_COLUMNS} | {"schema_version": SCHEMA_VERSION}
            for p in index_paths for r in json.loads(Path(p).read_text()).get("capacity", [])]


def write_csv(path: Path, records: list[dict], columns: list[str] = COLUMNS) -> None:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=columns, extrasaction="raise")
    w.writeheader()
    w.writerows(records)
    atomic_write_text(Path(path), buf.getvalue())


def run_command(a: argparse.Namespace) -> None:
    """``bakeoff summary``: results/summary.csv from the variants' indexes, with the columns each input adds."""
    from bakeoff.results import spread  # spread across repeats, and each difference's verdict
    from bakeoff.results.derived import extend
    from bakeoff.stages.kernel_bench import join

    # Each experiment's current config hash: per sweep point where the points file is given, else the one hash.
    points = json.loads(Path(a.points).read_text()) if a.points else {}
    expected = ({name: p["config_hash"] for name, p in points.items()} if points else
                {json.loads(Path(p).read_text())["variant"]["experiment"]: a.config_hash for p in a.indexes})
    if a.served_config_hash:  # a record served under an earlier config: its rows as they are, still one config
        expected = dict.fromkeys(expected, a.served_config_hash)
    records = rows([Path(p) for p in a.indexes], expected)
    columns = list(COLUMNS)
    if a.kernel:  # llama-bench beside the served rows (bakeoff.stages.kernel_bench)
        columns += [c for c in join(records, [Path(p) for p in a.kernel]) if c not in columns]
    if a.points:  # sweep axes, roofline and published ratios (bakeoff.results.derived)
        facts = json.loads(Path(a.hardware).read_text()) if a.hardware else None
        columns += [c for c in extend(records, points, Path(a.published) if a.published else None, facts)
                    if c not in columns]
    margins = spread.margins_of(points) if points else None  # answer.equivalence_margin_pct per experiment
    columns += [c for c in spread.extend(records, margins) if c not in columns]
    write_csv(Path(a.out), records, columns)
    if a.capacity_out:
        write_csv(Path(a.capacity_out), capacity_rows([Path(p) for p in a.indexes]), CAPACITY_COLUMNS)
