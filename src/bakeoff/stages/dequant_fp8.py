"""Stage: the ``fp8-dequant`` format -- the FP8 checkpoint back in fp16.

This is the seed blog's fallback on GPUs without FP8 kernels (V100): serve the
FP8 model's *values* in fp16. Its weights carry FP8 rounding error but fp16
size and speed, which separates the format's quality cost from its speed.
Dequantization is compressed-tensors' own, through transformers' loader.
"""

from __future__ import annotations

from pathlib import Path

from bakeoff.config.stageargs import StageArgs
from bakeoff.errors import BakeoffError
from bakeoff.models.derived import save_hf_format
from bakeoff.models.hfmodel import drop_quantizer, strip_quant_params
from bakeoff.models.manifest import verify


def dequantize(src_dir: Path, out_dir: Path, fmt: str = "fp8-dequant") -> None:
    import compressed_tensors
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, CompressedTensorsConfig

    src = verify(src_dir)
    model = AutoModelForCausalLM.from_pretrained(
        src_dir, dtype=torch.float16, quantization_config=CompressedTensorsConfig(dequantize=True)
    )
    tok = AutoTokenizer.from_pretrained(src_dir)
    drop_quantizer(model)
    if strip_quant_params(model) == 0:
        raise BakeoffError(f"{src_dir}: no FP8 scales found: is this a compressed-tensors FP8 checkpoint?")
    save_hf_format(model, tok, out_dir, src, fmt,
                   derived_from=f"{src['format']} ({src['derived_from']})",
                   tool={"name": "compressed-tensors", "version": compressed_tensors.__version__})


def run_stage(a: StageArgs) -> None:
    """``bakeoff stage dequant-fp8``: the FP8 checkpoint (``--input``) back to 16 bits."""
    dequantize(a.dir("input"), a.out_dir, fmt=a.format or "fp8-dequant")
