"""The router service: OpenAI-compatible, routes each request with a registered router.

Per request: validate the body (``protocol.py``; a 4xx in OpenAI's error shape with the
reason, before any routing), add it to the service table and let the router decide
(``dispatch.py``: one frozen snapshot per decision, holding routers on the simulator's grid),
then proxy it to its backend (``upstream.py``: timeouts at every stage, retries before the
first byte, streamed replies relayed and checked chunk by chunk, non-streamed ones assembled
from an upstream stream, ``assemble.py``). Backends are probed and scraped in the background
(``service.py``, ``health.py``). Endpoints: ``POST /v1/completions``, ``POST
/v1/chat/completions``, ``GET /v1/models``, ``GET /health``, ``GET /metrics``; any other path is
a 404, another method a 405, both in OpenAI's error shape.

Why a bare ASGI app on uvicorn (with uvloop and httptools), and aiohttp upstream: vLLM's
OpenAI server is FastAPI on uvicorn; here FastAPI's layer (request models, dependency
injection, middlewares) took about half of the router's CPU per request in a py-spy profile,
and Starlette's router and responses a further share, and a proxy needs neither. The upstream
client is aiohttp's, not httpx's: on this 2-core machine against one simulated backend, httpx's
async client managed ~230 req/s at 8 connections and ~90 at 64, aiohttp's ~1,100 and ~1,000
(docs/serving.md).
"""

from __future__ import annotations

import gc
from types import SimpleNamespace

from prometheus_client import generate_latest

from .config import RouterServiceConfig
from .protocol import CHAT, COMPLETIONS
from .service import RouterService
from .upstream import Proxy, send_json


def _error(message: str, code: str) -> dict:
    return {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": code}}


class RouterApp:
    """The ASGI application (``app.state.service`` is the ``RouterService``)."""

    def __init__(self, svc: RouterService):
        self.svc = svc
        self.state = SimpleNamespace(service=svc)
        proxy = Proxy(svc)

        def endpoint(kind, path):
            return lambda scope, receive, send: proxy.handle(scope, receive, send, kind, path)

        self.routes = {
            "/v1/completions": (("POST",), endpoint(COMPLETIONS, "/v1/completions")),
            "/v1/chat/completions": (("POST",), endpoint(CHAT, "/v1/chat/completions")),
            "/v1/models": (("GET", "HEAD"), self.models),
            "/health": (("GET", "HEAD"), self.health),
            "/metrics": (("GET", "HEAD"), self.metrics),
        }

    async def __call__(self, scope, receive, send) -> None:
        kind = scope["type"]
        if kind == "http":
            route = self.routes.get(scope["path"])
            if route is None:
                await send_json(send, 404, _error(f"no such endpoint: {scope['path']}; endpoints: "
                                                  + ", ".join(self.routes), "not_found"))
                return
            methods, handler = route
            if scope["method"] not in methods:
                allow = ", ".join(methods)
                await send_json(send, 405, _error(f"method {scope['method']} is not allowed on "
                                                  f"{scope['path']}; allowed: {allow}", "method_not_allowed"),
                                [(b"allow", allow.encode())])
                return
            await handler(scope, receive, send)
        elif kind == "lifespan":
            await self._lifespan(receive, send)

    async def _lifespan(self, receive, send) -> None:
        while True:
            msg = await receive()
            if msg["type"] == "lifespan.startup":
                # What exists now (the router, a trained network, torch, the config) lives as long
                # as the process: out of the cyclic collector's full passes, which otherwise walk it
                # (5% of the router's CPU under load in a py-spy --native profile).
                gc.freeze()
                await self.svc.start()
                await send({"type": "lifespan.startup.complete"})
            elif msg["type"] == "lifespan.shutdown":
                await self.svc.stop()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def models(self, scope, receive, send) -> None:
        cfg = self.svc.cfg
        await send_json(send, 200, {"object": "list", "data": [
            {"id": m, "object": "model", "owned_by": "llm_lb_gym", "max_model_len": cfg.context_tokens}
            for m in cfg.models]})

    async def health(self, scope, receive, send) -> None:
        views = self.svc.views
        up = [v.url for v in views if v.up]
        down = {v.url: v.health.reason for v in views if not v.up}
        await send_json(send, 200 if up else 503,
                        {"status": "ok" if up else "no_backend", "up": up, "down": down})

    async def metrics(self, scope, receive, send) -> None:
        body = generate_latest(self.svc.registry)
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/plain; version=0.0.4"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


def create_app(cfg: RouterServiceConfig, router=None) -> RouterApp:
    """The router service's ASGI app (serve it with uvicorn). ``router``: a router object to
    use instead of ``cfg.router`` (a trained policy, ``learned.LearnedPolicyRouter``)."""
    return RouterApp(RouterService(cfg, router))
