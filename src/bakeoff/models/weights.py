"""Weight accounting for manifests: parameter count, weight bytes, bits/weight.

Why here and not per stage: every format is compared on the same definition.
``weight_bytes`` counts tensor data only (quantization scales included, file
headers, tokenizer and config excluded); ``n_params`` counts the logical
weights (scales are not parameters). bits/weight = 8 * weight_bytes / n_params.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any

GIB = 1 << 30  # GPU memory is stated in GiB everywhere (hardware.gpu_memory_gib, NVML's MiB / 1024)

# safetensors dtype -> bytes per element
_ST_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "I64": 8, "I32": 4,
             "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}
# compressed-tensors companions of a weight, not weights themselves
_AUX_SUFFIXES = ("_scale", "_zero_point", "_g_idx", "weight_shape", "input_global_scale", "weight_global_scale")


def _safetensors_header(path: Path) -> dict:
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(n))


def safetensors_stats(model_dir: Path) -> dict[str, float | int]:
    n_params = 0
    nbytes = 0
    for f in sorted(Path(model_dir).glob("*.safetensors")):
        for name, meta in _safetensors_header(f).items():
            if name == "__metadata__":
                continue
            count = math.prod(meta["shape"])
            nbytes += count * _ST_BYTES[meta["dtype"]]
            if not name.endswith(_AUX_SUFFIXES):
                n_params += count
    return _finish(n_params, nbytes)


def gguf_stats(path: Path) -> dict[str, float | int]:
    from gguf import GGUFReader

    return reader_stats(GGUFReader(path))


def reader_stats(reader: Any) -> dict[str, float | int]:
    """gguf_stats of an open ``gguf.GGUFReader`` (reading a GGUF's fields takes seconds: read once)."""
    n_params = sum(int(t.n_elements) for t in reader.tensors)
    nbytes = sum(int(t.n_bytes) for t in reader.tensors)
    return _finish(n_params, nbytes)


def _finish(n_params: int, nbytes: int) -> dict[str, float | int]:
    return {
        "n_params": n_params,
        "weight_bytes": nbytes,
        "bits_per_weight": round(8 * nbytes / n_params, 4) if n_params else float("nan"),
    }


def gguf_kv_bytes_per_token(path: Path, cache_bytes: int = 2) -> int | None:
    """Bytes of KV cache one token takes in llama.cpp (f16 cache: ``cache_bytes`` 2), from the GGUF's shape:
    layers x KV heads x (key + value head size). None where the file does not state its attention shape."""
    from gguf import GGUFReader

    return reader_kv_bytes_per_token(GGUFReader(path), cache_bytes)


def reader_kv_bytes_per_token(reader: Any, cache_bytes: int = 2) -> int | None:
    """gguf_kv_bytes_per_token of an open ``gguf.GGUFReader`` (reading a GGUF's fields takes seconds: read once)."""

    def field(key: str) -> int | None:
        f = reader.fields.get(key)
        return int(f.parts[f.data[0]][0]) if f is not None and f.data else None

    f_arch = reader.fields.get("general.architecture")
    if f_arch is None:
        return None
    arch = bytes(f_arch.parts[f_arch.data[0]]).decode()
    layers, heads = field(f"{arch}.block_count"), field(f"{arch}.attention.head_count")
    kv_heads = field(f"{arch}.attention.head_count_kv") or heads
    width = field(f"{arch}.embedding_length")
    if not (layers and heads and kv_heads and width):
        return None
    k = field(f"{arch}.attention.key_length") or width // heads
    v = field(f"{arch}.attention.value_length") or width // heads
    return layers * kv_heads * (k + v) * cache_bytes
