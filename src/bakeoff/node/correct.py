"""Rows that name the node's GPU: hardware columns corrected where the run's config named another.

Why its own module: a node run made under another GPU's config (an H200 config on an H100) would name the
wrong GPU in every row and page made from it. Unpacking (bakeoff.node.bundle) and deriving a record
(bakeoff.node.record) both correct the rows from the doctor's findings the same way; measured values are
never touched.
"""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

from bakeoff.composition.compose import find_conf_dir, hardware_configs
from bakeoff.config.schema import HardwareCfg
from bakeoff.hardware.match import choose, mismatches
from bakeoff.layout import HARDWARE

CELL_COLUMNS = [
    "hardware", "gpu_name", "gpu_count", "gpu_memory_bytes",
    "engine", "format", "concurrency", "prompt_len", "repeat", "block", "order", "requests", "warmup_requests",
    "completed", "status", "load_note", "output_throughput", "steady_output_throughput", "ramp_s", "tail_s",
    "tail_share", "p99_ttft_ms", "p99_tpot_ms", "median_ttft_ms", "median_tpot_ms", "server_median_tpot_ms",
    "energy_j", "joules_per_output_token", "avg_power_w", "gpu_util_pct", "peak_gpu_bytes", "kv_cache_peak_pct",
    "peak_waiting_requests", "peak_running_requests", "energy_source", "weight_bytes", "engine_settings",
    "spec_hash", "started_utc", "node_id", "gpu_driver", "gpu_power_limit_w", "gpu_sm_clock_start_mhz",
    "gpu_mem_clock_start_mhz", "gpu_temp_start_c", "gpu_sm_clock_mean_mhz", "gpu_sm_clock_min_mhz",
    "client_cpu_s", "client_cpu_share", "client_loop_lag_p99_ms", "client_saturated", "client_saturated_reason",
    "cell", "ended_utc", "server_start", "startup_s",
]
# The pipeline's tables a record may hold beside what `record` derives (made on the submit host from the same
# tarball); `record` corrects their hardware columns as it does the cells'.
PIPELINE_TABLES = ["summary.csv", "capacity.csv"]
GPU_COLUMNS = ["gpu_name", "gpu_count", "gpu_memory_bytes"]


def write_csv(path: Path, rows: list[dict], columns: list[str]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: json.dumps(v, sort_keys=True) if isinstance(v, (dict, list)) else v for k, v in r.items()})


def hardware_correction(rec: dict) -> dict | None:
    """Where the doctor's record shows the run's config naming another GPU than the node's: the config
    ``hardware=auto`` picks from the doctor's findings (``name``, ``config``), the config as run and how it
    differs. None where the config describes the node."""
    as_run = rec["hardware_config"]
    wrong = mismatches(rec, as_run)
    if not wrong:
        return None
    configs = hardware_configs(find_conf_dir(Path(__file__).parent))
    name, made = choose(rec, configs)
    config = HardwareCfg.model_validate(made or configs[name]).model_dump(mode="json")
    return {"name": name, "config": config, "as_run": as_run, "mismatches": wrong}


def gpu_facts(rec: dict, node_id: str | None) -> dict:
    """``gpu_name``, ``gpu_count``, ``gpu_memory_bytes`` of a row's GPUs (its ``node_id``, ``gpu:<uuid,...>``)
    from the doctor's findings: for rows made before the telemetry recorded them."""
    gpus = rec.get("gpus") or []
    if node_id and str(node_id).startswith("gpu:"):
        used = str(node_id)[4:].split(",")
        gpus = [g for g in gpus if g.get("uuid") in used]
        if len(gpus) != len(used):
            return {}
    if not gpus:
        return {}
    return {"gpu_name": " + ".join(dict.fromkeys(str(g["name"]) for g in gpus)), "gpu_count": len(gpus),
            "gpu_memory_bytes": min(int(g["memory_total_mib"]) << 20 for g in gpus)}


def correct_row(row: dict, rec: dict, fix: dict | None) -> dict:
    out = dict(row)
    if not all(out.get(k) not in (None, "") for k in GPU_COLUMNS):
        out.update(gpu_facts(rec, out.get("node_id")))
    if fix is not None and out.get("hardware") == fix["as_run"]["name"]:
        out["hardware"] = fix["name"]
    return out


def correct_table(path: Path, rec: dict, fix: dict | None) -> None:
    """A pipeline table's ``hardware`` and GPU columns, corrected in place (other columns as they were)."""
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        columns, rows = list(reader.fieldnames or []), list(reader)
    if "hardware" not in columns:
        return
    at = columns.index("hardware") + 1
    columns[at:at] = [c for c in GPU_COLUMNS if c not in columns]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns, lineterminator="\n")
        w.writeheader()
        for r in rows:
            w.writerow(correct_row(r, rec, fix))


def corrected_record(rec: dict, fix: dict, by: str) -> dict:
    """The doctor's record with the config ``hardware=auto`` picks as ``hardware_config``, the run's kept as
    ``hardware_config_as_run`` and a note saying how it differs from the node (``by``: the command that
    corrected it)."""
    return {**rec, "hardware_config": fix["config"], "hardware_config_as_run": fix["as_run"],
            "hardware_config_note": f"the run's config ({fix['as_run']['name']}) does not describe this node: "
            f"{'; '.join(fix['mismatches'])}. hardware_config is the config hardware=auto picks from gpus "
            f"({by})"}


# Where the serving stage's JSON files hold rows (a cell or probe each): the file itself (a cell), or these lists.
ROW_LISTS = ["cells", "capacity", "probes"]


def _correct_result(data: object, rec: dict, fix: dict) -> object:
    """A serving-stage JSON file's rows corrected (:func:`correct_row`), and its ``variant``'s ``hardware``."""
    if not isinstance(data, dict):
        return data
    if "hardware" in data and "cell" in data:
        return correct_row(data, rec, fix)
    out = dict(data)
    for key in ROW_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [correct_row(r, rec, fix) if isinstance(r, dict) and "hardware" in r else r for r in out[key]]
    variant = out.get("variant")
    if isinstance(variant, dict) and variant.get("hardware") == fix["as_run"]["name"]:
        out["variant"] = {**variant, "hardware": fix["name"]}
    return out


def correct_unpacked(root: Path) -> dict | None:
    """Correct unpacked node results in place where the run's hardware config does not describe the node.

    Why: the summary and the pages take each row's ``hardware`` from the cells the node wrote, and the
    roofline and the environment page take the doctor's record's ``hardware_config``; a run made under another
    GPU's config (an H200 config on an H100) would name the wrong GPU on every page. As ``record`` does for a
    record's tables, rows name the config ``hardware=auto`` picks from the doctor's findings and gain
    ``gpu_name``, ``gpu_count``, ``gpu_memory_bytes``; ``results/hardware.json`` keeps the run's config as
    ``hardware_config_as_run`` (:func:`corrected_record`). Measured values are left as they are, and each
    rewritten file keeps its mtime (the node's). Returns the correction (None: nothing to correct, also once
    corrected).
    """
    path = root / HARDWARE
    if not path.is_file():
        return None
    rec = json.loads(path.read_text())
    fix = hardware_correction(rec)
    if fix is None:
        return None
    for p in [*sorted((root / "results/raw").rglob("*.json")), path]:
        data = json.loads(p.read_text())
        new = corrected_record(rec, fix, "bakeoff node unpack") if p == path else _correct_result(data, rec, fix)
        if new != data:
            st = p.stat()
            p.write_text(json.dumps(new, indent=2) + "\n")
            os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
    return fix
