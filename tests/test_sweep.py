"""Sweeps: Hydra sweep syntax from the command line becomes one DAG with one point per combination."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from bakeoff.composition.sweep import parse_sweep, points_from_snakemake, points_json
from bakeoff.errors import ConfigError
from bakeoff.results.derived import extend

from conftest import ROOT, snakemake, spec_texts

CONF = ROOT / "conf"
SMALL = "experiment.variants.vllm=[fp16] experiment.variants.llamacpp=[q4_k_m]"


def test_parse_sweep_is_the_cartesian_product_in_order() -> None:
    assert parse_sweep("a=1,2 b=x c=true,false") == [
        ["a=1", "b=x", "c=true"], ["a=1", "b=x", "c=false"], ["a=2", "b=x", "c=true"], ["a=2", "b=x", "c=false"]]
    assert parse_sweep("hardware.vllm_image=range(1,3)") == [["hardware.vllm_image=1"], ["hardware.vllm_image=2"]]
    assert parse_sweep(None) == [[]]
    with pytest.raises(ConfigError, match="cannot parse sweep"):
        parse_sweep("a=[1,")


def test_points_carry_their_axis_values() -> None:
    pts = points_from_snakemake({"overrides": SMALL, "sweep": "engines.llamacpp.settings.parallel=2,4 "
                                                              "engines.vllm.settings.enforce_eager=true,false"}, CONF)
    assert [p.name for p in pts] == ["smoke.parallel2-enforce_eagertrue", "smoke.parallel2-enforce_eagerfalse",
                                     "smoke.parallel4-enforce_eagertrue", "smoke.parallel4-enforce_eagerfalse"]
    assert pts[0].sweep == ("engines.llamacpp.settings.parallel=2", "engines.vllm.settings.enforce_eager=true")
    assert pts[0].cfg.engines["llamacpp"].settings["parallel"] == 2
    assert pts[3].cfg.engines["vllm"].settings["enforce_eager"] is False
    assert len({p.hash for p in pts}) == 4
    # the summary's axis columns come from the points
    import json

    data = json.loads(points_json(pts, CONF))
    rows = [{"experiment": p.name, "engine": "llamacpp", "format": "q4_k_m", "concurrency": "1",
             "median_tpot_ms": "10", "weight_bytes": "1e8", "engine_settings": ""} for p in pts]
    extend(rows, data, None)
    assert rows[2]["sweep"] == "engines.llamacpp.settings.parallel=4 engines.vllm.settings.enforce_eager=true"
    # overrides = what differs from the experiment's defaults (parallel=4 is smoke's default)
    assert not any(o.startswith("engines.llamacpp.settings.parallel") for o in rows[2]["overrides"].split())
    assert "engines.llamacpp.settings.parallel=2" in rows[0]["overrides"].split()
    # a row's config_hash is the one its variant was served under (its index), checked against the points by
    # bakeoff.stages.summary.rows; extend never overwrites it with the current config's
    assert "config_hash" not in rows[1] and data[pts[1].name]["config_hash"] == pts[1].hash


def test_sweeping_the_build_side_is_refused() -> None:
    with pytest.raises(ConfigError, match="changes the model, formats"):
        points_from_snakemake({"sweep": "formats.q4_k_m.gguf_type=Q4_K_M,Q5_K_M"}, CONF)
    with pytest.raises(ConfigError, match="cannot be combined"):
        points_from_snakemake({"composed": "params.yaml", "sweep": "load.output_len=8,16"}, CONF)


def test_sweep_plans_one_variant_job_per_point() -> None:
    out = snakemake("-n", "--cores", "1", "results/summary.csv", "--config", f"overrides={SMALL}",
                    "sweep=engines.llamacpp.settings.parallel=2,4 engines.vllm.settings.enforce_eager=true,false").stdout
    planned = {path.strip() for line in out.splitlines() if "output: results/raw/" in line
               for path in line.split("output:", 1)[1].split(",") if path.strip().endswith("cells.json")}
    expect = {f"results/raw/smoke.parallel{p}-enforce_eager{e}/smollm2-135m/{v}/cells.json"
              for p in (2, 4) for e in ("true", "false") for v in ("vllm-fp16", "llamacpp-q4_k_m")}
    assert planned == expect
    assert out.count("rule serve_load:") == 8
    assert out.count("rule quantize_gguf:") <= 1  # the build side is shared by every point (built once, if at all)


def test_dvc_composed_params_drive_the_dag(tmp_path: Path) -> None:
    """`dvc exp run -S load.concurrency=[1,8,32,64]`: DVC's own composition -> params.yaml -> Snakemake's plan."""
    from dvc.utils.hydra import compose_and_dump

    params = tmp_path / "params.yaml"
    compose_and_dump(params, str(CONF), None, "config", str(ROOT), ["load.concurrency=[1,8,32,64]"])
    out = snakemake("-n", "--cores", "1", "results/summary.csv", "--config", f"composed={params}").stdout
    assert out.count("rule serve_load:") == 6  # every variant of the composed experiment is measured
    assert "output: results/raw/smoke/smollm2-135m/vllm-fp16/cells.json" in out
    bad = tmp_path / "bad.yaml"
    compose_and_dump(bad, str(CONF), None, "config", str(ROOT), ["load.concurrency=[0]"])
    proc = snakemake("-n", "--cores", "1", "--config", f"composed={bad}", check=False)
    assert proc.returncode != 0 and "load.concurrency.0" in proc.stdout + proc.stderr


def test_committed_params_yaml_is_dvcs_composition_of_conf(tmp_path: Path) -> None:
    """`dvc repro` runs params.yaml as committed; it must equal what `dvc exp run` would compose."""
    from dvc.utils.hydra import compose_and_dump

    fresh = tmp_path / "params.yaml"
    compose_and_dump(fresh, os.fspath(CONF), None, "config", str(ROOT), [])
    assert (ROOT / "params.yaml").read_text() == fresh.read_text(), "params.yaml is stale: run `bakeoff dvc-params`"


def test_seed_vllm_version_ab_plans_both_images() -> None:
    """The seed's vLLM 0.5 vs 0.6 regression as a sweep: each point's servers get their own image."""
    images = ["vllm/vllm-openai:v0.5.5", "vllm/vllm-openai:v0.6.3.post1"]
    out = snakemake("-n", "-p", "--cores", "1", "results/summary.csv", "--config", "experiment=blog_v100",
                    f"sweep=hardware.vllm_image={','.join(images)}").stdout
    jobs = out.split("rule serve_load:")[1:]
    assert len(jobs) == 14  # 2 images x (vllm and vllm_open: fp16, fp8, fp8-dequant; llamacpp q4_k_m)
    image_of: dict[str, set[str]] = {}
    for j in jobs:
        point = re.search(r"results/raw/(blog_v100\.[^/]+)/", j).group(1)
        image_of.setdefault(point, set()).update(re.findall(r'"vllm_image": "([^"]+)"', spec_texts(j)))
    assert len(image_of) == 2
    assert sorted(img for imgs in image_of.values() for img in imgs) == images  # one image per point, both used


def test_narrowing_the_load_axes_keeps_a_cells_settings_hash() -> None:
    """A cell made by a narrowed run (one prompt length) is reused by the full run, and vice versa."""
    from bakeoff.config.schema import LoadCfg
    from bakeoff.loadgen.cells import cell_spec_hash

    base = {"engine": "llamacpp", "format": "q4_k_m", "engine_settings": {"parallel": 32}}
    full = LoadCfg(concurrency=[1, 8, 32], prompt_len=[128, 1024], output_len=256, num_requests=100)
    narrow = full.model_copy(update={"concurrency": [32], "prompt_len": [1024]})
    assert cell_spec_hash(base, narrow) == cell_spec_hash(base, full)
    # another format's request count does not touch this one's cells
    assert cell_spec_hash(base, full.model_copy(update={"num_requests_by_format": {"f16": 40}})) == \
        cell_spec_hash(base, full)
    # what a cell is made with still counts: requests, output length, the server's settings, repeats
    assert cell_spec_hash(base, full.model_copy(update={"num_requests": 40})) != cell_spec_hash(base, full)
    assert cell_spec_hash(base, full.model_copy(update={"output_len": 128})) != cell_spec_hash(base, full)
    assert cell_spec_hash({**base, "engine_settings": {"parallel": 4}}, full) != cell_spec_hash(base, full)
    three = full.model_copy(update={"repeats": 3})
    assert cell_spec_hash(base, three) != cell_spec_hash(base, full)
    # the block seed orders the servers, not what a cell sends
    assert cell_spec_hash(base, three.model_copy(update={"block_seed": 7})) == cell_spec_hash(base, three)
