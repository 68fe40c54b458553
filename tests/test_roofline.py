"""Decode roofline: the ceiling formula, its inputs, and the summary's efficiency column."""

from __future__ import annotations

import json

import pytest

from bakeoff.composition.compose import load_config
from bakeoff.results import published, roofline

from conftest import Pipeline

GIB = 2**30


def test_ceiling_reproduces_the_published_h200_roofline() -> None:
    """4.3 TB/s over Q4_0 (3.56 GiB) and F16 (12.55 GiB) weights: the reference's ~1125 and ~318 tok/s."""
    pub = {r.id: r for r in published.load().rows}
    h200 = load_config(["hardware=h200"]).hardware
    assert roofline.decode_ceiling(h200.mem_bandwidth_gbs, 3.56 * GIB) == pytest.approx(pub["h200.roofline.q4_0"].value, rel=0.01)
    assert roofline.decode_ceiling(h200.mem_bandwidth_gbs, 12.55 * GIB) == pytest.approx(pub["h200.roofline.f16"].value, rel=0.01)


def test_tensor_parallel_adds_bandwidth_layer_split_does_not() -> None:
    hw = load_config(["experiment=blog_v100"]).hardware.model_dump()
    assert roofline.effective_bandwidth_gbs(hw, "vllm", {"tensor_parallel_size": 2}) == 1800.0
    assert roofline.effective_bandwidth_gbs(hw, "llamacpp", {"n_gpu_layers": 99}) == 900.0
    assert roofline.effective_bandwidth_gbs({"mem_bandwidth_gbs": None}, "vllm", {}) is None


def test_aggregate_ceiling_grows_with_concurrency_until_compute_bound() -> None:
    w, n = 14e9, 7e9  # fp16 7B
    assert roofline.aggregate_ceiling(900, w, 1) == pytest.approx(900e9 / w)
    assert roofline.aggregate_ceiling(900, w, 8) == pytest.approx(8 * 900e9 / w)
    # V100 112 TFLOPS fp16 over 2 * 7e9 FLOPs/token = 8000 tok/s caps c=256 (bandwidth alone: 16457)
    assert roofline.aggregate_ceiling(900, w, 256, peak_tflops=112, n_params=n) == pytest.approx(8000)


def test_row_columns_define_efficiency_from_tpot() -> None:
    row = {"median_tpot_ms": "20", "weight_bytes": "4.7e9", "concurrency": "8", "n_params": "7.6e9"}
    cols = roofline.row_columns(row, {"mem_bandwidth_gbs": 900.0, "gpus": 2, "peak_tflops_fp16": 112.0},
                                "llamacpp", {"parallel": 4})
    ceiling = 900e9 / 4.7e9
    assert cols["decode_tok_s"] == pytest.approx(50)
    assert cols["decode_ceiling_tok_s"] == pytest.approx(ceiling)
    assert cols["decode_efficiency_pct"] == pytest.approx(100 * 50 / ceiling)
    assert cols["decode_ceiling_aggregate_tok_s"] == pytest.approx(8 * ceiling)
    # missing inputs leave the columns empty instead of inventing numbers
    empty = roofline.row_columns({"median_tpot_ms": ""}, {"mem_bandwidth_gbs": None}, "vllm", {})
    assert empty["decode_efficiency_pct"] == "" and empty["decode_ceiling_tok_s"] == ""
    with pytest.raises(ValueError, match="positive"):
        roofline.decode_ceiling(900, 0)


@pytest.mark.slow
def test_pipeline_summary_has_efficiency_for_every_ok_cell(pipeline: Pipeline) -> None:
    ok = [r for r in pipeline.rows() if r["status"] == "ok"]
    assert ok
    measured = json.loads(pipeline.hardware_path.read_text())["cpu"]["mem_bandwidth_gbs"]
    for r in ok:
        # on CPU the doctor's measured copy bandwidth replaces the configured estimate
        assert r["bandwidth_source"] == "measured"
        bw = float(r["mem_bandwidth_gbs"])
        assert bw == pytest.approx(measured, rel=1e-4)
        expect = 100 * (1000 / float(r["median_tpot_ms"])) / (bw * 1e9 / float(r["weight_bytes"]))
        assert float(r["decode_efficiency_pct"]) == pytest.approx(expect, rel=1e-4), r


def test_served_weight_bytes_follow_the_dtype_the_engine_computes_in() -> None:
    from bakeoff.engines import get_engine

    vllm, llama = get_engine("vllm"), get_engine("llamacpp")
    fp16 = {"weight_bytes": 1000, "bits_per_weight": 16.0}
    fp8 = {"weight_bytes": 560, "bits_per_weight": 8.9}
    assert vllm.served_weight_bytes(fp16, {"dtype": "float32"}) == 2000
    assert vllm.served_weight_bytes(fp16, {"dtype": "bfloat16"}) == 1000
    assert vllm.served_weight_bytes(fp8, {"dtype": "float32"}) == 560  # quantized weights stay quantized
    assert llama.served_weight_bytes(fp16, {}) == 1000
