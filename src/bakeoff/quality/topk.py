"""Token-level KL divergence against the fp16 reference, from top-k prompt logprobs.

OpenAI-compatible servers return at most the top-k logprobs per position
(vLLM's default cap is 20), not full distributions. We score the same token
sequence on the variant and on its reference, and compute per position the KL
divergence of the two distributions *coarsened* onto the tokens both top-k
lists share plus one "everything else" bucket. By the data-processing
inequality this is a lower bound on the true KL; it is exact when the shared
tokens hold nearly all the mass, which is the case for a close quantization.
The mean over positions is reported.
"""

from __future__ import annotations

import math
from typing import Any

from bakeoff.quality.canary import CanaryError, prompt_logprobs

TOP_K = 20
_FLOOR = 1e-12


def score_topk(base_url: str, model: str, token_ids: list[int], window: int, *, top: int = TOP_K,
               api_key: str | None = None) -> list[dict[str, float]]:
    """Top-k logprobs for every position of ``token_ids`` after the first of each window."""
    out: list[dict[str, float]] = []
    for start in range(0, len(token_ids), window):
        chunk = token_ids[start:start + window]
        if len(chunk) < 2:
            break
        lp = prompt_logprobs(base_url, model, chunk, top=top, api_key=api_key, timeout=600)
        tops = lp.get("top_logprobs") or []
        if len(tops) < len(chunk) or any(t is None for t in tops[1:len(chunk)]):
            raise CanaryError(f"top-{top} prompt logprobs missing for some of {len(chunk)} positions")
        out += [{str(k): float(v) for k, v in t.items()} for t in tops[1:len(chunk)]]
    return out


def kl_position(ref: dict[str, float], var: dict[str, float]) -> float:
    """KL(ref || var) of the two top-k lists coarsened onto shared tokens + rest (nats)."""
    shared = ref.keys() & var.keys()
    p = {t: math.exp(ref[t]) for t in shared}
    q = {t: math.exp(var[t]) for t in shared}
    p_rest = max(_FLOOR, 1.0 - sum(p.values()))
    q_rest = max(_FLOOR, 1.0 - sum(q.values()))
    kl = sum(pt * (math.log(max(pt, _FLOOR)) - math.log(max(q[t], _FLOOR))) for t, pt in p.items())
    return max(0.0, kl + p_rest * (math.log(p_rest) - math.log(q_rest)))


def mean_kl(ref: list[dict[str, Any]], var: list[dict[str, Any]]) -> float:
    if len(ref) != len(var) or not ref:
        raise ValueError(f"KL needs the same positions on both sides: {len(ref)} vs {len(var)}")
    return sum(kl_position(r, v) for r, v in zip(ref, var, strict=True)) / len(ref)
