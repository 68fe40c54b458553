"""MLflow cell runs carry when their cell ran, and the experiment opens on its runs table.

A real MLflow sqlite store, fed by the real logging function from a two-cell result tree written here
(the records' timestamps are set to known values so the test can compare them).
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

from mlflow.tracking import MlflowClient

from bakeoff.layout import variant_dir
from bakeoff.results.tracking import EXPERIMENT_KIND, log_invocation, ui_path


def test_cell_runs_carry_their_cells_real_start_and_end(tmp_path: Path) -> None:
    vdir = variant_dir("smoke", "m", "llamacpp", "q8_0", root=tmp_path)
    vdir.mkdir(parents=True)
    times = {1: (1_700_000_000.25, 1_700_000_012.5), 8: (1_700_000_020.0, None)}
    rows = []
    for conc, (start, end) in times.items():
        record = {"started_utc": start, "duration_s": 3.5, **({"ended_utc": end} if end else {})}
        (vdir / f"c{conc}-p32.json").write_text(json.dumps(record))
        rows.append({"experiment": "smoke", "model": "m", "engine": "llamacpp", "format": "q8_0", "status": "ok",
                     "concurrency": str(conc), "prompt_len": "32", "repeat": "0", "output_throughput": "10.5"})
    (vdir / "cells.json").write_text("{}")
    summary = tmp_path / "summary.csv"
    with open(summary, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"smoke": {"config": {"engines": {"llamacpp": {}}, "formats": {"q8_0": {}}}}}))
    versions = tmp_path / "versions.json"
    versions.write_text(json.dumps({"git_sha": "abc"}))
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    rec = log_invocation(summary=summary, config_json=config, versions_json=versions, cell_indexes=[vdir / "cells.json"],
                         plots=[], uri=uri, experiment="bakeoff-test", out=tmp_path / "runs.json", root=tmp_path)
    client = MlflowClient(tracking_uri=uri)
    assert client.get_experiment(rec["experiment_id"]).tags.items() >= EXPERIMENT_KIND.items()
    exp_id = rec["experiment_id"]
    assert rec["ui_path"] == ui_path(exp_id) == f"/#/experiments/{exp_id}/runs?workflowType=machine_learning"
    runs = {r.info.run_name: r for r in client.search_runs([rec["experiment_id"]], "tags.`bakeoff.role` = 'cell'")}
    one, eight = runs["smoke/llamacpp-q8_0/c1-p32"].info, runs["smoke/llamacpp-q8_0/c8-p32"].info
    assert (one.start_time, one.end_time) == (1_700_000_000_250, 1_700_000_012_500)
    assert (eight.start_time, eight.end_time) == (1_700_000_020_000, 1_700_000_023_500)  # start + duration
    # the invocation's run spans its cells: the first start to the last end
    parent = client.get_run(rec["parent_run_id"]).info
    assert (parent.start_time, parent.end_time) == (1_700_000_000_250, 1_700_000_023_500)
