"""One streaming request against an OpenAI-compatible ``/v1/completions`` endpoint.

The request asks for exactly ``output_len`` tokens (``max_tokens`` plus
``ignore_eos``), temperature 0, streamed, with ``stream_options.include_usage``
so the server itself reports token counts. Timing follows
:mod:`bakeoff.loadgen.metrics`, recorded as ``vllm bench serve``'s request function records it
(vllm/benchmarks/lib/endpoint_request_func.py): every chunk that carries ``choices`` is a token chunk,
even when its text is empty (a special token), TTFT is the first such chunk, each later one adds an ITL
gap, the latency ends at the last one, and a request succeeds once one arrived.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import aiohttp
import orjson

from bakeoff.loadgen.metrics import RequestRecord


def payload(model: str, prompt: str, output_len: int, temperature: float = 0.0) -> dict[str, Any]:
    return {
        "model": model,
        "prompt": prompt,
        "max_tokens": output_len,
        "temperature": temperature,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def server_timings(record: RequestRecord, timings: dict[str, Any]) -> None:
    """Keep the server's per-token generation time and prompt time (llama-server's ``timings``)."""
    tpot = timings.get("predicted_per_token_ms")
    prompt = timings.get("prompt_ms")
    record.server_tpot_ms = float(tpot) if tpot is not None else None
    record.server_prompt_ms = float(prompt) if prompt is not None else None


async def send(
    session: aiohttp.ClientSession,
    url: str,
    model: str,
    prompt: str,
    record: RequestRecord,
    t0: float,
    temperature: float = 0.0,
    headers: dict[str, str] | None = None,
    count_tokens: Callable[[str], int] | None = None,
) -> RequestRecord:
    """Fill ``record`` in place from one streamed completion; never raises on HTTP/stream errors."""
    body = payload(model, prompt, record.output_len, temperature)
    text_parts: list[str] = []
    usage: dict[str, Any] | None = None
    start = time.perf_counter()
    record.start = start - t0
    last = start
    first: float | None = None
    try:
        async with session.post(url, json=body, headers=headers) as resp:
            if resp.status != 200:
                record.error = f"HTTP {resp.status}: {(await resp.text())[:200]}"
                return record
            buf = b""
            async for chunk in resp.content.iter_any():
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    line = line.strip()
                    if not line.startswith(b"data:"):
                        continue
                    data = line[5:].strip()
                    if data == b"[DONE]":
                        continue
                    msg = orjson.loads(data)  # parsing every chunk is most of the client's CPU
                    if msg.get("usage"):
                        usage = msg["usage"]
                    if msg.get("timings"):  # llama-server: its own timing, in the final chunk
                        server_timings(record, msg["timings"])
                    choices = msg.get("choices")
                    if choices:  # as vLLM's client: a chunk with choices is a token chunk, even with empty text
                        now = time.perf_counter()
                        if first is None:
                            first = now
                            record.ttft = now - start
                        else:
                            record.itl.append(now - last)
                        last = now
                        text_parts.append(choices[0].get("text") or "")
        if first is not None:
            record.e2el = last - start  # vLLM's latency: to the last token chunk, not the stream's end
    except (aiohttp.ClientError, TimeoutError, ConnectionError, orjson.JSONDecodeError) as e:
        record.error = f"{type(e).__name__}: {e}"[:300]
        return record
    record.generated_text = "".join(text_parts)
    if usage and usage.get("completion_tokens") is not None:
        record.output_tokens = int(usage["completion_tokens"])
        record.prompt_tokens = usage.get("prompt_tokens")
        record.tokens_from = "usage"
    elif count_tokens is not None:
        record.output_tokens = count_tokens(record.generated_text)
        record.tokens_from = "client-tokenizer"
    if first is None:
        record.error = "stream ended without a token chunk"
        return record
    record.success = True
    return record
