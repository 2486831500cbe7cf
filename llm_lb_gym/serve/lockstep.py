"""The router service's decisions against the simulator's, on the same arrivals, in lockstep.

``served_run`` replays a request batch through the simulator's cluster (``sim/cluster.py``, the
env's instances), but every routing decision is made by the service's decision core
(``dispatch.Dispatcher`` over ``view.BackendView``s, the code the HTTP service runs), which
knows only what a router in front of real servers knows: the requests it sent, the tokens
streamed back to it, and each backend's polled metrics. At each decision the backends report
as the simulated backends do (``sim_backend.engine_load``: vLLM's gauges), with no network
delay: every token the engine has produced (the simulator's state at ``t`` counts the
iterations that started before ``t``) and a fresh poll. ``simulated_run`` is the same batch
with the router deciding on the simulator's own cluster (``routers.drive.run_router``).

Both walk the same decision clock (``sim.clock``): the grid for routers that may defer, on
arrival for the others. Equal decisions (instance and routing time per request) mean the
service's semantics are the simulator's: one frozen snapshot per decision, rounds, holds and
releases on the grid, the queue in arrival order, ties to the earlier request, and a view that
equals the engine wherever the service can know it (FCFS backends; preemption and chunked
prefill are where a router outside the server knows less: a preempted request looks running,
a partly prefilled one waiting). ``tests/test_serve_lockstep.py`` holds them equal for every
served router and a trained policy.
"""

from __future__ import annotations

import numpy as np

from ..routers.drive import run_router
from ..sim.clock import run_on_arrival, run_on_grid
from ..sim.cluster import Cluster
from ..sim.config import ClusterConfig
from ..sim.speed import ideal_s
from ..sim.request import RequestTable, Status
from .dispatch import Dispatcher
from .sim_backend import engine_load
from .view import BackendView, ServiceTable

_RUNNING, _FINISHED = int(Status.RUNNING), int(Status.FINISHED)


def inv_ideal(cluster_cfg: ClusterConfig, batch) -> np.ndarray:
    """1 / ideal latency per request, as the env and the service compute it."""
    e = cluster_cfg.engines[0]
    return 1.0 / ideal_s(e.latency_model, e.frontend_model, batch.prompt_tokens, batch.decode_tokens)


class _Recorder:
    """A router that notes each request it releases (the release order), deciding as ``router``."""

    def __init__(self, router):
        self.router, self.order = router, []
        self.name, self.defers = router.name, router.defers

    def reset(self, rng, num_instances: int) -> None:
        self.router.reset(rng, num_instances)

    def select(self, cluster, rid: int):
        inst = self.router.select(cluster, rid)
        if inst is not None:
            self.order.append(rid)
        return inst


class _QueueRecorder(_Recorder):
    def select_from_queue(self, cluster):
        choice = self.router.select_from_queue(cluster)
        if choice is not None:
            self.order.append(cluster.queue[choice[0]])
        return choice


def simulated_run(batch, cluster_cfg: ClusterConfig, router, rng: np.random.Generator,
                  decision_interval_s: float) -> tuple[Cluster, list[int]]:
    """The batch with ``router`` deciding in the simulator (oracle predictions: the service's
    ``max_tokens``); routers that never defer route on arrival. Returns the finished cluster
    and the request ids in the order they were routed."""
    dt = decision_interval_s if router.defers else 0.0
    rec = (_QueueRecorder if hasattr(router, "select_from_queue") else _Recorder)(router)
    cluster = run_router(batch, cluster_cfg, rec, rng, dt, inv_ideal_s=inv_ideal(cluster_cfg, batch),
                         decode_scheme=getattr(router, "decode_scheme", None),
                         prompt_scheme=getattr(router, "prompt_scheme", None))
    return cluster, rec.order


def _tokens(tb: RequestTable, engine, rid: int) -> int:
    """Output tokens the engine has made for ``rid`` (``sim_backend._release``'s count)."""
    st = tb.status[rid]
    if st == _FINISHED:
        return tb.decode[rid]
    if st == _RUNNING:
        return tb.o_base[rid] + engine.G - tb.g_base[rid]
    return tb.o_base[rid]


class _Lockstep:
    """The service's table, views and dispatcher beside a simulated cluster."""

    def __init__(self, cluster: Cluster, router, rng, dt: float, prepare=None):
        self.cluster = cluster
        self.stable = ServiceTable()
        e = cluster.cfg.engines[0]
        self.views = [BackendView(i, f"sim://{i}", self.stable, block_size=e.block_size,
                                  num_blocks=e.total_blocks, max_seqs=e.max_num_seqs,
                                  latency=e.latency_model, stale_s=float("inf"),
                                  async_scheduling=e.async_scheduling)
                      for i in range(cluster.cfg.num_instances)]
        if prepare is not None:
            prepare(self.views)
        self.buckets = getattr(router, "buckets", None)
        self.disp = Dispatcher(router, self.views, rng, dt)
        self.sim_of: dict[int, int] = {}    # service id -> simulator id
        self.svc_of: dict[int, int] = {}
        self.order: list[int] = []          # simulator ids in the order the service routed them

    def sync(self) -> None:
        """Every token and end the engines produced, then a poll of each (no delay)."""
        c, tb, st = self.cluster, self.cluster.table, self.stable
        for v in self.views:
            eng = c.engines[v.index]
            for srid in list(v.inflight):
                rid = self.sim_of[srid]
                n = _tokens(tb, eng, rid) - st.o_base[srid]
                if n > 0:
                    v.on_tokens(srid, n)
                if tb.status[rid] == _FINISHED:
                    v.on_end(srid)
                    st.free(srid)
            v.on_poll(engine_load(eng), c.t)

    def route_all(self, cluster: Cluster) -> None:
        """The clock's decider: the service decides, the simulator routes what it chose."""
        self.sync()
        tb, st = cluster.table, self.stable
        self.disp.cluster.arrivals_ahead = tb.n - cluster.n_arrived   # the episode's, as simulated
        for rid in cluster.queue:
            if rid not in self.svc_of:
                p, d = tb.prompt[rid], tb.pred[rid]
                pb, db = (0, 0) if self.buckets is None else self.buckets(p, d)
                srid = st.add(p, d, tb.arrival_s[rid], tb.inv_ideal[rid], pb, db, tb.pred_hi[rid])
                self.sim_of[srid], self.svc_of[rid] = rid, srid
                self.disp.arrive(srid)
        for srid, view in self.disp.decide(cluster.t):
            rid = self.sim_of[srid]
            cluster.route(view.index, cluster.queue.index(rid))
            self.order.append(rid)


def served_run(batch, cluster_cfg: ClusterConfig, router, rng: np.random.Generator,
               decision_interval_s: float) -> tuple[Cluster, list[int]]:
    """The batch through the simulator with the service's decision core routing (see the
    module docstring); returns what ``simulated_run`` returns."""
    table = RequestTable.from_batch(batch, None, inv_ideal_s=inv_ideal(cluster_cfg, batch))
    nb = getattr(router, "n_d", 1)
    np_ = getattr(router, "n_p", 1)
    cluster = Cluster(cluster_cfg, table, num_prompt_buckets=np_, num_decode_buckets=nb)
    holds = bool(getattr(router, "defers", True))
    ls = _Lockstep(cluster, router, rng, decision_interval_s, getattr(router, "prepare", None))
    if holds:
        run_on_grid(cluster, ls.route_all, decision_interval_s)
    else:
        run_on_arrival(cluster, ls.route_all, f"router {router.name!r}")
    assert cluster.done, "episode ended with requests neither finished nor rejected"
    return cluster, ls.order
