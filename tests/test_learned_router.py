"""The pieces of the learned router: the equivariant network, semi-MDP replay, masked targets,
demonstrations (imitation, DQfD losses) and an instance-count transfer."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch as th
from stable_baselines3.common.env_util import make_vec_env

import llm_lb_gym  # noqa: F401
from llm_lb_gym.agents import make_agent
from llm_lb_gym.agents.equivariant import InstanceSetQ, SetPolicyActor, equivariant_actor_critic_policy
from llm_lb_gym.agents.imitation import collect_demonstrations
from llm_lb_gym.agents.replay import SemiMDPReplayBuffer
from llm_lb_gym._validate import ConfigError
from llm_lb_gym.rollout import rollout_agent

th.set_num_threads(1)
FEATS = ["arrivals_left", "age", "block_need", "free_kv_blocks", "waiting_blocks", "time_since_route"]
KW = dict(num_requests=80, arrival_rate_rps=60.0, reward={"mode": "baseline", "penalty": "latency",
                                                          "completion_reward": 0.0},
          action={"candidates": 3, "order": "shortest"}, obs={"features": FEATS})
LAYOUT = dict(global_dim=2, num_candidates=3, candidate_dim=5, instance_dim=11)


def _obs(m: int, batch: int = 5, seed: int = 0) -> th.Tensor:
    g = th.Generator().manual_seed(seed)
    return th.rand(batch, 2 + 3 * 5 + m * 11, generator=g)


def test_network_is_equivariant_in_instances_and_runs_on_any_count():
    net = InstanceSetQ(LAYOUT, embed_dim=16, hidden=(32,))
    x = _obs(4)
    q = net(x)
    assert q.shape == (5, 3 * 4 + 1)
    perm = [2, 0, 3, 1]
    inst = x[:, 17:].reshape(5, 4, 11)[:, perm].reshape(5, 44)
    qp = net(th.cat([x[:, :17], inst], dim=1))
    # route candidate j to instance perm[i] in the permuted obs == to instance i... permuted back
    route, routep = q[:, :12].reshape(5, 3, 4), qp[:, :12].reshape(5, 3, 4)
    assert th.allclose(routep, route[:, :, perm], atol=1e-5)
    assert th.allclose(qp[:, 12], q[:, 12], atol=1e-5)              # defer does not move
    assert net(_obs(8)).shape == (5, 3 * 8 + 1)                        # the same weights on 8
    with pytest.raises(ValueError, match="does not fit the layout"):
        net(th.rand(2, 17 + 15))
    with pytest.raises(ConfigError, match="layout"):
        InstanceSetQ({"global_dim": 1}, 8)


def test_double_dqn_with_the_equivariant_policy_saves_loads_and_acts_on_eight_instances(tmp_path):
    venv = make_vec_env(lambda: gym.make("LLMCluster-v0", **KW), n_envs=1, seed=0)
    model = make_agent("double_dqn", venv, total_timesteps=300, episode_steps=100, policy="equivariant",
                       embed_dim=16, net_arch=[32], learning_starts=50, batch_size=32, seed=0)
    assert isinstance(model.replay_buffer, SemiMDPReplayBuffer)
    model.learn(300)
    assert np.all(model.replay_buffer.discounts[:model.replay_buffer.size()] <= 1.0)
    model.save(tmp_path / "m.zip")
    from llm_lb_gym.agents.double_dqn import DoubleDQN

    loaded = DoubleDQN.load(tmp_path / "m.zip", device="cpu")
    obs = venv.reset()
    assert np.array_equal(loaded.predict(obs, deterministic=True)[0], model.predict(obs, deterministic=True)[0])
    env8 = gym.make("LLMCluster-v0", num_instances=8, **KW)
    res = rollout_agent(env8, SetPolicyActor(loaded), seed=3)
    assert res.metrics["unfinished"] == 0 and res.metrics["completed"] == 80
    with pytest.raises(ConfigError, match="gamma is set by the env"):
        make_agent("double_dqn", venv, gamma=0.9)


def test_maskable_ppo_trains_with_the_equivariant_policy():
    pytest.importorskip("sb3_contrib")
    env = gym.make("LLMCluster-v0", **KW)
    model = make_agent("maskable_ppo", env, policy="equivariant", embed_dim=16, net_arch=[32], n_steps=64,
                       batch_size=32, n_epochs=1, seed=0)
    assert type(model.policy).__name__ == equivariant_actor_critic_policy().__name__
    model.learn(128)
    obs, info = env.reset(seed=0)
    a, _ = model.predict(obs, action_masks=info["action_mask"], deterministic=True)
    assert info["action_mask"][int(a)]


def test_masked_double_target_ignores_invalid_next_actions():
    venv = make_vec_env(lambda: gym.make("LLMCluster-v0", **KW), n_envs=1, seed=0)
    model = make_agent("double_dqn", venv, policy="equivariant", embed_dim=8, net_arch=[8], seed=0)
    x = _obs(4, batch=1)
    x = x[:, :2 + 15 + 44]
    online = model.q_net(x)
    mask = th.zeros_like(online, dtype=th.bool)
    mask[0, 5] = True
    y = model._target_q(x, th.zeros(1, 1), th.zeros(1, 1), th.full((1, 1), 0.5), mask)
    assert y.item() == pytest.approx(0.5 * model.q_net_target(x)[0, 5].item(), rel=1e-6)


def test_imitation_collects_the_teachers_transitions_and_pretraining_learns_them():
    env = gym.make("LLMCluster-v0", **KW)
    demos = collect_demonstrations(env, "late_binding", 2, seed=10, reward_scale=0.01,
                                   teacher_options={"period_s": 0.5, "rounds": "since_release", "reserve": "full"})
    assert demos.skipped == 0 and demos.steps == demos.buffer.size() > 100
    assert len(demos.metrics) == 2 and all(m["unfinished"] == 0 for m in demos.metrics)
    venv = make_vec_env(lambda: gym.make("LLMCluster-v0", **KW), n_envs=1, seed=0)
    model = make_agent("double_dqn", venv, policy="equivariant", embed_dim=16, net_arch=[32], seed=0,
                       batch_size=64, learning_rate=1e-3)
    model.set_demonstrations(demos.buffer, fraction=0.25, margin=0.01, weight=1.0, decay_updates=10)
    before = model.pretrain(1, batch_size=64)["teacher_agreement"]
    after = model.pretrain(600, batch_size=64)["teacher_agreement"]
    assert after > max(before + 0.2, 0.7)
    # a teacher the action space cannot express (Min-Min picks any queued request; the env
    # offers only the head) is followed but not recorded
    head = gym.make("LLMCluster-v0", num_requests=60, arrival_rate_rps=200.0)
    d2 = collect_demonstrations(head, "min_min", 1, seed=0)
    assert d2.skipped > 0 and d2.steps + d2.skipped >= 60
    with pytest.raises(ConfigError, match="imitation.loss"):
        model.set_demonstrations(demos.buffer, loss="hinge")
