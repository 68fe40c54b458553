"""Helpers for saving transformers models as plain checkpoints."""

from __future__ import annotations

from typing import Any


def drop_quantizer(model: Any) -> None:
    """Forget how a model was loaded (GGUF, compressed-tensors) once its weights are dense.

    Why: after dequantizing at load time the weights are ordinary fp16 tensors,
    but transformers still carries the loader's quantization config and refuses
    to (or wrongly would) write it into config.json. Dropping it yields a plain
    fp16 checkpoint that any loader, vLLM included, reads as such.
    """
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config


# Parameters compressed-tensors attaches to quantized modules; none is a weight.
QUANT_PARAM_NAMES = ("weight_scale", "weight_zero_point", "weight_global_scale", "input_scale",
                     "input_zero_point", "input_global_scale", "output_scale", "output_zero_point")


def strip_quant_params(model: Any) -> int:
    """Remove leftover scale/zero-point parameters from dequantized modules.

    Why: transformers' compressed-tensors loader dequantizes the weights in place
    but leaves each module's scales registered, so they would be saved as extra
    tensors that a plain fp16 loader does not expect. Returns how many went.
    """
    removed = 0
    for module in model.modules():
        for name in QUANT_PARAM_NAMES:
            if name in module._parameters:
                del module._parameters[name]
                removed += 1
        if hasattr(module, "quantization_scheme"):
            del module.quantization_scheme
    return removed
