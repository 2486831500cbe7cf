"""Tianshou 2.x on LLMCluster-v0: DQN with the action mask in the observation, as Tianshou reads it.

    pip install -e ".[rl]" "tianshou>=2,<3"      # tested with tianshou 2.0.1
    python docs/recipes/tianshou_dqn.py

Tianshou's discrete Q-learning policy masks actions through ``batch.obs.mask`` (a dict
observation ``{"obs": ..., "mask": ...}``), so a small observation wrapper moves
``info["action_mask"]`` there; the network reads ``obs.obs`` (Tianshou unpacks it) and the
epsilon-greedy exploration and the greedy argmax stay within the mask. Vector envs, the
collector, the replay buffer and the trainer are Tianshou's own.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch
from tianshou.algorithm import DQN
from tianshou.algorithm.modelfree.dqn import DiscreteQLearningPolicy
from tianshou.algorithm.optim import AdamOptimizerFactory
from tianshou.data import Batch, Collector, VectorReplayBuffer
from tianshou.env import DummyVectorEnv
from tianshou.trainer import OffPolicyTrainerParams
from tianshou.utils.net.common import Net

from _common import make_env, parse, report


class MaskInObs(gym.Wrapper):
    """``{"obs": observation, "mask": info["action_mask"]}``: Tianshou's masked observation."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        n = int(env.action_space.n)
        self.observation_space = gym.spaces.Dict(
            {"obs": env.observation_space, "mask": gym.spaces.MultiBinary(n)})

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        return {"obs": obs, "mask": info["action_mask"].astype(np.int8)}, info

    def step(self, action):
        obs, r, term, trunc, info = self.env.step(action)
        return {"obs": obs, "mask": info["action_mask"].astype(np.int8)}, r, term, trunc, info


def main() -> None:
    args = parse(__doc__.splitlines()[0], steps=5_000)
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    train_envs = DummyVectorEnv([lambda: MaskInObs(make_env()) for _ in range(2)])
    test_envs = DummyVectorEnv([lambda: MaskInObs(make_env())])
    train_envs.seed(args.seed)
    test_envs.seed(args.seed + 100)
    env = make_env()
    net = Net(state_shape=env.observation_space.shape, action_shape=int(env.action_space.n),
              hidden_sizes=[128, 128])
    policy = DiscreteQLearningPolicy(model=net, action_space=env.action_space,
                                     eps_training=0.1, eps_inference=0.0)
    algorithm = DQN(policy=policy, optim=AdamOptimizerFactory(lr=1e-3), gamma=0.99,
                    target_update_freq=200)
    buffer = VectorReplayBuffer(20_000, len(train_envs))
    train_collector = Collector(algorithm, train_envs, buffer, exploration_noise=True)
    test_collector = Collector(algorithm, test_envs)
    train_collector.reset()
    train_collector.collect(n_step=256, random=True)
    epoch_steps = max(args.steps // 2, 200)
    result = algorithm.run_training(OffPolicyTrainerParams(
        training_collector=train_collector, test_collector=test_collector, max_epochs=2,
        epoch_num_steps=epoch_steps, collection_step_num_env_steps=16,
        test_step_num_episodes=1, batch_size=64, update_step_num_gradient_steps_per_sample=0.25,
        verbose=False, show_progress=False))
    print(f"Tianshou DQN: {result.timing.total_time:.1f} s of training")
    eval_env = MaskInObs(make_env())
    obs, info = eval_env.reset(seed=100)
    while True:
        b = Batch(obs=Batch(obs=obs["obs"][None], mask=obs["mask"][None].astype(bool)), info={})
        with torch.no_grad():
            act = int(policy(b).act[0])
        obs, _, terminated, truncated, info = eval_env.step(act)
        if terminated or truncated:
            break
    report("Tianshou DQN", info["metrics"], 100)


if __name__ == "__main__":
    main()
