"""One streaming request against an OpenAI-compatible ``/v1/completions`` endpoint.

The request asks for exactly ``output_len`` tokens (``max_tokens`` plus
``ignore_eos``), temperature 0, streamed, with ``stream_options.include_usage``
so the server itself reports token counts. Timing follows
:mod:`bakeoff.loadgen.metrics`, recorded as ``vllm bench serve``'s request function records it
(vllm/benchmarks/lib/endpoint_request_func.py): every server-sent event that carries ``choices`` is a token
chunk, even when its text is empty (a special token), TTFT is the first such chunk, each later one adds an ITL
gap, the latency ends at the last one, and a request succeeds once one arrived.

Why the stream is decoded after it ends: while it runs, the client keeps only each network read and the moment
it arrived, so the work per token is one timestamp and one list append. An event is dated by the read that
completed it (the moment its bytes were in the client's hands, as when parsed on arrival), and the events are
decoded in one ``orjson`` call. A load worker defers even that past the measured window (``defer``): a closed
loop's requests end in waves, and decoding a wave's streams the moment they end blocked the event loop for tens of
milliseconds (an H100 node at c=64-256, 2026-12-06). At a request's end it reads only what an early stop needs
(:func:`quick`: the first and last token chunk's reads, and the usage event).

Connections are kept alive and reused. A server may close an idle kept-alive connection (llama-server's
keep-alive limits) just as a request is written on it; such a request, one that got no response at all, is
sent again once on a fresh connection, and its clock starts again (``retried``): the server never saw the first.
"""

from __future__ import annotations

import re
import time
from bisect import bisect_left
from collections.abc import Callable
from itertools import accumulate
from typing import Any

import aiohttp
import orjson

from bakeoff.loadgen.metrics import RequestRecord

# Where a server-sent event carries a choice: a token chunk (a usage-only event has "choices":[]).
TOKEN_CHUNK = re.compile(rb'"choices"\s*:\s*\[\s*\{')
# A kept-alive connection the server closed before answering: the request never reached it.
STALE_CONNECTION = (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError)


def payload(model: str, prompt: str | list[int], output_len: int, temperature: float = 0.0) -> dict[str, Any]:
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


def events(reads: list[bytes], stamps: list[float]) -> list[tuple[float, dict[str, Any]]]:
    """The stream's ``data:`` events, decoded, each with the time of the read that completed it.

    ``reads`` are the raw network reads in order and ``stamps`` their arrival times. ``[DONE]`` and other
    lines are dropped. One ``orjson`` call decodes every event (3 us a token here, against 15 for the
    network reads themselves; a regular expression and numpy's searchsorted measured 3x slower).
    """
    buf = b"".join(reads)
    ends = list(accumulate(len(r) for r in reads))  # the byte offset just past each read
    datas: list[bytes] = []
    times: list[float] = []
    pos = 0
    while (nl := buf.find(b"\n", pos)) >= 0:
        line = buf[pos:nl].strip()
        if line.startswith(b"data:") and (data := line[5:].strip()) != b"[DONE]" and data:
            datas.append(data)
            times.append(stamps[bisect_left(ends, nl + 1)])  # the read holding the line's newline
        pos = nl + 1
    if not datas:
        return []
    return list(zip(times, orjson.loads(b"[" + b",".join(datas) + b"]"), strict=True))


def read_events(record: RequestRecord, evs: list[tuple[float, dict[str, Any]]], start: float
                ) -> tuple[list[str], bool]:
    """Fill ``record``'s times and token counts from a stream's events.

    Returns the token chunks' texts (one a chunk, empty ones too) and whether the server sent its usage.
    """
    texts: list[str] = []
    got_usage = False
    first: float | None = None
    last = start
    for t, msg in evs:
        if msg.get("usage"):
            usage = msg["usage"]
            if usage.get("completion_tokens") is not None:
                got_usage = True
                record.output_tokens = int(usage["completion_tokens"])
                record.prompt_tokens = usage.get("prompt_tokens")
                record.tokens_from = "usage"
        if msg.get("timings"):  # llama-server: its own timing, in the final chunk
            server_timings(record, msg["timings"])
        choices = msg.get("choices")
        if choices:  # as vLLM's client: a chunk with choices is a token chunk, even with empty text
            if first is None:
                first = t
                record.ttft = t - start
            else:
                record.itl.append(t - last)
            last = t
            texts.append(choices[0].get("text") or "")
    if first is not None:
        record.e2el = last - start  # vLLM's latency: to the last token chunk, not the stream's end
    return texts, got_usage


async def _stream(session: aiohttp.ClientSession, url: str, body: bytes, headers: dict[str, str]
                  ) -> tuple[int, str, list[bytes], list[float], float]:
    """(HTTP status, error text, reads, their arrival times, the send time) of one request."""
    reads: list[bytes] = []
    stamps: list[float] = []
    start = time.perf_counter()
    async with session.post(url, data=body, headers=headers) as resp:
        if resp.status != 200:
            return resp.status, (await resp.text())[:200], reads, stamps, start
        async for chunk in resp.content.iter_any():  # per read: its bytes and the moment they arrived
            stamps.append(time.perf_counter())
            reads.append(chunk)
    return 200, "", reads, stamps, start


async def send(
    session: aiohttp.ClientSession,
    url: str,
    model: str,
    prompt: str | list[int],
    record: RequestRecord,
    t0: float,
    *,
    temperature: float = 0.0,
    headers: dict[str, str] | None = None,
    count_tokens: Callable[[str], int] | None = None,
    fresh: aiohttp.ClientSession | None = None,
    defer: bool = False,
) -> RequestRecord:
    """Fill ``record`` in place from one streamed completion; never raises on HTTP/stream errors.

    ``fresh``: a session that opens a new connection for every request, for the one retry of a request whose
    kept-alive connection the server had closed (module docstring). ``defer``: keep the raw stream on the
    record and fill only what an early stop needs (:func:`quick`); :func:`finish_deferred` decodes it later.
    """
    body = orjson.dumps(payload(model, prompt, record.output_len, temperature))
    hdrs = {"Content-Type": "application/json", **(headers or {})}
    try:
        try:
            status, text, reads, stamps, start = await _stream(session, url, body, hdrs)
        except STALE_CONNECTION:
            if fresh is None:
                raise
            record.retried = True
            status, text, reads, stamps, start = await _stream(fresh, url, body, hdrs)
    except (aiohttp.ClientError, TimeoutError, ConnectionError) as e:
        record.start = time.perf_counter() - t0
        record.error = f"{type(e).__name__}: {e}"[:300]
        return record
    record.start = start - t0
    if status != 200:
        record.error = f"HTTP {status}: {text}"
        return record
    if defer:
        record.raw = (reads, stamps, start)
        quick(record)
        return record
    return finish(record, reads, stamps, start, count_tokens)


def quick(record: RequestRecord) -> None:
    """What a probe's early stop needs the moment a request ends, without decoding its stream: TTFT and latency
    from the first and last reads that hold a token chunk, the token count from the usage event at its end.
    :func:`finish` later decodes the whole stream (and sets the same values, to the event)."""
    reads, stamps, start = record.raw or ([], [], 0.0)
    marked = [i for i, r in enumerate(reads) if TOKEN_CHUNK.search(r)]
    if not marked:
        record.error = "stream ended without a token chunk"
        return
    record.ttft = stamps[marked[0]] - start
    record.e2el = stamps[marked[-1]] - start
    tail = b"".join(reads[-3:])
    for line in reversed(tail.split(b"\n")):
        if b'"completion_tokens"' in line and line.strip().startswith(b"data:"):
            try:
                usage = orjson.loads(line.strip()[5:]).get("usage") or {}
            except orjson.JSONDecodeError:
                break
            if usage.get("completion_tokens") is not None:
                record.output_tokens = int(usage["completion_tokens"])
            break
    record.success = True


def finish(record: RequestRecord, reads: list[bytes], stamps: list[float], start: float,
           count_tokens: Callable[[str], int] | None = None) -> RequestRecord:
    """Decode a stream's events into ``record``: every token chunk's time, the text, the server's counts."""
    record.raw = None
    record.success, record.error, record.itl = False, "", []
    try:
        texts, got_usage = read_events(record, events(reads, stamps), start)
    except orjson.JSONDecodeError as e:
        record.error = f"JSONDecodeError: {e}"[:300]
        return record
    record.generated_text = "".join(texts)
    if not got_usage:  # counted by the caller's tokenizer, here or once the cell is merged
        record.tokens_from = "none"
        if count_tokens is not None:
            record.output_tokens = count_tokens(record.generated_text)
            record.tokens_from = "client-tokenizer"
    if not texts:
        record.error = "stream ended without a token chunk"
        return record
    record.success = True
    return record


def finish_deferred(record: RequestRecord) -> RequestRecord:
    """:func:`finish` for a record sent with ``defer`` (its raw stream kept on it); others are left as they are."""
    if record.raw is None:
        return record
    reads, stamps, start = record.raw
    return finish(record, reads, stamps, start)
