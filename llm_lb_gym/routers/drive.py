"""Drive the simulator with a router, without the Gymnasium layer.

For tests, and for comparing heuristics quickly (no observation building, no reward). Two
timings, matching the two ways a router is used:

- ``decision_interval_s == 0``: route on arrival, like ``sim/simulate.py``: at each arrival time
  every queued request is routed at once. A router that may defer is refused here (``defers``),
  because there is no next decision time at which to ask it again.
- ``decision_interval_s > 0``: decisions on the grid ``k * interval`` as in the env. At a grid
  point the router is asked again and again while requests wait (the env's default mode); a
  ``None`` ends the grid point and the queue waits for the next one. With an empty router queue
  the clock jumps to the first grid point at or after the next arrival.

Both walks are the decision clock's (``sim/clock.py``), which the env, the rollout operator and
``sim.simulate`` share; here it is given the router (``decide``) and the progress watchdog
(``sim/watchdog.py``).

``decide`` is the single place that knows the two calling conventions (``select`` on the head,
or ``select_from_queue`` for reordering routers); any driver - the env's evaluation loop
included - should use it.
"""

from __future__ import annotations

import functools

import numpy as np

from .._validate import ConfigError, check_range
from ..limits import MAX_ARRIVAL_S, MIN_DECISION_INTERVAL_S
from ..predictor.buckets import BucketScheme
from ..sim.clock import run_on_arrival, run_on_grid
from ..sim.cluster import Cluster
from ..sim.config import ClusterConfig
from ..sim.request import RequestTable
from ..sim.shared_host import SharedHost, SharedHostCluster
from ..sim.watchdog import Watchdog
from ..workload.batch import RequestBatch


ROUTER_SEED_STREAM = 7
"""Second entry of a router's RNG seed ``[episode seed, 7]``: routers draw from their own
stream, apart from the env's (workload, predictions), so every router sees the same requests."""


def router_rng(seed: int) -> np.random.Generator:
    """The RNG a router is reset with for the episode of env seed ``seed`` (the one place it is
    derived: evaluation, demonstrations, round-robin measurement, policy iteration)."""
    return np.random.default_rng([seed, ROUTER_SEED_STREAM])


def decide(cluster: Cluster, router) -> tuple[int, int] | None:
    """(router-queue position, instance) the router wants now, or None (defer). The queue must
    be non-empty. The cluster is not changed: route with ``cluster.route(instance, position)``."""
    pick = getattr(router, "select_from_queue", None)
    if pick is not None:
        choice = pick(cluster)
        if choice is None:
            return None
        pos, inst = choice
    else:
        inst = router.select(cluster, cluster.queue[0])
        if inst is None:
            return None
        pos = 0
    m = len(cluster.engines)
    if not (0 <= inst < m) or not (0 <= pos < len(cluster.queue)):
        raise ValueError(f"router {router.name!r} chose instance {inst} at queue position {pos}; "
                         f"allowed: instance in [0, {m - 1}], position in [0, {len(cluster.queue) - 1}]")
    return int(pos), int(inst)


def build_table(batch: RequestBatch, pred_decode_tokens=None,
                decode_scheme: BucketScheme | None = None, inv_ideal_s=None,
                prompt_scheme: BucketScheme | None = None) -> RequestTable:
    """The episode's table; predictions default to the true lengths (oracle). With a scheme,
    ``decode_bucket`` holds each prediction's bucket (``prompt_bucket`` each prompt's), as the
    env fills it; ``inv_ideal_s``
    (1 / each request's ideal latency, as the env and the router service fill it: late_binding
    orders by it) defaults to 0."""
    pred = np.asarray(batch.decode_tokens if pred_decode_tokens is None else pred_decode_tokens,
                      dtype=np.float64)
    if pred.shape != (len(batch),):
        raise ValueError(f"pred_decode_tokens has shape {pred.shape}, expected ({len(batch)},)")
    buckets = None if decode_scheme is None else decode_scheme.bucket(pred)
    pb = None if prompt_scheme is None else prompt_scheme.bucket(batch.prompt_tokens)
    return RequestTable.from_batch(batch, pred, decode_bucket=buckets, prompt_bucket=pb,
                                   inv_ideal_s=inv_ideal_s)


def run_router(batch: RequestBatch, cluster_cfg: ClusterConfig, router, rng: np.random.Generator,
               decision_interval_s: float = 0.0, pred_decode_tokens=None, *,
               decode_scheme: BucketScheme | None = None, check: bool = False,
               inv_ideal_s=None, prompt_scheme: BucketScheme | None = None,
               host: SharedHost | None = None) -> Cluster:
    """Run one episode with ``router`` until every request has finished or been rejected.

    ``rng`` goes to ``router.reset``; the simulator itself is deterministic. ``decode_scheme``
    fills ``table.decode_bucket`` (give Min-Min the same edges); ``prompt_scheme`` and
    ``inv_ideal_s`` fill ``table.prompt_bucket`` and ``table.inv_ideal`` (``build_table``; a
    trained policy's observation reads the buckets). ``host``: the instances share one
    machine's cores (``sim/shared_host.py``; CPU servers) instead of a GPU each. Returns the
    finished cluster (metrics: ``sim.metrics`` over ``cluster.table``).
    """
    check_range("decision_interval_s", decision_interval_s, 0.0, MAX_ARRIVAL_S)
    if 0.0 < decision_interval_s < MIN_DECISION_INTERVAL_S:
        raise ConfigError(f"decision_interval_s={decision_interval_s!r} is out of range; allowed: "
                          f"0.0 or [{MIN_DECISION_INTERVAL_S}, {MAX_ARRIVAL_S:g}]")
    if decision_interval_s == 0.0 and getattr(router, "defers", True):
        raise ConfigError(
            f"router {router.name!r} may defer, which needs a decision grid: "
            f"decision_interval_s=0.0 is not valid for it; allowed: > 0")
    table = build_table(batch, pred_decode_tokens, decode_scheme, inv_ideal_s, prompt_scheme)
    nb = 1 if decode_scheme is None else decode_scheme.num_buckets
    npb = 1 if prompt_scheme is None else prompt_scheme.num_buckets
    if host is None:
        cluster = Cluster(cluster_cfg, table, num_prompt_buckets=npb, num_decode_buckets=nb, check=check)
    else:
        cluster = SharedHostCluster(cluster_cfg, table, host, num_prompt_buckets=npb, num_decode_buckets=nb,
                                    check=check)
    router.reset(rng, cluster_cfg.num_instances)
    route_all = functools.partial(_route_all, router=router)
    if decision_interval_s == 0.0:
        run_on_arrival(cluster, route_all, f"router {router.name!r}")
    else:
        run_on_grid(cluster, route_all, decision_interval_s, Watchdog(cluster, f"router {router.name!r} ({router!r})").on_hold)
    assert cluster.done, "episode ended with requests neither finished nor rejected"
    return cluster


def _route_all(cluster: Cluster, router) -> None:
    """Route while the router agrees (the clock's ``route_all`` for any registered router)."""
    while cluster.queue:
        choice = decide(cluster, router)
        if choice is None:
            return
        pos, inst = choice
        cluster.route(inst, pos)
