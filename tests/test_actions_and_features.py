"""Options beyond the paper: k candidate requests with a starvation bound, extra features,
router teachers and honest guidance."""

from __future__ import annotations

import math

import numpy as np
import pytest

from llm_lb_gym._validate import ConfigError
from llm_lb_gym.envs import LLMClusterEnv
from llm_lb_gym.routers.drive import decide
from llm_lb_gym.rollout import make_env_router, rollout_router

BUSY = dict(num_requests=200, arrival_rate_rps=400.0)   # requests pile up at the router
FEATURES = ["arrivals_left", "age", "block_need", "free_kv_blocks", "waiting_blocks", "time_since_route"]


def _fill_queue(env, steps=8):
    env.reset(seed=1)
    for _ in range(steps):
        env.route_step(env.m)   # defer as a router does (step's defer is masked on an idle cluster)
    assert len(env.cluster.queue) > 8


def test_candidates_are_the_shortest_queued_requests_and_actions_address_them():
    env = LLMClusterEnv(action={"candidates": 3, "order": "shortest"}, **BUSY)
    assert env.action_space.n == 3 * env.m + 1 and env.defer_action == 12
    _fill_queue(env)
    tb, q = env.cluster.table, list(env.cluster.queue)
    ideal = {r: 1.0 / tb.inv_ideal[r] for r in q}
    want = sorted(q, key=lambda r: (ideal[r], r))[:3]
    assert list(env.candidates) == want
    mask = env.action_masks()
    assert mask.tolist() == [True] * 12 + [False]   # the cluster is idle: no deferring
    # action j * m + i routes candidate j to instance i
    rid = env.candidates[2]
    env.step(2 * env.m + 1)
    assert tb.instance[rid] == 1 and rid not in env.cluster.queue
    assert env.action_for(list(env.cluster.queue).index(env.candidates[0]), 3) == 3


def test_scored_order_follows_the_order_score_and_zero_weights_give_shortest():
    from llm_lb_gym.routers.scored_binding import order_key

    w = {"prompt_weight": 0.8, "age_per_s": 3.0}
    scored = LLMClusterEnv(action={"candidates": 4, "order": "scored", "order_weights": w}, **BUSY)
    assert scored.cfg.action.order_weights == {"age_per_s": 3.0, "prompt_weight": 0.8, "late_penalty": 0.0}
    _fill_queue(scored)
    c = scored.cluster
    key = order_key(c.table, c.t, 3.0, 0.8, 0.0)
    assert list(scored.candidates) == sorted(c.queue, key=key, reverse=True)[:4]
    shortest = LLMClusterEnv(action={"candidates": 4, "order": "shortest"}, **BUSY)
    _fill_queue(shortest)
    assert list(scored.candidates) != list(shortest.candidates)   # the weights matter here
    zero = LLMClusterEnv(action={"candidates": 4, "order": "scored"}, **BUSY)
    _fill_queue(zero)
    assert list(zero.candidates) == list(shortest.candidates)


def test_scored_binding_first_choice_is_candidate_zero_under_its_own_order():
    """Every release of scored_binding is expressible with order=scored and its weights (the
    teacher of ``experiment=scored_teacher``); with order=shortest some are not."""
    opts = {"period_s": 0.05, "reserve_frac": 1.0, "prompt_weight": 0.9, "age_per_s": 0.5,
            "growth_frac": 1.0}
    weights = {k: opts[k] for k in ("prompt_weight", "age_per_s")}
    env = LLMClusterEnv(action={"candidates": 2, "order": "scored", "order_weights": weights},
                        num_requests=300, arrival_rate_rps=60.0)
    from llm_lb_gym.rollout import router_choice, start_episode, take_choice

    teacher = make_env_router("scored_binding", env, **opts)
    start_episode(env, teacher, 4)
    routes = 0
    while True:
        choice = router_choice(env, teacher)
        if choice is not None:
            routes += 1
            assert env.action_for(*choice) is not None and env.action_for(*choice) < env.m
        *_, term, trunc, _ = take_choice(env, choice)
        if term or trunc:
            break
    assert routes == 300


@pytest.mark.parametrize("action,match", [
    ({"order": "shortest", "order_weights": {"age_per_s": 1.0}}, "order_weights is for action.order=scored"),
    ({"order": "scored", "order_weights": {"age": 1.0}}, "age.*allowed: age_per_s, late_penalty, prompt_weight"),
    ({"order": "scored", "order_weights": {"prompt_weight": 9.0}}, "action.order_weights.prompt_weight"),
    ({"order": "scored", "order_weights": [1.0]}, "must be a mapping"),
])
def test_scored_order_options_are_named_errors(action, match):
    with pytest.raises(ConfigError, match=match):
        LLMClusterEnv(action=action, **BUSY)


def test_oldest_order_with_one_candidate_is_the_papers_head_of_line():
    a = LLMClusterEnv(**BUSY)
    b = LLMClusterEnv(action={"candidates": 1, "order": "oldest"}, **BUSY)
    for env in (a, b):
        _fill_queue(env)
        assert env.candidates == (env.cluster.queue[0],)
    assert a.observation_space == b.observation_space


def test_starvation_bound_puts_overdue_requests_first():
    env = LLMClusterEnv(action={"candidates": 2, "order": "shortest", "max_wait_s": 0.05}, **BUSY)
    _fill_queue(env, steps=10)
    tb, c = env.cluster.table, env.cluster
    overdue = [r for r in c.queue if c.t - tb.arrival_s[r] > 0.05]
    assert len(overdue) >= 2
    assert list(env.candidates) == overdue[:2]   # oldest first, whatever their length


def test_empty_slots_are_masked_and_a_no_op():
    # as_taken: package 0.4's meaning of a masked action (the default's is in test_masked_actions)
    env = LLMClusterEnv(action={"candidates": 4, "order": "shortest", "masked": "as_taken"},
                        num_requests=30, arrival_rate_rps=2.0)
    env.reset(seed=0)
    assert len(env.candidates) == 1
    mask = env.action_masks()
    assert mask[:env.m].all() and not mask[env.m:4 * env.m].any()
    assert not mask[-1]   # a request waits on an idle cluster: deferring is masked
    t0 = env.cluster.t
    _, _, _, _, info = env.step(3 * env.m)   # slot 3 holds no request: behaves as defer
    assert info["time_s"] == pytest.approx(t0 + 0.02)


def test_extra_features_by_hand():
    env = LLMClusterEnv(action={"candidates": 2, "order": "oldest"}, obs={"features": FEATURES, "normalize": False},
                        **BUSY)
    lay = env.obs_layout
    assert (lay.global_dim, lay.candidate_dim, lay.instance_dim) == (2, 5, 3 + 3 + 2 + 3)
    assert env.observation_space.shape == (lay.size,)
    _fill_queue(env)
    env.step(1)              # candidate 0 to instance 1
    obs, *_ = env.step(env.defer_action)
    c, tb = env.cluster, env.cluster.table
    assert obs[0] == min(len(c.queue), 512) and obs[1] == tb.n - c.n_arrived
    r = env.candidates[0]
    cand = obs[2:7]
    assert cand[0] == tb.prompt[r] and cand[2] == pytest.approx(tb.pred[r])
    assert cand[3] == pytest.approx(c.t - tb.arrival_s[r], abs=1e-5)
    assert cand[4] == math.ceil((tb.prompt[r] + tb.pred[r]) / 16)
    inst1 = obs[2 + 2 * 5 + lay.instance_dim: 2 + 2 * 5 + 2 * lay.instance_dim]
    e = c.engines[1]
    assert inst1[-3] == e.free_blocks
    assert inst1[-2] == pytest.approx((e.pending_prefill_tokens + e.wait_left) / 16)
    assert inst1[-1] == pytest.approx(0.02, abs=1e-6)    # routed one interval ago
    with pytest.raises(ConfigError, match="obs.features"):
        LLMClusterEnv(obs={"features": ["queue_age"]})


def test_router_teacher_guidance_is_zero_when_followed_and_negative_otherwise():
    reward = {"mode": "workload_aware", "guidance_scale": 2.0, "teacher": "least_requests",
              "mismatch_penalty": 0.5}
    env = LLMClusterEnv(reward=reward, **BUSY)
    env.reset(seed=1)
    for _ in range(40):
        c = env.cluster
        teacher = make_env_router("least_requests", env)
        teacher.reset(np.random.default_rng(0), env.m)
        pos, inst = decide(c, teacher)
        _, _, _, _, info = env.step(inst)          # follow the teacher
        assert info["reward_components"]["guidance"] == 0.0
        other = (decide(env.cluster, teacher)[1] + 1) % env.m
        _, _, _, _, info = env.step(other)          # disagree
        assert info["reward_components"]["guidance"] == -1.0
    # deferring while the mixing teacher would route is penalised too
    env = LLMClusterEnv(reward={"mode": "workload_aware", "guidance_scale": 1.0},
                        action={"masked": "as_taken"}, **BUSY)   # the defer is masked: take it
    env.reset(seed=1)
    _, _, _, _, info = env.step(env.defer_action)
    assert info["reward_components"]["guidance"] == -1.0


@pytest.mark.parametrize("bad,match", [
    ({"action": {"candidates": 0}}, "action.candidates"),
    ({"action": {"order": "longest"}}, "action.order.*allowed: oldest, shortest, scored"),
    ({"action": {"max_wait_s": 0}}, "action.max_wait_s"),
    ({"reward": {"teacher": "rr"}}, "reward.teacher.*allowed: mixing, round_robin"),
    ({"reward": {"teacher": "max_capacity", "teacher_options": {"periods": 1}}}, "periods.*allowed: period_s"),
    ({"reward": {"horizon_s": 0}}, "reward.horizon_s"),
    ({"reward": {"discount": "sometimes"}}, "reward.discount.*semi_mdp, per_step"),
    ({"reward": {"penalty": "slowdown"}}, "reward.penalty.*paper, latency"),
])
def test_bad_options_are_named_errors(bad, match):
    with pytest.raises(ConfigError, match=match):
        LLMClusterEnv(**bad)


def test_late_binding_holds_requests_and_releases_the_shortest_first():
    env = LLMClusterEnv(reward={"mode": "baseline"}, num_requests=300, arrival_rate_rps=60.0)
    rr = rollout_router(env, make_env_router("round_robin", env), 2).metrics
    for rounds in ("global", "since_release"):
        res = rollout_router(env, make_env_router("late_binding", env, period_s=1.0, rounds=rounds), 2)
        m = res.metrics
        assert m["unfinished"] == 0 and m["completed"] + m["rejected"] == 300
        assert m["mean_router_wait_s"] > 10 * rr["mean_router_wait_s"]
        assert m["preemptions"] <= rr["preemptions"]
    with pytest.raises(ConfigError, match="router.late_binding.reserve"):
        make_env_router("late_binding", env, reserve="all")


def test_idle_defer_mask_prevents_deferring_forever():
    """A policy that defers whenever it may still finishes: once requests wait on an idle
    cluster, defer is masked."""
    env = LLMClusterEnv(num_requests=40, arrival_rate_rps=5.0)
    env.reset(seed=0)
    for _ in range(100_000):
        mask = env.action_masks()
        a = env.defer_action if mask[-1] else int(mask.nonzero()[0][0])
        *_, term, _, info = env.step(a)
        if term:
            break
    assert term and info["metrics"]["unfinished"] == 0
