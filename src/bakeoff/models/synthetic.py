"""A synthetic model source: a real architecture's exact shape, random F16 weights, written with gguf-py.

Why: a GPU node that cannot download a model (one without network)
must still run the pipeline. Decode and prefill speed depend on the shape
(layers, widths, heads, vocabulary) and the format, not on the weight values,
when every request has a fixed output length (the load client sends
``ignore_eos``). Rows from such a model are marked ``synthetic`` and never get
a quality score.

What is written (``models/<model>/source/``):

* ``model.gguf`` -- a ``llama``-architecture GGUF in F16. Weights are drawn
  from N(0, 0.02) (one seeded pool of 2^26 values, cycled with a different
  offset per tensor, so writing 13.5 GB takes seconds); norm weights are 1.
  Tensors are streamed to disk one at a time, so memory stays at one tensor.
* A byte-level BPE tokenizer of exactly ``n_vocab`` tokens, identical in the
  GGUF (``tokenizer.ggml.*``, pre-tokenizer ``gpt-2``) and in
  ``tokenizer.json`` (Hugging Face tokenizers, for bakeoff's prompt builder):
  256 byte tokens, ``<s>``/``</s>``, then merges of 2- and 3-character strings
  until the vocabulary is full. Both sides segment text the same way, so a
  "128-token prompt" is 128 tokens to llama-server too.

For vLLM the same shape is a Hugging Face directory without weights
(:func:`write_dummy_hf`): ``config.json`` of the same architecture
(``LlamaForCausalLM``, every size as in the GGUF) and the same tokenizer files;
vLLM serves it with ``--load-format dummy``, drawing random weights of that
shape at load. Both engines then serve one shape, each in its own formats.

This module imports only numpy, gguf and tokenizers (no bakeoff config), so it
also runs standalone on a bare GPU node: ``python -m bakeoff.models.synthetic --help``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import string
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from bakeoff.layout import GGUF_NAME

POOL = 1 << 26
STD = 0.02
SPECIALS = ("<s>", "</s>")


@dataclass(frozen=True)
class Shape:
    """A llama architecture's shape (the config's ``model.synthetic``; pydantic validates it there)."""

    __pydantic_config__ = {"extra": "forbid"}  # noqa: RUF012 -- read by pydantic, not a dataclass field

    n_layer: int
    n_embd: int
    n_ff: int
    n_head: int
    n_head_kv: int
    n_vocab: int = 32000
    context_length: int = 4096
    rope_theta: float = 10000.0
    rms_eps: float = 1e-5
    seed: int = 0
    shape_of: str = ""  # the real model whose shape this is, e.g. meta-llama/Llama-2-7b-hf
    arch: str = "llama"

    def __post_init__(self) -> None:
        if self.arch != "llama":
            raise ValueError(f"synthetic shape: arch {self.arch!r} is not supported (llama)")
        if min(self.n_layer, self.n_embd, self.n_ff, self.n_head, self.n_head_kv, self.n_vocab, self.context_length) < 1:
            raise ValueError("synthetic shape: every size must be positive")
        if self.n_embd % self.n_head or self.n_head % self.n_head_kv:
            raise ValueError(f"synthetic shape: n_embd {self.n_embd} must divide by n_head {self.n_head}, "
                             f"and n_head by n_head_kv {self.n_head_kv}")
        if self.n_vocab < 300:
            raise ValueError("synthetic shape: n_vocab must be >= 300 (256 byte tokens, specials, merges)")

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    def tensors(self) -> Iterator[tuple[str, tuple[int, ...]]]:
        """(name, numpy shape) of every tensor, in llama.cpp's ``llama`` naming; numpy shape is (out, in)."""
        kv = self.n_head_kv * self.head_dim
        yield "token_embd.weight", (self.n_vocab, self.n_embd)
        for i in range(self.n_layer):
            b = f"blk.{i}"
            yield f"{b}.attn_norm.weight", (self.n_embd,)
            yield f"{b}.attn_q.weight", (self.n_embd, self.n_embd)
            yield f"{b}.attn_k.weight", (kv, self.n_embd)
            yield f"{b}.attn_v.weight", (kv, self.n_embd)
            yield f"{b}.attn_output.weight", (self.n_embd, self.n_embd)
            yield f"{b}.ffn_norm.weight", (self.n_embd,)
            yield f"{b}.ffn_gate.weight", (self.n_ff, self.n_embd)
            yield f"{b}.ffn_up.weight", (self.n_ff, self.n_embd)
            yield f"{b}.ffn_down.weight", (self.n_embd, self.n_ff)
        yield "output_norm.weight", (self.n_embd,)
        yield "output.weight", (self.n_vocab, self.n_embd)

    def n_params(self) -> int:
        return sum(int(np.prod(s)) for _, s in self.tensors())

    def linear_params(self) -> int:
        """Parameters of the decoder layers' matrices (attention and MLP projections): what FP8 linear layers hold;
        the embeddings, the output head and the norms stay 16-bit."""
        return sum(int(np.prod(s)) for n, s in self.tensors() if n.startswith("blk.") and len(s) == 2)


LLAMA2_7B = Shape(n_layer=32, n_embd=4096, n_ff=11008, n_head=32, n_head_kv=32, n_vocab=32000,
                  context_length=4096, shape_of="meta-llama/Llama-2-7b-hf")


# --------------------------------------------------------------------------- tokenizer
def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map (the convention both tokenizers use)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    chars = printable[:]
    n = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n)
            n += 1
    return dict(zip(printable, map(chr, chars), strict=True))


def vocabulary(n_vocab: int) -> tuple[list[str], list[tuple[str, str]]]:
    """Tokens (id order) and merges (rank order) of the synthetic byte-level BPE vocabulary."""
    byte_tokens = [_bytes_to_unicode()[b] for b in range(256)]
    tokens = [*byte_tokens, *SPECIALS]
    alphabet = ["Ġ", *string.ascii_lowercase, *string.ascii_uppercase, *string.digits]
    merges: list[tuple[str, str]] = []
    pairs = (((a, b), a + b) for a, b in itertools.product(alphabet, repeat=2))
    triples = (((a + b, c), a + b + c) for a, b, c in itertools.product(alphabet, repeat=3))
    for merge, token in itertools.chain(pairs, triples):
        if len(tokens) >= n_vocab:
            break
        merges.append(merge)
        tokens.append(token)
    if len(tokens) != n_vocab:
        raise ValueError(f"cannot build a vocabulary of {n_vocab} tokens (max {len(tokens)})")
    return tokens, merges


def write_hf_tokenizer(out_dir: Path, n_vocab: int, context_length: int) -> None:
    """``tokenizer.json`` + ``tokenizer_config.json`` for ``AutoTokenizer`` (Hugging Face tokenizers)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    tokens, merges = vocabulary(n_vocab)
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIALS])
    tok.save(str(out_dir / "tokenizer.json"))
    (out_dir / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": SPECIALS[0], "eos_token": SPECIALS[1],
        "model_max_length": context_length, "clean_up_tokenization_spaces": False}, indent=2) + "\n")


# --------------------------------------------------------------------------- Hugging Face, no weights
HF_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def hf_config(shape: Shape) -> dict:
    """``config.json`` of ``shape`` as ``LlamaForCausalLM``: every size the GGUF records, the same special tokens.

    Both spellings of the RoPE base and dtype are written (``rope_theta``/``rope_parameters``,
    ``torch_dtype``/``dtype``) so transformers 4 and 5, and vLLM on either, read the same model.
    """
    tokens, _ = vocabulary(shape.n_vocab)
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": shape.n_embd, "intermediate_size": shape.n_ff, "num_hidden_layers": shape.n_layer,
        "num_attention_heads": shape.n_head, "num_key_value_heads": shape.n_head_kv, "head_dim": shape.head_dim,
        "vocab_size": shape.n_vocab, "max_position_embeddings": shape.context_length, "rms_norm_eps": shape.rms_eps,
        "rope_theta": shape.rope_theta, "rope_parameters": {"rope_type": "default", "rope_theta": shape.rope_theta},
        "hidden_act": "silu", "attention_bias": False, "mlp_bias": False, "tie_word_embeddings": False,
        "torch_dtype": "float16", "dtype": "float16",
        "bos_token_id": tokens.index(SPECIALS[0]), "eos_token_id": tokens.index(SPECIALS[1]),
    }


def write_dummy_hf(shape: Shape, out_dir: Path, tokenizer_dir: Path) -> dict:
    """``config.json`` of ``shape`` and the tokenizer files of ``tokenizer_dir`` (the GGUF's source) into ``out_dir``.

    No weight files: vLLM serves the directory with ``--load-format dummy``. Returns the manifest's fields:
    the load format and the weights vLLM holds in float16 (every parameter at 2 bytes).
    """
    import shutil

    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.json").write_text(json.dumps(hf_config(shape), indent=2) + "\n")
    for name in HF_TOKENIZER_FILES:
        shutil.copyfile(tokenizer_dir / name, out_dir / name)
    n = shape.n_params()
    return {"load_format": "dummy", "n_params": n, "weight_bytes": 2 * n, "bits_per_weight": 16.0,
            "weights": "none: vLLM draws them at random in this shape at load (--load-format dummy)",
            "shape": asdict(shape)}


# --------------------------------------------------------------------------- GGUF
def write_gguf(shape: Shape, path: Path, name: str) -> int:
    """Stream a synthetic F16 GGUF of ``shape`` to ``path``; returns the parameter count."""
    import gguf

    tokens, merges = vocabulary(shape.n_vocab)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name(name)
    w.add_description(f"bakeoff synthetic: random F16 weights in the shape of {shape.shape_of or 'a llama model'}; "
                      f"seed {shape.seed}. For speed measurements only.")
    w.add_context_length(shape.context_length)
    w.add_embedding_length(shape.n_embd)
    w.add_block_count(shape.n_layer)
    w.add_feed_forward_length(shape.n_ff)
    w.add_head_count(shape.n_head)
    w.add_head_count_kv(shape.n_head_kv)
    w.add_rope_dimension_count(shape.head_dim)
    w.add_rope_freq_base(shape.rope_theta)
    w.add_layer_norm_rms_eps(shape.rms_eps)
    w.add_vocab_size(shape.n_vocab)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(tokens)
    w.add_token_types([gguf.TokenType.CONTROL if t in SPECIALS else gguf.TokenType.NORMAL for t in tokens])
    w.add_token_merges([f"{a} {b}" for a, b in merges])
    w.add_bos_token_id(tokens.index(SPECIALS[0]))
    w.add_eos_token_id(tokens.index(SPECIALS[1]))
    w.add_add_bos_token(False)  # prompts are counted without a BOS, as bakeoff's HF tokenizer does

    specs = list(shape.tensors())
    for tname, tshape in specs:
        dtype = np.float32 if len(tshape) == 1 else np.float16
        w.add_tensor_info(tname, tshape, np.dtype(dtype), int(np.prod(tshape)) * np.dtype(dtype).itemsize)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    pool = (np.random.default_rng(shape.seed).standard_normal(POOL, dtype=np.float32) * STD).astype(np.float16)
    for k, (_name, tshape) in enumerate(specs):
        if len(tshape) == 1:
            w.write_tensor_data(np.ones(tshape, dtype=np.float32))
            continue
        n = int(np.prod(tshape))
        start = (k * 7919 * 4099) % POOL
        w.write_tensor_data(np.resize(np.roll(pool, -start), n).reshape(tshape))
    w.close()
    return shape.n_params()


def write_source(shape: Shape, out_dir: Path, name: str) -> dict:
    """The whole synthetic source (GGUF + tokenizer files) into ``out_dir``; returns its description."""
    out_dir.mkdir(parents=True, exist_ok=True)
    n = write_gguf(shape, out_dir / GGUF_NAME, name)
    write_hf_tokenizer(out_dir, shape.n_vocab, shape.context_length)
    return {"kind": "synthetic", "shape": asdict(shape), "n_params": n, "weights": f"N(0, {STD}) F16, seed {shape.seed}"}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bakeoff.models.synthetic", description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, type=Path, help="output directory (model.gguf + tokenizer files)")
    p.add_argument("--name", default="llama2-7b-synthetic")
    p.add_argument("--shape", default="llama2-7b", choices=["llama2-7b"])
    p.add_argument("--n-layer", type=int, help="override the shape's layer count (e.g. a quick check)")
    a = p.parse_args(argv)
    shape = LLAMA2_7B if a.n_layer is None else Shape(**{**asdict(LLAMA2_7B), "n_layer": a.n_layer})
    print(json.dumps(write_source(shape, a.out, a.name)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
