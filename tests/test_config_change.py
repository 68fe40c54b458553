"""After a config change every variant is re-measured, and the summary never holds rows of two configs.

Snakemake re-runs a job on changed params only where it kept a record of them; a job without one (outputs
copied in, a node's results unpacked) was skipped, and the summary then mixed old and new rows. Here the
serving jobs' config slice is an input named by its hash, each variant's index records the config hash it
was served under, and the summary refuses an experiment whose variants disagree.
"""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest

from bakeoff.composition.sweep import points_from_snakemake
from bakeoff.errors import BakeoffError
from bakeoff.loadgen.blocks import schedule
from bakeoff.stages.summary import rows

from conftest import EXPERIMENT, ROOT, Pipeline, planned_jobs, results_root


def _index(path: Path, fmt: str, config_hash: str | None) -> Path:
    path.mkdir(parents=True)
    cell = {"experiment": "e", "engine": "llamacpp", "format": fmt, "concurrency": 1, "prompt_len": 32, "status": "ok"}
    (path / "cells.json").write_text(json.dumps({"variant": {"experiment": "e", "engine": "llamacpp", "format": fmt},
                                                 **({"config_hash": config_hash} if config_hash else {}),
                                                 "cells": [cell]}))
    return path / "cells.json"


def test_the_summary_refuses_variants_of_another_config_and_names_them(tmp_path: Path) -> None:
    fresh, stale, unknown = (_index(tmp_path / f, f, h) for f, h in (("f16", "new"), ("q8_0", "old"), ("q4_k_m", None)))
    assert [r["config_hash"] for r in rows([fresh], {"e": "new"})] == ["new"]
    with pytest.raises(BakeoffError) as e:
        rows([fresh, stale, unknown], {"e": "new"})
    msg = str(e.value)
    assert "experiment e (config new)" in msg and "llamacpp-q8_0 (made under old" in msg
    assert "llamacpp-q4_k_m (made under no recorded config" in msg and "llamacpp-f16" not in msg


def test_a_record_served_under_an_earlier_config_is_summarized_only_under_its_one_hash(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`--config served_config_hash=<hash>` (a GPU node's record made by an earlier bakeoff, re-made into pages):
    the summary takes rows of that one hash as they are, still refuses any other, and the entry is no override."""
    from bakeoff.cli import main
    from bakeoff.composition.sweep import SERVED_KEY

    old, older = _index(tmp_path / "f16", "f16", "old"), _index(tmp_path / "q8_0", "q8_0", "older")
    out = tmp_path / "summary.csv"

    def summary(*args: str) -> str:
        rc = main(["summary", *args, "--config-hash", "new", "--out", str(out)])
        return capsys.readouterr().err if rc else ""

    assert "served_config_hash=<hash>" in summary(str(old))
    assert summary(str(old), "--served-config-hash", "old") == ""
    assert [r["config_hash"] for r in csv.DictReader(out.open())] == ["old"]
    mixed = summary(str(old), str(older), "--served-config-hash", "old")
    assert "llamacpp-q8_0 (made under older" in mixed and "llamacpp-f16" not in mixed
    assert "llamacpp-f16 (made under old," in summary(str(old), "--served-config-hash", "older")
    plain = points_from_snakemake({"experiment": "smoke"})[0]
    assert points_from_snakemake({"experiment": "smoke", SERVED_KEY: "old"})[0].hash == plain.hash


def test_a_fresh_working_directory_plans_every_variant_with_its_spec(tmp_path: Path) -> None:
    """No .snakemake/ yet (a fresh clone): every serving job's spec exists before Snakemake lists its folder.

    Snakemake caches a folder's listing, so a spec written by an input function after that listing read as a
    missing input for every variant but the first."""
    run = Pipeline(results_root(tmp_path))
    last = "results/raw/smoke/smollm2-135m/llamacpp-q4_k_m/cells.json"  # its order edges pull in the variants before it
    plan = run.snakemake("-n", "--forceall", "--cores", "1", "--config", "experiment=smoke", "--", last).stdout
    served = {Path(f["output"].split()[0]).parent.name for rule, f in planned_jobs(plan) if rule == "serve_load"}
    assert served >= {"llamacpp-q8_0", "llamacpp-q4_k_m", "vllm-fp16", "vllm-fp8"}, plan[-3000:]
    specs = list((tmp_path / ".snakemake" / "bakeoff-specs").glob("*.json"))
    assert {json.loads(s.read_text()).get("engine_name") for s in specs} >= {"llamacpp", "vllm"}


def test_a_spec_is_dated_by_the_config_its_output_was_made_under(tmp_path: Path) -> None:
    """A serving job's spec, written anew (fresh clone, copied results/), re-runs nothing where the output was made
    under the current config (dated 1970), and re-runs it where the output is of another config (dated now)."""
    run = Pipeline(results_root(tmp_path))
    (point,) = points_from_snakemake({"experiment": "smoke"}, conf_dir=ROOT / "conf")
    cells = Path("results/raw/smoke/smollm2-135m/llamacpp-q4_k_m/cells.json")

    def spec_mtime(made_under: str) -> float:
        (run.root / cells).parent.mkdir(parents=True, exist_ok=True)
        (run.root / cells).write_text(json.dumps({"config_hash": made_under, "cells": []}))
        run.snakemake("-n", "--cores", "1", "--config", "experiment=smoke", "--", str(cells))
        specs = [json.loads(f.read_text()) | {"path": f} for f in (run.root / ".snakemake" / "bakeoff-specs").glob("*.json")]
        (spec,) = [d["path"] for d in specs if (d.get("engine_name"), d.get("format")) == ("llamacpp", "q4_k_m")]
        return spec.stat().st_mtime

    assert spec_mtime(point.hash) == 0
    assert spec_mtime("another") >= (run.root / cells).stat().st_mtime
    assert spec_mtime(point.hash) == 0  # switched back: the same spec file, dated old again


@pytest.mark.slow
def test_a_load_change_re_measures_every_variant_even_without_snakemakes_records(pipeline: Pipeline,
                                                                                   tmp_path: Path) -> None:
    """The finished ci run's results, copied without .snakemake/ (no params records), then c=[1] only."""
    run = Pipeline(results_root(tmp_path / "run"))
    shutil.copytree(pipeline.results, run.results, symlinks=True)
    change = ("--config", f"experiment={EXPERIMENT}", "overrides=load.concurrency=[1]")
    plan = run.snakemake("-n", "--cores", "all", *change, "--", "results/summary.csv").stdout
    served = sorted(f["output"] for rule, f in planned_jobs(plan) if rule == "serve_load")
    variants = sorted({f"{r['engine']}-{r['format']}" for r in pipeline.rows()})
    assert len(served) == len(variants) == 4, plan[-3000:]
    run.snakemake("--cores", "all", *change, "--", "results/summary.csv")
    with open(run.summary_path, newline="") as f:
        after = list(csv.DictReader(f))
    fixed = [r for r in after if not r.get("probe_of")]
    assert sorted({f"{r['engine']}-{r['format']}" for r in fixed}) == variants
    assert {r["concurrency"] for r in fixed} == {"1"}  # no variant kept its c=4 rows from the old config
    assert len({r["config_hash"] for r in after}) == 1 and after[0]["config_hash"] != pipeline.rows()[0]["config_hash"]
    # unchanged config: nothing left to run
    again = run.snakemake("-n", "--cores", "all", *change, "--", "results/summary.csv").stdout
    assert not [rule for rule, _ in planned_jobs(again) if rule == "serve_load"], again[-2000:]


@pytest.mark.slow
def test_a_re_made_predecessor_re_measures_nothing(pipeline: Pipeline, tmp_path: Path) -> None:
    """The serving jobs are chained in the schedule's order. Re-making one (--forcerun its index) re-runs it and
    the jobs after it, none before, and every one reuses its kept cells: no cell is measured again."""
    run = Pipeline(results_root(tmp_path / "run"))
    shutil.copytree(pipeline.results, run.results, symlinks=True)
    (point,) = points_from_snakemake({"experiment": EXPERIMENT}, conf_dir=ROOT / "conf")
    cfg = point.cfg
    assert cfg.load.repeats == 1  # one slot per variant: its serve_load job
    slots = schedule(cfg.variants(), 1, cfg.load.block_seed)
    first = slots[1]  # the second: one variant runs before it, two after
    remake = ("--forcerun", str((run.raw / f"{first.engine}-{first.format}" / "cells.json").relative_to(run.root)))
    plan = run.snakemake("-n", "--cores", "all", "--config", f"experiment={EXPERIMENT}", *remake, "--",
                         "results/summary.csv").stdout
    served = [Path(f["output"].split(",")[0]).parent.name for rule, f in planned_jobs(plan) if rule == "serve_load"]
    assert sorted(served) == sorted(f"{s.engine}-{s.format}" for s in slots[1:]), plan[-3000:]
    run.snakemake("--cores", "all", "--config", f"experiment={EXPERIMENT}", *remake, "--", "results/summary.csv")
    for index in pipeline.raw.glob("*/cells.json"):
        cells = json.loads(index.read_text())["cells"]
        again = json.loads((run.raw / index.parent.name / "cells.json").read_text())["cells"]
        assert cells and [(c["cell"], c.get("started_utc")) for c in again] == [
            (c["cell"], c.get("started_utc")) for c in cells], index.parent.name  # kept, as measured then
