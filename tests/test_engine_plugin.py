"""An engine added from outside bakeoff: this module and one config file, with no edit anywhere else.

The engine here wraps a real server bakeoff already has (llama-server) under its own plugin name and
version string. The config file lives in the test's own folder, found through Hydra's search path, and
names the engine as ``"test_engine_plugin:RenamedLlamaCpp"``. The pipeline serves it, load-tests it and
summarizes it; the records show the plugin's own version string, so it was this class that served.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from bakeoff.engines import get_engine, register
from bakeoff.engines.llamacpp import LlamaCppEngine
from bakeoff.errors import BakeoffError

from conftest import MODEL, Pipeline, results_root

PLUGIN = f"{Path(__file__).stem}:RenamedLlamaCpp"


@register
class RenamedLlamaCpp(LlamaCppEngine):
    """llama-server under another name: only the registration and the version string are new."""

    name = "renamed_llamacpp"

    def versions(self) -> dict[str, str]:
        return {**super().versions(), "engine_version": "renamed-" + super().versions()["engine_version"]}


# The one config file: an experiment in the user's own config folder (the `ci` run's load, this engine only).
EXPERIMENT = f"""# @package _global_
defaults:
  - /engine@engines.mine: llamacpp
  - override /model: smollm2_135m
  - override /hardware: cpu
  - override /load: smoke
  - override /eval: none

experiment:
  name: plugin_ci
  variants:
    mine: [q4_k_m]

load:
  concurrency: [1, 4]
  prompt_len: [64]
  output_len: 16
  num_requests: 4
  requests_per_concurrency: 1
  warmup_requests: 1

engines:
  mine:
    plugin: "{PLUGIN}"
    settings:
      ctx_size: 4096
      parallel: 4
"""


def test_a_module_class_plugin_is_imported_and_checked():
    assert get_engine(PLUGIN) is RenamedLlamaCpp
    assert get_engine("renamed_llamacpp") is RenamedLlamaCpp  # registered by this module's import
    with pytest.raises(BakeoffError, match="cannot be loaded"):
        get_engine("no_such_module_here:Engine")
    with pytest.raises(BakeoffError, match="not a subclass"):
        get_engine("json:JSONDecoder")


@pytest.mark.slow
def test_an_engine_from_a_test_module_is_served_load_tested_and_summarized(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch):
    conf = tmp_path / "userconf"
    (conf / "experiment").mkdir(parents=True)
    (conf / "experiment" / "plugin_ci.yaml").write_text(EXPERIMENT)
    run = Pipeline(results_root(tmp_path / "run"), experiment="plugin_ci")
    # The user's module is importable from PYTHONPATH, by the Snakefile and by every stage it runs.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(Path(__file__).parent),
                                                                    os.environ.get("PYTHONPATH")])))
    run.snakemake("--cores", "all", "--config", "experiment=plugin_ci",
                  f"overrides=hydra.searchpath=[file://{conf}]", "--", "results/summary.csv")
    rows = run.rows()
    assert {(r["engine"], r["format"]) for r in rows} == {("mine", "q4_k_m")}
    assert {int(r["concurrency"]) for r in rows} == {1, 4}
    for r in rows:
        assert r["status"] == "ok", r
        assert float(r["output_throughput"]) > 0 and r["engine_version"].startswith("renamed-llama.cpp@"), r
        assert r["metrics_source"] == "renamed_llamacpp /metrics + /slots" and float(r["metrics_scrapes"]) > 0, r
    cells = json.loads((run.results / "raw" / "plugin_ci" / MODEL / "mine-q4_k_m" / "cells.json").read_text())
    assert cells["variant"]["engine"] == "mine"
    assert all(c["engine_version"].startswith("renamed-llama.cpp@") and c["completed"] == c["requests"]
               for c in cells["cells"])
