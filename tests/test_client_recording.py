"""bakeoff's client records a stream as vLLM's own request function does (``vllm bench serve``).

Both clients read the same SSE streams from one small replay server and their records are compared field
by field. The streams are constructed here (not recorded from an engine) to hold the cases that tell the
two recordings apart: a chunk whose text is empty (a special token), several tokens in one chunk, a
usage-only last chunk, llama-server's final chunk with ``timings``, and a stream with no token chunk.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from contextlib import contextmanager

import aiohttp
import pytest
from aiohttp import web

from bakeoff.loadgen import echo_server
from bakeoff.loadgen.client import send
from bakeoff.loadgen.metrics import RequestRecord


def _choice(text: str, finish: str | None = None, **extra: object) -> dict:
    return {"id": "x", "object": "text_completion", "choices": [{"index": 0, "text": text, "finish_reason": finish}],
            **extra}


USAGE = {"id": "x", "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 6, "total_tokens": 11}}
STREAMS: dict[str, list[dict]] = {
    # a special token as the first chunk (empty text), then text, then a usage-only chunk
    "empty-first": [_choice(""), _choice(" a"), _choice(" b"), _choice(" c"), _choice(" d"), _choice(" e"), USAGE],
    # several tokens a chunk: 6 tokens in 3 chunks
    "multi-token": [_choice(" a b"), _choice(" c d"), _choice(" e f", "length"), USAGE],
    # llama-server's shape: the last chunk carries choices with empty text, finish_reason and timings
    "llama-final": [_choice(" a"), _choice(" b"), _choice(" c"), _choice(" d"), _choice(" e"),
                    _choice("", "length", timings={"predicted_per_token_ms": 4.0, "prompt_ms": 9.0}), USAGE],
    # every chunk with empty text: the server answered 200 and generated tokens (vLLM: a success)
    "all-empty": [_choice("")] * 6 + [USAGE],
    # no token chunk at all: a failure for both
    "no-tokens": [USAGE],
}
GAP_S = 0.02


@contextmanager
def replay() -> Iterator[str]:
    """The echo server, with a middleware that answers every request by streaming ``STREAMS[model]``,
    ``GAP_S`` between chunks."""

    @web.middleware
    async def streams(request: web.Request, _handler):  # type: ignore[no-untyped-def]
        body = await request.json()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for msg in STREAMS[body["model"]]:
            await asyncio.sleep(GAP_S)
            await resp.write(b"data: " + json.dumps(msg).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    with echo_server.serving(middlewares=[streams]) as base:
        yield f"{base}/v1/completions"


async def _both(url: str, stream: str) -> tuple[RequestRecord, object]:
    from vllm.benchmarks.lib.endpoint_request_func import RequestFuncInput, async_request_openai_completions

    async with aiohttp.ClientSession() as session:
        ours = await send(session, url, stream, "p", RequestRecord(0, 5, 6), 0.0)
        theirs = await async_request_openai_completions(
            RequestFuncInput(prompt="p", api_url=url, prompt_len=5, output_len=6, model=stream), session)
    return ours, theirs


@pytest.mark.parametrize("stream", sorted(STREAMS))
def test_one_stream_makes_the_same_record_in_both_clients(stream: str) -> None:
    with replay() as url:
        ours, theirs = asyncio.run(_both(url, stream))
    assert ours.success == theirs.success, (ours.error, theirs.error)
    assert len(ours.itl) == len(theirs.itl)
    if not theirs.success:
        return
    assert ours.output_tokens == theirs.output_tokens == 6
    assert ours.generated_text == theirs.generated_text
    # the same chunks timed: each gap is GAP_S in both, within scheduling jitter
    for mine, vllms in [(ours.ttft, theirs.ttft), (ours.e2el, theirs.latency), *zip(ours.itl, theirs.itl, strict=True)]:
        assert mine == pytest.approx(vllms, abs=0.015)
    assert ours.e2el == pytest.approx(ours.ttft + sum(ours.itl), abs=1e-6)  # latency ends at the last token chunk
