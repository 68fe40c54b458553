"""Generations of a fixed prompt set at temperature 0, saved side by side per variant.

The seed judged quality partly by eye ("Q4_K_M occasionally slips on bracket
nesting and Chinese punctuation" in a quicksort program); these samples make
that comparison reproducible. They come from the serving engine itself, since
that is what a user of the variant gets.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import requests

from bakeoff.config.schema import SamplesCfg
from bakeoff.models.artifacts import read_kept


def samples_hash(cells_hash: str, cfg: SamplesCfg) -> str:
    """What a variant's samples depend on: the settings its cells were made with and the prompt set."""
    return hashlib.sha256(json.dumps([cells_hash, cfg.model_dump()]).encode()).hexdigest()[:16]


def made_with(path: Path, digest: str) -> bool:
    """Samples made with these inputs are kept for ``path`` (a failed attempt records no hash, so it is retried)."""
    kept = read_kept(path)
    return kept is not None and kept.get("samples_hash") == digest


def generate(base_url: str, model: str, prompts: list[str], max_tokens: int, api_key: str | None = None,
             timeout: float = 600) -> list[dict[str, Any]]:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    out = []
    for prompt in prompts:
        payload = {"model": model, "messages": [{"role": "user", "content": prompt}], "temperature": 0,
                   "max_tokens": max_tokens, "seed": 0}
        r = requests.post(f"{base_url}/v1/chat/completions", json=payload, headers=headers, timeout=timeout)
        if r.status_code != 200:
            out.append({"prompt": prompt, "text": None, "error": f"HTTP {r.status_code}: {r.text[:300]}"})
            continue
        choice = r.json()["choices"][0]
        out.append({"prompt": prompt, "text": choice["message"]["content"], "finish_reason": choice.get("finish_reason")})
    return out
