"""A simulated inference server: OpenAI API and vLLM's metric names, token timing from the engine.

Routers are exercised at cluster scale over real HTTP without a GPU by running N of these
behind the router service. Each holds one simulator engine (``sim/engine.py``, the same
instance model the env uses) whose clock is the wall clock times ``time_scale`` (2.0: the
simulated GPU runs twice as fast as real time). Iterations run when the engine says they
start, and a token is released to its client when the iteration that made it *ends* on the
wall clock, so TTFT, TBT and E2E seen by a client over HTTP are the simulator's, plus the
event loop's lateness (measured in ``docs/serving.md``).

The output is ``max_tokens`` tokens (the text " tok" each, one word = one token for the word
counter), as vLLM does with ``ignore_eos``: the load generator asks for a workload's decode
length and gets exactly that many tokens.

A client that disconnects, streamed or not, has its request aborted (``Engine.abort``): it
leaves the waiting queue or the batch, its KV blocks and batch slot go to the waiting requests
at the next iteration, as vLLM aborts a request whose client went away (counted in
``sim_backend_cancelled_total``). One mid-chunked-prefill is aborted when its prefill ends.
A stream with ``stream_options.include_usage`` ends with OpenAI's usage chunk (no choices).
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.routing import Route
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from ..sim._compiled import engine_class
from ..sim.config import EngineConfig
from ..sim.request import RequestTable, Status
from .protocol import CHAT, COMPLETIONS, BadRequest, parse_request
from .scrape import BackendLoad

_RUNNING, _FINISHED = int(Status.RUNNING), int(Status.FINISHED)
_EPS_S = 1e-9     # "run the iteration that starts now": advance_to runs those starting before T


@dataclass(frozen=True)
class SimBackendConfig:
    """Options of one simulated backend."""

    model: str = "sim-model"
    """Model name served (``/v1/models``, and the only ``model`` accepted)."""
    engine: EngineConfig = EngineConfig()
    """The simulated instance (preset, KV cache, batch limits, scheduler)."""
    time_scale: float = 1.0
    """Simulated seconds per wall-clock second (> 1: faster than the simulated GPU)."""
    table_capacity: int = 65536
    """Requests one engine table holds; a fresh engine takes over when it is full and idle."""

    def __post_init__(self) -> None:
        from .._validate import check_int, check_range

        check_range("time_scale", self.time_scale, 0.0, 1e6, lo_open=True)
        check_int("table_capacity", self.table_capacity, 16, 1 << 24)
        if not self.model:
            raise ValueError("model must be a non-empty name")


class _Live:
    """A request being served: tokens released so far and the event that wakes its writer."""

    __slots__ = ("rid", "tokens", "done", "event", "cancelled")

    def __init__(self, rid: int):
        self.rid = rid
        self.tokens = 0
        self.done = False
        self.cancelled = False
        self.event = asyncio.Event()


class SimBackend:
    """The engine, its wall-clock pacing loop and the live requests (one asyncio loop)."""

    def __init__(self, cfg: SimBackendConfig):
        self.cfg = cfg
        e = cfg.engine
        self.context_tokens = min(e.context_len, (e.total_blocks - e.watermark_blocks) * e.block_size)
        self._new_engine()
        self.t0 = time.monotonic()
        self.live: dict[int, _Live] = {}
        self.aborting: set[int] = set()   # cancelled mid-chunked-prefill: aborted once it runs
        self.wake = asyncio.Event()
        self.counters = {"requests_total": 0, "success_total": 0, "cancelled_total": 0,
                         "prompt_tokens_total": 0, "generation_tokens_total": 0}
        self._task: asyncio.Task | None = None

    def _new_engine(self) -> None:
        n = self.cfg.table_capacity
        zeros = [0] * n
        self.table = RequestTable(zeros, [1] * n, [1] * n, [1.0] * n)
        self.engine = engine_class()(0, self.cfg.engine, self.table, fast=True)
        self.next_rid = 0

    def now(self) -> float:
        return (time.monotonic() - self.t0) * self.cfg.time_scale

    def submit(self, prompt_tokens: int, max_tokens: int) -> _Live:
        if self.next_rid >= self.cfg.table_capacity:
            if not self.engine.idle():
                raise BadRequest(503, f"simulated backend: its table of {self.cfg.table_capacity} "
                                      "requests is full and the engine is busy; retry later",
                                 None, "overloaded")
            t = self.engine.t
            self._new_engine()
            self.engine.t = t
        rid = self.next_rid
        self.next_rid += 1
        tb, now = self.table, self.now()
        tb.arrival_s[rid] = now
        tb.prompt[rid] = prompt_tokens
        tb.decode[rid] = max_tokens
        tb.pred[rid] = float(max_tokens)
        self.engine.advance_to(now)
        self.engine.add(rid, now)
        live = _Live(rid)
        self.live[rid] = live
        self.counters["requests_total"] += 1
        self.counters["prompt_tokens_total"] += prompt_tokens
        self.wake.set()
        return live

    def abort(self, live: _Live) -> None:
        """The client of ``live`` went away: drop its request from the engine now (or, if it is
        between chunks of a chunked prefill, as soon as the pacing loop sees it run)."""
        if live.done or live.cancelled:
            return
        live.cancelled = True
        self.counters["cancelled_total"] += 1
        self.live.pop(live.rid, None)
        self._try_abort(live.rid)

    def _try_abort(self, rid: int) -> None:
        self.engine.advance_to(self.now())
        if self.engine.abort(rid, self.now()):
            self.aborting.discard(rid)
        else:
            self.aborting.add(rid)
        self.wake.set()

    def _release(self) -> None:
        """Hand every live request the tokens its engine state holds (iterations ended)."""
        tb, eng = self.table, self.engine
        G = eng.G
        finished = []
        for rid, live in self.live.items():
            st = tb.status[rid]
            if st == _FINISHED:
                n = tb.decode[rid]
            elif st == _RUNNING:
                n = tb.o_base[rid] + G - tb.g_base[rid]
            else:
                n = tb.o_base[rid]
            if n > live.tokens:
                self.counters["generation_tokens_total"] += n - live.tokens
                live.tokens = n
                live.event.set()
            if st == _FINISHED:
                live.done = True
                live.event.set()
                finished.append(rid)
        for rid in finished:
            del self.live[rid]
            self.counters["success_total"] += 1
        for rid in tuple(self.aborting):
            if tb.status[rid] == _FINISHED:
                self.aborting.discard(rid)
            else:
                self._try_abort(rid)

    async def run(self) -> None:
        """Pace the engine: run the iteration that starts now, sleep until it ends, release."""
        eng, scale = self.engine, self.cfg.time_scale
        while True:
            eng = self.engine
            if eng.idle():
                self._release()
                self.wake.clear()
                await self.wake.wait()
                continue
            eng.advance_to(max(self.now(), eng.t) + _EPS_S)
            now = self.now()
            if eng.t <= now and eng.fe_count and math.isfinite(eng.fe_next):
                # Nothing runs until the frontend hands a request on (``engine.frontend``): sleep
                # until then, or until a new request arrives. Without this the loop spun, holding
                # the event loop (no request accepted, no stream written) for the ~44 ms of the
                # vLLM V1 frontends' delay and input work.
                self.wake.clear()
                try:
                    await asyncio.wait_for(self.wake.wait(), max(eng.fe_next - now, 0.0) / scale)
                except asyncio.TimeoutError:
                    pass
                continue
            delay = (eng.t - now) / scale
            if delay > 0 and math.isfinite(delay):
                await asyncio.sleep(delay)
            self._release()

    def metrics_text(self) -> str:
        e = self.engine
        load = engine_load(e)
        running, usage = load.running, load.kv_usage
        c = self.counters
        name = self.cfg.model
        lines = [
            "# TYPE vllm:num_requests_running gauge",
            f'vllm:num_requests_running{{model_name="{name}"}} {running}',
            "# TYPE vllm:num_requests_waiting gauge",
            f'vllm:num_requests_waiting{{model_name="{name}"}} {e.num_waiting}',
            "# TYPE vllm:gpu_cache_usage_perc gauge",
            f'vllm:gpu_cache_usage_perc{{model_name="{name}"}} {usage}',
            "# TYPE vllm:kv_cache_usage_perc gauge",
            f'vllm:kv_cache_usage_perc{{model_name="{name}"}} {usage}',
            "# TYPE vllm:cache_config_info gauge",
            f'vllm:cache_config_info{{block_size="{e.bs}",num_gpu_blocks="{e.total_blocks}",'
            f'max_num_seqs="{e.max_seqs}"}} 1.0',
            "# TYPE vllm:num_preemptions_total counter",
            f'vllm:num_preemptions_total{{model_name="{name}"}} {e.n_preemptions}',
            "# TYPE vllm:request_success_total counter",
            f'vllm:request_success_total{{model_name="{name}"}} {c["success_total"]}',
            "# TYPE vllm:prompt_tokens_total counter",
            f'vllm:prompt_tokens_total{{model_name="{name}"}} {c["prompt_tokens_total"]}',
            "# TYPE vllm:generation_tokens_total counter",
            f'vllm:generation_tokens_total{{model_name="{name}"}} {c["generation_tokens_total"]}',
            "# TYPE sim_backend_cancelled_total counter",
            f"sim_backend_cancelled_total {c['cancelled_total']}",
            "# TYPE sim_backend_requests_total counter",
            f"sim_backend_requests_total {c['requests_total']}",
        ]
        return "\n".join(lines) + "\n"


def engine_load(e) -> BackendLoad:
    """What a simulated backend's ``/metrics`` says of its engine (vLLM's gauges): running
    (batch and prefilling), waiting, KV usage, the KV cache's size. The router's lockstep
    driver (``lockstep.py``) polls engines through it too."""
    used = e.total_blocks - e.free_blocks
    return BackendLoad(e.B + len(e.prefilling), e.num_waiting, used / e.total_blocks,
                       e.total_blocks, e.bs)


async def _client_gone(receive) -> None:
    """Return when the client disconnects (the body already read; as in ``router_app``)."""
    while (await receive())["type"] != "http.disconnect":
        pass


def _chunk_bytes(kind: str, cid: str, model: str, finish: str | None, text: str) -> bytes:
    if kind == CHAT:
        choice = {"index": 0, "delta": {"content": text} if text else {}, "finish_reason": finish}
        obj = {"id": cid, "object": "chat.completion.chunk", "model": model, "choices": [choice]}
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        obj = {"id": cid, "object": "text_completion", "model": model, "choices": [choice]}
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def create_app(cfg: SimBackendConfig = SimBackendConfig()):
    """The ASGI app of one simulated backend (serve it with uvicorn)."""
    state: dict[str, SimBackend] = {}

    @asynccontextmanager
    async def lifespan(app):
        backend = SimBackend(cfg)
        state["b"] = backend
        task = asyncio.create_task(backend.run())
        yield
        task.cancel()


    async def serve(request: Request, kind: str):
        b = state["b"]
        try:
            req = parse_request(await request.body(), kind, (cfg.model,), b.context_tokens)
            live = b.submit(req.prompt_tokens, req.max_tokens)
        except BadRequest as exc:
            return JSONResponse(exc.body(), status_code=exc.status)
        cid = f"cmpl-sim-{live.rid}-{id(b.engine) & 0xffff:x}"
        usage = {"prompt_tokens": req.prompt_tokens, "completion_tokens": req.max_tokens,
                 "total_tokens": req.prompt_tokens + req.max_tokens}
        opts = req.body.get("stream_options")
        include_usage = isinstance(opts, dict) and bool(opts.get("include_usage"))
        if not req.stream:
            gone = asyncio.ensure_future(_client_gone(request.receive))
            try:
                while not live.done:
                    live.event.clear()
                    waiter = asyncio.ensure_future(live.event.wait())
                    await asyncio.wait((waiter, gone), return_when=asyncio.FIRST_COMPLETED)
                    waiter.cancel()
                    if gone.done() and not live.done:
                        b.abort(live)
                        return Response(status_code=499)   # nobody reads it
            finally:
                gone.cancel()
            text = " tok" * req.max_tokens
            if kind == CHAT:
                choice = {"index": 0, "message": {"role": "assistant", "content": text},
                          "finish_reason": "length"}
                return JSONResponse({"id": cid, "object": "chat.completion", "model": cfg.model,
                                     "choices": [choice], "usage": usage})
            return JSONResponse({"id": cid, "object": "text_completion", "model": cfg.model,
                                 "choices": [{"index": 0, "text": text, "finish_reason": "length"}],
                                 "usage": usage})

        token = _chunk_bytes(kind, cid, cfg.model, None, " tok")

        async def stream():
            sent = 0
            try:
                while True:
                    await live.event.wait()
                    live.event.clear()
                    if live.tokens > sent:
                        yield token * (live.tokens - sent)
                        sent = live.tokens
                    if live.done:
                        break
                yield _chunk_bytes(kind, cid, cfg.model, "length", "")
                if include_usage:   # OpenAI's last chunk: no choices, the usage
                    obj = "chat.completion.chunk" if kind == CHAT else "text_completion"
                    yield b"data: " + json.dumps({"id": cid, "object": obj, "model": cfg.model,
                                                  "choices": [], "usage": usage}).encode() + b"\n\n"
                yield b"data: [DONE]\n\n"
            finally:
                if not live.done:
                    b.abort(live)

        return StreamingResponse(stream(), media_type="text/event-stream")

    async def completions(request: Request):
        return await serve(request, COMPLETIONS)

    async def chat(request: Request):
        return await serve(request, CHAT)

    async def models(request: Request):
        return JSONResponse({"object": "list", "data": [{
            "id": cfg.model, "object": "model", "owned_by": "llm_lb_gym",
            "max_model_len": state["b"].context_tokens}]})

    async def health(request: Request):
        return JSONResponse({"status": "ok"})

    async def metrics(request: Request):
        return PlainTextResponse(state["b"].metrics_text(), media_type="text/plain; version=0.0.4")

    app = Starlette(lifespan=lifespan, routes=[
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/v1/models", models), Route("/health", health), Route("/metrics", metrics)])
    app.state.backend = state
    return app
