"""Final metrics on every episode end, truncations included (issue 10, item 3)."""

from __future__ import annotations

import pickle
import warnings

import gymnasium as gym
import pytest
from gymnasium.wrappers import TimeLimit

import llm_lb_gym
from llm_lb_gym.envs import LLMClusterEnv
from llm_lb_gym.envs.wrappers import FinalMetrics


def _readme_loop(env):
    """The README's quick-start loop, verbatim but for the env."""
    obs, info = env.reset(seed=0)
    done = False
    steps = 0
    while not done:
        action = env.action_space.sample(mask=info["action_mask"])
        obs, reward, terminated, truncated, info = env.step(action)
        done = terminated or truncated
        steps += 1
    print(info["metrics"]["mean_e2e_s"], info["metrics"]["p99_ttft_s"])
    return steps, terminated, truncated, info


def _accounted(m: dict, n: int) -> bool:
    return m["completed"] + m["rejected"] + m["unfinished"] == m["num_requests"] == n


@pytest.mark.parametrize("limit", [1, 7, 20])
def test_readme_quick_start_with_a_step_limit(limit):
    env = gym.make("LLMCluster-v0", num_instances=4, arrival_rate_rps=20.0, num_requests=40,
                   engine={"preset": "llama2-7b-v100", "scheduler": "fcfs"},
                   predictor={"name": "noisy", "accuracy": 0.8},
                   reward={"mode": "workload_guided"}, max_episode_steps=limit)
    env.action_space.seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # no "mean of empty slice" with nothing completed
        # ... but the one warning that says why: 40 requests cannot end within `limit` steps
        warnings.filterwarnings("ignore", message=".*num_requests=40 exceeds max_episode_steps")
        steps, terminated, truncated, info = _readme_loop(env)
    assert steps == limit and truncated and not terminated
    assert _accounted(info["metrics"], 40) and info["metrics"]["unfinished"] > 0


def test_more_requests_than_the_step_limit_warns_once():
    env = gym.make("LLMCluster-v0", num_requests=40, max_episode_steps=39)
    with pytest.warns(UserWarning, match="num_requests=40 exceeds max_episode_steps=39: an episode needs "
                                         "at least one step per request"):
        env.reset(seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        env.reset(seed=1)                                            # once per env
        gym.make("LLMCluster-v0", num_requests=40, max_episode_steps=40).reset(seed=0)
        gym.make("LLMCluster-v0", num_requests=40, max_episode_steps=None).reset(seed=0)


def test_registered_limit_truncates_with_metrics(monkeypatch):
    """The registration's own max_episode_steps (here lowered) goes through the same wrapper."""
    spec = gym.spec(llm_lb_gym.ENV_ID)
    monkeypatch.setattr(spec, "max_episode_steps", 3)
    env = gym.make(llm_lb_gym.ENV_ID, num_requests=30)
    assert isinstance(env, FinalMetrics) and isinstance(env.env, TimeLimit)
    env.reset(seed=1)
    for _ in range(3):
        _, _, terminated, truncated, info = env.step(env.unwrapped.m)   # defer
    assert truncated and not terminated and _accounted(info["metrics"], 30)


def test_terminated_episode_keeps_the_env_metrics():
    env = gym.make("LLMCluster-v0", num_requests=20)
    env.action_space.seed(3)
    steps, terminated, truncated, info = _readme_loop(env)
    assert terminated and info["metrics"]["completed"] + info["metrics"]["rejected"] == 20
    assert info["metrics"]["unfinished"] == 0


def test_steps_before_the_limit_carry_no_metrics():
    env = gym.make("LLMCluster-v0", num_requests=30, max_episode_steps=4)
    env.reset(seed=0)
    for _ in range(3):
        *_, truncated, info = env.step(0)
        assert not truncated and "metrics" not in info


def test_hand_built_stack_and_unwrapped_env():
    env = FinalMetrics(TimeLimit(LLMClusterEnv(num_requests=25), 2))
    env.reset(seed=0)
    env.step(0)
    *_, truncated, info = env.step(0)
    assert truncated and _accounted(info["metrics"], 25)
    raw = LLMClusterEnv(num_requests=10)    # no limit: runs to termination, metrics there
    _, info = raw.reset(seed=0)
    terminated = False
    while not terminated:
        _, _, terminated, truncated, info = raw.step(0 if info["action_mask"][0] else raw.m)
        assert not truncated
    assert _accounted(info["metrics"], 10)


def test_spec_round_trip_and_pickling_keep_one_wrapper():
    env = gym.make("LLMCluster-v0", num_requests=20, max_episode_steps=5)
    again = gym.make(env.spec)
    assert repr(again).count("FinalMetrics") == 1 and again.spec.max_episode_steps == 5
    clone = pickle.loads(pickle.dumps(env))
    clone.reset(seed=0)
    for _ in range(5):
        *_, truncated, info = clone.step(4)
    assert truncated and _accounted(info["metrics"], 20)
