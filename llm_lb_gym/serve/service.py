"""The router service's state: the view, the decision core's clock, backend health, metrics.

One asyncio loop owns all of it. Requests (``upstream.py``) ask ``acquire`` for a backend and
``finish`` when they leave it; decisions go through ``dispatch.Dispatcher`` (a frozen snapshot
per decision, holding routers on the grid); each backend has two background loops here: a
``/health`` probe (``health.py``: hysteresis, and the circuit breaker fed by the requests) and
a ``/metrics`` scrape (its load for the view; a failed scrape only makes it stale).

A backend taken out (``mark_down``) leaves the routers' view at the next decision (the router is
reset over the remaining ones), and its requests that have sent nothing to their clients yet
fail over at once: those waiting for headers or a first token, and, when the probes took it out,
streams idle longer than a probe's deadline (a hung server), instead of each waiting out its
own timeout.
"""

from __future__ import annotations

import asyncio
import time

import aiohttp
import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from ..routers.registry import make_router
from .config import RouterServiceConfig
from .dispatch import Dispatcher
from .health import BackendHealth
from .http_client import Pool, UpstreamHTTPError, backend_address
from .protocol import make_counter
from .scrape import parse_metrics
from .view import BackendView, ServiceTable, inv_ideal_function

_DECISION_BUCKETS = (1e-6, 2e-6, 5e-6, 1e-5, 2e-5, 5e-5, 1e-4, 2e-4, 5e-4, 1e-3, 2e-3, 5e-3, 1e-2)
UPSTREAM_ERRORS = (UpstreamHTTPError, aiohttp.ClientError, asyncio.TimeoutError, ConnectionError)


class NoBackend(Exception):
    """No backend took the request within ``queue_timeout_s``."""


class RouterService:
    """The router's state: view, router, waiters, health, HTTP client, metrics (one event loop)."""

    def __init__(self, cfg: RouterServiceConfig, router=None):
        self.cfg = cfg
        self.count = make_counter(cfg.tokenizer)
        self.router = make_router(cfg.router, **cfg.router_options) if router is None else router
        self.latency = cfg.latency_model
        self.inv_ideal = inv_ideal_function(self.latency, cfg.frontend_model)
        self.rng = np.random.default_rng(cfg.seed)
        self.table = ServiceTable()
        self.views = [BackendView(i, url.rstrip("/"), self.table, block_size=cfg.backend_block_size,
                                  num_blocks=cfg.kv_blocks, max_seqs=cfg.backend_max_seqs,
                                  latency=self.latency, stale_s=cfg.stale_s, async_scheduling=cfg.async_scheduling)
                      for i, url in enumerate(cfg.backends)]
        hc = cfg.health
        for v in self.views:
            v.health = BackendHealth(hc)
            v.guards = {}     # rid -> Guard of a request that has sent its client nothing yet
            v.relays = {}     # rid -> Relay of a reply being read (idle streams are cut on a probe down)
            v.addr, v.base_path = backend_address(v.url)
        self.buckets = self._bucket_function()
        if hasattr(self.router, "prepare"):
            self.router.prepare(self.views)
        self._metrics()
        self.dispatcher = Dispatcher(self.router, self.views, self.rng, cfg.decision_interval_s,
                                     on_decision=self.m_decision.observe)
        self.cluster = self.dispatcher.cluster
        self.cluster.arrivals_ahead = getattr(self.router, "arrivals_ahead", 0)
        self.t0 = time.monotonic()
        self.waiters: dict[int, asyncio.Future] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self.client: aiohttp.ClientSession | None = None   # the probes' and scrapes'
        self.pool: Pool | None = None                      # the requests' (http_client.py)
        self._tasks: list[asyncio.Task] = []

    def _bucket_function(self):
        """(prompt bucket, decode bucket) of a request: a trained policy's edges, Min-Min's
        decode edges (as the env fills ``decode_bucket`` for it), or none."""
        b = getattr(self.router, "buckets", None)
        if b is not None:
            return b
        edges = getattr(getattr(self.router, "options", None), "decode_edges_tokens", ())
        if edges:
            import bisect

            return lambda p, d: (0, bisect.bisect_right(edges, d))
        return None

    def _metrics(self) -> None:
        r = self.registry = CollectorRegistry()
        self.m_requests = Counter("llm_lb_router_requests", "Requests by endpoint and outcome",
                                  ["endpoint", "outcome"], registry=r)
        self._outcomes: dict[tuple[str, str], object] = {}   # labelled children, looked up once
        Gauge("llm_lb_router_queue_length", "Requests held at the router",
              registry=r).set_function(lambda: self.dispatcher.waiting)
        inflight = Gauge("llm_lb_router_backend_in_flight", "Requests in flight per backend",
                         ["backend"], registry=r)
        up = Gauge("llm_lb_router_backend_up", "1 when the backend is routed to", ["backend"], registry=r)
        for v in self.views:
            inflight.labels(v.url).set_function(lambda v=v: len(v.inflight))
            up.labels(v.url).set_function(lambda v=v: 1.0 if v.up else 0.0)
        self.m_decision = Histogram("llm_lb_router_decision_seconds", "Time of one routing decision",
                                    buckets=_DECISION_BUCKETS, registry=r)
        self.m_failover = Counter("llm_lb_router_failovers", "Requests sent again after an attempt failed",
                                  ["backend"], registry=r)
        self.m_down = Counter("llm_lb_router_backend_down", "Times a backend was taken out",
                              ["backend"], registry=r)
        self.m_attempt_fail = Counter("llm_lb_router_upstream_failures",
                                      "Attempts that failed at a backend, by stage",
                                      ["backend", "stage"], registry=r)

    def count_outcome(self, kind: str, outcome: str) -> None:
        c = self._outcomes.get((kind, outcome))
        if c is None:
            c = self._outcomes[(kind, outcome)] = self.m_requests.labels(kind, outcome)
        c.inc()

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
        self.dispatch(max(self._timer_at, self.dispatcher.grid_time(self.now_s())))

    async def acquire(self, rid: int, retry: bool = False, avoid=()) -> BackendView:
        """The backend the router sends ``rid`` to (its ``on_route`` done); a retry goes back
        to the queue at its arrival's place and, where another backend is up, not to one in
        ``avoid`` (those it failed at)."""
        fut = asyncio.get_running_loop().create_future()
        self.waiters[rid] = fut
        d = self.dispatcher
        if retry:
            d.requeue(rid, avoid)
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
        """``rid`` left ``view`` (ended, failed or cancelled)."""
        if rid in view.inflight:
            view.on_end(rid)
        if self.cluster.queue and not self.dispatcher.holds:   # held ones wait for the grid
            self.dispatch()

    # ------------------------------------------------------------------ health
    def attempt_failed(self, view: BackendView, stage: str, why: str, fatal: bool = False) -> None:
        """An attempt failed at ``view`` (the circuit breaker counts it)."""
        self.m_attempt_fail.labels(view.url, stage).inc()
        if view.health.on_failure(self.now_s(), why, fatal) is False:
            self.mark_down(view, probe=False)

    def attempt_ok(self, view: BackendView) -> None:
        view.health.on_success()

    def mark_down(self, view: BackendView, probe: bool) -> None:
        """Take ``view`` out: the router stops choosing it at the next decision; its requests
        that sent nothing to their clients fail over now (``probe``: also cut its streams
        that are idle longer than a probe's deadline)."""
        if view.up:
            view.up = False
            self.m_down.labels(view.url).inc()
        for guard in list(view.guards.values()):
            guard.trip("backend_down")
        if probe:
            now = time.monotonic()
            for relay in list(view.relays.values()):
                if now - relay.last >= self.cfg.health_timeout_s:
                    relay.cut(f"backend {view.url} was taken out: {view.health.reason}")
        if self.cluster.queue and not self.dispatcher.holds:
            self.dispatch()

    def mark_up(self, view: BackendView) -> None:
        view.up = True
        if self.cluster.queue and not self.dispatcher.holds:
            self.dispatch()

    async def _probe_forever(self, v: BackendView) -> None:
        """``/health`` every ``health_interval_s``: the backend's up/down state (``health.py``)."""
        timeout = aiohttp.ClientTimeout(total=self.cfg.health_timeout_s)
        while True:
            why = ""
            try:
                async with self.client.get(v.url + "/health", timeout=timeout) as r:
                    ok = r.status == 200
                    why = f"HTTP {r.status}"
                    await r.read()
            except UPSTREAM_ERRORS as exc:
                ok, why = False, type(exc).__name__
            change = v.health.on_probe(ok, self.now_s(), why)
            if change is False:
                self.mark_down(v, probe=True)
            elif change is True:
                self.mark_up(v)
            await asyncio.sleep(self.cfg.health_interval_s)

    async def _scrape_forever(self, v: BackendView) -> None:
        """``/metrics`` every ``poll_interval_s``: the backend's load for the view."""
        timeout = aiohttp.ClientTimeout(total=max(0.5, self.cfg.poll_interval_s))
        while True:
            try:
                async with self.client.get(v.url + "/metrics", timeout=timeout) as r:
                    if r.status == 200:
                        v.on_poll(parse_metrics(await r.text()), self.now_s())
            except UPSTREAM_ERRORS:
                pass    # stale metrics are ignored after stale_s; health is the probe's
            await asyncio.sleep(self.cfg.poll_interval_s)

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        cfg = self.cfg
        self.client = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=None),
                                            auto_decompress=False)
        self.pool = Pool(cfg.connect_timeout_s)
        for v in self.views:
            self._tasks.append(asyncio.create_task(self._probe_forever(v)))
            self._tasks.append(asyncio.create_task(self._scrape_forever(v)))

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._timer is not None:
            self._timer.cancel()
        if self.client is not None:
            await self.client.close()
        if self.pool is not None:
            self.pool.close()
