"""A minimal OpenAI-compatible *scoring* server for GGUF files, on the pinned llama-cpp-python.

Why this exists: lm-eval needs prompt logprobs (``echo`` + ``logprobs``), and
neither llama.cpp server scores prompts correctly:

* llama-server ignores ``echo`` and returns logprobs for generated tokens only
  (lm-eval then scores at chance: llama.cpp issue #27174);
* llama-cpp-python 0.3.36's ``llama_cpp.server`` echoes prompt logprobs, but
  pairs token *i* with the logits *at* position *i* (which predict token
  *i + 1*), and omits the generated token. Measured on SmolLM2-135M: " over"
  after "The quick brown fox jumps" comes back at -16.4 instead of -0.005.
  The canary rejects it.

This server evaluates the request's tokens with the same binding
(``Llama.eval`` with ``logits_all``), and reports for each token the log-softmax
of the *previous* position's logits, plus the greedy next token, in the
OpenAI completions format lm-eval parses. It serves only scoring requests
(``echo: true``, ``max_tokens`` <= 1); anything else is refused with a 400 that
says so. Run: ``python -m bakeoff.quality.gguf_server --model X.gguf --port N``.
"""

from __future__ import annotations

import argparse
import asyncio
import threading
import time
from typing import Any

import numpy as np
from aiohttp import web


def log_softmax(logits: np.ndarray) -> np.ndarray:
    m = logits.max(axis=-1, keepdims=True)
    shifted = logits - m
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


class Scorer:
    """One loaded GGUF; requests are scored one at a time (the context is shared)."""

    def __init__(self, model_path: str, n_ctx: int, n_threads: int | None, n_batch: int, n_gpu_layers: int = 0) -> None:
        from llama_cpp import Llama

        self.llm = Llama(model_path=model_path, n_ctx=n_ctx, logits_all=True, n_threads=n_threads,
                         n_batch=n_batch, n_gpu_layers=n_gpu_layers, verbose=False)
        self.n_ctx = n_ctx
        self.lock = threading.Lock()

    def tokens_of(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            return self.llm.tokenize(prompt.encode(), add_bos=False, special=True)
        return [int(t) for t in prompt]

    def piece(self, token: int, prev: list[int]) -> str:
        return self.llm.detokenize([token], prev_tokens=prev).decode("utf-8", errors="replace")

    def score(self, tokens: list[int], top: int) -> dict[str, Any]:
        if not 1 <= len(tokens) < self.n_ctx:
            raise ValueError(f"prompt of {len(tokens)} tokens: need 1..{self.n_ctx - 1} (n_ctx {self.n_ctx})")
        with self.lock:
            self.llm.reset()
            self.llm.eval(tokens)
            lp = log_softmax(np.asarray(self.llm.scores[: len(tokens)], dtype=np.float64))
        nxt = int(lp[-1].argmax())
        seq = [*tokens, nxt]
        token_logprobs: list[float | None] = [None]
        tops: list[dict[str, float] | None] = [None]
        for i in range(1, len(seq)):
            row = lp[i - 1]  # the logits at i-1 predict token i
            token_logprobs.append(float(row[seq[i]]))
            if top > 0:
                best = np.argpartition(-row, top - 1)[:top] if top < row.size else np.arange(row.size)
                entry = {self.piece(int(t), seq[:i]): float(row[t]) for t in best}
                entry[self.piece(seq[i], seq[:i])] = float(row[seq[i]])
                tops.append(entry)
            else:
                tops.append({})
        pieces = [self.piece(t, seq[:i]) for i, t in enumerate(seq)]
        offsets, pos = [], 0
        for p in pieces:
            offsets.append(pos)
            pos += len(p)
        return {"text": "".join(pieces), "tokens": pieces, "token_logprobs": token_logprobs, "top_logprobs": tops,
                "text_offset": offsets, "n_prompt": len(tokens)}


def make_app(scorer: Scorer, alias: str) -> web.Application:
    async def models(_: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": alias, "object": "model", "owned_by": "bakeoff"}]})

    async def completions(request: web.Request) -> web.Response:
        body = await request.json()
        if not body.get("echo") or int(body.get("max_tokens", 16)) > 1 or body.get("logprobs") is None:
            raise web.HTTPBadRequest(text="this is bakeoff's GGUF scoring server: only echo=true, logprobs>=0, "
                                          "max_tokens<=1 requests (prompt scoring) are served")
        prompts = body["prompt"]
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        choices = []
        loop = asyncio.get_running_loop()
        for i, prompt in enumerate(prompts):
            try:
                tokens = scorer.tokens_of(prompt)
                res = await loop.run_in_executor(None, scorer.score, tokens, int(body["logprobs"]))
            except ValueError as e:
                raise web.HTTPBadRequest(text=str(e)) from None
            n = res.pop("n_prompt")
            choices.append({"index": i, "text": res.pop("text"), "logprobs": res, "finish_reason": "length",
                            "prompt_tokens": n})
        usage = sum(c.pop("prompt_tokens") for c in choices)
        return web.json_response({"id": f"cmpl-{time.time_ns()}", "object": "text_completion", "created": int(time.time()),
                                  "model": alias, "choices": choices,
                                  "usage": {"prompt_tokens": usage, "completion_tokens": len(choices),
                                            "total_tokens": usage + len(choices)}})

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.add_routes([web.get("/v1/models", models), web.get("/health", models), web.post("/v1/completions", completions)])
    return app


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--model_alias", default="model")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--n_ctx", type=int, default=2048)
    p.add_argument("--n_threads", type=int, default=None)
    p.add_argument("--n_batch", type=int, default=512)
    p.add_argument("--n_gpu_layers", type=int, default=0, help="-1: every layer on the GPU (CUDA builds)")
    a = p.parse_args(argv)
    scorer = Scorer(a.model, a.n_ctx, a.n_threads, a.n_batch, a.n_gpu_layers)
    web.run_app(make_app(scorer, a.model_alias), host=a.host, port=a.port, print=None)


if __name__ == "__main__":
    main()
