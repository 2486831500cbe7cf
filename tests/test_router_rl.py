"""``RouterRL`` (``llm_lb_gym/envs/wrappers.py``): the framework wrapper's reward scale, its
survival form of the semi-MDP discount, and int8 masks."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

import llm_lb_gym  # noqa: F401
from llm_lb_gym._validate import ConfigError
from llm_lb_gym.envs.wrappers import RouterRL, reward_scale_of, round_robin_returns

KW = {"num_requests": 80, "arrival_rate_rps": 52.0}


def _drive(env, seed, steps=None):
    """Masked-random actions from a seeded stream; every step's tuple, through virtual ends."""
    rng = np.random.default_rng(7)
    obs, info = env.reset(seed=seed)
    out = []
    while steps is None or len(out) < steps:
        a = int(rng.choice(np.flatnonzero(info["action_mask"])))
        obs, r, term, trunc, info = env.step(a)
        out.append((obs.copy(), r, term, trunc, info))
        if term or trunc:
            if "metrics" in info:   # the real end
                return out
            obs, info = env.reset()
    return out


def test_auto_scale_is_round_robins_return_spread_and_leaves_the_env_alone():
    plain = gym.make("LLMCluster-v0", **KW)
    wrapped = RouterRL(gym.make("LLMCluster-v0", **KW), discount="none")
    stats = round_robin_returns(gym.make("LLMCluster-v0", **KW).unwrapped, 0)
    assert wrapped.reward_scale == reward_scale_of(stats) == 1.0 / stats["return_std"]
    assert wrapped.value_offset == pytest.approx(stats["return_mean"] / stats["return_std"])
    a, b = _drive(plain, 3), _drive(wrapped, 3)
    assert len(a) == len(b)
    for (oa, ra, *_), (ob, rb, *_) in zip(a, b):
        assert np.array_equal(oa, ob) and rb == ra * wrapped.reward_scale


def test_survival_ends_are_virtual_and_continue_the_same_episode():
    short = {**KW, "reward": {"horizon_s": 0.5}}   # ends often enough to see several
    plain = _drive(gym.make("LLMCluster-v0", **short), 3)
    env = RouterRL(gym.make("LLMCluster-v0", **short), reward_scale=1.0, discount="survival")
    wrapped = _drive(env, 3)
    assert len(wrapped) == len(plain)   # the same simulated episode, cut into pieces
    ends = [step for step in wrapped if step[4].get("survival_end")]
    assert ends and all(step[2] for step in ends)
    assert all(step[4]["discount"] < 1.0 for step in ends)   # a routing step takes no time: never cut
    for (oa, ra, ta, *_), (ob, rb, tb, *_) in zip(plain, wrapped):
        assert np.array_equal(oa, ob) and ra == rb
    again = _drive(RouterRL(gym.make("LLMCluster-v0", **short), reward_scale=1.0), 3)
    assert [s[2] for s in again] == [s[2] for s in wrapped]   # the ends follow the seed


def test_survival_end_rate_matches_the_discount():
    """Over many defers each ends the virtual episode with probability 1 - discount."""
    env = RouterRL(gym.make("LLMCluster-v0", num_requests=400, arrival_rate_rps=2.0,
                            reward={"horizon_s": 0.5}), reward_scale=1.0)
    obs, info = env.reset(seed=1)
    ends, expected = 0, 0.0
    for _ in range(3000):
        a = env.unwrapped.defer_action if info["action_mask"][-1] else int(np.flatnonzero(info["action_mask"])[0])
        obs, r, term, trunc, info = env.step(a)
        expected += 1.0 - info["discount"]
        ends += bool(info.get("survival_end"))
        if term or trunc:
            obs, info = env.reset()
    assert expected > 50 and abs(ends - expected) < 4 * np.sqrt(expected)


def test_masks_are_int8_as_gymnasium_samples_them():
    env = RouterRL(gym.make("LLMCluster-v0", **KW), reward_scale=1.0)
    obs, info = env.reset(seed=0)
    assert info["action_mask"].dtype == np.int8 and env.action_masks().dtype == np.int8
    env.action_space.sample(mask=info["action_mask"])   # no astype needed


def test_bad_options_are_named():
    env = gym.make("LLMCluster-v0", **KW)
    with pytest.raises(ConfigError, match="RouterRL discount='gamma' is not valid; allowed: survival, none"):
        RouterRL(env, discount="gamma")
    with pytest.raises(ConfigError, match="RouterRL reward_scale=-1.0; allowed: 'auto' or a number > 0"):
        RouterRL(env, reward_scale=-1.0)


def test_wrapped_env_pickles_mid_episode_and_continues_the_same():
    """SubprocVecEnv and friends pickle envs: the wrapper's scale and its ends' stream travel."""
    import pickle

    env = RouterRL(gym.make("LLMCluster-v0", **KW, reward={"horizon_s": 0.5}))
    obs, info = env.reset(seed=5)
    for _ in range(20):
        obs, r, term, trunc, info = env.step(int(np.flatnonzero(info["action_mask"])[-1]))
    twin = pickle.loads(pickle.dumps(env))
    for _ in range(30):
        a = env.unwrapped.defer_action
        one, two = env.step(a), twin.step(a)
        assert np.array_equal(one[0], two[0]) and one[1:4] == two[1:4]
        if one[2] or one[3]:
            break
