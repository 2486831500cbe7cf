"""Rollout policy improvement: score candidate actions by simulating the base router forward.

The simulator is an exact model of the router's world, so one step of policy iteration can be
done by search instead of by temporal-difference learning (Bertsekas' rollout algorithm; the
expert in expert iteration). From a state (a cluster with requests at the router), for every
candidate action - route the queued request at position ``p`` to instance ``i``, or hold
(``None``) - copy the cluster, apply the action, and continue with the *base* router (any
registered router with its own options, e.g. ``late_binding`` as tuned for the setting) for
``plan_horizon_s`` simulated seconds on the decision grid the env uses; then score what happened:

- ``score="drain"`` (default): arrivals stop at ``t + plan_horizon_s``, the base routes what still
  waits and every instance runs until idle; the score is the integral over ``[t, inf)`` of the
  number of requests in the system, i.e. the remaining time in the system of every request that
  arrived by ``t + plan_horizon_s``. The drain is the terminal estimate of the work left at the
  horizon: without it a request parked behind a queue longer than the horizon costs the same on
  every instance, so short horizons would be myopic.
- ``score="window"``: the integral over ``[t, t + plan_horizon_s]`` only.

By Little's law the integral over a whole episode is the sum of the requests' latencies, so a
candidate's score is what it adds to the total E2E of the requests it can see, and the
*advantage* of a candidate over the base's own choice is the latency it saves.

What a rollout may see. ``see_future=False`` (default, deployable): every request that has not
arrived yet is replaced by a fresh draw from the workload model (``workload.sample``), with the
predictor's estimate as its output length; requests still in the router queue get their
rounded prediction as output length, so a score never uses a length the router cannot know.
Requests already on an instance keep the simulator's state (exact under the oracle predictor).
``see_future=True`` keeps the real future and the true lengths: a **clairvoyant reference**,
never a deployable result (every table that shows it says so).

Variance. Every candidate of a state is rolled out on the same imagined futures (common random
numbers), ``samples`` of them; :meth:`RolloutImprovement.score` returns the whole
(samples x candidates) matrix, so callers can form paired differences against the base's choice
(a control variate that removes what every candidate shares) and their standard errors. With
``antithetic=True`` the futures come in pairs whose arrival gaps use ``u`` and ``1 - u`` of the
same uniforms (Poisson arrivals only; any other workload is refused with a named error).

Cost per state: ``len(candidates) * samples`` rollouts (a cluster copy, ~0.5 ms, plus
``plan_horizon_s`` seconds of simulation and the drain). Parallelism is across states (one episode's
states per worker process): see ``llm_lb_gym.agents.policy_iteration``.
"""

from __future__ import annotations

import copyreg
import io
import math
import pickle
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from .._validate import ConfigError, check_choice, check_int, check_range
from ..sim.request import RequestTable, Status
from ..sim.clock import DEFAULT_DECISION_INTERVAL_S, decide_on_grid, drain, grid_index_of  # noqa: F401 (drain: lookahead re-exports it)
from .drive import decide

_REJECTED = int(Status.REJECTED)
_DONE = (Status.FINISHED, Status.REJECTED)
SCORES = ("window", "drain")


@dataclass(frozen=True)
class ImprovementOptions:
    base: str = "late_binding"
    """Registered router that decides inside the rollouts (any but ``lookahead``)."""
    base_options: Mapping[str, Any] = field(default_factory=dict)
    """The base router's own options (e.g. the setting's tuned ``late_binding`` options)."""
    plan_horizon_s: float = 2.0
    """Simulated seconds of arrivals each candidate is rolled out for."""
    samples: int = 4
    """Imagined futures per state (``see_future=False``); all candidates share them."""
    see_future: bool = False
    """True: roll out on the real future (clairvoyant reference, not deployable)."""
    score: str = "drain"
    """``drain`` (window plus the terminal cost of the work left) or ``window``."""
    antithetic: bool = False
    """Pair the imagined futures antithetically (Poisson arrivals; needs an even ``samples``)."""
    decision_interval_s: float = DEFAULT_DECISION_INTERVAL_S
    """The decision grid of the rollouts; must be the env's."""

    def __post_init__(self) -> None:
        p = "improve"
        from .registry import ROUTERS, make_router   # the registry imports lookahead, which imports us

        allowed = [n for n in ROUTERS if n != "lookahead"]
        if self.base not in allowed:
            raise ConfigError(f"{p}.base={self.base!r} is not valid; allowed: {', '.join(allowed)}")
        if not isinstance(self.base_options, Mapping):
            raise ConfigError(f"{p}.base_options={self.base_options!r} must be a mapping of "
                              f"{self.base!r}'s options")
        make_router(self.base, **dict(self.base_options))   # names a bad option or value
        check_range(f"{p}.plan_horizon_s", self.plan_horizon_s, 0.0, lo_open=True)
        check_range(f"{p}.decision_interval_s", self.decision_interval_s, 0.0, lo_open=True)
        check_int(f"{p}.samples", self.samples, 1)
        check_choice(f"{p}.score", self.score, SCORES)
        for name in ("see_future", "antithetic"):
            v = getattr(self, name)
            if not isinstance(v, (bool, np.bool_)):
                raise ConfigError(f"{p}.{name}={v!r} must be a bool; allowed: True, False")
        if self.see_future and self.samples != 1:
            raise ConfigError(f"{p}.samples={self.samples} needs see_future=False (there is one "
                              "real future); allowed with see_future=True: 1")
        if self.antithetic and (self.see_future or self.samples % 2):
            raise ConfigError(f"{p}.antithetic=True needs see_future=False and an even number "
                              f"of samples; got samples={self.samples}, see_future={self.see_future}")


# --------------------------------------------------------------------------- cluster copies
def _stub_table(table: RequestTable):
    return (RequestTable.__new__, (RequestTable,))


_DISPATCH = copyreg.dispatch_table.copy()
_DISPATCH[RequestTable] = _stub_table


def copy_cluster(cluster):
    """An independent copy of ``cluster`` (same as a pickle round trip, ~5x cheaper).

    The request table is most of a cluster's pickle, and its columns are lists of immutable
    numbers: the pickle stores an empty table in its place (one object, shared by the copy's
    cluster and engines through the pickle memo), then the columns are copied by slicing.
    """
    buf = io.BytesIO()
    p = pickle.Pickler(buf, pickle.HIGHEST_PROTOCOL)
    p.dispatch_table = _DISPATCH
    p.dump(cluster)
    new = pickle.loads(buf.getbuffer())
    cols = new.table.__dict__
    for k, v in cluster.table.__dict__.items():
        cols[k] = v[:] if type(v) is list else v
    # The table's frontends are the copy's own (the engines' copies), not the original's: a
    # flush of the copy's (``metrics``, ``simulate``) must not run the original's to the end.
    cols["frontends"] = [e.fe for e in new.engines if e.fe is not None]
    return new


# --------------------------------------------------------------------------- rollouts
def base_route_all(base):
    """The clock's ``route_all`` for a registered router: ``drive.decide`` in a loop without
    its checks (a registered router's choices are valid); rollouts make hundreds of these calls
    per decision, so the calling convention is looked up once."""
    pick = getattr(base, "select_from_queue", None)
    if pick is None:
        select = base.select

        def route_all(cluster) -> None:
            queue = cluster.queue
            while queue:
                inst = select(cluster, queue[0])
                if inst is None:
                    return
                cluster.route(inst)
    else:
        def route_all(cluster) -> None:
            queue = cluster.queue
            while queue:
                choice = pick(cluster)
                if choice is None:
                    return
                cluster.route(choice[1], choice[0])
    return route_all


def rollout(cluster, route_all, k: int, dt: float, t_end: float) -> int:
    """Run ``cluster`` to ``t_end`` with ``route_all`` (:func:`base_route_all`) deciding at grid
    points ``k, k+1, ...`` (``k * dt`` at or before ``cluster.t`` means: decide now) on the
    decision clock (``sim.clock``). Returns the first grid point left undecided."""
    k = decide_on_grid(cluster, route_all, k, dt, t_end)
    if cluster.t < t_end:
        cluster.advance_to(t_end)
    return k


def in_system_integral(table, lo: int, hi: int, t0: float, t1: float) -> float:
    """Integral over [t0, t1] of the number of requests ``lo <= rid < hi`` in the system
    (arrived and neither finished nor rejected). Requests outside that id range must be out of
    the system throughout (finished before ``t0``, or arriving after ``t1``)."""
    if hi <= lo:
        return 0.0
    arr = np.asarray(table.arrival_s[lo:hi])
    fin = np.asarray(table.finish_s[lo:hi])
    status = np.asarray(table.status[lo:hi], np.int64)
    dur = np.fmin(fin, t1) - np.maximum(arr, t0)    # NaN finish (still running) -> t1
    dur[status == _REJECTED] = 0.0
    return float(np.sum(dur[dur > 0.0]))


# --------------------------------------------------------------------------- the operator
class RolloutImprovement:
    """Scores candidate actions of a state by rollouts of the base router (module doc).

    ``workload`` (``sample(rng, n)``) and ``predictor`` (``predict(batch, rng)``, None: the
    oracle) imagine the future; the bucket schemes fill the imagined rows' bucket columns as the
    env does (None: bucket 0); ``base_router`` replaces ``make_router(base, **base_options)``
    (to give it env-derived options, e.g. Min-Min's bucket edges).
    """

    def __init__(self, options: ImprovementOptions, *, workload=None, predictor=None,
                 prompt_scheme=None, decode_scheme=None, base_router=None):
        if not options.see_future and workload is None:
            raise ConfigError("improve: see_future=False needs the workload model to imagine "
                              "future arrivals (attach the env's workload), or see_future=True")
        self.options = options
        self.workload, self.predictor = workload, predictor
        self.prompt_scheme, self.decode_scheme = prompt_scheme, decode_scheme
        if base_router is None:
            from .registry import make_router
            base_router = make_router(options.base, **dict(options.base_options))
        elif base_router.name != options.base:
            raise ConfigError(f"improve: base_router is {base_router.name!r} but options.base is "
                              f"{options.base!r}")
        self.base = base_router
        self._poisson_rate = None
        if options.antithetic:
            from ..workload.arrivals import PoissonArrivals
            arrivals = getattr(workload, "arrivals", None)
            if not isinstance(arrivals, PoissonArrivals):
                raise ConfigError(f"improve.antithetic=True needs a workload with Poisson arrivals "
                                  f"(workload.arrivals); got {type(arrivals).__name__}; "
                                  "allowed otherwise: antithetic=False")
            self._poisson_rate = arrivals.rate_rps
        self._table = None
        self._lo = 0
        self._n_draw = 16        # requests per workload draw (grows to cover the horizon)
        self.rollouts = 0

    def first_unfinished(self, cluster) -> int:
        """Lowest request id neither finished nor rejected (cached per episode's table)."""
        tb = cluster.table
        if tb is not self._table:
            self._table, self._lo = tb, 0
        while self._lo < tb.n and tb.status[self._lo] in _DONE:
            self._lo += 1
        return self._lo

    def base_choice(self, cluster, base_seed: int) -> tuple[int, int] | None:
        """The base router's own decision in this state (what the advantages are relative to)."""
        self.base.reset(np.random.default_rng(base_seed), len(cluster.engines))
        return decide(cluster, self.base)

    def score(self, cluster, candidates: list, rng: np.random.Generator,
              base_seed: int | None = None) -> np.ndarray:
        """(samples, len(candidates)) requests-in-system seconds of each candidate (lower is
        better) on each imagined future. ``candidates``: ``(queue position, instance)`` or
        ``None`` (hold one decision interval). Draws the futures from ``rng``; leaves
        ``cluster`` unchanged. The base router is reset with ``base_seed`` before every rollout
        (drawn from ``rng`` when None), so randomised bases also share their draws."""
        if not cluster.queue:
            raise ValueError("improve: scoring needs a non-empty router queue")
        o = self.options
        lo = self.first_unfinished(cluster)
        t, dt = cluster.t, o.decision_interval_s
        t_end = t + o.plan_horizon_s
        k0 = grid_index_of(t, dt)
        if base_seed is None:
            base_seed = int(rng.integers(2**63))
        drain_to_end = o.score == "drain"
        out = np.empty((o.samples, len(candidates)))
        base = self.base
        route_all = base_route_all(base)
        m = len(cluster.engines)
        u = None
        for s in range(o.samples):
            root = copy_cluster(cluster)
            if not o.see_future:
                if o.antithetic:
                    u = None if s % 2 == 0 else 1.0 - u
                    u = self._imagine(root, t_end, rng, u)
                else:
                    self._imagine(root, t_end, rng)
            last = len(candidates) - 1
            for j, cand in enumerate(candidates):
                c = root if j == last else copy_cluster(root)
                if cand is None:
                    k = k0 + 1
                else:
                    c.route(cand[1], cand[0])
                    k = k0
                base.reset(np.random.default_rng(base_seed), m)
                k = rollout(c, route_all, k, dt, t_end)
                hi = c._next
                if drain_to_end:
                    drain(c, route_all, k, dt)
                out[s, j] = in_system_integral(c.table, lo, hi, t, math.inf if drain_to_end else t_end)
        self.rollouts += o.samples * len(candidates)
        return out

    # ------------------------------------------------------------------ the imagined future
    def _imagine(self, c, t_end: float, rng, u=None):
        """Overwrite, in the copy ``c``, what the router may not know (module doc). Returns the
        uniforms behind the arrival gaps when drawn antithetically."""
        tb = c.table
        limit = c.max_request_tokens
        for rid in c.queue:      # admitted already: keep them admissible
            p = tb.prompt[rid]
            tb.decode[rid] = max(1, min(int(round(tb.pred[rid])), limit - p))
        lo = c._next
        room = tb.n - lo
        if room <= 0:
            return u
        arr, prompt, pred, task, u = self._draw(t_end - c.t, room, rng, u)
        hi = lo + len(arr)
        tb.arrival_s[lo:hi] = (c.t + arr).tolist()
        tb.prompt[lo:hi] = prompt.tolist()
        tb.pred[lo:hi] = pred.tolist()
        tb.decode[lo:hi] = np.maximum(1, np.rint(pred)).astype(np.int64).tolist()
        tb.task_id[lo:hi] = task.tolist()
        zeros = [0] * len(arr)
        tb.prompt_bucket[lo:hi] = zeros if self.prompt_scheme is None else self.prompt_scheme.bucket(prompt).tolist()
        tb.decode_bucket[lo:hi] = zeros if self.decode_scheme is None else self.decode_scheme.bucket(pred).tolist()
        tb.inv_ideal[lo:hi] = (1.0 / c.speeds.ideal_latency_s(prompt, pred)).tolist()
        return u

    def _draw(self, window_s: float, room: int, rng, u=None):
        """Imagined arrivals (seconds from now), prompt tokens, predicted decode tokens and task
        ids: every arrival within ``window_s`` plus the first after it, at most ``room``.
        With ``antithetic`` the arrival gaps are re-drawn from uniforms ``u`` (given: the
        mirrored ones of the pair's first future) at the workload's mean rate."""
        parts, offset, n = [], 0.0, self._n_draw
        total = 0
        rate = self._poisson_rate
        us = []
        while True:
            b = self.workload.sample(rng, n + 1)
            if self.predictor is None:
                pred = np.asarray(b.decode_tokens, np.float64)
            else:
                pred = np.asarray(self.predictor.predict(b, rng).tokens, np.float64)
            if rate:
                if u is not None and total + n <= len(u):
                    uu = u[total:total + n]
                else:
                    uu = rng.random(n)
                us.append(uu)
                arr = offset + np.cumsum(-np.log1p(-uu) / rate)
            else:
                arr = offset + b.arrival_s[1:]     # drop the draw's request at 0 s
            parts.append((arr, b.prompt_tokens[1:], np.maximum(1.0, pred[1:]), b.task_id[1:]))
            total += n
            if arr[-1] > window_s or total >= room:
                break
            offset, n = arr[-1], 2 * n
        arr, prompt, pred, task = (np.concatenate(x) for x in zip(*parts))
        cut = min(int(np.searchsorted(arr, window_s, side="right")) + 1, room)
        self._n_draw = max(self._n_draw, cut + cut // 4)
        return arr[:cut], prompt[:cut], pred[:cut], task[:cut], (np.concatenate(us) if us else None)
