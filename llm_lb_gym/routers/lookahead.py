"""Model-predictive lookahead: try every action on a copy of the cluster, keep the best one.

At a decision the router enumerates its candidate actions: route the router-queue head to each
instance ``i``, or defer it one decision interval (with ``candidates=k > 1`` also route each of
the ``k - 1`` other queued requests of shortest predicted ideal latency to each instance). For
every candidate it copies the cluster (``copy_cluster``), applies the action, and simulates
``plan_horizon_s`` seconds ahead with a base heuristic (``base``) deciding on the decision grid
``k * decision_interval_s`` (with its own options, ``base_options``: e.g. the setting's
tuned ``late_binding``) on the decision clock the env and ``drive.run_router`` use
(``sim/clock.py``): after a route the next decision is at the same time while requests wait, a
deferral waits one interval, an empty queue waits for the first grid point at or after the next
arrival.

Score (lower is better), computed exactly from the copy's arrival and finish timestamps:
- ``score="window"``: the time integral over ``[t, t + plan_horizon_s]`` of the number of requests
  in the system (arrived, neither finished nor rejected).
- ``score="drain"`` (default): after the window, arrivals stop, the base routes what waits and
  every instance runs until idle; the score is the integral over ``[t, inf)`` of the same count,
  i.e. the remaining time in the system of every request that arrived by ``t + plan_horizon_s``.
  The drain is a terminal cost: in the window score a request parked behind a queue longer than
  the horizon costs the same on every instance, so the window cannot tell a short queue from a
  long one beyond the horizon. Measured: with the window score the router is no better than
  round robin when overloaded (+0.1% at 5 s, -6.5% at 30 s, one seed), with the drain -10.4%.
By Little's law the integral over a whole episode is the sum of the requests' latencies, so a
score is what the candidate adds to the total E2E of the requests it can see.
Ties (exact ties are common: a request that waits beyond the horizon whatever the instance)
go to the base's own choice, then to the lowest queue position and instance, defer last.
Breaking them to instance 0 instead piles work on instance 0 (measured +140% mean E2E vs round
robin when overloaded).

What it may see. ``see_future=False`` (default, deployable): in each decision's copy every
request that has not yet arrived is replaced by a fresh draw from the workload model, using only
the router's generator: arrivals at ``t + sample.arrival_s`` (the draw's first request, which
every arrival process puts at 0 s, is dropped, so the first imagined arrival comes after ``t``:
exact for Poisson arrivals by memorylessness; for renewal and trace arrivals an approximation
that ignores the time since the last real arrival); prompt tokens as drawn; output tokens = the
predictor's estimate on the draw, rounded (under the oracle predictor, the drawn true length).
The derived columns the engines read (``pred``, ``prompt_bucket``, ``decode_bucket``,
``inv_ideal``) are recomputed as ``LLMClusterEnv.reset`` does. Requests still in the router
queue get their rounded prediction as output length (capped to what the instance can hold),
so the rollout never uses the true length of a request it has not routed. Requests already on
an instance keep the simulator's state, true lengths included: exact under the oracle
predictor, optimistic under a noisy one (the rollout knows when a routed request ends). The
rows overwritten stop at the first imagined arrival after the horizon, or at the table's end
(near the end of an episode the imagined future has at most the requests the episode still
has). All candidates of a decision share one imagined future (common random numbers);
``samples=n`` averages over ``n`` futures. ``see_future=True`` keeps the real future and the
true lengths of queued requests: a clairvoyant variant.

Why it exists. A baseline that plans instead of scoring instances one by one; a teacher whose
choices (and per-candidate scores, ``score_candidates``) can label states for behaviour
cloning or reward guidance; and a reference for the headroom: what planning with the simulator
itself gains over the heuristics, so roughly what a learned router might hope to gain.

Cost per decision: ``(k m + 1) * samples`` rollouts (a cluster copy, ~0.5 ms, and a simulation
of ``plan_horizon_s`` seconds plus the drain) and one workload draw. Measured on one core with the
compiled engine, defaults (``plan_horizon_s=5``, ``base=least_requests``, ``score=drain``), 3 x
2,000-request episodes, ``python -m llm_lb_gym.experiments.bench_lookahead --horizons 5``:

    regime (4 x Llama-2-7B V100)       per decision median / p90   per episode   mean E2E vs RR
    default, 20 req/s                   9.5 ms / 10.6 ms            22 s          -1.6% (least_requests -1.7%)
    near capacity, 52 req/s             23 ms / 46 ms               63 s          -6.4% (least_requests -3.4%)
    overloaded, 72 KV blocks, 20 req/s  55 ms / 93 ms               112 s         -10.4% (least_requests -0.6%)

The drain dominates when instance queues are long (overloaded); the rest scales about linearly
with ``plan_horizon_s`` and the arrival rate.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from .._validate import ConfigError, check_choice, check_int, check_range
from ..sim.clock import DEFAULT_DECISION_INTERVAL_S
from ..sim.request import Status
from .base import RouterBase
from .drive import decide
from .improve import (SCORES, ImprovementOptions, RolloutImprovement, copy_cluster,  # noqa: F401
                      drain, in_system_integral, rollout)


@dataclass(frozen=True)
class LookaheadOptions:
    plan_horizon_s: float = 5.0
    """Simulated seconds each candidate is rolled out for with arrivals (the window of its
    score; with ``score="drain"`` the requests arriving within it are followed to the end)."""
    base: str = "least_requests"
    """Registered router that decides inside the rollouts (any but ``lookahead``)."""
    base_options: Mapping[str, Any] = field(default_factory=dict)
    """The base router's own options (e.g. the setting's tuned ``late_binding`` options)."""
    see_future: bool = False
    """False: future arrivals and unrouted requests' lengths come from the workload model and
    the predictor (deployable). True: the rollout sees the real future (clairvoyant)."""
    candidates: int = 1
    """Queued requests considered per decision: the head, plus the ``candidates - 1`` others of
    shortest predicted ideal latency (each tried on every instance)."""
    score: str = "drain"
    """``window``: requests-in-system seconds within ``[t, t + plan_horizon_s]``. ``drain``: then
    stop arrivals and run to completion, and count the whole remaining time in the system of
    every request that arrived by ``t + plan_horizon_s`` (a terminal cost: a request parked behind
    a long queue costs what it will wait, even beyond the horizon)."""
    samples: int = 1
    """Imagined futures per decision (scores are averaged; cost scales with it). Only with
    ``see_future=False``: the real future is one."""
    decision_interval_s: float = DEFAULT_DECISION_INTERVAL_S
    """The decision grid of the rollouts; must match the driver's (``make_env_router`` sets it
    from the env)."""

    def __post_init__(self) -> None:
        check_range("router.lookahead.plan_horizon_s", self.plan_horizon_s, 0.0, lo_open=True)
        check_range("router.lookahead.decision_interval_s", self.decision_interval_s, 0.0, lo_open=True)
        check_int("router.lookahead.candidates", self.candidates, 1)
        check_choice("router.lookahead.score", self.score, SCORES)
        check_int("router.lookahead.samples", self.samples, 1)
        if self.see_future and self.samples != 1:
            raise ConfigError(f"router.lookahead.samples={self.samples} needs see_future=False "
                              "(there is one real future); allowed with see_future=True: 1")
        if not isinstance(self.see_future, (bool, np.bool_)):
            raise ConfigError(f"router.lookahead.see_future={self.see_future!r} must be a bool; "
                              "allowed: True, False")
        from .registry import ROUTERS, make_router   # the registry imports this module

        allowed = [n for n in ROUTERS if n != "lookahead"]
        if self.base not in allowed:
            raise ConfigError(f"router.lookahead.base={self.base!r} is not valid; "
                              f"allowed: {', '.join(allowed)}")
        if not isinstance(self.base_options, Mapping):
            raise ConfigError(f"router.lookahead.base_options={self.base_options!r} must be a "
                              f"mapping of {self.base!r}'s options")
        make_router(self.base, **dict(self.base_options))   # names a bad option or value

    def improvement(self) -> ImprovementOptions:
        """The rollout operator's options (``routers.improve``) these options describe."""
        return ImprovementOptions(base=self.base, base_options=dict(self.base_options),
                                  plan_horizon_s=self.plan_horizon_s, samples=self.samples,
                                  see_future=self.see_future, score=self.score,
                                  decision_interval_s=self.decision_interval_s)


# --------------------------------------------------------------------------- the router
class Lookahead(RouterBase):
    """Model-predictive router: roll each candidate action out with ``base``, keep the best.

    The scoring is ``routers.improve.RolloutImprovement`` (the rollout policy-improvement
    operator) used online: this router is one step of policy iteration over its base."""

    name = "lookahead"
    defers = True
    Options = LookaheadOptions

    def __init__(self, options: LookaheadOptions | None = None):
        super().__init__(options)
        self.workload = None
        self.predictor = None
        self.prompt_scheme = None
        self.decode_scheme = None
        self._base_router = None
        self.operator: RolloutImprovement | None = None

    def attach(self, workload=None, predictor=None, prompt_scheme=None, decode_scheme=None,
               base_router=None) -> "Lookahead":
        """Give the router the env's models (``make_env_router`` does this).

        ``workload`` (``sample(rng, n)``) draws the imagined future (needed unless
        ``see_future``); ``predictor`` estimates its lengths (None: the oracle); the bucket
        schemes fill the table's bucket columns (None: bucket 0, as ``drive.build_table``
        leaves prompt buckets); ``base_router`` replaces ``make_router(options.base,
        **options.base_options)`` (to give the base its env-derived options, e.g. Min-Min's
        bucket edges).
        """
        self.workload, self.predictor = workload, predictor
        self.prompt_scheme, self.decode_scheme = prompt_scheme, decode_scheme
        if base_router is not None:
            if base_router.name != self.options.base:
                raise ConfigError(f"router.lookahead: base_router is {base_router.name!r} but "
                                  f"options.base is {self.options.base!r}")
            self._base_router = base_router
        return self

    def reset(self, rng: np.random.Generator, num_instances: int) -> None:
        super().reset(rng, num_instances)
        if not self.options.see_future and self.workload is None:
            raise ConfigError("router.lookahead: see_future=False needs the workload model to "
                              "imagine future arrivals; call attach(workload, predictor, ...) "
                              "(make_env_router does) or set see_future=True")
        self.operator = RolloutImprovement(
            self.options.improvement(), workload=self.workload, predictor=self.predictor,
            prompt_scheme=self.prompt_scheme, decode_scheme=self.decode_scheme,
            base_router=self._base_router)
        self._base_router = self.operator.base
        self.stats = {"decisions": 0, "rollouts": 0, "wall_s": 0.0}
        self.decision_wall_s: list[float] = []   # per decision, for cost figures

    # ------------------------------------------------------------------ deciding
    def select(self, cluster, rid: int) -> int | None:
        if not cluster.queue or cluster.queue[0] != rid:
            raise ValueError(f"router 'lookahead' decides for the router-queue head; got request {rid}")
        best = self._best(self.score_candidates(cluster, heads_only=True))
        return None if best is None else best[1]

    def select_from_queue(self, cluster) -> tuple[int, int] | None:
        return self._best(self.score_candidates(cluster))

    @staticmethod
    def _best(scored):
        best, best_score = None, math.inf
        for cand, score in scored:
            if score < best_score:
                best, best_score = cand, score
        return best

    def queue_positions(self, cluster, heads_only: bool = False) -> list[int]:
        """Router-queue positions to try: the head, then the ``candidates - 1`` others with the
        shortest predicted ideal latency (ties: earlier in the queue), in queue order."""
        k = 1 if heads_only else self.options.candidates
        n = len(cluster.queue)
        if k == 1 or n == 1:
            return [0]
        tb = cluster.table
        rids = list(cluster.queue)[1:]
        p = np.array([tb.prompt[r] for r in rids], np.float64)
        d = np.array([tb.pred[r] for r in rids], np.float64)
        ideal = cluster.speeds.ideal_latency_s(p, d)   # the env's T_j
        order = np.argsort(ideal, kind="stable")[: k - 1]
        return [0] + sorted(int(j) + 1 for j in order)

    def score_candidates(self, cluster, heads_only: bool = False) -> list[tuple[tuple[int, int] | None, float]]:
        """``[(candidate, score)]`` in tie-break order: ``(queue position, instance)`` for a
        route, ``None`` for defer; score = requests-in-system seconds over the horizon. Draws
        from the router's generator (the imagined future, the base router's generator) and
        leaves ``cluster`` unchanged."""
        self._require_reset(cluster)
        if not cluster.queue:
            raise ValueError("router 'lookahead' asked to decide with an empty router queue")
        start = time.perf_counter()
        op = self.operator
        base_seed = int(self.rng.integers(2**63))
        cands: list[tuple[int, int] | None] = [
            (pos, i) for pos in self.queue_positions(cluster, heads_only) for i in range(self.num_instances)]
        cands.append(None)
        own = op.base_choice(cluster, base_seed)
        if own in cands:        # ties go to the base's own choice (see the module doc)
            cands.remove(own)
            cands.insert(0, own)
        totals = op.score(cluster, cands, self.rng, base_seed).mean(axis=0)
        scored = [(cand, float(total)) for cand, total in zip(cands, totals)]
        st = self.stats
        st["decisions"] += 1
        st["rollouts"] += len(cands) * self.options.samples
        wall = time.perf_counter() - start
        st["wall_s"] += wall
        self.decision_wall_s.append(wall)
        return scored
