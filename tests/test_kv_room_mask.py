"""``action.kv_room``: the mask carries late_binding's KV-room rule (``envs/config.py``).

A route is valid only to an instance with room for the candidate (``late_binding``'s
``rooms``/``need_blocks``/``fits``); with ``hold_without_room_only`` defer is valid only while no
candidate fits anywhere, so a mask-respecting agent holds exactly when the rule says so. Agents
that ignore the mask still end every episode (the fallback rules).
"""

from __future__ import annotations

import numpy as np
import pytest

from llm_lb_gym._validate import ConfigError
from llm_lb_gym.envs import LLMClusterEnv
from llm_lb_gym.rollout import make_env_router, rollout_router

BUSY = dict(num_requests=400, arrival_rate_rps=150.0, num_instances=2)   # KV binds


def _episode(env, policy, seed, check=None, max_steps=50_000):
    rng = np.random.default_rng(seed)
    _, info = env.reset(seed=seed)
    for steps in range(1, max_steps + 1):
        if check is not None:
            check(env, info)
        _, _, term, trunc, info = env.step(policy(env, info, rng))
        if term or trunc:
            return steps, term, info
    raise AssertionError("episode did not end")


def masked_uniform(env, info, rng):
    return int(rng.choice(np.flatnonzero(info["action_mask"])))


@pytest.mark.parametrize("bad", [dict(kv_room="all"), dict(kv_room=True),
                                 dict(hold_without_room_only=True),
                                 dict(kv_room="full", hold_without_room_only=1)])
def test_bad_values_are_named_errors(bad):
    with pytest.raises(ConfigError, match="action.kv_room|action.hold_without_room_only"):
        LLMClusterEnv(action=bad)


@pytest.mark.parametrize("reserve", ["full", "prompt"])
@pytest.mark.parametrize("hold_only", [False, True])
def test_mask_is_late_bindings_room_rule(reserve, hold_only):
    env = LLMClusterEnv(**BUSY, action=dict(candidates=3, order="shortest", kv_room=reserve,
                                            hold_without_room_only=hold_only))
    rule = make_env_router("late_binding", env, reserve=reserve, period_s=0.0)
    seen = {"held": 0, "routes_cut": 0}

    def check(env, info):
        mask, c, m = info["action_mask"], env.unwrapped.cluster, env.m
        assert mask.dtype == np.int8 and mask.any()
        if not c.queue:
            return
        rooms = rule.rooms(c)
        fits = np.zeros(env.defer_action, dtype=bool)
        for j, rid in enumerate(env.candidates):
            for i in range(m):
                fits[j * m + i] = rule.fits(c, rooms[i], rule.need_blocks(c, rid, i), i)
        assert (mask[:-1].astype(bool) == fits).all()
        seen["routes_cut"] += int(fits[:len(env.candidates) * m].sum() < len(env.candidates) * m)
        if not fits.any():
            seen["held"] += 1
            assert mask[-1] == 1            # nothing fits: defer is the only valid action
        elif hold_only:
            assert mask[-1] == 0            # something fits: no holding

    steps, term, info = _episode(env, masked_uniform, 3, check)
    assert term and info["metrics"]["unfinished"] == 0 and env.masked_actions == 0
    assert seen["held"] > 0 and seen["routes_cut"] > 0   # the rule bound in this episode


def test_same_seed_same_episode():
    kw = dict(**BUSY, action=dict(candidates=2, order="shortest", kv_room="full",
                                  hold_without_room_only=True))
    a = _episode(LLMClusterEnv(**kw), masked_uniform, 5)
    b = _episode(LLMClusterEnv(**kw), masked_uniform, 5)
    assert a[0] == b[0] and a[2]["metrics"] == b[2]["metrics"]


@pytest.mark.parametrize("masked", ["fallback", "as_taken"])
def test_mask_ignorant_agents_still_end_every_episode(masked):
    env = LLMClusterEnv(**BUSY, action=dict(kv_room="full", hold_without_room_only=True, masked=masked))
    first_route = lambda env, info, rng: 0   # noqa: E731  (piles onto instance 0, rooms or not)
    steps, term, info = _episode(env, first_route, 1)
    assert term and info["metrics"]["unfinished"] == 0
    if masked == "fallback":
        assert env.masked_actions > 0       # routes without room went to the fallback router


def test_heuristic_routers_are_unchanged():
    """The option changes the mask, not the dynamics: a router's episode is the same bit for bit."""
    plain = LLMClusterEnv(**BUSY)
    masked = LLMClusterEnv(**BUSY, action=dict(kv_room="prompt"))
    for name in ("round_robin", "late_binding"):
        a = rollout_router(plain, make_env_router(name, plain), seed=2).metrics
        b = rollout_router(masked, make_env_router(name, masked), seed=2).metrics
        assert a == b


def test_shipped_ppo_mask_hyperparameters_build_the_agent_on_the_masked_env():
    """``docs/recipes/zoo_ppo_mask.yml`` (what the probe and the zoo read): its env keywords
    make the masked action space, its hyperparameters a MaskablePPO that respects the mask."""
    pytest.importorskip("sb3_contrib")
    import gymnasium as gym
    from sb3_contrib import MaskablePPO

    from llm_lb_gym.envs.wrappers import RouterRL
    from llm_lb_gym.experiments.probe_stock_agents import hyperparameters

    hp, wrap, env_kwargs = hyperparameters("ppo_mask")
    assert env_kwargs["action"]["kv_room"] in ("full", "prompt") and hp["gamma"] == 1.0
    env = RouterRL(gym.make("LLMCluster-NearCapacity-v0", num_requests=400, **env_kwargs), **wrap)
    assert env.unwrapped.cfg.action.kv_room == env_kwargs["action"]["kv_room"]
    model = MaskablePPO(env=env, seed=0, verbose=0, **{**hp, "n_steps": 256, "batch_size": 64})
    model.learn(256)
    assert env.unwrapped.masked_actions == 0   # one episode (>= 400 steps): the agent took no masked action


def test_shipped_guided_ppo_mask_recipe_pays_the_guidance_per_decision_through_router_rl():
    """``docs/recipes/zoo_ppo_mask_guided.yml``: through ``RouterRL`` every decision that differs
    from the teacher's (late_binding, period_s=0, on the masked action space) pays
    -guidance_scale x reward_scale at episode 0, one that matches pays no guidance; the
    hyperparameters (a ``lin_`` learning rate) build a MaskablePPO that respects the mask."""
    pytest.importorskip("sb3_contrib")
    import gymnasium as gym
    from sb3_contrib import MaskablePPO

    from llm_lb_gym.envs.wrappers import RouterRL
    from llm_lb_gym.experiments.probe_stock_agents import RECIPES, hyperparameters
    from llm_lb_gym.routers.drive import decide

    hp, wrap, env_kwargs = hyperparameters("ppo_mask", RECIPES / "zoo_ppo_mask_guided.yml")
    assert callable(hp["learning_rate"]) and hp["learning_rate"](0.5) == pytest.approx(1.5e-4)
    rc = env_kwargs["reward"]
    env = RouterRL(gym.make("LLMCluster-NearCapacity-v0", num_requests=300, **env_kwargs), **wrap)
    base = env.unwrapped
    teacher = make_env_router(rc["teacher"], base, **rc["teacher_options"])
    _, info = env.reset(seed=0)
    teacher.reset(np.random.default_rng(0), base.m)
    rng, seen = np.random.default_rng(0), set()
    for _ in range(300):
        mask = info["action_mask"]
        choice = decide(base.cluster, teacher)
        wanted = base.defer_action if choice is None else base.action_for(*choice)
        a = int(rng.choice(np.flatnonzero(mask)))
        _, r, term, trunc, info = env.step(a)
        g = info["reward_components"]["guidance"]
        assert g == (0.0 if a == wanted else -rc["guidance_scale"])
        if mask.sum() > 1:
            seen.add(a == wanted)
        if term or trunc:
            break
    assert seen == {True, False}
    model = MaskablePPO(env=env, seed=0, verbose=0, **{**hp, "n_steps": 256, "batch_size": 64})
    model.learn(256)
    assert base.masked_actions == 0
