"""The decision clock: the one place that walks a cluster along the decision grid.

Routing decisions happen at grid points ``k * dt`` (``dt``: the decision interval). The rules,
the same for the env, router evaluation (``routers.drive``), the rollout operator
(``routers.improve``) and everything built on them:

- at a grid point the decider is asked again and again while requests wait; when it holds
  (or the queue still has requests after it), the next decision comes one interval later;
- with an empty router queue the clock jumps to the first grid point at or after the next
  arrival (:func:`next_decision_index`), never to the same point again;
- after the last arrival, once the router queue is empty, the instances drain.

Deciders are callables ``route_all(cluster) -> None`` that route while they agree (so this
module needs nothing of the routers above it). A test (``tests/test_clock.py``) fails if a
second copy of the grid walk or of its jump arithmetic appears anywhere else in the code.

Without a grid (``decision_interval_s == 0``) requests are routed the moment they arrive:
:func:`run_on_arrival`.
"""

from __future__ import annotations

import math
from typing import Callable

from ..limits import _MAX_GRID_INDEX, MAX_ARRIVAL_S, ArrivalLimitError
from .cluster import Cluster
from .watchdog import Watchdog

RouteAll = Callable[[Cluster], object]
"""Route queued requests while the decider agrees (its return value is ignored)."""
OnHold = Callable[[Cluster, float], None]
"""Called at a grid point ``t`` that ends with requests still waiting (the decider held)."""

DEFAULT_DECISION_INTERVAL_S = 0.02
"""The decision interval of the paper's setting ("the minimum decode batch execution time"): the
one default of the env (``EnvConfig``), the rollout operator and the lookahead router."""

GRID_SLACK = 1e-9
"""Decision times are ``k * dt``; a cluster time meant to be a grid point may sit a few ulps
off, so the grid point of time ``t`` is ``floor(t / dt + GRID_SLACK)``."""


def grid_index_at_or_after(t: float, dt: float, k_min: int) -> int:
    """The smallest grid index ``k >= k_min`` with ``k * dt >= t``.

    ``ceil(t / dt)`` is off by at most a step or two in floating point; the corrections below
    are bounded, and a time the grid cannot resolve raises instead of looping."""
    q = t / dt
    if not q < _MAX_GRID_INDEX:
        raise ArrivalLimitError(
            f"time {t!r} s is beyond the decision grid: time / decision_interval_s must stay "
            f"below 2**52 (arrival times are limited to MAX_ARRIVAL_S={MAX_ARRIVAL_S:g} s)")
    k = math.ceil(q)
    if k < k_min:
        k = k_min
    # Usually exact already (the env's fast-forward asks once per step): return without the
    # loops, which would leave k as it is.
    if k * dt >= t and (k <= k_min or (k - 1) * dt < t):
        return k
    for _ in range(8):
        if k * dt >= t:
            break
        k += 1
    else:
        raise ArrivalLimitError(f"no grid point k * {dt!r} reaches {t!r} s (grid resolution)")
    for _ in range(8):
        if k - 1 >= k_min and (k - 1) * dt >= t:
            k -= 1
        else:
            break
    else:
        raise ArrivalLimitError(f"no grid point k * {dt!r} reaches {t!r} s (grid resolution)")
    return k


def grid_index_of(t: float, dt: float) -> int:
    """The grid point a decision at time ``t`` belongs to (``t`` a grid time up to a few ulps)."""
    return math.floor(t / dt + GRID_SLACK)


def next_decision_index(cluster: Cluster, k: int, dt: float) -> int:
    """Grid point of the next decision after point ``k`` left the router queue empty: the first
    at or after the next arrival, and at least ``k + 1``."""
    return grid_index_at_or_after(cluster.next_arrival_s, dt, k + 1)


def decide_on_grid(cluster: Cluster, route_all: RouteAll, k: int, dt: float,
                   t_end: float = math.inf, on_hold: OnHold | None = None) -> int:
    """Walk the grid from point ``k`` (a point at or before ``cluster.t`` means: decide now)
    with ``route_all`` deciding, until the point ``t_end`` is reached or, with an empty router
    queue, the next arrival lies at or after ``t_end`` (``inf``: every request has arrived).
    Returns the first grid point left undecided. The cluster must have taken the arrivals up
    to ``cluster.t`` (a fresh one: ``advance_to(0.0)`` first). The instances are not drained (:func:`drain`,
    ``cluster.run_to_completion``); the clock stops at the last decision made.

    The rollout operator calls this hundreds of times per decision: keep it lean."""
    queue = cluster.queue
    while True:
        t = k * dt
        if t >= t_end:
            return k
        if t > cluster.t:
            cluster.advance_to(t)
        route_all(cluster)
        if queue:
            if on_hold is not None:
                on_hold(cluster, t)
            k += 1
            continue
        nxt = cluster.next_arrival_s
        if nxt >= t_end:
            return k + 1
        k = grid_index_at_or_after(nxt, dt, k + 1)


def run_on_grid(cluster: Cluster, route_all: RouteAll, dt: float,
                on_hold: OnHold | None = None) -> None:
    """A whole episode on the grid from time 0: decide at every point, then drain."""
    cluster.advance_to(0.0)        # requests arriving at t = 0 are decided at t = 0
    decide_on_grid(cluster, route_all, 0, dt, on_hold=on_hold)
    cluster.run_to_completion()


def run_on_arrival(cluster: Cluster, route_all: RouteAll, who: str = "the router") -> None:
    """A whole episode without a grid: at each arrival time route every queued request (the
    decider must not hold), then drain."""
    while not cluster.all_arrived:
        cluster.advance_to(cluster.next_arrival_s)
        route_all(cluster)
        if cluster.queue:
            raise RuntimeError(f"{who} held requests although decisions are made on arrival "
                               "(decision_interval_s=0 has no later decision time)")
    cluster.run_to_completion()


def drain(cluster: Cluster, route_all: RouteAll, k: int, dt: float) -> None:
    """Stop arrivals now (the table's next arrival moves to ``inf``), route what waits in the
    router queue at grid points ``k, k+1, ...``, then run every instance until it is idle."""
    tb = cluster.table
    if cluster._next < tb.n:
        tb.arrival_s[cluster._next] = math.inf      # arrivals are taken in id order
    decide_on_grid(cluster, route_all, k, dt,
                   on_hold=Watchdog(cluster, "the drain of a rollout (routers.improve)").on_hold)
    for e in cluster.engines:
        e.advance_to(math.inf)


def skip_to_decision(cluster: Cluster, k: int, dt: float, k_start: int,
                     g: float = 1.0) -> tuple[float, int, int, float, float]:
    """With an empty router queue, advance grid point by grid point to the next decision (the
    first point at or after the next arrival, again while that arrival is rejected), or after
    the last arrival run the instances until idle, integrating the in-system penalty over the
    points passed (``Cluster.run_grid``; point j weighs ``g**(j - k_start - 1)``: ``k_start``
    is the grid point the env's step began at, ``g`` a learner's per-interval discount).
    Returns (penalty, grid point reached, completions, weighted completions, weighted
    completions within their SLO deadlines). Once per env step: one call does the whole skip."""
    pen = comp = met = 0.0
    count = 0
    queue = cluster.queue
    while not queue:
        if cluster.all_arrived:   # one drain, then the episode ends
            if not cluster.done:
                p, k, n, nw, mw = cluster.run_grid(k, dt, None, g ** (k - k_start), g)
                pen += p
                comp += nw
                met += mw
                count += n
            break
        p, k, n, nw, mw = cluster.run_grid(k, dt, grid_index_at_or_after(cluster.next_arrival_s, dt, k + 1),
                                           g ** (k - k_start), g)
        pen += p
        comp += nw
        met += mw
        count += n
    return pen, k, count, comp, met
