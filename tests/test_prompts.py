"""Prompts of an exact token length on the synthetic Llama-2-7B vocabulary, at the seed's 1024 tokens.

Decode, re-encode, cut and pad can cycle on a byte-level vocabulary without ever landing on the length; the H100
run of a c=32 prompt-1024 cell stopped on such a prompt. These are the draws that cycled.
"""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from bakeoff.loadgen.prompts import make_prompts
from bakeoff.models.synthetic import LLAMA2_7B, write_hf_tokenizer


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory):
    out = tmp_path_factory.mktemp("tok")
    write_hf_tokenizer(out, LLAMA2_7B.n_vocab, LLAMA2_7B.context_length)
    return AutoTokenizer.from_pretrained(out)


@pytest.mark.parametrize("seed", [116, 150])  # each holds a prompt whose first draw cycles for 64 rounds
def test_every_prompt_round_trips_to_exactly_1024_tokens_where_a_first_draw_cycles(tokenizer, seed: int) -> None:
    prompts = make_prompts(tokenizer, 1024, 40, seed=seed, tag="c32-p1024-")
    assert len(set(prompts)) == 40
    assert {len(tokenizer.encode(p, add_special_tokens=False)) for p in prompts} == {1024}
    assert all(p.startswith(f"c32-p1024-{i}:") for i, p in enumerate(prompts))
    assert make_prompts(tokenizer, 1024, 40, seed=seed, tag="c32-p1024-") == prompts  # the same draws every run
