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
