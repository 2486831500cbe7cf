"""The lookahead router: options, determinism, what it may see, its score, whole episodes."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from llm_lb_gym._validate import ConfigError
from llm_lb_gym.envs.cluster_env import LLMClusterEnv
from llm_lb_gym.rollout import make_env_router, rollout_router
from llm_lb_gym.routers import ROUTERS, make_router, run_router
from llm_lb_gym.routers.drive import build_table, decide
from llm_lb_gym.routers.lookahead import Lookahead, copy_cluster
from llm_lb_gym.predictor.base import Prediction
from llm_lb_gym.predictor.buckets import BucketScheme
from llm_lb_gym.sim.cluster import Cluster
from llm_lb_gym.sim.config import ClusterConfig, EngineConfig
from llm_lb_gym.sim.latency import LatencyModel
from llm_lb_gym.sim.request import Status
from llm_lb_gym.workload.batch import RequestBatch

LAT = LatencyModel(base_s=0.02, token_s=2e-4, prefill_attn_s=0.0, decode_seq_s=1e-3,
                   decode_ctx_s=1e-5)
SCHEME = BucketScheme((32, 128))


class GeomWorkload:
    """Poisson arrivals (the first at 0 s, like every arrival process), geometric lengths."""

    def __init__(self, rate_rps=8.0, prompt_mean=40.0, decode_mean=60.0):
        self.rate, self.p, self.d = rate_rps, prompt_mean, decode_mean

    def sample(self, rng, n):
        arr = np.concatenate([[0.0], np.cumsum(rng.exponential(1.0 / self.rate, n - 1))])
        return RequestBatch.from_arrays(arr, np.minimum(rng.geometric(1 / self.p, n), 400),
                                        np.minimum(rng.geometric(1 / self.d, n), 400))


class FixedPredictor:
    """Predictions that do not depend on the true lengths: ``pred = 50 + 7 * (row % 5)``."""

    scheme = SCHEME

    def predict(self, batch, rng):
        tokens = 50.0 + 7.0 * (np.arange(len(batch)) % 5)
        return Prediction(bucket=SCHEME.bucket(tokens), tokens=tokens, scheme=SCHEME)


def small_cluster(m=2, blocks=200, rows=None, seed=3, n=12, rate=6.0):
    e = EngineConfig(block_size=8, num_kv_blocks=blocks, watermark=0.0, max_num_seqs=8,
                     max_model_len=1000, latency=LAT)
    if rows is None:
        rng = np.random.default_rng(seed)
        b = GeomWorkload(rate).sample(rng, n)
    else:
        b = RequestBatch.from_arrays(*zip(*rows))
    return Cluster(ClusterConfig(m, e), build_table(b, decode_scheme=SCHEME),
                   num_decode_buckets=SCHEME.num_buckets), b


def lookahead(**opts) -> Lookahead:
    r = make_router("lookahead", **opts)
    base = None
    if r.options.base == "min_min":        # its bucket upper bounds come from the scheme
        base = make_router("min_min", decode_edges_tokens=SCHEME.edges_tokens)
    return r.attach(GeomWorkload(), None, None, SCHEME, base_router=base)


# ------------------------------------------------------------------ options and registry
def test_registered_with_options_named_in_errors():
    assert "lookahead" in ROUTERS
    r = make_router("lookahead")
    assert r.defers and r.options.base == "least_requests" and not r.options.see_future
    for bad, match in [({"plan_horizon_s": 0}, r"router.lookahead.plan_horizon_s=0 .*\(0.0, inf\)"),
                       ({"base": "lookahead"}, r"router.lookahead.base='lookahead' .*allowed: round_robin"),
                       ({"base": "rr"}, r"router.lookahead.base='rr'"),
                       ({"candidates": 0}, r"router.lookahead.candidates=0 .*\[1, inf\)"),
                       ({"see_future": "yes"}, r"router.lookahead.see_future='yes' must be a bool"),
                       ({"score": "total"}, r"router.lookahead.score='total' .*allowed: window, drain"),
                       ({"samples": 0}, r"router.lookahead.samples=0 .*\[1, inf\)"),
                       ({"samples": 2, "see_future": True}, r"router.lookahead.samples=2 needs see_future=False"),
                       ({"decision_interval_s": -1.0}, r"router.lookahead.decision_interval_s=-1.0")]:
        with pytest.raises(ConfigError, match=match):
            make_router("lookahead", **bad)
    with pytest.raises(ConfigError, match="see_future=False needs the workload model"):
        make_router("lookahead").reset(np.random.default_rng(0), 2)
    with pytest.raises(ConfigError, match="base_router is 'round_robin'"):
        make_router("lookahead").attach(GeomWorkload(), base_router=make_router("round_robin"))


# ------------------------------------------------------------------ cluster copies
def test_copy_is_independent_and_equals_a_pickle_copy():
    c, _ = small_cluster(n=30, rate=10.0)
    c.advance_to(1.0)
    while c.queue:
        c.route(len(c.queue) % 2)
    c.advance_to(1.5)
    before = pickle.dumps(c)
    a, b = copy_cluster(c), pickle.loads(pickle.dumps(c))
    assert all(e.table is a.table for e in a.engines) and a.table is not c.table
    for x in (a, b):
        while not x.done:
            x.advance_to(x.t + 0.5)
            while x.queue:
                x.route(0)
    np.testing.assert_array_equal(a.table.column("finish_s"), b.table.column("finish_s"))
    assert pickle.dumps(c) == before      # the original did not move


# ------------------------------------------------------------------ the score
def brute_force_score(cluster, cand, base_name, dt, t_end, drain, substeps=20):
    """An independent rollout (the base decides at every grid point, the cluster also advances
    to ``substeps`` points in between), then the count of requests in the system sampled at the
    midpoints of a grid ``dt / substeps`` fine. Returns (integral, error bound: h / 2 per
    arrival or finish in the window)."""
    c = pickle.loads(pickle.dumps(cluster))
    base = make_router(base_name)
    base.reset(np.random.default_rng(0), len(c.engines))
    t0, k = c.t, round(c.t / dt)
    decide_now = cand is not None          # a defer waits one interval
    if cand is not None:
        c.route(cand[1], cand[0])
    h = dt / substeps
    while True:
        T = k * dt
        if T >= t_end and (not drain or c.done):
            break
        if drain and T >= t_end and c._next < c.table.n:
            c.table.arrival_s[c._next] = np.inf        # no arrivals after the horizon
        c.advance_to(max(T, c.t))
        while decide_now and c.queue and (choice := decide(c, base)) is not None:
            c.route(choice[1], choice[0])
        decide_now = True
        for i in range(1, substeps):
            c.advance_to(max(T + i * h, c.t))
        k += 1
    if not drain:
        c.advance_to(t_end)
    tb = c.table
    arr, fin = tb.column("arrival_s"), tb.column("finish_s")
    ok = tb.column("status") != Status.REJECTED
    t1 = t_end if not drain else np.nanmax(fin)
    s = t0 + (np.arange(int(np.ceil((t1 - t0) / h))) + 0.5) * h
    s = s[s < t1]
    inside = ok & (arr <= s[:, None]) & ~(fin <= s[:, None])     # NaN finish: still inside
    total = inside.sum() * h
    total -= max(0.0, s[-1] + h / 2 - t1) * inside[-1].sum()    # the last cell ends at t1
    events = np.sum((arr >= t0) & (arr <= t1) & ok) + np.sum((fin >= t0) & (fin <= t1))
    return total, events * h / 2 + 1e-9


@pytest.mark.parametrize("score", ["window", "drain"])
def test_score_equals_a_brute_force_count(score):
    c, _ = small_cluster(n=14, rate=6.0)
    c.advance_to(1.0)               # a few requests queued, none routed yet
    c.route(0)
    c.advance_to(1.4)
    assert len(c.queue) >= 2
    r = make_router("lookahead", see_future=True, plan_horizon_s=1.5, decision_interval_s=0.05,
                    candidates=2, score=score)
    r.reset(np.random.default_rng(0), 2)
    scored = r.score_candidates(c)
    assert len(scored) == 2 * 2 + 1 and None in [cand for cand, _ in scored]
    assert len({round(s, 9) for _, s in scored}) > 1, "every candidate scored the same: no test"
    for cand, s in scored:
        brute, tol = brute_force_score(c, cand, "least_requests", 0.05, c.t + 1.5, score == "drain")
        assert abs(brute - s) <= tol, (cand, s, brute, tol)


# ------------------------------------------------------------------ what it may see
def _decision_states(seed: int, defer_steps: int = 6, states: int = 4):
    """Clusters of an env episode at decision times with several requests in the router queue."""
    env = LLMClusterEnv(num_instances=2, num_requests=60, arrival_rate_rps=12.0,
                        predictor=FixedPredictor(), engine={"num_kv_blocks": 300})
    env.reset(seed=seed)
    out = []
    while len(out) < states:
        for _ in range(defer_steps):
            env.step(2)
        out.append(pickle.loads(pickle.dumps(env.cluster)))
        for _ in range(len(env.cluster.queue)):   # route what waits (the env then moves on)
            env.step(len(env.cluster.queue) % 2)
        assert not env.cluster.done, "episode too short for the states asked"
    return env, out


def _hide(cluster, rng):
    """The same state with other true output lengths for every unrouted request."""
    c = pickle.loads(pickle.dumps(cluster))
    tb = c.table
    for rid in list(c.queue) + list(range(c._next, tb.n)):
        tb.decode[rid] = int(rng.integers(1, 300))
    return c


@pytest.mark.parametrize("see_future", [False, True])
def test_decisions_ignore_true_lengths_of_unrouted_requests(see_future):
    env, states = _decision_states(5)
    rng = np.random.default_rng(9)
    differs = False
    for c in states:
        scores = []
        for x in (c, _hide(c, rng)):
            r = make_env_router("lookahead", env, plan_horizon_s=3.0, candidates=2, see_future=see_future)
            r.reset(np.random.default_rng(1), 2)
            scores.append(r.score_candidates(x))
        if see_future:
            differs |= scores[0] != scores[1]
        else:
            assert scores[0] == scores[1]   # exactly: nothing of the hidden lengths leaks
    if see_future:
        assert differs, "the clairvoyant variant should see the changed lengths (test has no power)"


# ------------------------------------------------------------------ whole episodes
def _timestamps(table):
    return [table.column(f) for f in ("instance", "routed_s", "first_token_s", "finish_s")]


def test_episode_through_rollout_router_is_deterministic_and_complete():
    env = LLMClusterEnv(num_instances=3, num_requests=50, arrival_rate_rps=15.0,
                        predictor={"name": "noisy", "accuracy": 0.6})
    runs = []
    for _ in range(2):
        r = make_env_router("lookahead", env, plan_horizon_s=2.0, candidates=2)
        res = rollout_router(env, r, seed=4)
        assert res.metrics["unfinished"] == 0
        assert res.metrics["completed"] + res.metrics["rejected"] == 50
        assert r.stats["decisions"] > 0 and r.stats["rollouts"] >= 4 * r.stats["decisions"]   # m + 1 or more
        runs.append(_timestamps(env.cluster.table))
    for a, b in zip(*runs):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("base", ["round_robin", "max_capacity", "min_min"])
def test_run_router_with_preemptions_and_rejections(base):
    # Tight KV (30 blocks of 8 tokens) forces preemptions; prompts + outputs over 240 tokens
    # are rejected; invariants checked at every state change, in the copies too.
    c, b = small_cluster(m=2, blocks=30, n=40, rate=8.0)
    rng = np.random.default_rng(2)
    pred = np.maximum(1, b.decode_tokens * rng.uniform(0.5, 1.5, len(b)))
    r = lookahead(plan_horizon_s=1.0, base=base, decision_interval_s=0.05)
    out = run_router(b, c.cfg, r, np.random.default_rng(1), 0.05, pred, decode_scheme=SCHEME,
                     check=True)
    status = set(out.table.status)
    assert status <= {Status.FINISHED, Status.REJECTED} and Status.REJECTED in status
    assert sum(e.n_preemptions for e in out.engines) > 0
