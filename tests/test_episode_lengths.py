"""The observation space does not depend on the episode length (issue 22, class 3): a model
trained on 500-request episodes loads and acts on 2,000-request ones, and vector envs may mix
episode lengths. Only the bounds are episode-free; the values are what they were."""

from __future__ import annotations

import os

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import llm_lb_gym  # noqa: F401
from llm_lb_gym.envs.observation import FEATURES

EXAMPLES = int(os.environ.get("LLM_LB_GYM_HYPOTHESIS_EXAMPLES", "60"))
SMALL = dict(arrival_rate_rps=40.0)


@settings(max_examples=min(EXAMPLES, 30), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lengths=st.lists(st.integers(1, 100_000), min_size=2, max_size=3),
       normalize=st.booleans(), as_dict=st.booleans(),
       features=st.lists(st.sampled_from(FEATURES), unique=True, max_size=4),
       instances=st.integers(1, 5))
def test_space_is_the_same_for_every_episode_length(lengths, normalize, as_dict, features,
                                                    instances):
    spaces = [gym.make("LLMCluster-v0", num_requests=n, num_instances=instances,
                       obs={"normalize": normalize, "as_dict": as_dict,
                            "features": list(features)}).observation_space
              for n in lengths]
    assert all(s == spaces[0] for s in spaces[1:])


def test_observations_stay_inside_the_space_on_a_long_episode():
    """Every bucket count below its bound even when one instance holds the whole episode."""
    env = gym.make("LLMCluster-v0", num_requests=300, arrival_rate_rps=200.0, num_instances=2,
                   obs={"normalize": False, "features": ["arrivals_left"]})
    obs, _ = env.reset(seed=0)
    space = env.observation_space
    for _ in range(400):
        obs, _, term, trunc, _ = env.step(0)   # everything to instance 0
        assert space.contains(obs)
        if term or trunc:
            break


def test_vector_env_over_different_episode_lengths():
    lengths = (30, 120, 75)
    vec = gym.vector.SyncVectorEnv([lambda n=n: gym.make("LLMCluster-v0", num_requests=n, **SMALL)
                                    for n in lengths])
    obs, _ = vec.reset(seed=0)
    ends = 0
    for _ in range(600):
        obs, _, term, trunc, _ = vec.step(np.zeros(len(lengths), np.int64))
        assert vec.single_observation_space.contains(obs[0])
        ends += int(np.sum(term | trunc))
    assert ends >= 2   # the short episodes ended and restarted beside the long one
    vec.close()


def test_model_saved_on_500_requests_runs_on_2000(tmp_path):
    """SB3 refuses to load a model on an env whose observation space differs; a DQN trained a
    few hundred steps on 500-request episodes must load and act on 2,000-request episodes,
    in a single env and in a vector env mixing both lengths."""
    import torch
    from stable_baselines3 import DQN
    from stable_baselines3.common.vec_env import DummyVecEnv

    torch.set_num_threads(1)
    train_env = gym.make("LLMCluster-v0", num_requests=500, **SMALL)
    model = DQN("MlpPolicy", train_env, learning_starts=50, buffer_size=1000, batch_size=32,
                train_freq=4, seed=0, device="cpu", policy_kwargs={"net_arch": [32]})
    model.learn(300)
    model.save(tmp_path / "dqn500")

    long_env = gym.make("LLMCluster-v0", num_requests=2000, **SMALL)
    loaded = DQN.load(tmp_path / "dqn500", env=long_env, device="cpu")
    obs, _ = long_env.reset(seed=1)
    for _ in range(300):
        action, _ = loaded.predict(obs, deterministic=True)
        obs, _, term, trunc, _ = long_env.step(int(action))
        if term or trunc:
            obs, _ = long_env.reset()
    vec = DummyVecEnv([lambda n=n: gym.make("LLMCluster-v0", num_requests=n, **SMALL)
                       for n in (500, 2000)])
    mixed = DQN.load(tmp_path / "dqn500", env=vec, device="cpu")
    mixed.learn(100, reset_num_timesteps=False)   # keeps training on the mixed lengths
    assert mixed.num_timesteps >= 400


@pytest.mark.parametrize("normalize", [True, False])
def test_values_unchanged_arrivals_left_is_the_share_of_the_episode(normalize):
    env = gym.make("LLMCluster-v0", num_requests=40, obs={"normalize": normalize,
                                                            "features": ["arrivals_left"]})
    obs, _ = env.reset(seed=3)
    left = 40 - env.unwrapped.cluster.n_arrived
    assert obs[1] == np.float32(left / 40 if normalize else left)
    assert env.observation_space.high[1] == (1.0 if normalize else 10_000_000)


def test_model_saved_with_the_old_episode_bounds_still_loads(tmp_path):
    """Models saved before these bounds (bucket counts bounded by num_requests) load on the new
    space: only those bounds differ. A model whose other bounds differ is still refused."""
    import torch
    from gymnasium import spaces
    from stable_baselines3 import DQN

    from llm_lb_gym.agents.factory import load_agent

    torch.set_num_threads(1)
    env = gym.make("LLMCluster-v0", num_requests=500, obs={"features": ["arrivals_left"]})
    free = env.unwrapped.obs_builder.episode_free_bounds
    assert free.sum() == 1 + env.unwrapped.m * (env.unwrapped.obs_builder.n_p
                                                + env.unwrapped.obs_builder.n_d)
    space = env.observation_space
    old_high = space.high.copy()
    old_high[free] = 500 / 128   # what num_requests / max_num_seqs gave
    model = DQN("MlpPolicy", env, learning_starts=10, buffer_size=100, device="cpu")
    model.observation_space = spaces.Box(space.low, old_high, dtype=np.float32)
    model.save(tmp_path / "old")
    loaded = load_agent("dqn", tmp_path / "old.zip", env=gym.make(
        "LLMCluster-v0", num_requests=2000, obs={"features": ["arrivals_left"]}))
    assert loaded.observation_space == space
    other = old_high.copy()
    other[0] = 7.0   # the queue bound: a different observation, not an old episode bound
    model.observation_space = spaces.Box(space.low, other, dtype=np.float32)
    model.save(tmp_path / "other")
    with pytest.raises(ValueError, match="Observation spaces do not match"):
        load_agent("dqn", tmp_path / "other.zip", env=env)
