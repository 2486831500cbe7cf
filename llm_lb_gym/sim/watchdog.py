"""The progress watchdog: a rollout that stops making progress stops, and says why.

Every loop that drives a cluster to the end of an episode (``rollout.rollout_router`` and
``rollout_agent``, ``routers.drive.run_router``, the drain of the rollout operator's
candidates, demonstrations and policy-iteration episodes) runs until every request has finished
or been rejected. A decider that holds requests at the router forever would make that loop
run forever. Registered routers cannot (``routers/release.py`` bounds every hold), but an agent,
a user's router written to the bare protocol, or a future bug can; so each loop also keeps a
``Watchdog`` and calls :meth:`Watchdog.check` once per step or held grid point.

Progress is a request routed, rejected or finished, and nothing is stuck while the router
queue is empty (the clock then jumps to the next arrival, however far). The watchdog raises
``StalledRolloutError`` once requests have waited at the router through ``STALL_S`` of
simulated time or ``STALL_STEPS`` steps with no progress, naming the decider, the time and
the requests stuck where. Finishes are counted only when a bound is reached (they cost a pass
over the instances), so a stall is reported within twice the bound.

Why the bounds leave every real run alone: a holding router releases the router-queue head
within ``MAX_HOLD_S`` = 3600 s (``routers/release.py``), a route is progress, so a registered
router's rollout never goes ``STALL_S`` = 7200 s without progress; ``STALL_STEPS`` (two
million steps, about a minute of stepping) binds first only on decision grids finer than
3.6 ms, where it caps the wall time of a stall instead.
"""

from __future__ import annotations

STALL_S = 7200.0
"""Simulated seconds of requests waiting at the router with no progress that stop a rollout
(twice ``routers.release.MAX_HOLD_S``; a test checks)."""

STALL_STEPS = 2_000_000
"""Steps (env steps, or held grid points) with no progress that stop a rollout."""


class StalledRolloutError(RuntimeError):
    """A rollout made no progress within the watchdog's bounds (the message says who and what)."""


class Watchdog:
    """Watches one episode's cluster; ``who`` names the decider in the report
    (e.g. ``"router LateBinding(LateBindingOptions(...)) on seed 3"``)."""

    __slots__ = ("cluster", "who", "stall_s", "stall_steps", "steps", "_mark", "_t", "_step0", "_fin")

    def __init__(self, cluster, who: str, *, stall_s: float | None = None, stall_steps: int | None = None):
        self.cluster, self.who = cluster, who
        self.stall_s = STALL_S if stall_s is None else stall_s          # read now: tests lower them
        self.stall_steps = STALL_STEPS if stall_steps is None else stall_steps
        self.steps = 0
        self._mark = -1
        self._t = cluster.t
        self._step0 = 0
        self._fin = cluster.n_finished

    def check(self) -> None:
        """Once per step: raise ``StalledRolloutError`` if the bounds are passed without progress."""
        c = self.cluster
        self.steps += 1
        mark = c.n_routed + c.n_rejected
        if mark != self._mark or not c.queue:
            self._mark, self._t, self._step0 = mark, c.t, self.steps
            return
        if c.t - self._t <= self.stall_s and self.steps - self._step0 <= self.stall_steps:
            return
        fin = c.n_finished
        if fin != self._fin:   # requests finished meanwhile: progress, look again a bound later
            self._fin, self._t, self._step0 = fin, c.t, self.steps
            return
        raise StalledRolloutError(self.report())

    def on_hold(self, cluster, t: float) -> None:
        """The decision clock's ``on_hold`` hook (``sim.clock``): a held grid point is a step."""
        self.check()

    def report(self) -> str:
        c = self.cluster
        tb = c.table
        wait = c.t - tb.arrival_s[c.queue[0]] if c.queue else 0.0
        on_instances = sum(e.num_waiting for e in c.engines)
        running = sum(e.B + len(e.prefilling) for e in c.engines)
        return (f"{self.who} made no progress (no request routed, finished or rejected) for "
                f"{c.t - self._t:.6g} s of simulated time and {self.steps - self._step0} steps, up to "
                f"t={c.t:.6g} s: {len(c.queue)} requests held at the router (the oldest for "
                f"{wait:.6g} s), {on_instances} waiting and {running} running on instances, "
                f"{c.n_finished} finished and {c.n_rejected} rejected of {tb.n}. The watchdog's "
                f"bounds: STALL_S={self.stall_s:g} s, STALL_STEPS={self.stall_steps} "
                f"(llm_lb_gym.sim.watchdog)")
