"""Open-loop load generation: replay a workload's requests against an OpenAI-compatible URL.

Each request is sent at its arrival time (divided by ``time_scale``), whether or not earlier
ones have finished (open loop: a slow server does not slow the arrivals, as in production);
``max_concurrency`` bounds the connections held at once, and a request that waits for one
is late: its latencies still count from its scheduled arrival, so the wait shows in them.
The prompt is ``prompt_tokens`` words (one token each for the word counter; a real tokenizer
counts about as many) and ``max_tokens`` is the workload's decode length, so a simulated
backend generates exactly the workload's tokens.

Per request: TTFT (first SSE event with text), mean TBT (time between the first and the last
token over the tokens after the first), E2E, tokens received, HTTP status and the error, if
any; and where the server reports its own ``timings`` (llama.cpp's ``prompt_ms`` and
``predicted_ms``, in the final stream event or the body), the server's time on the prompt and on
the further tokens. Why: a served TTFT is the prompt's computation plus everything around it
(queueing, HTTP, the router's hop); the server's own clock splits the two, so a sim-to-real gap
can be put on the computation or on the rest (``experiments/sim_to_real.py``). Latencies are reported in the workload's seconds: wall seconds times ``time_scale``
(which is what the simulated backends' clock runs at when given the same time scale).
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Result:
    """One replayed request (seconds on the workload's clock; NaN where not reached)."""

    index: int
    arrival_s: float
    prompt_tokens: int
    max_tokens: int
    ttft_s: float
    tbt_s: float
    e2e_s: float
    tokens: int
    status: int
    error: str | None
    server_prompt_s: float = math.nan
    """The server's own time on the prompt (llama.cpp ``timings.prompt_ms``; NaN: not reported)."""
    server_decode_s: float = math.nan
    """The server's own time on the tokens after the first (``timings.predicted_ms``)."""
    backend: str = ""
    """The backend that answered, as a router service names it (``x-llm-lb-backend``, its
    ``backend_header``); empty where the reply does not say."""


def server_timings_s(obj) -> tuple[float, float]:
    """(prompt, decode) seconds of a response's ``timings`` (NaN where absent)."""
    t = obj.get("timings") if isinstance(obj, dict) else None
    if not isinstance(t, dict):
        return math.nan, math.nan
    return (float(t["prompt_ms"]) / 1e3 if "prompt_ms" in t else math.nan,
            float(t["predicted_ms"]) / 1e3 if "predicted_ms" in t else math.nan)


def backend_index(backend: str, urls) -> int:
    """A reply's named backend (``Result.backend``) as its index in ``urls``, the instance
    number a simulation of those backends gives it; -1 where the reply named none of them."""
    return urls.index(backend) if backend in urls else -1


def _error_of(payload: bytes) -> str | None:
    try:
        obj = json.loads(payload)
    except ValueError:
        return None
    if isinstance(obj, dict) and "error" in obj:
        err = obj["error"]
        return err.get("message", str(err)) if isinstance(err, dict) else str(err)
    return None


async def _one(client, url: str, model: str, i: int, arrival_s: float, p: int, d: int,
               t0: float, scale: float, sem: asyncio.Semaphore, stream: bool, chat: bool,
               extra: dict, stale=lambda exc: False) -> Result:
    await asyncio.sleep(max(0.0, t0 + arrival_s / scale - time.monotonic()))
    start = t0 + arrival_s / scale
    words = " ".join(["tok"] * p)
    if chat:
        body = {"model": model, "messages": [{"role": "user", "content": words}], "max_tokens": d,
                "stream": stream}
        path = "/v1/chat/completions"
    else:
        body = {"model": model, "prompt": words, "max_tokens": d, "stream": stream}
        path = "/v1/completions"
    body.update(extra)
    first = last = math.nan
    timings = (math.nan, math.nan)
    tokens, status, error, backend = 0, 0, None, ""
    async with sem:
        for attempt in range(2):
            try:
                async with client.post(url + path, json=body) as r:
                    status = r.status
                    backend = r.headers.get("x-llm-lb-backend", "")
                    if status != 200:
                        error = _error_of(await r.read()) or f"HTTP {status}"
                    elif not stream:
                        obj = json.loads(await r.read())
                        tokens = int(obj.get("usage", {}).get("completion_tokens", d))
                        timings = server_timings_s(obj)
                        first = last = time.monotonic()
                    else:
                        async for raw in r.content:
                            line = raw.decode().rstrip("\n")
                            if not line.startswith("data: ") or line == "data: [DONE]":
                                continue
                            if '"error"' in line:
                                error = _error_of(line[6:].encode()) or line
                                continue
                            if '"finish_reason":null' in line.replace(" ", ""):
                                now = time.monotonic()
                                if tokens == 0:
                                    first = now
                                last = now
                                tokens += 1
                            elif '"timings"' in line:   # the final event (llama.cpp): the server's own clock
                                try:
                                    timings = server_timings_s(json.loads(line[6:]))
                                except (ValueError, KeyError, TypeError):
                                    pass   # not ours to judge: the latencies stand without it
            except Exception as exc:   # connection refused, reset, timeout: recorded, not raised
                if attempt == 0 and status == 0 and stale(exc):
                    continue   # nothing came back on a kept-alive connection the server had closed: once more
                error = f"{type(exc).__name__}: {exc}"
            break
    end = time.monotonic()
    if error is None and stream and tokens < d:
        error = f"stream ended after {tokens} of {d} tokens"
    ok = error is None
    tbt = (last - first) / (tokens - 1) * scale if ok and tokens > 1 else math.nan
    return Result(i, arrival_s, p, d, (first - start) * scale if ok else math.nan, tbt,
                  (end - start) * scale if ok else math.nan, tokens, status, error,
                  *(t * scale if ok else math.nan for t in timings), backend)


async def replay(url: str, arrival_s, prompt_tokens, max_tokens, *, model: str = "sim-model",
                 time_scale: float = 1.0, max_concurrency: int = 256, stream: bool = True,
                 chat: bool = False, timeout_s: float = 600.0, extra_body: dict | None = None) -> list[Result]:
    """Replay the requests (arrival times in seconds from 0) against ``url``; one Result each,
    in input order. Every request ends with a result: an error is recorded, never raised.
    ``extra_body``: fields added to every request (llama.cpp needs ``ignore_eos`` to generate
    exactly ``max_tokens``, and ``cache_prompt`` false to compute every prompt token).

    A request is sent again once, and only if nothing at all came back and the failure is one
    of a stale kept-alive connection (the body could not be written, or the server disconnected
    before any header; not a refused connection, a timeout or anything after the status line).
    Why: llama-server closes a connection after a streamed reply, and a request that takes the
    pooled connection in that instant fails to write its body without the server ever seeing
    it (seen once in CI: ``ClientOSError: Can not write request body``, the second of two
    requests 0.1 s apart). That is the client's race, not the server's failure; a server that
    is down still fails the second attempt, and is recorded."""
    import aiohttp

    def stale(exc: BaseException) -> bool:
        return (isinstance(exc, (aiohttp.ClientOSError, aiohttp.ServerDisconnectedError))
                and not isinstance(exc, aiohttp.ClientConnectorError))

    if time_scale <= 0 or max_concurrency < 1:
        raise ValueError(f"time_scale={time_scale} must be > 0 and max_concurrency={max_concurrency} >= 1")
    url = url.rstrip("/")
    sem = asyncio.Semaphore(max_concurrency)
    connector = aiohttp.TCPConnector(limit=max_concurrency)
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as client:
        t0 = time.monotonic() + 0.05
        tasks = [_one(client, url, model, i, float(a), int(p), int(d), t0, time_scale, sem, stream, chat,
                      dict(extra_body or {}), stale)
                 for i, (a, p, d) in enumerate(zip(arrival_s, prompt_tokens, max_tokens))]
        return list(await asyncio.gather(*tasks))


def summarize(results: list[Result]) -> dict[str, float]:
    """Mean / p50 / p99 of E2E, TTFT, TBT over the successful requests, and the error count."""
    ok = [r for r in results if r.error is None]
    out: dict[str, float] = {"requests": len(results), "errors": len(results) - len(ok)}
    for key in ("e2e_s", "ttft_s", "tbt_s"):
        v = np.array([getattr(r, key) for r in ok], np.float64)
        v = v[~np.isnan(v)]
        name = key[:-2]
        for stat, f in (("mean", np.mean), ("p50", lambda x: np.percentile(x, 50)),
                        ("p99", lambda x: np.percentile(x, 99))):
            out[f"{stat}_{name}_s"] = float(f(v)) if len(v) else math.nan
    return out
