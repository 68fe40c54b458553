"""Prompts of an exact token length, built from random tokens with the model's own tokenizer.

Why random tokens: content-free prompts measure the serving stack, not the
text. Why the model's tokenizer: "128 tokens" must mean 128 tokens to the
engine. Each prompt starts with a unique marker, so no prefix cache can share
work between requests and inflate the results. The text is decoded and
re-encoded until it round-trips to exactly the requested length (the way
vLLM's random dataset does it).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from bakeoff.errors import BakeoffError

DRAWS = 8  # random draws tried per prompt before giving up


def _vocab_ids(tokenizer: Any) -> np.ndarray:
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    ids = [i for i in range(len(tokenizer)) if i not in special]
    return np.asarray(ids)


def exact_length_prompt(tokenizer: Any, length: int, rng: np.random.Generator, marker: str, vocab: np.ndarray) -> str:
    """A text of exactly ``length`` tokens (no special tokens added) starting with ``marker``."""
    prefix = tokenizer.encode(marker, add_special_tokens=False)
    if len(prefix) >= length:
        raise BakeoffError(f"prompt length {length} is too short for its unique marker ({len(prefix)} tokens)")
    for _draw in range(DRAWS):
        # A fresh draw after a failed one: cut and pad can cycle between one token short and a few over (about one
        # 1024-token prompt in 3,000 on the synthetic byte-level vocabulary), and another draw ends the cycle.
        ids = prefix + rng.choice(vocab, size=length - len(prefix)).tolist()
        for attempt in range(64):
            text = tokenizer.decode(ids)
            re_ids = tokenizer.encode(text, add_special_tokens=False)
            if len(re_ids) == length:
                return text
            if len(re_ids) > length:
                # Cut a little more each time round: random byte-level vocabularies (synthetic models) can merge
                # the same boundary back and forth forever when cut at exactly ``length``.
                ids = re_ids[:max(len(prefix) + 1, length - attempt // 4)]
            else:
                ids = re_ids + rng.choice(vocab, size=length - len(re_ids)).tolist()
    raise BakeoffError(f"could not build a prompt that round-trips to exactly {length} tokens "
                       f"in {DRAWS} draws of random tokens (marker {marker!r})")


def make_prompts(tokenizer: Any, length: int, count: int, seed: int = 0, tag: str = "") -> list[str]:
    """``count`` distinct prompts of ``length`` tokens; deterministic for a seed."""
    rng = np.random.default_rng(seed)
    vocab = _vocab_ids(tokenizer)
    return [exact_length_prompt(tokenizer, length, rng, f"{tag}{i}:", vocab) for i in range(count)]


def vocab_ids(tokenizer: Any) -> np.ndarray:
    """The token ids prompts are drawn from: the whole vocabulary but its special tokens."""
    return _vocab_ids(tokenizer)
