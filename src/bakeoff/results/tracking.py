"""MLflow tracking: one parent run per pipeline invocation, one child run per cell.

Why from one place: Snakemake runs jobs in parallel, and sqlite writers from
many jobs would contend (and a crash mid-job would leave half-logged runs).
So one rule, after the summary, logs everything; it also holds an exclusive
file lock next to the database, so two Snakemake invocations sharing the
store serialise instead of interleaving.

What is logged:

* child run per summary row, tagged ``mlflow.parentRunId``: params = every
  config value of the cell (model, hardware, load, eval, experiment, *its*
  engine as ``engine.*`` and *its* format as ``format.*``, the cell axes);
  metrics = every numeric column of ``summary.csv`` (read generically, so
  columns added later are logged too) with step = concurrency; artifacts =
  the cell's per-request JSONL and record, and its variant's server log.
* parent run: the invocation's summary, resolved config, versions and plots;
  per-variant series ``<engine>-<format>.p<prompt>.<metric>`` with step =
  concurrency, so the UI charts throughput against concurrency.
* tags on both: the pinned versions (:mod:`bakeoff.results.versions`), git sha and
  dirty flag, model revision and sha256, config hash.

A cell run carries the time its cell ran (``started_utc``/``ended_utc`` of its record), not the time it
was logged, so the UI's compare view shows when and how long each cell ran. MLflow 3's UI opens an
experiment on the GenAI overview unless the address asks for the model-training runs table
(``ui_path``, seen in headless Chromium: scripts/mlflow_ui_check.py); the experiment is also tagged as
the model-development kind, which is what MLflow's own run-centric experiments carry.
"""

from __future__ import annotations

import argparse
import csv
import fcntl
import json
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bakeoff.errors import BakeoffError
from bakeoff.layout import SERVER_LOG, row_cell_name, row_variant_key, variant_of
from bakeoff.models.artifacts import atomic_write_text
from bakeoff.results.numbers import number

# summary columns that identify a cell rather than measure it (never metrics)
ID_COLUMNS = {"experiment", "model", "engine", "engine_version", "format", "hardware", "status", "reason",
              "engine_settings", "config_hash", "sweep", "overrides", "published_refs", "schema_version"}
SERIES_METRICS = ["output_throughput", "median_ttft_ms", "median_tpot_ms", "decode_efficiency_pct"]
EXPERIMENT_KIND = {"mlflow.experimentKind": "custom_model_development"}


def ui_path(experiment_id: str) -> str:
    """The MLflow UI address (after host:port) of an experiment's runs table, in model-training view."""
    return f"/#/experiments/{experiment_id}/runs?workflowType=machine_learning"


def cell_times_ms(record: Mapping[str, Any]) -> tuple[int | None, int | None]:
    """When a cell ran, in epoch ms, from its record: start, and end (or start + the measured duration)."""
    start = number(record.get("started_utc"))
    end = number(record.get("ended_utc"))
    if end is None and start is not None and (d := number(record.get("duration_s"))) is not None:
        end = start + d
    return (int(start * 1000) if start is not None else None, int(end * 1000) if end is not None else None)


def resolve_uri(uri: str, root: Path) -> str:
    """A relative ``sqlite:///x.db`` becomes absolute under the project root (jobs and the UI agree)."""
    prefix = "sqlite:///"
    if uri.startswith(prefix) and not uri.startswith(prefix + "/"):
        return prefix + str((root / uri[len(prefix):]).resolve())
    return uri


@contextmanager
def store_lock(uri: str, root: Path) -> Iterator[None]:
    """Exclusive lock for the duration of one invocation's logging."""
    path = Path(uri[len("sqlite:///"):] + ".lock") if uri.startswith("sqlite:///") else root / ".mlflow.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)




def numeric_columns(row: Mapping[str, str]) -> dict[str, float]:
    return {k: f for k, v in row.items() if k not in ID_COLUMNS and (f := number(v)) is not None}


def _flatten(d: Any, prefix: str) -> dict[str, str]:
    if isinstance(d, dict) and d:
        out: dict[str, str] = {}
        for k, v in d.items():
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: json.dumps(d) if isinstance(d, (list, dict)) else str(d)}


def cell_params(cfg: Mapping[str, Any], row: Mapping[str, str]) -> dict[str, str]:
    """Every config value of one cell: shared groups, plus this cell's engine and format only."""
    params: dict[str, str] = {}
    for group in ("model", "hardware", "load", "eval", "experiment"):
        params.update(_flatten(cfg.get(group, {}), group))
    params.update(_flatten(cfg["engines"].get(row["engine"], {}), "engine"))
    params.update(_flatten(cfg["formats"].get(row["format"], {}), "format"))
    params.update({"cell.engine": row["engine"], "cell.format": row["format"], "cell.concurrency": row["concurrency"],
                   "cell.prompt_len": row["prompt_len"], "cell.repeat": row.get("repeat", "0"),
                   "cell.sweep": row.get("sweep", ""), "cell.overrides": row.get("overrides", "")})
    return {k[:250]: (v if len(v) <= 6000 else v[:5997] + "...") for k, v in params.items()}


def _chunks(items: list, n: int) -> Iterator[list]:
    for i in range(0, len(items), n):
        yield items[i:i + n]


def _cells_span_ms(rows: list[dict[str, str]], variant_dirs: Mapping[str, Path]) -> tuple[int | None, int | None]:
    """The first cell's start and the last cell's end (ms), so the invocation's run spans what it measured."""
    starts, ends = [], []
    for r in rows:
        d = variant_dirs.get(row_variant_key(r))
        cell = d / f"{row_cell_name(r)}.json" if d is not None else None
        if cell is not None and cell.is_file():
            a, b = cell_times_ms(json.loads(cell.read_text()))
            starts += [a] if a is not None else []
            ends += [b] if b is not None else []
    return (min(starts) if starts else None, max(ends) if ends else None)


def log_invocation(*, summary: Path, config_json: Path, versions_json: Path, cell_indexes: list[Path],
                   plots: list[Path], uri: str, experiment: str, out: Path, root: Path) -> dict[str, Any]:
    """Log one invocation (parent + a child per summary row); write ``out`` with the run ids."""
    import mlflow
    from mlflow.entities import Metric, Param
    from mlflow.tracking import MlflowClient

    with open(summary, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        raise BakeoffError(f"{summary} has no rows: nothing to track")
    points = json.loads(Path(config_json).read_text())
    versions = json.loads(Path(versions_json).read_text())
    variant_dirs = {variant_of(Path(i)).key: Path(i).parent for i in cell_indexes}

    uri = resolve_uri(uri, root)
    mlflow.set_tracking_uri(uri)
    with store_lock(uri, root):
        # inside the lock: opening a new sqlite store creates/migrates its tables, which must not race
        client = MlflowClient(tracking_uri=uri)
        exp = client.get_experiment_by_name(experiment)
        exp_id = exp.experiment_id if exp else client.create_experiment(
            experiment, artifact_location=(root / "mlartifacts").resolve().as_uri(), tags=EXPERIMENT_KIND)
        for k, v in EXPERIMENT_KIND.items():
            client.set_experiment_tag(exp_id, k, v)
        names = sorted(points)
        vtags = {f"version.{k}": str(v) for k, v in versions.items()}
        base_tags = {**vtags, "git_sha": versions.get("git_sha", ""), "git_dirty": versions.get("git_dirty", ""),
                     "model_revision": versions.get("model_revision", ""), "model_sha256": versions.get("model_sha256", ""),
                     "config_hash": versions.get("config_hash", "")}
        span = _cells_span_ms(rows, variant_dirs)
        parent = client.create_run(exp_id, run_name=f"{'+'.join(names)} {time.strftime('%Y-%m-%d %H:%M:%S')}",
                                   tags={**base_tags, "bakeoff.role": "invocation", "bakeoff.points": " ".join(names)},
                                   start_time=span[0])
        pid = parent.info.run_id
        children: dict[str, str] = {}
        try:
            client.log_batch(pid, params=[Param("points", " ".join(names)),
                                          *(Param(f"sweep.{n}", points[n].get("sweep") or "-") for n in names)])
            now = int(time.time() * 1000)
            series = []
            for r in rows:
                c = int(r["concurrency"])
                for m in SERIES_METRICS:
                    if (v := number(r.get(m))) is not None:
                        key = f"{row_variant_key(r)}.p{r['prompt_len']}.{m}"
                        series.append(Metric(key, v, now, c))
            for batch in _chunks(series, 1000):
                client.log_batch(pid, metrics=batch)
            for p in (summary, config_json, versions_json):
                client.log_artifact(pid, str(p))
            for p in plots:
                client.log_artifact(pid, str(p), "plots")
            for key, d in variant_dirs.items():
                if (d / SERVER_LOG).is_file():
                    client.log_artifact(pid, str(d / SERVER_LOG), f"server_logs/{key}")

            for r in rows:
                point = points.get(r["experiment"])
                if point is None:
                    raise BakeoffError(f"summary row experiment {r['experiment']!r} is not in {config_json}")
                name = f"{row_variant_key(r)}/{row_cell_name(r)}"
                tags = {**base_tags, "mlflow.parentRunId": pid, "bakeoff.role": "cell", "engine": r["engine"],
                        "format": r["format"], "engine_version": r.get("engine_version", ""), "status": r.get("status", ""),
                        "reason": r.get("reason", "")[:5000], "experiment": r["experiment"],
                        "config_hash": r.get("config_hash") or base_tags["config_hash"],
                        "schema_version": r.get("schema_version", "")}
                d = variant_dirs.get(row_variant_key(r))
                cell_json = d / f"{row_cell_name(r)}.json" if d is not None else None
                record = json.loads(cell_json.read_text()) if cell_json is not None and cell_json.is_file() else {}
                started_ms, ended_ms = cell_times_ms(record)
                child = client.create_run(exp_id, run_name=name, tags=tags, start_time=started_ms)
                cid = child.info.run_id
                children[name] = cid
                params = [Param(k, v) for k, v in cell_params(point["config"], r).items()]
                for batch in _chunks(params, 100):
                    client.log_batch(cid, params=batch)
                step = int(r["concurrency"])
                metrics = [Metric(k, v, ended_ms or now, step) for k, v in numeric_columns(r).items()]
                for batch in _chunks(metrics, 1000):
                    client.log_batch(cid, metrics=batch)
                if d is not None:
                    for f in (d / f"{row_cell_name(r)}.jsonl", d / f"{row_cell_name(r)}.json", d / SERVER_LOG):
                        if f.is_file():
                            client.log_artifact(cid, str(f), "requests" if f.suffix == ".jsonl" else "cell")
                client.set_tag(cid, "bakeoff.logged", "true")
                client.set_terminated(cid, "FINISHED", end_time=ended_ms)
        except BaseException:
            for cid in children.values():
                client.set_terminated(cid, "FAILED")
            client.set_terminated(pid, "FAILED")
            raise
        client.set_terminated(pid, "FINISHED", end_time=span[1])
    record = {"tracking_uri": uri, "experiment": experiment, "experiment_id": exp_id, "parent_run_id": pid,
              "ui_path": ui_path(exp_id), "children": children}
    atomic_write_text(Path(out), json.dumps(record, indent=2) + "\n")
    return record


def run_command(a: argparse.Namespace) -> None:
    """``bakeoff track``: this invocation in MLflow, a parent run and a child run per cell."""
    rec = log_invocation(summary=Path(a.summary), config_json=Path(a.config), versions_json=Path(a.versions),
                         cell_indexes=[Path(p) for p in a.indexes], plots=[Path(p) for p in a.plots],
                         uri=a.uri, experiment=a.experiment, out=Path(a.out), root=Path.cwd())
    print(f"parent run {rec['parent_run_id']} with {len(rec['children'])} cell runs in {rec['tracking_uri']}")
