"""Stage: GGUF quantization (``q8_0``, ``q4_k_m``) with the pinned llama-quantize."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from bakeoff.engines.toolchain import toolchain_bin
from bakeoff.errors import ToolchainError
from bakeoff.layout import GGUF_NAME
from bakeoff.models.artifacts import staged_dir
from bakeoff.models.manifest import read_manifest, verify, write_format_manifest
from bakeoff.models.weights import gguf_stats


def quantize(src_dir: Path, toolchain_dir: Path, out_dir: Path, gguf_type: str, fmt: str, threads: int = 0) -> None:
    src = verify(src_dir)
    tc = read_manifest(toolchain_dir)
    tool = toolchain_bin(toolchain_dir, "llama-quantize")
    with staged_dir(out_dir) as stage:
        out = stage / GGUF_NAME
        cmd = [str(tool), str(src_dir / GGUF_NAME), str(out), gguf_type]
        if threads:
            cmd.append(str(threads))
        proc = subprocess.run(cmd, capture_output=True, text=True)
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
        if proc.returncode != 0 or not out.is_file():
            raise ToolchainError(f"llama-quantize {gguf_type} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
        write_format_manifest(
            stage,
            src,
            fmt,
            derived_from=f"{src['format']} GGUF ({src['derived_from']})",
            tool={"name": "llama-quantize", "version": f"llama.cpp@{tc['commit']}"},
            gguf_type=gguf_type,
            **gguf_stats(out),
        )
