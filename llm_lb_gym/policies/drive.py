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

``decide`` is the single place that knows the two calling conventions (``select`` on the head,
or ``select_from_queue`` for reordering routers); any driver - the env's evaluation loop
included - should use it.
"""

from __future__ import annotations

import math

import numpy as np

from .._validate import ConfigError, check_range
from ..limits import MAX_ARRIVAL_S, MIN_DECISION_INTERVAL_S
from ..predictor.buckets import BucketScheme
from ..sim.cluster import Cluster
from ..sim.config import ClusterConfig
from ..sim.request import RequestTable
from ..workload.batch import RequestBatch

# A router deferring on a completely idle cluster for this long will never route: stop instead
# of spinning (no sensible policy waits an hour of simulated time with nothing running).
_MAX_IDLE_DEFER_S = 3600.0


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
                decode_scheme: BucketScheme | None = None) -> RequestTable:
    """The episode's table; predictions default to the true lengths (oracle). With a scheme,
    ``decode_bucket`` holds each prediction's bucket, as the env fills it."""
    pred = np.asarray(batch.decode_tokens if pred_decode_tokens is None else pred_decode_tokens,
                      dtype=np.float64)
    if pred.shape != (len(batch),):
        raise ValueError(f"pred_decode_tokens has shape {pred.shape}, expected ({len(batch)},)")
    buckets = None if decode_scheme is None else decode_scheme.bucket(pred)
    return RequestTable(batch.arrival_s, batch.prompt_tokens, batch.decode_tokens, pred,
                        batch.task_id, decode_bucket=buckets, prefix_hashes=batch.prefix_hashes,
                        hash_block_tokens=batch.hash_block_tokens)


def run_router(batch: RequestBatch, cluster_cfg: ClusterConfig, router, rng: np.random.Generator,
               decision_interval_s: float = 0.0, pred_decode_tokens=None, *,
               decode_scheme: BucketScheme | None = None, check: bool = False) -> Cluster:
    """Run one episode with ``router`` until every request has finished or been rejected.

    ``rng`` goes to ``router.reset``; the simulator itself is deterministic. ``decode_scheme``
    fills ``table.decode_bucket`` (give Min-Min the same edges). Returns the finished cluster
    (metrics: ``sim.metrics`` over ``cluster.table``).
    """
    check_range("decision_interval_s", decision_interval_s, 0.0, MAX_ARRIVAL_S)
    if 0.0 < decision_interval_s < MIN_DECISION_INTERVAL_S:
        raise ConfigError(f"decision_interval_s={decision_interval_s!r} is out of range; allowed: "
                          f"0.0 or [{MIN_DECISION_INTERVAL_S}, {MAX_ARRIVAL_S:g}]")
    if decision_interval_s == 0.0 and getattr(router, "defers", True):
        raise ConfigError(
            f"router {router.name!r} may defer, which needs a decision grid: "
            f"decision_interval_s=0.0 is not valid for it; allowed: > 0")
    table = build_table(batch, pred_decode_tokens, decode_scheme)
    nb = 1 if decode_scheme is None else decode_scheme.num_buckets
    cluster = Cluster(cluster_cfg, table, num_decode_buckets=nb, check=check)
    router.reset(rng, cluster_cfg.num_instances)
    if decision_interval_s == 0.0:
        _on_arrival(cluster, router)
    else:
        _on_grid(cluster, router, decision_interval_s)
    assert cluster.done, "episode ended with requests neither finished nor rejected"
    return cluster


def _route_all(cluster: Cluster, router) -> bool:
    """Route while the router agrees; True when it deferred with requests still queued."""
    while cluster.queue:
        choice = decide(cluster, router)
        if choice is None:
            return True
        pos, inst = choice
        cluster.route(inst, pos)
    return False


def _on_arrival(cluster: Cluster, router) -> None:
    while not cluster.all_arrived:
        cluster.advance_to(cluster.next_arrival_s)
        if _route_all(cluster, router):
            raise RuntimeError(f"router {router.name!r} deferred although its defers flag is False")
    cluster.run_to_completion()


def _on_grid(cluster: Cluster, router, dt: float) -> None:
    k = 0
    idle_defer_since = None
    while not cluster.done:
        t = k * dt
        cluster.advance_to(t)
        deferred = _route_all(cluster, router)
        if not cluster.queue:
            idle_defer_since = None
            if cluster.all_arrived:
                cluster.run_to_completion()
                break
            k = max(k + 1, math.ceil(cluster.next_arrival_s / dt))
            continue
        if deferred and cluster.all_arrived and all(e.idle() for e in cluster.engines):
            idle_defer_since = t if idle_defer_since is None else idle_defer_since
            if t - idle_defer_since > _MAX_IDLE_DEFER_S:
                raise RuntimeError(f"router {router.name!r} keeps deferring on an idle cluster "
                                   f"(since t={idle_defer_since:.3f} s)")
        else:
            idle_defer_since = None
        k += 1
