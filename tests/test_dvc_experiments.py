"""DVC brings an experiment back: with the small results cached, `dvc exp apply` and `dvc plots diff` work.

Two tiny experiments run through real DVC with **this repository's dvc.yaml** -- its outs (and their cache
settings), metrics and plots sections unchanged -- in a scratch git repository with the repository's
.gitignore (results/ is not in git, so git cannot bring results back; only DVC's cache can). Only the stage's command is
replaced: a stand-in script writes results of the same names and shapes (summary.csv columns the plots read,
metrics.json, capacity.csv, plots PNGs, samples, report pages) from a parameter in seconds, instead of the pipeline's
twenty minutes. What is tested is DVC's handling of those outs, not the pipeline's numbers.
"""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from conftest import BIN, ROOT

pytestmark = pytest.mark.slow  # about 40 s here: seven DVC commands

STANDIN = '''\
"""Stand-in for the pipeline (tests/test_dvc_experiments.py): writes results/ shaped like bakeoff's from params.yaml."""
import base64, json, pathlib, yaml
p = yaml.safe_load(open("params.yaml"))
r = pathlib.Path("results")
for d in ("models", "build", "results/raw", "results/samples", "results/plots", "results/report"):
    pathlib.Path(d).mkdir(parents=True, exist_ok=True)
for d in ("models", "build", "results/raw"):
    (pathlib.Path(d) / "keep").write_text("state")
rows = ["concurrency,output_throughput,median_tpot_ms,decode_efficiency_pct"]
rows += [f"{c},{p['scale'] * 10 * c},{20.0 / p['scale']},{p['scale'] * 30}" for c in p["load"]["concurrency"]]
(r / "summary.csv").write_text("\\n".join(rows) + "\\n")
(r / "capacity.csv").write_text("variant,capacity_concurrency\\nllamacpp-f16," + str(p["scale"] * 4) + "\\n")
(r / "metrics.json").write_text(json.dumps({"ci": {"llamacpp-f16": {"c1-p128": {"output_throughput": p["scale"] * 10}}}}))
(r / "samples" / "ci.md").write_text(f"scale {p['scale']}\\n")
(r / "report" / "summary.html").write_text(f"<p>scale {p['scale']}</p>\\n")
png = base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAQAAAC1HAwCAAAAC0lEQVR42mNkYAAAAAYAAjCB0C8AAAAASUVORK5CYII=")
for name in ("throughput_vs_concurrency", "ttft", "tpot", "quality_vs_speed", "roofline"):
    (r / "plots" / f"{name}.png").write_bytes(png + str(p["scale"]).encode())
'''


def _run(cmd: list[str], cwd: Path, env: dict) -> str:
    p = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, f"{cmd}:\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}"
    return p.stdout


def _summary(path: Path) -> list[dict]:
    return list(csv.DictReader(io.StringIO((path / "results" / "summary.csv").read_text())))


def test_two_experiments_can_be_shown_applied_and_their_plots_diffed(tmp_path: Path) -> None:
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "DVC_NO_ANALYTICS": "1",
           "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    dvc = str(BIN / "dvc")
    spec = yaml.safe_load((ROOT / "dvc.yaml").read_text())
    stage = spec["stages"]["bakeoff"]
    stage["cmd"], stage["deps"] = "python make_results.py", ["make_results.py"]  # the outs stay the repository's
    (tmp_path / "dvc.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    (tmp_path / "make_results.py").write_text(STANDIN)
    (tmp_path / "params.yaml").write_text("scale: 1\nload:\n  concurrency: [1, 4]\n")
    # The repository's .gitignore: results/ is never in git, so only DVC's cache can bring a result back.
    (tmp_path / ".gitignore").write_text((ROOT / ".gitignore").read_text())
    _run(["git", "init", "-q"], tmp_path, env)
    _run([dvc, "init", "-q"], tmp_path, env)
    _run(["git", "add", "-A"], tmp_path, env)
    _run(["git", "commit", "-qm", "tiny"], tmp_path, env)

    _run([dvc, "exp", "run", "-n", "slow", "-S", "scale=1"], tmp_path, env)
    _run([dvc, "exp", "run", "-n", "fast", "-S", "scale=2"], tmp_path, env)
    assert [r["output_throughput"] for r in _summary(tmp_path)] == ["20", "80"]  # the workspace: the last one

    shown = json.loads(_run([dvc, "exp", "show", "--json"], tmp_path, env))
    names = {e.get("name") for b in shown for e in (b.get("experiments") or [])
             for e in ([e] + (e.get("revs") or []))}
    assert {"slow", "fast"} <= names, shown

    _run([dvc, "exp", "apply", "slow"], tmp_path, env)  # brings back the cached results of the first
    assert [r["output_throughput"] for r in _summary(tmp_path)] == ["10", "40"]
    assert (tmp_path / "results" / "report" / "summary.html").read_text() == "<p>scale 1</p>\n"
    assert (tmp_path / "results" / "plots" / "tpot.png").read_bytes().endswith(b"1")

    diff = json.loads(_run([dvc, "plots", "diff", "slow", "fast", "--json"], tmp_path, env))["data"]
    (plot,) = diff["output throughput vs concurrency"]
    by_rev: dict[str, list[float]] = {}
    for v in plot["content"]["data"]["values"]:
        by_rev.setdefault(v["rev"], []).append(float(v["output_throughput"]))
    assert by_rev == {"slow": [10.0, 40.0], "fast": [20.0, 80.0]}
    assert "results/plots/tpot.png" in diff  # the PNGs of both experiments are there to compare too
