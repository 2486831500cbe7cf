"""Instances that share one machine's CPU cores: a cluster whose instances slow each other down.

Every other cluster in the package gives each instance hardware of its own (a GPU each), so an
instance's iterations take what its latency model says whatever the others do. CPU servers on
one machine do not: two single-threaded ``llama-server``\\ s and a busy process on two cores
compute at full speed while one server is busy and at two thirds while both are (the
sim-to-real runs of ``experiments/sim_to_real.py`` measured a request that arrives at an idle
server while the other computes 30% slower than one arriving at an idle machine; a single
slowdown per replay cannot follow that, docs/serving.md).

The model is a fluid processor sharing of the host's ``cores`` among the runnable threads: each
busy instance computes with one thread, ``background_threads`` more (other processes, in mean
runnable threads) compete all the time, and while ``k`` instances are busy each runs at

    rate(k) = min(1, cores / (k + background_threads))

of its own speed. Each instance keeps a *work clock*: its engine runs, unchanged, on the time
its latency model would take on a core of its own, and the cluster maps real time to each work
clock (``dv_i / dt = rate(k(t))`` while instance ``i`` is busy, 1 while it is idle). An engine's
trajectory in work time depends only on the work times its requests reach it, so between two
routing decisions each engine runs ahead on its own; the rates only decide where real time
puts the next decision on each work clock. Within a stretch with no routing, instances only go
idle, so rates only rise: running every busy instance at the current rates to the stretch's end
never passes a point the true mapping would not reach, and an instance that runs out of work
before that end is an event at which the others' rates are recomputed (at most ``m`` per stretch).

At the end (``run_to_completion``) every per-request time an engine or its frontend wrote is
mapped from its instance's work clock back to real time, so ``sim.metrics`` reads real times.
Until then the engines' clocks (``engine.t``) and any time a router reads from an engine are work
times; routers that decide on counts and tokens (round robin, least requests, random,
dedicated small-large: the sim-to-real set) see exactly what they would. The env's grid
(``tick``, ``run_grid``) is not supported: it integrates penalties over real time per engine.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

from .._validate import ConfigError, check_range
from .cluster import Cluster

_TIME_COLUMNS = ("first_scheduled_s", "first_token_s", "finish_s")
_CLIENT_COLUMNS = ("seen_first_token_s", "seen_finish_s")


@dataclass(frozen=True)
class SharedHost:
    """The machine the instances share (each instance computes with one thread)."""

    cores: float
    """CPU cores the instances' threads and the background share (``os.sched_getaffinity``)."""
    background_threads: float = 0.0
    """Other runnable threads, on average over the run (a busy loop: 1; ``experiments/
    sim_to_real.py`` measures it as every other thread's run + runqueue time over the wall time)."""

    def __post_init__(self) -> None:
        check_range("host.cores", self.cores, 1e-3, 4096.0)
        check_range("host.background_threads", self.background_threads, 0.0, 4096.0)

    def rate(self, busy: int) -> float:
        """Speed of each of ``busy`` computing instances, as a fraction of a core of its own."""
        demand = busy + self.background_threads
        return 1.0 if demand <= self.cores else self.cores / demand


class SharedHostCluster(Cluster):
    """A :class:`Cluster` whose instances share ``host``'s cores (module doc)."""

    def __init__(self, cfg, table, host: SharedHost, **kwargs):
        if not isinstance(host, SharedHost):
            raise ConfigError(f"host: expected a SharedHost, got {type(host).__name__}")
        super().__init__(cfg, table, **kwargs)
        self.host = host
        m = cfg.num_instances
        self.work = [0.0] * m                     # each instance's work clock at self.t
        self._map_t = [[0.0] for _ in range(m)]   # breakpoints (real, work) of each mapping
        self._map_v = [[0.0] for _ in range(m)]
        self.busy_real_s = [0.0] * m              # real seconds each instance was busy
        self.busy_work_s = [0.0] * m              # the work it did meanwhile (its own-core seconds)
        self._remapped = False

    def _busy(self, i: int) -> bool:
        e = self.engines[i]
        return e.t > self.work[i] or not e.idle()

    def _run_until(self, T: float) -> None:
        """Advance real time from ``self.t`` to ``T`` (``inf``: until every instance is idle)
        with no routing meanwhile, moving each work clock at its instance's rate."""
        t, engines, work, m = self.t, self.engines, self.work, len(self.engines)
        while True:
            busy = [self._busy(i) for i in range(m)]
            k = sum(busy)
            if k == 0 and T == math.inf:
                break
            r = self.host.rate(k)
            # Run every busy instance to where it stands at T if nothing changes; the first to
            # run out of work on the way (rates only rise after it) is the next event.
            t_next, who = T, -1
            for i in range(m):
                if busy[i]:
                    target = work[i] + r * (T - t) if T != math.inf else math.inf
                    e = engines[i]
                    if e.t < target:
                        e.advance_to(target)
                    if e.idle() and e.t < target:
                        te = t + (e.t - work[i]) / r
                        if te < t_next:
                            t_next, who = te, i
            dt = t_next - t
            for i in range(m):
                if i == who:
                    v = engines[i].t        # exactly its last iteration's end
                elif busy[i]:
                    v = work[i] + r * dt
                else:
                    v = work[i] + dt
                if busy[i]:
                    self.busy_real_s[i] += dt
                    self.busy_work_s[i] += v - work[i]
                work[i] = v
                self._map_t[i].append(t_next)
                self._map_v[i].append(v)
            t = t_next
            if who < 0:
                break
        self._t_real = t

    def advance_to(self, T: float) -> None:
        if T < self.t:
            raise ValueError(f"time cannot go backwards: {T} < {self.t}")
        tb = self.table
        while self._next < tb.n and tb.arrival_s[self._next] <= T:
            self._arrive(self._next)
            self._next += 1
        if T > self.t:
            self._run_until(T)
        self.t = T

    def route(self, instance: int, position: int = 0) -> int:
        now = self.t
        self.t = self.work[instance]        # the engine takes the request on its work clock
        try:
            rid = super().route(instance, position)
        finally:
            self.t = now
        self.table.routed_s[rid] = now
        self.last_route_s[instance] = now
        return rid

    def run_to_completion(self) -> None:
        """Run every instance until it is idle, then write real times into the table."""
        assert not self.queue and self.all_arrived
        self._run_until(math.inf)
        self.t = max(self.t, self._t_real)
        for fe in self.table.frontends:
            fe.flush()
        self._remap()

    def _remap(self) -> None:
        """Each request's engine and client times, from its instance's work clock to real time."""
        assert not self._remapped, "times mapped twice"
        self._remapped = True
        tb = self.table
        columns = [getattr(tb, c) for c in _TIME_COLUMNS]
        if tb.seen_first_token_s is not None:
            columns += [getattr(tb, c) for c in _CLIENT_COLUMNS]
        for rid in range(tb.n):
            i = tb.instance[rid]
            if i < 0:
                continue
            for col in columns:
                v = col[rid]
                if v == v:
                    col[rid] = self.real_time(i, v)

    def real_time(self, instance: int, work_s: float) -> float:
        """The real time at which ``instance``'s work clock reads ``work_s`` (past the last
        breakpoint the clock runs at rate 1: the instance is idle there)."""
        ts, vs = self._map_t[instance], self._map_v[instance]
        j = bisect.bisect_right(vs, work_s) - 1
        if j < 0:
            return work_s
        if j >= len(vs) - 1:
            return ts[-1] + (work_s - vs[-1])
        dv = vs[j + 1] - vs[j]
        return ts[j] + (work_s - vs[j]) * (ts[j + 1] - ts[j]) / dv if dv > 0 else ts[j]

    def tick(self, T: float):
        raise ConfigError("a shared host (sim/shared_host.py) supports router rollouts "
                          "(routers.drive.run_router), not the env's decision grid")

    run_grid = tick
