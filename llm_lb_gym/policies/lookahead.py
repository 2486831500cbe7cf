"""Model-predictive lookahead: try every action on a copy of the cluster, keep the best one.

At a decision the router enumerates its candidate actions: route the router-queue head to each
instance ``i``, or defer it one decision interval (with ``candidates=k > 1`` also route each of
the ``k - 1`` other queued requests of shortest predicted ideal latency to each instance). For
every candidate it copies the cluster (``copy_cluster``), applies the action, and simulates
``horizon_s`` seconds ahead with a base heuristic (``base``) deciding on the decision grid
``k * decision_interval_s`` exactly as the env and ``drive.run_router`` do: after a route the
next decision is at the same time while requests wait, a deferral waits one interval, an empty
queue waits for the first grid point at or after the next arrival.

Score (lower is better), computed exactly from the copy's arrival and finish timestamps:
- ``score="window"``: the time integral over ``[t, t + horizon_s]`` of the number of requests
  in the system (arrived, neither finished nor rejected).
- ``score="drain"`` (default): after the window, arrivals stop, the base routes what waits and
  every instance runs until idle; the score is the integral over ``[t, inf)`` of the same count,
  i.e. the remaining time in the system of every request that arrived by ``t + horizon_s``.
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
of ``horizon_s`` seconds plus the drain) and one workload draw. Measured on one core with the
compiled engine, defaults (``horizon_s=5``, ``base=least_requests``, ``score=drain``), 3 x
2,000-request episodes, ``python -m experiments.bench_lookahead --horizons 5``:

    regime (4 x Llama-2-7B V100)       per decision median / p90   per episode   mean E2E vs RR
    default, 20 req/s                   9.5 ms / 10.6 ms            22 s          -1.6% (least_requests -1.7%)
    near capacity, 52 req/s             23 ms / 46 ms               63 s          -6.4% (least_requests -3.4%)
    overloaded, 72 KV blocks, 20 req/s  55 ms / 93 ms               112 s         -10.4% (least_requests -0.6%)

The drain dominates when instance queues are long (overloaded); the rest scales about linearly
with ``horizon_s`` and the arrival rate.
"""

from __future__ import annotations

import copyreg
import io
import math
import pickle
import time
from dataclasses import dataclass

import numpy as np

from .._validate import ConfigError, check_choice, check_int, check_range
from ..sim.request import RequestTable, Status
from .base import RouterBase
from .drive import decide

_REJECTED = int(Status.REJECTED)
SCORES = ("window", "drain")
# Decision times are k * interval; a cluster time meant to be a grid point may sit a few ulps off.
_GRID_SLACK = 1e-9


@dataclass(frozen=True)
class LookaheadOptions:
    horizon_s: float = 5.0
    """Simulated seconds each candidate is rolled out for with arrivals (the window of its
    score; with ``score="drain"`` the requests arriving within it are followed to the end)."""
    base: str = "least_requests"
    """Registered router that decides inside the rollouts (any but ``lookahead``)."""
    see_future: bool = False
    """False: future arrivals and unrouted requests' lengths come from the workload model and
    the predictor (deployable). True: the rollout sees the real future (clairvoyant)."""
    candidates: int = 1
    """Queued requests considered per decision: the head, plus the ``candidates - 1`` others of
    shortest predicted ideal latency (each tried on every instance)."""
    score: str = "drain"
    """``window``: requests-in-system seconds within ``[t, t + horizon_s]``. ``drain``: then
    stop arrivals and run to completion, and count the whole remaining time in the system of
    every request that arrived by ``t + horizon_s`` (a terminal cost: a request parked behind
    a long queue costs what it will wait, even beyond the horizon)."""
    samples: int = 1
    """Imagined futures per decision (scores are averaged; cost scales with it). Only with
    ``see_future=False``: the real future is one."""
    decision_interval_s: float = 0.02
    """The decision grid of the rollouts; must match the driver's (``make_env_router`` sets it
    from the env)."""

    def __post_init__(self) -> None:
        check_range("router.lookahead.horizon_s", self.horizon_s, 0.0, lo_open=True)
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
        from .registry import ROUTERS   # the registry imports this module

        allowed = [n for n in ROUTERS if n != "lookahead"]
        if self.base not in allowed:
            raise ConfigError(f"router.lookahead.base={self.base!r} is not valid; "
                              f"allowed: {', '.join(allowed)}")


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
    return new


# --------------------------------------------------------------------------- rollout, score
def _route_while_base_agrees(cluster, base) -> None:
    # drive.decide without its checks (a registered router's choices are valid): the rollouts
    # make hundreds of these calls per decision.
    queue = cluster.queue
    pick = getattr(base, "select_from_queue", None)
    if pick is None:
        select = base.select
        while queue:
            inst = select(cluster, queue[0])
            if inst is None:
                return
            cluster.route(inst)
    else:
        while queue:
            choice = pick(cluster)
            if choice is None:
                return
            cluster.route(choice[1], choice[0])


def rollout(cluster, base, k: int, dt: float, t_end: float) -> int:
    """Run ``cluster`` to ``t_end`` with ``base`` deciding at grid points ``k, k+1, ...``
    (``k * dt`` at or before ``cluster.t`` means: decide now), as ``drive.run_router`` does.
    Returns the first grid point left undecided."""
    queue = cluster.queue
    while True:
        t = k * dt
        if t >= t_end:
            break
        if t > cluster.t:
            cluster.advance_to(t)
        _route_while_base_agrees(cluster, base)
        if queue:
            k += 1
            continue
        nxt = cluster.next_arrival_s
        if nxt >= t_end:
            k += 1
            break
        k1 = max(k + 1, math.ceil(nxt / dt))
        while k1 * dt < nxt:            # the env's rounding of "first grid point at or after"
            k1 += 1
        while k1 - 1 > k and (k1 - 1) * dt >= nxt:
            k1 -= 1
        k = k1
    if cluster.t < t_end:
        cluster.advance_to(t_end)
    return k


def drain(cluster, base, k: int, dt: float) -> None:
    """No more arrivals: route what waits in the router queue with ``base`` at grid points
    ``k, k+1, ...``, then run every instance until it is idle."""
    if cluster._next < cluster.table.n:
        cluster.table.arrival_s[cluster._next] = math.inf    # arrivals are taken in id order
    queue = cluster.queue
    while queue:
        t = k * dt
        if t > cluster.t:
            cluster.advance_to(t)
        _route_while_base_agrees(cluster, base)
        k += 1
    for e in cluster.engines:
        e.advance_to(math.inf)


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


# --------------------------------------------------------------------------- the router
class Lookahead(RouterBase):
    """Model-predictive router: roll each candidate action out with ``base``, keep the best."""

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

    def attach(self, workload=None, predictor=None, prompt_scheme=None, decode_scheme=None,
               base_router=None) -> "Lookahead":
        """Give the router the env's models (``make_env_router`` does this).

        ``workload`` (``sample(rng, n)``) draws the imagined future (needed unless
        ``see_future``); ``predictor`` estimates its lengths (None: the oracle); the bucket
        schemes fill the table's bucket columns (None: bucket 0, as ``drive.build_table``
        leaves prompt buckets); ``base_router`` replaces ``make_router(options.base)`` (to
        give the base its env-derived options, e.g. Min-Min's bucket edges).
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
        if self._base_router is None:
            from .registry import make_router
            self._base_router = make_router(self.options.base)
        self._lo = 0              # every request below this id has finished or been rejected
        self._n_draw = 16         # requests per workload draw (grows to cover the horizon)
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
        o = self.options
        tb = cluster.table
        while self._lo < tb.n and tb.status[self._lo] in (Status.FINISHED, Status.REJECTED):
            self._lo += 1
        t, dt = cluster.t, o.decision_interval_s
        t_end = t + o.horizon_s
        k0 = math.floor(t / dt + _GRID_SLACK)
        base_seed = int(self.rng.integers(2**63))
        cands: list[tuple[int, int] | None] = [
            (pos, i) for pos in self.queue_positions(cluster, heads_only) for i in range(self.num_instances)]
        cands.append(None)
        base = self._base_router
        base.reset(np.random.default_rng(base_seed), self.num_instances)
        own = decide(cluster, base)
        if own in cands:        # ties go to the base's own choice (see the module doc)
            cands.remove(own)
            cands.insert(0, own)
        to_completion = o.score == "drain"
        totals = [0.0] * len(cands)
        for _ in range(o.samples):
            root = copy_cluster(cluster)
            if not o.see_future:
                self._imagine(root, t_end)    # one imagined future, common to every candidate
            for j, cand in enumerate(cands):
                c = root if j == len(cands) - 1 else copy_cluster(root)
                if cand is None:
                    k = k0 + 1
                else:
                    c.route(cand[1], cand[0])
                    k = k0
                base.reset(np.random.default_rng(base_seed), self.num_instances)
                k = rollout(c, base, k, dt, t_end)
                hi = c._next
                if to_completion:
                    drain(c, base, k, dt)
                totals[j] += in_system_integral(c.table, self._lo, hi, t, math.inf if to_completion else t_end)
        scored = [(cand, total / o.samples) for cand, total in zip(cands, totals)]
        st = self.stats
        st["decisions"] += 1
        st["rollouts"] += len(cands) * o.samples
        wall = time.perf_counter() - start
        st["wall_s"] += wall
        self.decision_wall_s.append(wall)
        return scored

    # ------------------------------------------------------------------ the imagined future
    def _imagine(self, c, t_end: float) -> None:
        """Overwrite, in the copy ``c``, what the router may not know (see the module doc)."""
        tb = c.table
        limit = c.max_request_tokens
        for rid in c.queue:      # admitted already: keep them admissible
            p = tb.prompt[rid]
            tb.decode[rid] = max(1, min(int(round(tb.pred[rid])), limit - p))
        lo = c._next
        room = tb.n - lo
        if room <= 0:
            return
        arr, prompt, pred, task = self._draw(t_end - c.t, room)
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

    def _draw(self, horizon_s: float, room: int):
        """Imagined arrivals (seconds from now), prompt tokens, predicted decode tokens and task
        ids: every arrival within ``horizon_s`` plus the first after it, at most ``room``."""
        parts, offset, n = [], 0.0, self._n_draw
        total = 0
        while True:
            b = self.workload.sample(self.rng, n + 1)
            if self.predictor is None:
                pred = np.asarray(b.decode_tokens, np.float64)
            else:
                pred = np.asarray(self.predictor.predict(b, self.rng).tokens, np.float64)
            arr = offset + b.arrival_s[1:]     # drop the draw's request at 0 s
            parts.append((arr, b.prompt_tokens[1:], np.maximum(1.0, pred[1:]), b.task_id[1:]))
            total += n
            if arr[-1] > horizon_s or total >= room:
                break
            offset, n = arr[-1], 2 * n
        arr, prompt, pred, task = (np.concatenate(x) for x in zip(*parts))
        cut = min(int(np.searchsorted(arr, horizon_s, side="right")) + 1, room)
        self._n_draw = max(self._n_draw, cut + cut // 4)
        return arr[:cut], prompt[:cut], pred[:cut], task[:cut]
