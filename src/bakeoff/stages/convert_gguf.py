"""Stage: the ``f16`` GGUF, written by the pinned ``convert_hf_to_gguf.py``.

The converter comes from the same llama.cpp tree as llama-quantize and
llama-server (and it imports that tree's gguf-py, not PyPI's), so the GGUF it
writes is one the pinned tools read.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from bakeoff.config.schema import QuantCfg
from bakeoff.config.stageargs import StageArgs
from bakeoff.errors import ToolchainError
from bakeoff.layout import GGUF_NAME
from bakeoff.models.artifacts import staged_dir
from bakeoff.models.derived import run_gguf_tool
from bakeoff.models.manifest import read_manifest, verify, write_format_manifest
from bakeoff.models.weights import gguf_stats


def _synthetic_f16(src: dict, src_dir: Path, out_dir: Path, outtype: str, fmt: str) -> None:
    """A synthetic source already is an F16 GGUF: the format is that file (hard-linked), not a conversion."""
    if outtype.upper() != "F16":
        raise ToolchainError(f"format {fmt!r}: a synthetic source is F16; make {outtype} with llama-quantize instead")
    with staged_dir(out_dir) as stage:
        try:
            os.link(src_dir / GGUF_NAME, stage / GGUF_NAME)
        except OSError:
            shutil.copy2(src_dir / GGUF_NAME, stage / GGUF_NAME)
        write_format_manifest(stage, src, fmt,
                              derived_from=f"source ({src['derived_from']})",
                       tool={"name": "bakeoff.models.synthetic", "version": "F16 as written"}, gguf_type="F16",
                       **gguf_stats(stage / GGUF_NAME))


def convert(src_dir: Path, source_tree: Path, out_dir: Path, outtype: str = "f16", fmt: str = "f16") -> None:
    src = verify(src_dir)
    if src.get("source", {}).get("kind") == "synthetic":
        return _synthetic_f16(src, src_dir, out_dir, outtype, fmt)
    tree_manifest = read_manifest(source_tree)
    script = source_tree / "llama.cpp" / "convert_hf_to_gguf.py"
    if not script.is_file():
        raise ToolchainError(f"{script} not found: is {source_tree} a llama.cpp source tree?")
    run_gguf_tool(lambda out: [sys.executable, str(script), str(src_dir), "--outtype", outtype.lower(),
                               "--outfile", str(out)],
                  "convert_hf_to_gguf.py", out_dir, src, fmt,
                  derived_from=f"{src['format']} ({src['derived_from']})",
                  tool={"name": "convert_hf_to_gguf.py", "version": f"llama.cpp@{tree_manifest['commit']}"},
                  gguf_type=outtype.upper())


def run_stage(a: StageArgs) -> None:
    """``bakeoff stage convert-gguf``: the 16-bit checkpoint as a GGUF, by the source tree's converter (``--tree``)."""
    q = a.spec_as(QuantCfg)
    convert(a.dir("input"), a.dir("tree"), a.out_dir, outtype=q.gguf_type or "F16", fmt=a.format or "f16")
