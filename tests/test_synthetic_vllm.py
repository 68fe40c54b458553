"""The synthetic shape for vLLM: a config and tokenizer without weights, served with ``--load-format dummy``.

Fast: the tiny shape's GGUF is written with gguf-py and read back with gguf-py's reader; the HF directory
made from it (the fp16 stage) must describe the same model tensor for tensor, instantiated by transformers
on the meta device (no memory). Slow: vLLM's CPU build serves that directory through the pipeline.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bakeoff.composition.compose import load_config
from bakeoff.layout import GGUF_NAME
from bakeoff.stages.fetch_model import fetch
from bakeoff.stages.fp8_online import make
from bakeoff.stages.model_fp16 import convert

from conftest import results_root, snakemake

# llama.cpp's tensor names -> transformers' LlamaForCausalLM names ({i}: the layer).
HF_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head",
            "attn_norm": "model.layers.{i}.input_layernorm", "ffn_norm": "model.layers.{i}.post_attention_layernorm",
            "attn_q": "model.layers.{i}.self_attn.q_proj", "attn_k": "model.layers.{i}.self_attn.k_proj",
            "attn_v": "model.layers.{i}.self_attn.v_proj", "attn_output": "model.layers.{i}.self_attn.o_proj",
            "ffn_gate": "model.layers.{i}.mlp.gate_proj", "ffn_up": "model.layers.{i}.mlp.up_proj",
            "ffn_down": "model.layers.{i}.mlp.down_proj"}


def _hf_name(gguf_name: str) -> str:
    parts = gguf_name.removesuffix(".weight").split(".")
    if parts[0] == "blk":
        return HF_NAMES[parts[2]].format(i=parts[1]) + ".weight"
    return HF_NAMES[parts[0]] + ".weight"


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """The synthetic_tiny source (GGUF + tokenizer), its fp16 (no weights) and its fp8-online, as the stages write them."""
    root = tmp_path_factory.mktemp("tiny")
    cfg = load_config(["experiment=synthetic_tiny_vllm"])
    fetch(cfg.model, root / "source")
    convert(root / "source", root / "fp16", fmt="fp16")
    make(root / "fp16", root / "fp8-online", fmt="fp8-online")
    return root / "source", root / "fp16", root / "fp8-online"


def test_the_dummy_directory_has_the_ggufs_shape_tensor_for_tensor(tiny_dirs: tuple[Path, Path, Path]):
    import torch
    from gguf import GGUFReader
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    source, fp16, _ = tiny_dirs
    reader = GGUFReader(source / GGUF_NAME)
    kv = {f.name: f.contents() for f in reader.fields.values() if not f.name.startswith("tokenizer.ggml.")}
    cfg = json.loads((fp16 / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    assert (cfg["num_hidden_layers"], cfg["hidden_size"], cfg["intermediate_size"], cfg["num_attention_heads"],
            cfg["num_key_value_heads"], cfg["max_position_embeddings"]) == (
        kv["llama.block_count"], kv["llama.embedding_length"], kv["llama.feed_forward_length"],
        kv["llama.attention.head_count"], kv["llama.attention.head_count_kv"], kv["llama.context_length"])
    assert cfg["rope_theta"] == pytest.approx(kv["llama.rope.freq_base"])
    assert cfg["rms_norm_eps"] == pytest.approx(kv["llama.attention.layer_norm_rms_epsilon"])
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()
    assert cfg["vocab_size"] == len(tokens) == kv["llama.vocab_size"]
    assert (cfg["bos_token_id"], cfg["eos_token_id"]) == (reader.fields["tokenizer.ggml.bos_token_id"].contents(),
                                                          reader.fields["tokenizer.ggml.eos_token_id"].contents())
    gguf_shapes = {_hf_name(t.name): tuple(int(d) for d in reversed(t.shape)) for t in reader.tensors}
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(fp16))
    hf_shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
    assert hf_shapes == gguf_shapes  # every tensor, by name and shape
    for name in ("tokenizer.json", "tokenizer_config.json"):  # the same tokenizer, byte for byte
        assert (fp16 / name).read_bytes() == (source / name).read_bytes()
    tok = AutoTokenizer.from_pretrained(fp16)
    assert tok.convert_ids_to_tokens(list(range(300))) == tokens[:300]
    assert not list(fp16.glob("*.safetensors")) and not list(fp16.glob("*.bin"))
    m = json.loads((fp16 / "manifest.json").read_text())
    assert m["load_format"] == "dummy" and m["n_params"] == sum(int(t.n_elements) for t in reader.tensors)
    assert m["weight_bytes"] == 2 * m["n_params"] and m["format"] == "fp16"


def test_fp8_online_asks_vllm_for_its_own_fp8_and_counts_its_bytes(tiny_dirs: tuple[Path, Path, Path]):
    from gguf import GGUFReader

    source, fp16, fp8 = tiny_dirs
    m = json.loads((fp8 / "manifest.json").read_text())
    assert m["format"] == "fp8-online" and m["serve_settings"] == {"quantization": "fp8"}
    assert m["load_format"] == "dummy" and (fp8 / "config.json").read_bytes() == (fp16 / "config.json").read_bytes()
    tensors = GGUFReader(source / GGUF_NAME).tensors
    linear = sum(int(t.n_elements) for t in tensors if t.name.startswith("blk.") and len(t.shape) == 2)
    assert 0 < linear < m["n_params"]
    assert m["weight_bytes"] == linear + 2 * (m["n_params"] - linear)


@pytest.mark.slow
def test_vllm_cpu_serves_the_dummy_model_through_the_pipeline(tmp_path: Path):
    root = results_root(tmp_path / "run")
    cells = "results/raw/synthetic_tiny_vllm/synthetic-tiny/vllm-fp16/cells.json"
    snakemake("--cores", "all", "--config", "experiment=synthetic_tiny_vllm", "--", cells, cwd=root, timeout=1500)
    index = json.loads((root / cells).read_text())
    ok = [c for c in index["cells"] if c["status"] == "ok"]
    assert len(ok) == 2 and all(c["completed"] == c["requests"] > 0 for c in ok)
    records = (root / cells).parent / "c2-p32.jsonl"
    lines = [json.loads(x) for x in records.read_text().splitlines() if x.strip()]
    assert lines and all(r["output_tokens"] == 16 for r in lines if r.get("success", True))
    log = ((root / cells).parent / "server.log").read_text()
    assert "--load-format dummy" in log or "load_format='dummy'" in log or "'load_format': 'dummy'" in log
    assert ok[0]["engine_version"] == "0.32.0"  # the vLLM that served, asked of its interpreter
