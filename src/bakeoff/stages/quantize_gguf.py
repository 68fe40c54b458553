"""Stage: GGUF quantization (``q8_0``, ``q4_k_m``) with the pinned llama-quantize."""

from __future__ import annotations

from pathlib import Path

from bakeoff.config.schema import QuantCfg
from bakeoff.config.stageargs import StageArgs
from bakeoff.engines.toolchain import toolchain_bin
from bakeoff.errors import BakeoffError
from bakeoff.layout import GGUF_NAME
from bakeoff.models.derived import run_gguf_tool
from bakeoff.models.manifest import read_manifest, verify


def quantize(src_dir: Path, toolchain_dir: Path, out_dir: Path, gguf_type: str, fmt: str, threads: int = 0) -> None:
    src = verify(src_dir)
    tc = read_manifest(toolchain_dir)
    tool = toolchain_bin(toolchain_dir, "llama-quantize")
    run_gguf_tool(lambda out: [str(tool), str(src_dir / GGUF_NAME), str(out), gguf_type, *([str(threads)] if threads else [])],
                  f"llama-quantize {gguf_type}", out_dir, src, fmt,
                  derived_from=f"{src['format']} GGUF ({src['derived_from']})",
                  tool={"name": "llama-quantize", "version": f"llama.cpp@{tc['commit']}"},
                  gguf_type=gguf_type)


def run_stage(a: StageArgs) -> None:
    """``bakeoff stage quantize-gguf``: the f16 GGUF quantized to ``--spec``'s ``gguf_type``."""
    q = a.spec_as(QuantCfg)
    if not q.gguf_type:
        raise BakeoffError(f"format {a.format!r} has no gguf_type")
    quantize(a.dir("input"), a.dir("toolchain"), a.out_dir, q.gguf_type, str(a.format), threads=a.jobs or 0)
