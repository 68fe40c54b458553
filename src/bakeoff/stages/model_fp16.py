"""Stage: the ``fp16`` format, an HF safetensors checkpoint in float16.

* From a hub snapshot: load with transformers in float16 and save.
* From the embedded GGUF: transformers' GGUF loader dequantizes every tensor
  with gguf-py and undoes llama.cpp's q/k row permutation (convert_hf_to_gguf
  permutes attn_q/attn_k rows for rotary layout); it also rebuilds the
  tokenizer from the GGUF vocabulary. We save that as a normal checkpoint.

The manifest notes what the fp16 is derived from, so a reader knows that the
embedded model's "fp16" is fp16 *of a Q4_1 file*, not the original weights.
"""

from __future__ import annotations

from pathlib import Path

from bakeoff.config.stageargs import StageArgs
from bakeoff.errors import ModelSourceError
from bakeoff.models.derived import save_hf_format
from bakeoff.models.hfmodel import drop_quantizer
from bakeoff.models.manifest import verify


def _load(source_dir: Path, source: dict):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    if source["kind"] == "embedded":
        ggufs = sorted(source_dir.glob("*.gguf"))
        if len(ggufs) != 1:
            raise ModelSourceError(f"{source_dir}: expected one .gguf, found {[g.name for g in ggufs]}")
        tok_kw = {"gguf_file": ggufs[0].name}
        model_kw = {**tok_kw, "quantization_config": GgufConfig(dequantize=True)}
    else:
        tok_kw, model_kw = {}, {}
    tok = AutoTokenizer.from_pretrained(source_dir, **tok_kw)
    model = AutoModelForCausalLM.from_pretrained(source_dir, dtype=torch.float16, **model_kw)
    drop_quantizer(model)
    return model, tok


def dummy(source_dir: Path, out_dir: Path, src: dict, fmt: str) -> None:
    """A synthetic source's fp16: its shape as a config and tokenizer without weights (``--load-format dummy``)."""
    from bakeoff.models.artifacts import staged_dir
    from bakeoff.models.manifest import write_format_manifest
    from bakeoff.models.synthetic import Shape, write_dummy_hf

    shape = Shape(**src["source"]["shape"])
    with staged_dir(out_dir) as stage:
        info = write_dummy_hf(shape, stage, source_dir)
        write_format_manifest(stage, src, fmt, derived_from=f"{src['format']} ({src['derived_from']})",
                              tool={"name": "bakeoff.models.synthetic", "version": "config.json + tokenizer"}, **info)


def convert(source_dir: Path, out_dir: Path, fmt: str = "fp16") -> None:
    """Write ``out_dir`` as an fp16 HF checkpoint of the verified source (a synthetic one: without weights)."""
    src = verify(source_dir)
    if src["source"]["kind"] == "synthetic":
        return dummy(source_dir, out_dir, src, fmt)
    import transformers

    model, tok = _load(source_dir, src["source"])
    save_hf_format(model, tok, out_dir, src, fmt,
                   derived_from=src["derived_from"],
                   tool={"name": "transformers", "version": transformers.__version__})


def run_stage(a: StageArgs) -> None:
    """``bakeoff stage model-fp16``: the fetched checkpoint (``--input``) as 16-bit safetensors."""
    convert(a.dir("input"), a.out_dir, fmt=a.format or "fp16")
