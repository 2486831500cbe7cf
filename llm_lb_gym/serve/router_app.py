"""The router service: OpenAI-compatible, routes each request with a registered router.

Per request: validate the body (``protocol.py``; a 4xx with the reason, before any routing),
add it to the service table and the router queue, and let the router decide through
``routers.drive.decide`` on the ``ServiceCluster`` view (``view.py``), exactly as it decides in
the simulator. A router that never defers routes every queued request at once; a holding
router (``late_binding``) keeps requests in the queue and is asked again every
``decision_interval_s`` and whenever a request ends. The request is then proxied to its backend
and a streamed reply passed through unchanged, chunk by chunk as it arrives (each SSE event
counts as one token streamed in the in-flight table). A non-streamed request goes upstream as a
stream too and the router assembles the reply (``assemble.py``; ``assemble_upstream``, default
on): llama.cpp aborts only streamed requests whose client left, and the tokens are counted as
they come; off, or for a request the assembler cannot rebuild, the body and reply pass through.

Faults. A backend that refuses the connection or breaks a non-streamed reply (an assembled
one too, or one that ends unfinished: nothing went out yet) is marked down and the request goes
back to the queue for another backend (up to ``max_attempts``); an assembled reply whose
backend sends an SSE error event gets a 502 with its message; a streamed reply that breaks
after bytes went out cannot be replayed, so the client gets a final SSE ``error`` event;
either way it is counted (``llm_lb_router_requests_total{outcome}``). The poller marks a backend down when its ``/metrics`` fails and up again when it answers. A client
that disconnects, streamed or not, closes the upstream connection (or leaves the router's
queue), which cancels the request at a vLLM or llama.cpp server and at the simulated backend
(at llama.cpp only for a stream, hence the assembled non-streamed replies).

Why Starlette + uvicorn + aiohttp: Starlette is FastAPI's core (vLLM's OpenAI server is FastAPI
on uvicorn), and uvicorn with uvloop and httptools is among the fastest Python ASGI servers;
FastAPI's own layer (request models, dependency injection, its middlewares) took about half of
the router's CPU per request in a py-spy profile and gives a proxy nothing it needs. The
upstream client is aiohttp's, not httpx's: on this 2-core machine against one simulated
backend, httpx's async client managed ~230 req/s at 8 connections and ~90 at 64, aiohttp's
~1,100 and ~1,000 (docs/serving.md). Handlers read the raw body (no request model).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from contextlib import asynccontextmanager

import aiohttp
import numpy as np
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.routing import Route
from starlette.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from ..routers.drive import decide
from ..routers.registry import make_router
from ..sim.latency import get_preset
from .assemble import Assembler, UpstreamErrorEvent, needs_passthrough, streamed_body
from .config import RouterServiceConfig
from .protocol import CHAT, COMPLETIONS, BadRequest, error_body, make_counter, parse_request
from .scrape import parse_metrics
from .dispatch import Dispatcher
from .view import BackendView, ServiceTable, inv_ideal_function

_DECISION_BUCKETS = (1e-6, 2e-6, 5e-6, 1e-5, 2e-5, 5e-5, 1e-4, 2e-4, 5e-4, 1e-3, 2e-3, 5e-3, 1e-2)
_UPSTREAM_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError)


async def _client_gone(receive) -> None:
    """Return when the ASGI server reports the client's disconnect (call after the body is
    read: the next message is then ``http.disconnect``, or nothing until the response ends)."""
    while (await receive())["type"] != "http.disconnect":
        pass


class NoBackend(Exception):
    """No backend took the request within ``queue_timeout_s``."""


class RouterService:
    """The router's state: view, router, waiters, HTTP client, metrics (one event loop)."""

    def __init__(self, cfg: RouterServiceConfig, router=None):
        self.cfg = cfg
        self.count = make_counter(cfg.tokenizer)
        self.router = make_router(cfg.router, **cfg.router_options) if router is None else router
        self.latency = get_preset(cfg.preset).latency
        self._inv_ideal = inv_ideal_function(self.latency)
        self.rng = np.random.default_rng(cfg.seed)
        self.table = ServiceTable()
        self.views = [BackendView(i, url.rstrip("/"), self.table, block_size=cfg.block_size,
                                  num_blocks=cfg.kv_blocks, max_seqs=cfg.max_seqs,
                                  latency=self.latency, stale_s=cfg.stale_s)
                      for i, url in enumerate(cfg.backends)]
        self._buckets = getattr(self.router, "buckets", None)
        if hasattr(self.router, "prepare"):
            self.router.prepare(self.views)
        self._metrics()
        self.dispatcher = Dispatcher(self.router, self.views, self.rng, cfg.decision_interval_s,
                                     on_decision=self.m_decision.observe)
        self.cluster = self.dispatcher.cluster
        self.t0 = time.monotonic()
        self.waiters: dict[int, asyncio.Future] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self.client: aiohttp.ClientSession | None = None

    def _metrics(self) -> None:
        r = self.registry = CollectorRegistry()
        self.m_requests = Counter("llm_lb_router_requests", "Requests by endpoint and outcome",
                                  ["endpoint", "outcome"], registry=r)
        Gauge("llm_lb_router_queue_length", "Requests held in the router queue",
              registry=r).set_function(lambda: self.dispatcher.waiting)
        inflight = Gauge("llm_lb_router_backend_in_flight", "Requests in flight per backend",
                         ["backend"], registry=r)
        up = Gauge("llm_lb_router_backend_up", "1 when the backend is routed to", ["backend"], registry=r)
        for v in self.views:
            inflight.labels(v.url).set_function(lambda v=v: len(v.inflight))
            up.labels(v.url).set_function(lambda v=v: 1.0 if v.up else 0.0)
        self.m_decision = Histogram("llm_lb_router_decision_seconds", "Time of one routing decision",
                                    buckets=_DECISION_BUCKETS, registry=r)
        self.m_failover = Counter("llm_lb_router_failovers", "Requests sent again after a backend failed",
                                  ["backend"], registry=r)
        self.m_down = Counter("llm_lb_router_backend_down", "Times a backend was marked down",
                              ["backend"], registry=r)

    # ------------------------------------------------------------------ routing
    def now_s(self) -> float:
        """The service's clock: seconds since it started (the decision grid's origin)."""
        return time.monotonic() - self.t0

    def dispatch(self, t: float | None = None) -> None:
        """Make the decision at ``t`` (default now; ``dispatch.py``), wake each routed request's
        handler, and while requests wait at a holding router, ask it again at the next grid
        point."""
        d = self.dispatcher
        for rid, view in d.decide(self.now_s() if t is None else t):
            fut = self.waiters.pop(rid, None)
            if fut is not None and not fut.done():
                fut.set_result(view)
        if d.holds and d.waiting and self._timer is None:
            self._schedule(d.next_grid_time(self.now_s()))

    def _schedule(self, t: float) -> None:
        self._timer_at = t
        self._timer = asyncio.get_running_loop().call_later(max(0.0, t - self.now_s()), self._tick)

    def _tick(self) -> None:
        """A grid point: decide there (or at the latest point passed, if the loop was late)."""
        self._timer = None
        d = self.dispatcher
        self.dispatch(max(self._timer_at, d.grid_time(self.now_s())))

    async def acquire(self, rid: int, retry: bool = False) -> BackendView:
        fut = asyncio.get_running_loop().create_future()
        self.waiters[rid] = fut
        d = self.dispatcher
        if retry:   # back to the router after a failed attempt: ahead of later arrivals
            d.requeue(rid)
        else:
            d.arrive(rid)
        if not d.holds:
            self.dispatch()
        elif self._timer is None:
            self._schedule(d.next_grid_time(self.now_s()))
        if fut.done():
            return fut.result()
        # asyncio.wait, not wait_for: wait_for returns the result when the request is routed in
        # the same loop step as its handler is cancelled (client gone), and the cancellation is lost.
        try:
            done, _ = await asyncio.wait((fut,), timeout=self.cfg.queue_timeout_s)
        except asyncio.CancelledError:
            self._withdraw(rid, fut)
            raise
        if done:
            return fut.result()
        self._withdraw(rid, fut)
        raise NoBackend from None

    def _withdraw(self, rid: int, fut: asyncio.Future) -> None:
        """Take a waiting request back: out of the queue, or, if it was routed meanwhile, out
        of its backend's in-flight table."""
        self.waiters.pop(rid, None)
        self.dispatcher.withdraw(rid)
        if fut.done() and not fut.cancelled():
            self.finish(fut.result(), rid)
        else:
            fut.cancel()

    def finish(self, view: BackendView, rid: int) -> None:
        view.on_end(rid)
        if self.cluster.queue and not self.dispatcher.holds:   # held ones wait for the grid
            self.dispatch()

    def mark_down(self, view: BackendView) -> None:
        if view.up:
            view.up = False
            self.m_down.labels(view.url).inc()

    async def poll_forever(self) -> None:
        """Scrape every backend's /metrics each poll interval; it is also the health check."""
        while True:
            await asyncio.gather(*(self._poll(v) for v in self.views))
            if self.cluster.queue and not self.dispatcher.holds:
                self.dispatch()
            await asyncio.sleep(self.cfg.poll_interval_s)

    async def _poll(self, v: BackendView) -> None:
        try:
            timeout = aiohttp.ClientTimeout(total=max(0.5, self.cfg.poll_interval_s))
            async with self.client.get(v.url + "/metrics", timeout=timeout) as r:
                r.raise_for_status()
                text = await r.text()
        except _UPSTREAM_ERRORS:
            self.mark_down(v)
            return
        v.on_poll(parse_metrics(text), self.now_s())
        v.up = True

    # ------------------------------------------------------------------ proxying
    async def handle(self, request: Request, kind: str, path: str):
        raw = await request.body()
        try:
            req = parse_request(raw, kind, self.cfg.models, self.cfg.context_tokens, self.count)
        except BadRequest as exc:
            self.m_requests.labels(kind, "rejected").inc()
            return JSONResponse(exc.body(), status_code=exc.status)
        tb = self.table
        pb, db = (0, 0) if self._buckets is None else self._buckets(req.prompt_tokens, req.max_tokens)
        rid = tb.add(req.prompt_tokens, float(req.max_tokens), self.now_s(),
                     self._inv_ideal(req.prompt_tokens, req.max_tokens), pb, db)
        headers = {"content-type": "application/json"}
        if "authorization" in request.headers:
            headers["authorization"] = request.headers["authorization"]
        try:
            if req.stream:
                return await self._send(req, raw, headers, kind, path, rid)
            return await self._unless_client_leaves(request, self._send(req, raw, headers, kind, path, rid),
                                                    kind, rid)
        except BaseException:
            tb.free(rid)
            raise

    async def _unless_client_leaves(self, request: Request, work, kind: str, rid: int):
        """Run a non-streamed request while watching its client's connection; if the client
        goes first, cancel the work, which closes the upstream connection mid-reply (the backend
        sees the disconnect and aborts the request, freeing its slot) or takes the request out
        of the router's queue if it was still held. Why: a non-streamed handler writes nothing
        until the reply is complete, so without the watch the router would learn of the
        disconnect only then, after the backend spent the whole generation on it.

        ``work`` (the ``_send`` coroutine) runs in this task and the watcher cancels this task:
        one extra task per request and no ``asyncio.wait``, which cost ~0.05 ms of the router's
        ~0.3 ms CPU per request. A cancellation lands at one of ``work``'s awaits, before it
        settled its accounts, or not at all once ``work`` has returned (``working`` is False)."""
        me = asyncio.current_task()
        state = {"working": True, "left": False}

        def on_gone(watch: asyncio.Future) -> None:
            if state["working"] and not watch.cancelled():
                state["left"] = True
                me.cancel()

        gone = asyncio.ensure_future(_client_gone(request.receive))
        gone.add_done_callback(on_gone)
        try:
            return await work
        except asyncio.CancelledError:
            if not state["left"]:
                raise   # cancelled from outside (shutdown)
            me.uncancel()
            self.table.free(rid)   # _send gave back the backend slot; the row is this side's
            self.m_requests.labels(kind, "cancelled").inc()
            return Response(status_code=499)   # nobody reads it: the connection is gone
        finally:
            state["working"] = False
            gone.cancel()

    async def _send(self, req, raw: bytes, headers: dict, kind: str, path: str, rid: int):
        assemble = not req.stream and self.cfg.assemble_upstream and needs_passthrough(req.body) is None
        if assemble:
            raw = streamed_body(req.body)
        last_error = ""
        for attempt in range(self.cfg.max_attempts):
            try:
                view = await self.acquire(rid, retry=attempt > 0)
            except NoBackend:
                self.m_requests.labels(kind, "no_backend").inc()
                self.table.free(rid)
                why = "no backend is up" if not self.cluster.engines else "the router held it"
                return JSONResponse(error_body(f"no backend took the request within "
                                               f"{self.cfg.queue_timeout_s} s ({why})", "no_backend"),
                                    status_code=503)
            url = view.url + path
            try:
                resp = await self.client.post(url, data=raw, headers=headers)
                asm = None
                if not req.stream:
                    try:
                        if assemble and resp.status == 200:
                            asm = await self._assemble(resp, view, rid, kind)
                        else:
                            content = await resp.read()
                    except BaseException:
                        resp.close()    # drop the connection: the backend sees the client go
                        raise
                    resp.release()
            except UpstreamErrorEvent as exc:   # the backend's own error event: not a fault to retry
                self.finish(view, rid)
                self.table.free(rid)
                self.m_requests.labels(kind, "upstream_error").inc()
                return JSONResponse(error_body(f"backend {view.url} sent an error instead of its "
                                               f"reply: {exc}", "upstream_error"), status_code=502)
            except _UPSTREAM_ERRORS as exc:
                last_error = f"{view.url}: {type(exc).__name__}: {exc}"
                self.mark_down(view)
                self.m_failover.labels(view.url).inc()
                self.finish(view, rid)
                self.table.o_base[rid] = 0
                continue
            except BaseException:   # cancelled (client gone, shutdown): out of flight, then up
                self.finish(view, rid)
                raise
            if not req.stream:
                self.finish(view, rid)
                self.table.free(rid)
                outcome = "ok" if resp.status == 200 else "backend_status"
                self.m_requests.labels(kind, outcome).inc()
                if asm is not None:
                    return JSONResponse(asm.reply(req.prompt_tokens))
                return Response(content, status_code=resp.status,
                                media_type=resp.headers.get("content-type", "application/json"))
            if resp.status != 200:
                try:
                    body = await resp.read()
                except _UPSTREAM_ERRORS:
                    msg = f"backend {view.url} answered {resp.status}"
                    body = json.dumps(error_body(msg, "upstream_error")).encode()
                resp.release()
                self.finish(view, rid)
                self.table.free(rid)
                self.m_requests.labels(kind, "backend_status").inc()
                return Response(body, status_code=resp.status,
                                media_type=resp.headers.get("content-type", "application/json"))
            relay = _Relay(self, resp, view, rid, kind)
            response = StreamingResponse(self._stream(relay), media_type="text/event-stream")
            response.relay = relay
            return response
        self.m_requests.labels(kind, "upstream_error").inc()
        self.table.free(rid)
        return JSONResponse(error_body(f"every attempt failed ({self.cfg.max_attempts}); last: "
                                       f"{last_error}", "upstream_error"), status_code=502)

    async def _assemble(self, resp, view: BackendView, rid: int, kind: str) -> Assembler:
        """Read a streamed upstream reply into an ``Assembler``, counting its tokens; a stream
        that ends before the reply is complete is an upstream fault (retried elsewhere)."""
        asm = Assembler(kind)
        try:
            async for chunk in resp.content.iter_any():
                n = asm.feed(chunk)
                if n:
                    view.on_tokens(rid, n)
        except _UPSTREAM_ERRORS:
            if not asm.done:    # broken after [DONE]: the reply is whole all the same
                raise
        if not asm.complete:
            raise aiohttp.ClientPayloadError("the stream ended before the reply was complete")
        return asm

    async def _stream(self, relay: "_Relay"):
        resp, view, rid = relay.resp, relay.view, relay.rid
        try:
            try:
                async for chunk in resp.content.iter_any():
                    n = chunk.count(b"data: ")
                    if n:
                        view.on_tokens(rid, n)
                    yield chunk
                relay.outcome = "ok"
            except _UPSTREAM_ERRORS as exc:
                relay.outcome = "upstream_error"
                self.mark_down(view)
                msg = f"backend {view.url} failed mid-stream ({type(exc).__name__}); the reply is incomplete"
                yield b"data: " + json.dumps(error_body(msg, "upstream_error")).encode() + b"\n\n"
        finally:
            relay.close()


class _Relay:
    """The end of one streamed request, run exactly once: by the relay generator, or by the
    endpoint when the generator never started (the client left before the first byte)."""

    def __init__(self, svc: RouterService, resp, view: BackendView, rid: int, kind: str):
        self.svc, self.resp, self.view, self.rid, self.kind = svc, resp, view, rid, kind
        self.outcome = "cancelled"
        self.closed = False

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.outcome == "ok":
            self.resp.release()     # read to the end: the connection goes back to the pool
        else:
            self.resp.close()       # drop the connection: the backend sees the client go
        self.svc.finish(self.view, self.rid)
        self.svc.table.free(self.rid)
        self.svc.m_requests.labels(self.kind, self.outcome).inc()


class _Endpoint:
    """An OpenAI endpoint as a raw ASGI app, so that a streamed reply whose generator never
    started (client gone before the first byte) is still closed and counted."""

    def __init__(self, svc: RouterService, kind: str, path: str):
        self.svc, self.kind, self.path = svc, kind, path

    async def __call__(self, scope, receive, send) -> None:
        response = await self.svc.handle(Request(scope, receive), self.kind, self.path)
        try:
            await response(scope, receive, send)
        finally:
            relay = getattr(response, "relay", None)
            if relay is not None:
                relay.close()


def create_app(cfg: RouterServiceConfig, router=None) -> Starlette:
    """The router service's ASGI app (serve it with uvicorn). ``router``: a router object to
    use instead of ``cfg.router`` (a trained policy, ``learned.LearnedPolicyRouter``)."""
    svc = RouterService(cfg, router)

    @asynccontextmanager
    async def lifespan(app):
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=5.0, sock_read=cfg.request_timeout_s)
        svc.client = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout,
                                           auto_decompress=False)
        poller = asyncio.create_task(svc.poll_forever())
        yield
        poller.cancel()
        await svc.client.close()


    async def models(request: Request):
        return JSONResponse({"object": "list", "data": [
            {"id": m, "object": "model", "owned_by": "llm_lb_gym", "max_model_len": cfg.context_tokens}
            for m in cfg.models]})

    async def health(request: Request):
        up = [v.url for v in svc.views if v.up]
        down = [v.url for v in svc.views if not v.up]
        return JSONResponse({"status": "ok" if up else "no_backend", "up": up, "down": down},
                            status_code=200 if up else 503)

    async def metrics(request: Request):
        return Response(generate_latest(svc.registry), media_type="text/plain; version=0.0.4")

    app = Starlette(lifespan=lifespan, routes=[
        Route("/v1/completions", _Endpoint(svc, COMPLETIONS, "/v1/completions"), methods=["POST"]),
        Route("/v1/chat/completions", _Endpoint(svc, CHAT, "/v1/chat/completions"), methods=["POST"]),
        Route("/v1/models", models), Route("/health", health), Route("/metrics", metrics)])
    app.state.service = svc
    return app
