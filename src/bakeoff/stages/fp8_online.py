"""Stage: the ``fp8-online`` format -- vLLM's own dynamic FP8, made by the server at load (``--quantization fp8``).

Why a format of its own: it is the FP8 the seed ran (an fp16 checkpoint served
with ``--quantization fp8``: per-tensor E4M3 weight scales computed at load,
activation scales computed per batch), and no checkpoint on disk is FP8. So
the rows must name it apart from ``fp8`` and ``fp8-dynamic``, the
compressed-tensors checkpoints bakeoff writes. The directory holds the fp16
input's files (hard links where the filesystem allows) and a manifest whose
``serve_settings`` tell the vLLM engine to quantize at load; its weight bytes
are what the server then holds: the decoder layers' matrices at one byte, the
embeddings, output head and norms at two. A synthetic input keeps its
``load_format: dummy``.
"""

from __future__ import annotations

import math
import os
import shutil
from pathlib import Path

from bakeoff.config.stageargs import StageArgs
from bakeoff.errors import BakeoffError
from bakeoff.layout import MANIFEST
from bakeoff.models.artifacts import staged_dir
from bakeoff.models.manifest import verify, write_format_manifest

SERVE_SETTINGS = {"quantization": "fp8"}
QUANTIZATION = {"by": "vLLM at load (--quantization fp8)", "weights": "FP8 E4M3, one scale per tensor",
                "activations": "FP8 E4M3, dynamic per-tensor scale", "kept_16bit": "embeddings, lm_head, norms"}


def _linear_params(src_dir: Path, src: dict) -> tuple[int, int]:
    """(all parameters, those in the decoder layers' projection matrices) of the fp16 input."""
    if src.get("shape"):  # a synthetic shape without weights
        from bakeoff.models.synthetic import Shape

        shape = Shape(**src["shape"])
        return shape.n_params(), shape.linear_params()
    from bakeoff.models.weights import _safetensors_header

    total = linear = 0
    for f in sorted(src_dir.glob("*.safetensors")):
        for name, meta in _safetensors_header(f).items():
            if name == "__metadata__":
                continue
            n = math.prod(meta["shape"])
            total += n
            if ".layers." in name and name.endswith("proj.weight") and len(meta["shape"]) == 2:
                linear += n
    if total == 0:
        raise BakeoffError(f"{src_dir}: no weights and no synthetic shape to count FP8 weight bytes from")
    return total, linear


def make(input_dir: Path, out_dir: Path, fmt: str = "fp8-online") -> None:
    src = verify(input_dir)
    if src.get("bits_per_weight", 16) < 15.5:
        raise BakeoffError(f"{input_dir}: fp8-online quantizes a 16-bit checkpoint at load; this input is "
                           f"{src.get('bits_per_weight')} bits a weight")
    n, linear = _linear_params(input_dir, src)
    nbytes = linear + 2 * (n - linear)
    with staged_dir(out_dir) as stage:
        for f in sorted(input_dir.iterdir()):
            if f.name == MANIFEST or not f.is_file():
                continue
            try:
                os.link(f, stage / f.name)
            except OSError:
                shutil.copy2(f, stage / f.name)
        fields = {k: src[k] for k in ("load_format", "weights", "shape") if src.get(k)}
        write_format_manifest(stage, src, fmt, derived_from=f"{src['format']} ({src['derived_from']})",
                              tool={"name": "vllm", "version": "at serve time (--quantization fp8)"},
                              serve_settings=SERVE_SETTINGS, quantization=QUANTIZATION, n_params=n,
                              weight_bytes=nbytes, bits_per_weight=round(8 * nbytes / n, 4), **fields)


def run_stage(a: StageArgs) -> None:
    """``bakeoff stage fp8-online``: the 16-bit checkpoint (``--input``) marked for vLLM's online FP8."""
    make(a.dir("input"), a.out_dir, fmt=a.format or "fp8-online")
