"""Agents that ignore ``info["action_mask"]`` cannot stall an episode (``action.masked``).

Most DQN code never reads the mask. Under the default ``masked=fallback`` a masked action is
handed to the fallback router and defers are budgeted, so an agent that always defers, or acts
at random, finishes every episode with every request accounted for in at most twice round
robin's steps; ``masked=as_taken`` keeps package 0.4's meaning (an always-defer agent stalls).
Mask-respecting agents and heuristic routers see exactly the episodes they saw before.
"""

from __future__ import annotations

import numpy as np
import pytest

from llm_lb_gym._validate import ConfigError
from llm_lb_gym.envs import LLMClusterEnv
from llm_lb_gym.rollout import make_env_router, rollout_router

SETTINGS = {
    "light": dict(num_requests=300, arrival_rate_rps=20.0),
    "busy": dict(num_requests=300, arrival_rate_rps=60.0),
    "sparse": dict(num_requests=60, arrival_rate_rps=0.5),
    "k3": dict(num_requests=200, arrival_rate_rps=30.0,
               action={"candidates": 3, "order": "shortest"}),
}


def _run(env, policy, seed, max_steps=20_000):
    """Steps ``policy(info, rng) -> action`` until the episode ends; (steps, terminated, info)."""
    rng = np.random.default_rng(seed)
    _, info = env.reset(seed=seed)
    for steps in range(1, max_steps + 1):
        _, _, terminated, truncated, info = env.step(policy(env, info, rng))
        if terminated or truncated:
            return steps, terminated, info
    return max_steps, False, info


def always_defer(env, info, rng):
    return env.defer_action


def uniform(env, info, rng):
    return int(rng.integers(env.defer_action + 1))


def masked_uniform(env, info, rng):
    return int(rng.choice(np.flatnonzero(info["action_mask"])))


@pytest.mark.parametrize("setting", sorted(SETTINGS))
@pytest.mark.parametrize("policy", [always_defer, uniform], ids=["always_defer", "random"])
def test_mask_ignorant_agents_finish_within_twice_round_robins_steps(setting, policy):
    env = LLMClusterEnv(**SETTINGS[setting])
    n = env.cfg.num_requests
    for seed in (0, 1):
        rr = rollout_router(env, make_env_router("round_robin", env), seed=seed)
        steps, terminated, info = _run(env, policy, seed)
        m = info["metrics"]
        assert terminated, (setting, seed, steps)
        assert m["completed"] + m["rejected"] == n and m["unfinished"] == 0
        assert steps <= 2 * rr.steps, (setting, seed, steps, rr.steps)
        if policy is always_defer:
            assert env.masked_actions > 0


def test_always_defer_stalls_as_taken_and_the_budget_is_what_bounds_it():
    """The paper's meaning stays available, and it does stall; without the budget the fallback
    alone (idle cluster only) lets an always-defer agent run far past round robin's steps."""
    kw = SETTINGS["light"]
    steps, terminated, info = _run(LLMClusterEnv(action={"masked": "as_taken"}, **kw),
                                   always_defer, 0, max_steps=3_000)
    assert not terminated and info["queue_len"] > 0
    env = LLMClusterEnv(action={"defer_budget": None}, **kw)
    rr = rollout_router(env, make_env_router("round_robin", env), seed=0)
    steps, _, _ = _run(env, always_defer, 0, max_steps=3_000)
    assert steps > 2 * rr.steps


@pytest.mark.parametrize("masked", ["fallback", "as_taken"])
def test_mask_respecting_agents_see_the_same_episode_under_both_meanings(masked):
    """A random agent that reads the mask: no masked action, so the two options agree bit for
    bit (rewards, observations, metrics), and the fallback router never draws from np_random."""
    base = LLMClusterEnv(action={"masked": "as_taken", "defer_budget": None}, **SETTINGS["busy"])
    env = LLMClusterEnv(action={"masked": masked}, **SETTINGS["busy"])
    rng_a = np.random.default_rng(5)
    _, info_a = base.reset(seed=3)
    _, info_b = env.reset(seed=3)
    while True:
        assert np.array_equal(info_a["action_mask"], info_b["action_mask"])
        a = int(rng_a.choice(np.flatnonzero(info_b["action_mask"])))
        oa, ra, ta, _, info_a = base.step(a)
        ob, rb, tb, _, info_b = env.step(a)
        assert np.array_equal(oa, ob) and ra == rb and ta == tb
        if ta:
            break
    assert info_a["metrics"] == info_b["metrics"] and env.masked_actions == 0


def test_round_robin_through_step_is_unchanged_by_the_guard():
    """Round robin never defers: the default env gives exactly the as_taken episode."""
    def rr(env, info, rng):
        rr.i = (getattr(rr, "i", -1) + 1) % env.m
        return rr.i
    out = []
    for masked in ("fallback", "as_taken"):
        rr.i = -1
        out.append(_run(LLMClusterEnv(action={"masked": masked}, **SETTINGS["light"]), rr, 7))
    assert out[0][0] == out[1][0] and out[0][2]["metrics"] == out[1][2]["metrics"]


def test_a_masked_action_is_the_fallback_routers_choice_and_seeded():
    env = LLMClusterEnv(action={"fallback_router": "power_of_two"}, **SETTINGS["light"])
    twin = LLMClusterEnv(action={"fallback_router": "power_of_two"}, **SETTINGS["light"])
    for e in (env, twin):
        _, info = e.reset(seed=2)
    assert not info["action_mask"][-1]   # a request waits on an idle cluster
    rid = env.cluster.queue[0]
    _, _, _, _, info = env.step(env.defer_action)
    assert env.masked_actions == 1 and rid not in env.cluster.queue   # routed, not deferred
    twin.step(twin.defer_action)
    assert env.cluster.table.instance[rid] == twin.cluster.table.instance[rid]
    # an empty candidate slot (k > 1) is masked too, and routes instead of waiting
    env = LLMClusterEnv(action={"candidates": 4, "order": "shortest"}, num_requests=30,
                        arrival_rate_rps=2.0)
    env.reset(seed=0)
    rid = env.cluster.queue[0]
    env.step(3 * env.m)
    assert env.masked_actions == 1 and rid not in env.cluster.queue


@pytest.mark.parametrize("bad,match", [
    ({"masked": "ignore"}, r"action.masked.*allowed: fallback, as_taken"),
    ({"fallback_router": "rr"}, r"action.fallback_router.*allowed: round_robin"),
    ({"defer_budget": -1.0}, r"action.defer_budget"),
])
def test_bad_options_name_themselves(bad, match):
    with pytest.raises(ConfigError, match=match):
        LLMClusterEnv(action=bad)
