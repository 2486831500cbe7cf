"""The router service's decision core: when a router is asked, and what it sees while it decides.

The simulator's rules (``sim/clock.py``), kept in the service:

- **One snapshot per decision.** A decision at time ``t`` freezes the view
  (``ServiceCluster.freeze``): ``cluster.t`` is ``t`` for every read, and each backend's polled
  load is fresh or stale as of ``t``. The router is then asked again and again while it routes,
  as at one grid point of the simulator, so a release round (``late_binding``'s
  ``rounds=since_release``: open while the last release was at ``t``) lets out every request
  that fits, not one per round.
- **Holding routers decide on the grid.** A router that may defer (``defers``: late_binding,
  scored_binding, max_capacity, a trained policy) is asked at the grid points ``k * dt`` of
  the service's clock (``dt = decision_interval_s``), as the env and ``routers.drive`` ask it.
  A request that arrives between two points waits in ``pending`` and joins the router queue at
  the first point at or after its arrival; while requests wait the router is asked at every
  point. Finishes are seen at the next point, as in the simulator.
- **Routers that never defer route on arrival** (``sim.clock.run_on_arrival``): a decision at
  the arrival's own time.

The core is synchronous and clock-free: ``decide(t)`` is called with the decision's time by the
asyncio service (``router_app.py``: a timer per grid point while requests wait) and by the
simulator in lockstep (``lockstep.py``), which is how a test compares the two worlds.
"""

from __future__ import annotations

import time
from collections import deque

import numpy as np

from ..routers.drive import decide
from ..sim.clock import grid_index_of
from .view import BackendView, ServiceCluster


class Dispatcher:
    """The router, its view and its queues; every routing decision of the service goes here."""

    def __init__(self, router, views: list[BackendView], rng: np.random.Generator,
                 decision_interval_s: float, on_decision=None):
        self.router = router
        self.rng = rng
        self.dt = decision_interval_s
        self.holds = bool(getattr(router, "defers", True))
        self.cluster = ServiceCluster(views)
        self.pending: deque[int] = deque()   # arrived, waiting for the next grid point (holding routers)
        self.on_decision = on_decision       # called with the seconds each decision took (metrics)
        self.avoid: dict[int, set] = {}      # retried request -> backends it failed at
        if self.cluster.engines:
            router.reset(rng, len(self.cluster.engines))

    @property
    def waiting(self) -> int:
        """Requests at the router: queued for a decision or pending the next grid point."""
        return len(self.cluster.queue) + len(self.pending)

    def arrive(self, rid: int) -> None:
        """A request has arrived (its table row is filled, ``arrival_s`` included)."""
        (self.pending if self.holds else self.cluster.queue).append(rid)

    def requeue(self, rid: int, avoid=()) -> None:
        """A request back from a failed attempt: into the router queue at its arrival's place
        (the queue is in arrival order, as the simulator's). ``avoid``: backends it failed at;
        if the router picks one of them while another is up, it goes to the one of the others
        with the fewest requests in flight instead (a failover, not the router's choice)."""
        if avoid:
            self.avoid[rid] = set(avoid)
        q, arr = self.cluster.queue, self.cluster.table.arrival_s
        a = arr[rid]
        i = len(q)
        while i and arr[q[i - 1]] > a:
            i -= 1
        q.insert(i, rid)

    def grid_time(self, t: float) -> float:
        """The latest grid point at or before ``t`` (holding routers decide there)."""
        return grid_index_of(t, self.dt) * self.dt

    def next_grid_time(self, t: float) -> float:
        """The first grid point after ``t``."""
        return (grid_index_of(t, self.dt) + 1) * self.dt

    def decide(self, t: float) -> list[tuple[int, BackendView]]:
        """Make the decision at time ``t``: freeze the view, take the pending arrivals up to
        ``t`` into the router queue, ask the router while it routes. Returns the requests
        routed, in order, with their backends (their ``on_route`` done)."""
        c = self.cluster
        c.freeze(t)
        if self.pending:
            arr, pend, queue = c.table.arrival_s, self.pending, c.queue
            while pend and arr[pend[0]] <= t:
                queue.append(pend.popleft())
        if c.refresh() and c.engines:
            self.router.reset(self.rng, len(c.engines))
        routed = []
        if not c.engines:
            return routed
        router, timed = self.router, self.on_decision
        while c.queue:
            if timed is None:
                choice = decide(c, router)
            else:
                t0 = time.perf_counter()
                choice = decide(c, router)
                timed(time.perf_counter() - t0)
            if choice is None:
                break
            pos, inst = choice
            if self.avoid:
                inst = self._failover(c.queue[pos], inst)
            rid = c.route(inst, pos)
            routed.append((rid, c.engines[inst]))
        return routed

    def _failover(self, rid: int, inst: int) -> int:
        bad = self.avoid.pop(rid, None)
        engines = self.cluster.engines
        if not bad or engines[inst] not in bad:
            return inst
        others = [i for i, e in enumerate(engines) if e not in bad]
        return min(others, key=lambda i: len(engines[i].inflight)) if others else inst

    def withdraw(self, rid: int) -> bool:
        """Take a request that is still at the router out of its queues; False if it is not
        there (routed already)."""
        self.avoid.pop(rid, None)
        for q in (self.cluster.queue, self.pending):
            try:
                q.remove(rid)
                return True
            except ValueError:
                pass
        return False
