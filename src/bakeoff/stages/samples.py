"""Stage: ``results/samples/<experiment>/<model>.md`` -- every variant's answer to each prompt, side by side.

Markdown, so a reviewer can read a quicksort from vLLM fp16 next to the one
from llama.cpp q4_k_m (the seed's subjective check, made reproducible); a
JSON twin (same name, ``.json``) holds the same data for tools.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from bakeoff.models.artifacts import atomic_write_text


def collect(paths: list[Path], out: Path) -> None:
    variants: list[dict[str, Any]] = [json.loads(Path(p).read_text()) for p in paths]
    prompts: list[str] = []
    for v in variants:
        prompts += [s["prompt"] for s in v["samples"] if s["prompt"] not in prompts]
    lines = ["# Samples: fixed prompts, temperature 0", ""]
    for v in variants:
        if not v["samples"]:
            lines.append(f"- **{v['variant']}**: no samples ({v.get('reason') or 'none configured'})")
    for i, prompt in enumerate(prompts, 1):
        lines += ["", f"## Prompt {i}", "", "> " + prompt.replace("\n", "\n> "), ""]
        for v in variants:
            for s in v["samples"]:
                if s["prompt"] == prompt:
                    body = s["text"] if s.get("text") is not None else f"(error: {s.get('error')})"
                    lines += [f"### {v['variant']}", "", "````text", body.rstrip(), "````", ""]
    atomic_write_text(out.with_suffix(".json"), json.dumps(variants, indent=2, ensure_ascii=False) + "\n")
    atomic_write_text(out, "\n".join(lines) + "\n")


def run_command(a: argparse.Namespace) -> None:
    """``bakeoff samples``: the variants' sample generations side by side."""
    collect([Path(p) for p in a.variants], Path(a.out))
