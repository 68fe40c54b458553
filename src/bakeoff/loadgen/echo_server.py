"""A trivially fast OpenAI-compatible streaming server, to measure the client alone.

Why: the client's own limits (CPU, event-loop lag) only show when the server
costs nothing. This server answers ``/v1/completions`` with ``max_tokens``
one-token chunks, as fast as the socket takes them, plus the ``usage`` chunk
real servers send, so every byte the client parses looks like a real stream.
It serves the client-saturation measurement (benchmarks/client_saturation.py)
and the tests of the load generator that need no model.

Two stand-ins for what a real server does under load, each off unless asked:

* **Admission in steps** (:class:`Steps`): at most ``k`` prompts start a step of ``step_s``; the rest wait for
  a later step, as vLLM's scheduler takes at most ``max_num_batched_tokens`` prompt tokens a step. A prompt's
  first token comes at the end of the step that admitted it. A burst of ``c > k`` prompts then gets its first
  tokens in groups, the last ``c / k`` steps late: the start a ramp avoids (bakeoff.loadgen.cellload).
* **Requests in flight** (:class:`InFlight`): a middleware that counts the requests being served, the most at
  once, and every change with its time, so a test checks what the server saw, not what the client says.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import orjson
from aiohttp import web


class Steps:
    """Admission in steps (module docstring): :meth:`admit` returns at the end of the first step with room.

    The steps run on the server's loop from the first request on, every ``step_s``; each admits the ``k`` longest
    waiting prompts, in their order of arrival."""

    def __init__(self, k: int, step_s: float = 0.05) -> None:
        if k < 1 or step_s <= 0:
            raise ValueError(f"admission needs k >= 1 and step_s > 0, got {k}, {step_s}")
        self.k, self.step_s = k, step_s
        self.waiting: deque[asyncio.Future[None]] = deque()
        self.ticker: asyncio.Task[None] | None = None

    async def admit(self) -> None:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiting.append(fut)
        if self.ticker is None:
            self.ticker = asyncio.create_task(self._run())
        await fut

    async def _run(self) -> None:
        next_step = time.perf_counter()
        while True:
            next_step += self.step_s
            await asyncio.sleep(max(0.0, next_step - time.perf_counter()))
            for _ in range(min(self.k, len(self.waiting))):
                fut = self.waiting.popleft()
                if not fut.done():
                    fut.set_result(None)

    async def close(self, _app: web.Application | None = None) -> None:
        if self.ticker is not None:
            self.ticker.cancel()


class InFlight:
    """Middleware: the completions being served now, the most at once, and ``(time.perf_counter(), now)`` at each
    change (``log``), from the moment a request arrives to the moment its response ended."""

    def __init__(self) -> None:
        self.now = 0
        self.peak = 0
        self.log: list[tuple[float, int]] = []
        self.lock = threading.Lock()

    def _step(self, by: int) -> None:
        with self.lock:
            self.now += by
            self.peak = max(self.peak, self.now)
            self.log.append((time.perf_counter(), self.now))

    def middleware(self) -> Callable[..., Awaitable[web.StreamResponse]]:
        @web.middleware
        async def count(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                        ) -> web.StreamResponse:
            if request.path != "/v1/completions":
                return await handler(request)
            self._step(1)
            try:
                return await handler(request)
            finally:
                self._step(-1)

        return count

    def mean(self, start: float, end: float) -> float:
        """The requests in flight averaged over ``[start, end]`` (``time.perf_counter()`` times)."""
        with self.lock:
            log = list(self.log)
        level, area, t = 0, 0.0, start
        for when, now in log:
            if when > start:
                area += level * (min(when, end) - t)
                t = min(when, end)
            if when >= end:
                break
            level = now
        area += level * (end - t)
        return area / (end - start)


async def _completions(request: web.Request) -> web.StreamResponse:
    a = request.app
    body = await request.json()
    n = int(body.get("max_tokens") or 16)
    if (steps := a[STEPS]) is not None:  # the prompt waits for a step with room; its first token ends that step
        await steps.admit()
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    chunk = b"data: " + orjson.dumps({"id": "x", "object": "text_completion", "model": body.get("model"),
                                       "choices": [{"index": 0, "text": " t", "finish_reason": None}]}) + b"\n\n"
    a[ACTIVE][0] += 1
    try:
        for _ in range(n):  # one serialized chunk, sent n times: the server's cost per token stays tiny
            await resp.write(chunk)
            if delay_s := a[TOKEN_DELAY] + a[SLOT_DELAY] * a[ACTIVE][0]:
                await asyncio.sleep(delay_s)
    finally:
        a[ACTIVE][0] -= 1
    usage = {"prompt_tokens": len(str(body.get("prompt", "")).split()), "completion_tokens": n,
             "total_tokens": n}
    await resp.write(b"data: " + orjson.dumps({"choices": [], "usage": usage}) + b"\n\n")
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp


async def _health(_request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


TOKEN_DELAY = web.AppKey("token_delay_s", float)
SLOT_DELAY = web.AppKey("slot_delay_s", float)
ACTIVE = web.AppKey("active", list)
STEPS = web.AppKey("steps", object)


def app(token_delay_s: float = 0.0, middlewares: Sequence[Any] = (), slot_delay_s: float = 0.0,
        steps: Steps | None = None) -> web.Application:
    """``token_delay_s``: the server's time per output token (0: as fast as the client reads); ``slot_delay_s``:
    added to it per request being served, so TPOT grows with load in a known way (token_delay + slot_delay x
    requests streaming); ``middlewares`` see every request first (a test counts what arrives, and when);
    ``steps``: prompts admitted in steps (module docstring), else each at once."""
    a = web.Application(middlewares=list(middlewares))
    a[TOKEN_DELAY] = token_delay_s
    a[SLOT_DELAY] = slot_delay_s
    a[ACTIVE] = [0]
    a[STEPS] = steps
    if steps is not None:
        a.on_cleanup.append(steps.close)
    a.router.add_post("/v1/completions", _completions)
    a.router.add_get("/health", _health)
    return a


@contextmanager
def serving(host: str = "127.0.0.1", token_delay_s: float = 0.0, middlewares: Sequence[Any] = (),
            steps: Steps | None = None, slot_delay_s: float = 0.0) -> Iterator[str]:
    """Run the server (:func:`app`'s arguments) on a free port in a background thread of this process; yields its
    base URL."""
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app(token_delay_s, middlewares, slot_delay_s=slot_delay_s, steps=steps), access_log=None)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, host, 0)
    loop.run_until_complete(site.start())
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    thread = threading.Thread(target=loop.run_forever, daemon=True, name="echo-server")
    thread.start()
    try:
        yield f"http://{host}:{port}"
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.run_until_complete(runner.cleanup())
        loop.close()


@contextmanager
def own_process(token_delay_ms: float = 0.0, host: str = "127.0.0.1") -> Iterator[tuple[str, int]]:
    """Run the server in a process of its own (its CPU is not the client's): yields its base URL and pid."""
    import socket
    import subprocess
    import sys
    import time
    import urllib.request

    with socket.socket() as sock:
        sock.bind((host, 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "bakeoff.loadgen.echo_server", "--host", host, "--port", str(port),
                             "--token-delay-ms", str(token_delay_ms)])
    url = f"http://{host}:{port}"
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(url + "/health", timeout=1)
                break
            except OSError:
                time.sleep(0.1)
        yield url, proc.pid
    finally:
        proc.terminate()
        proc.wait(10)


def main(argv: list[str] | None = None) -> None:
    """``python -m bakeoff.loadgen.echo_server --port N``: serve in its own process (its CPU is not the client's)."""
    import argparse

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--token-delay-ms", type=float, default=0.0)
    p.add_argument("--slot-delay-ms", type=float, default=0.0)
    a = p.parse_args(argv)
    web.run_app(app(a.token_delay_ms / 1000.0, slot_delay_s=a.slot_delay_ms / 1000.0), host=a.host, port=a.port,
                access_log=None, print=None)


if __name__ == "__main__":
    main()
