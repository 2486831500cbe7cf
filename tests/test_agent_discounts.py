"""Every agent discounts a transition by the env's ``info["discount"]``, or refuses to train.

``LLMCluster-v0`` discounts in simulated time (gamma_s ** dt per step under
``reward.discount=semi_mdp``). REINFORCE's returns-to-go and MaskablePPO's GAE use each step's own
factor (worked by hand below; with every factor equal to gamma the GAE is SB3's, bit for bit);
a MaskablePPO given a rollout buffer that keeps one gamma refuses an env whose discount differs
from it, naming the setting that would make them agree; ``gamma`` is not an agent option there.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch as th
from gymnasium import spaces
from sb3_contrib.common.maskable.buffers import MaskableRolloutBuffer
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env

import llm_lb_gym  # noqa: F401
from llm_lb_gym.agents import REINFORCEAgent, make_agent
from llm_lb_gym.agents.maskable_ppo import SemiMDPMaskablePPO, SemiMDPRolloutBuffer
from llm_lb_gym.agents.reinforce import returns_to_go
from llm_lb_gym._validate import ConfigError

th.set_num_threads(1)
KW = dict(num_requests=40, arrival_rate_rps=30.0, reward={"mode": "baseline", "penalty": "latency",
                                                          "completion_reward": 0.0})


class _TwoSteps(gym.Env):
    """Two-step episodes whose steps report discounts 0.3 then 0.7 (or none)."""

    observation_space = spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32)
    action_space = spaces.Discrete(2)

    def __init__(self, discounts=(0.3, 0.7)):
        self.discounts = discounts
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(2, np.float32), {}

    def step(self, action):
        info = {} if self.discounts is None else {"discount": self.discounts[self.t]}
        self.t += 1
        return np.zeros(2, np.float32), 1.0, self.t == 2, False, info


def test_returns_to_go_by_hand():
    # G2 = 3; G1 = 2 + 0.25 * 3 = 2.75; G0 = 1 + 0.5 * 2.75 = 2.375
    assert returns_to_go([1.0, 2.0, 3.0], [0.5, 0.25, 0.9]) == [2.375, 2.75, 3.0]


@pytest.mark.parametrize("discounts, expected", [((0.3, 0.7), [0.3, 0.7]), (None, [0.9, 0.9])])
def test_reinforce_discounts_each_step_by_its_info(discounts, expected, monkeypatch):
    agent = REINFORCEAgent(_TwoSteps(discounts), gamma=0.9, episodes_per_update=1, seed=0)
    seen = []
    monkeypatch.setattr(agent, "_update", lambda episodes: seen.extend(episodes))
    agent.learn(2)
    assert [t[4] for t in seen[0]] == pytest.approx(expected)


def _buffers(discounts: np.ndarray, gamma: float = 0.9, lam: float = 0.8):
    """A plain and a per-step buffer filled with the same 4 steps (2 envs, an episode start)."""
    obs_space, act_space = spaces.Box(-1, 1, (2,), np.float32), spaces.Discrete(3)
    rng = np.random.default_rng(0)
    rewards, values = rng.normal(size=(4, 2)), rng.normal(size=(4, 2))
    starts = np.array([[1, 1], [0, 0], [0, 1], [0, 0]], dtype=np.float32)
    out = []
    for cls in (MaskableRolloutBuffer, SemiMDPRolloutBuffer):
        buf = cls(4, obs_space, act_space, "cpu", gamma=gamma, gae_lambda=lam, n_envs=2)
        buf.reset()
        for t in range(4):
            extra = {"discounts": discounts[t]} if cls is SemiMDPRolloutBuffer else {}
            buf.add(np.zeros((2, 2)), np.zeros((2, 1)), rewards[t], starts[t], th.as_tensor(values[t]),
                    th.zeros(2), action_masks=np.ones((2, 3), bool), **extra)
        buf.compute_returns_and_advantage(th.as_tensor([0.5, -0.5]), np.array([False, True]))
        out.append(buf)
    return out, rewards, values, starts


def test_gae_with_constant_discounts_is_sb3s_bit_for_bit():
    (plain, per_step), *_ = _buffers(np.full((4, 2), 0.9))
    assert np.array_equal(plain.advantages, per_step.advantages)
    assert np.array_equal(plain.returns, per_step.returns)


def test_gae_with_per_step_discounts_by_hand():
    d = np.array([[0.5, 1.0], [0.25, 0.9], [1.0, 0.1], [0.8, 0.6]])
    (_, buf), r, v, starts = _buffers(d)
    lam, last_v, last_done = 0.8, np.array([0.5, -0.5]), np.array([0.0, 1.0])
    for env in (0, 1):
        adv, expected = 0.0, np.zeros(4)
        for t in (3, 2, 1, 0):
            nonterm = 1.0 - (last_done[env] if t == 3 else starts[t + 1, env])
            nxt = last_v[env] if t == 3 else v[t + 1, env]
            delta = r[t, env] + d[t, env] * nxt * nonterm - v[t, env]
            adv = delta + d[t, env] * lam * nonterm * adv
            expected[t] = adv
        assert buf.advantages[:, env] == pytest.approx(expected, rel=1e-5)
        assert buf.returns[:, env] == pytest.approx(expected + v[:, env], rel=1e-5)


class _Infos(BaseCallback):
    def __init__(self):
        super().__init__()
        self.discounts = []

    def _on_step(self) -> bool:
        self.discounts.append(self.locals["infos"][0]["discount"])
        return True


def test_maskable_ppo_keeps_the_envs_discount_of_every_step():
    venv = make_vec_env(lambda: gym.make("LLMCluster-v0", **KW), n_envs=1, seed=0)
    model = make_agent("maskable_ppo", venv, n_steps=64, batch_size=32, n_epochs=1, seed=0)
    assert isinstance(model, SemiMDPMaskablePPO) and isinstance(model.rollout_buffer, SemiMDPRolloutBuffer)
    seen = _Infos()
    model.learn(64, callback=seen)
    kept = model.rollout_buffer.discounts[:, 0]
    assert kept.tolist() == pytest.approx(seen.discounts)
    assert len(set(np.round(kept, 6))) > 1   # semi-MDP: not one constant factor
    with pytest.raises(ConfigError, match="gamma is set by the env"):
        make_agent("maskable_ppo", venv, gamma=0.9)
    with pytest.raises(ConfigError, match="gamma is set by the env"):
        make_agent("reinforce", gym.make("LLMCluster-v0", **KW), gamma=0.9)


def test_a_one_gamma_buffer_refuses_a_varying_discount_and_names_the_setting():
    venv = make_vec_env(lambda: gym.make("LLMCluster-v0", **KW), n_envs=1, seed=0)
    model = make_agent("maskable_ppo", venv, n_steps=32, batch_size=16, n_epochs=1, seed=0,
                       rollout_buffer_class=MaskableRolloutBuffer)
    with pytest.raises(ConfigError, match=r"reward.discount=per_step with reward.gamma=0.99"):
        model.learn(32)
    # A constant discount equal to the agent's gamma is what that buffer computes: it trains.
    per_step = {**KW, "reward": {**KW["reward"], "discount": "per_step", "gamma": 0.99}}
    venv = make_vec_env(lambda: gym.make("LLMCluster-v0", **per_step), n_envs=1, seed=0)
    make_agent("maskable_ppo", venv, n_steps=32, batch_size=16, n_epochs=1, seed=0,
               rollout_buffer_class=MaskableRolloutBuffer).learn(32)
