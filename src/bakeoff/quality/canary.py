"""The logprob canary: proof that a server really scores prompts before lm-eval trusts it.

lm-eval's ``local-completions`` computes loglikelihoods from ``echo=True``
prompt logprobs. A server that ignores ``echo`` (llama-server does: it returns
logprobs for the generated token only) makes lm-eval sum an empty slice and
silently report a chance-level score (llama.cpp issue #27174). So before any
evaluation we send lm-eval's exact loglikelihood request for a known sentence
and check that:

1. a logprob comes back for every prompt token after the first;
2. every one is finite;
3. the sentence scores clearly better per token than a shuffled copy of itself.

Any failure raises :class:`CanaryError`, and the variant gets no quality score.
"""

from __future__ import annotations

import math
import random
from typing import Any

import requests

from bakeoff.errors import BakeoffError

SENTENCE = ("The quick brown fox jumps over the lazy dog, and then it runs back into the forest "
            "before the farmer wakes up in the morning.")
# Mean logprob per token must beat the shuffled copy by this much (nats). Measured on
# SmolLM2-135M: about 3 nats; a model that cannot read is at ~0.
MIN_MARGIN_NATS = 1.0


class CanaryError(BakeoffError):
    """The server's prompt logprobs cannot be trusted for evaluation."""


def shuffled(text: str, seed: int = 0) -> str:
    words = text.split()
    rng = random.Random(seed)
    while True:
        out = words[:]
        rng.shuffle(out)
        if out != words:
            return " ".join(out)


def prompt_logprobs(base_url: str, model: str, prompt: str | list[int], *, top: int = 1,
                    api_key: str | None = None, timeout: float = 120) -> dict[str, Any]:
    """lm-eval's own loglikelihood request (echo, max_tokens=1); returns the choice's ``logprobs``."""
    payload = {"model": model, "prompt": prompt, "temperature": 0, "max_tokens": 1, "logprobs": top, "seed": 1234,
               "echo": True}
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    r = requests.post(f"{base_url}/v1/completions", json=payload, headers=headers, timeout=timeout)
    if r.status_code != 200:
        raise CanaryError(f"{base_url}/v1/completions answered {r.status_code} to an echo+logprobs request: "
                          f"{r.text[:300]}")
    choice = r.json()["choices"][0]
    lp = choice.get("logprobs")
    if not lp or "token_logprobs" not in lp:
        raise CanaryError("the server returned no logprobs for an echo+logprobs request: it does not echo prompt "
                          "logprobs, so lm-eval would score at chance level")
    return lp


def _mean_prompt_logprob(lp: dict[str, Any], n_prompt: int, what: str) -> float:
    values = lp["token_logprobs"]
    # lm-eval reads echo as: n_prompt prompt entries (the first None: nothing predicts it) + 1 generated,
    # and sums token_logprobs[ctxlen:-1]. Any other shape shifts or empties that slice.
    if len(values) <= 2 < n_prompt:
        raise CanaryError(
            f"{what}: {len(values)} logprob entries for a {n_prompt}-token prompt: the server does not echo prompt "
            "logprobs, so lm-eval would score at chance level")
    if len(values) != n_prompt + 1:
        raise CanaryError(
            f"{what}: {len(values)} logprob entries for {n_prompt} prompt tokens + 1 generated: misaligned, "
            "lm-eval would attribute logprobs to the wrong tokens")
    scored = [v for v in values[1:n_prompt] if v is not None]
    if len(scored) < n_prompt - 1:
        raise CanaryError(f"{what}: logprobs for only {len(scored)} of {n_prompt - 1} prompt tokens")
    bad = [v for v in scored if not math.isfinite(v)]
    if bad:
        raise CanaryError(f"{what}: {len(bad)} prompt logprobs are not finite (e.g. {bad[0]})")
    return sum(scored) / len(scored)


def check(base_url: str, model: str, tokenizer: Any, api_key: str | None = None,
          as_text: bool = False) -> dict[str, float]:
    """Run the canary; returns its numbers (recorded with the scores) or raises CanaryError.

    lm-eval sends token ids; ``as_text`` sends the text instead (for servers
    that only take strings), counting tokens with the same tokenizer.
    """
    result: dict[str, float] = {}
    for name, text in (("sentence", SENTENCE), ("shuffled", shuffled(SENTENCE))):
        ids = tokenizer.encode(text, add_special_tokens=False)
        lp = prompt_logprobs(base_url, model, text if as_text else ids, api_key=api_key)
        result[f"canary_{name}_mean_logprob"] = _mean_prompt_logprob(lp, len(ids), name)
    margin = result["canary_sentence_mean_logprob"] - result["canary_shuffled_mean_logprob"]
    result["canary_margin_nats"] = margin
    if margin < MIN_MARGIN_NATS:
        raise CanaryError(f"a known sentence scores only {margin:.2f} nats/token better than its shuffled copy "
                          f"(need >= {MIN_MARGIN_NATS}): the prompt logprobs do not reflect the text")
    return result
