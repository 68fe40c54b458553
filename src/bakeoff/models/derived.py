"""Writing a derived format: one staged directory, what the tool made, and the format manifest.

Why one place: every format stage (fp16, FP8, its dequantized copy, the GGUFs)
ends the same way, and a half-written format must never look finished. The
directory appears only when its weights and manifest are complete, and the
manifest's size and bits-per-weight are read from the files written, not the
model in memory.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from bakeoff.errors import ToolchainError
from bakeoff.layout import GGUF_NAME
from bakeoff.models.artifacts import staged_dir
from bakeoff.models.manifest import write_format_manifest
from bakeoff.models.weights import gguf_stats, safetensors_stats


def save_hf_format(model: Any, tok: Any, out_dir: Path, src: Mapping[str, Any], fmt: str, *,
                   finish: Callable[[Path], None] | None = None, **fields: Any) -> None:
    """Save a transformers model and tokenizer as format ``fmt``; ``finish`` may add files before the manifest."""
    with staged_dir(out_dir) as stage:
        model.save_pretrained(stage, safe_serialization=True)
        if finish is not None:
            finish(stage)
        tok.save_pretrained(stage)
        write_format_manifest(stage, src, fmt, **fields, **safetensors_stats(stage))


def run_gguf_tool(cmd: Callable[[Path], list[str]], name: str, out_dir: Path, src: Mapping[str, Any], fmt: str,
                  **fields: Any) -> None:
    """Run a tool that writes one GGUF (``cmd(out)`` is its command line), then the format manifest."""
    with staged_dir(out_dir) as stage:
        out = stage / GGUF_NAME
        proc = subprocess.run(cmd(out), capture_output=True, text=True)
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
        if proc.returncode != 0 or not out.is_file():
            raise ToolchainError(f"{name} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
        write_format_manifest(stage, src, fmt, **fields, **gguf_stats(out))
