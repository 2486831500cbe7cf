"""Tianshou 2.x near capacity: DQN with the action mask in the observation, as Tianshou reads it.

    pip install -e ".[rl,recipes]"               # torch, tianshou 2.x (tested with 2.0.1)
    python docs/recipes/tianshou_dqn.py          # 50k steps, a few minutes on 2 cores
    python docs/recipes/tianshou_dqn.py --quick  # a few hundred steps on 200-request episodes

One file you can copy. Tianshou's discrete Q-learning policy masks actions through
``batch.obs.mask`` (a dict observation ``{"obs": ..., "mask": ...}``), so a small wrapper moves
``info["action_mask"]`` (int8, as Tianshou wants it) there; the network reads ``obs.obs`` and the
epsilon-greedy exploration and the greedy argmax stay within the mask. ``RouterRL``
(``llm_lb_gym.envs.wrappers``) scales the reward to O(1) and folds the env's per-transition
discount into episode ends, hence ``gamma=1.0``. Vector envs, the collector, the replay buffer and
the trainer are Tianshou's own.
"""

from __future__ import annotations

import argparse

import gymnasium as gym
import torch
from tianshou.algorithm import DQN
from tianshou.algorithm.modelfree.dqn import DiscreteQLearningPolicy
from tianshou.algorithm.optim import AdamOptimizerFactory
from tianshou.data import Batch, Collector, VectorReplayBuffer
from tianshou.env import DummyVectorEnv
from tianshou.trainer import OffPolicyTrainerParams
from tianshou.utils.net.common import Net

import llm_lb_gym  # noqa: F401  (registers the ids)
from llm_lb_gym.envs.router_factory import make_env_router
from llm_lb_gym.envs.wrappers import RouterRL
from llm_lb_gym.rollout import rollout_router

ENV_ID = "LLMCluster-NearCapacity-v0"   # 4 x V100 at 52 req/s: the regime where routing matters
QUICK = {"num_requests": 200}           # --quick: short episodes


class MaskInObs(gym.Wrapper):
    """``{"obs": observation, "mask": info["action_mask"]}``: Tianshou's masked observation."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        n = int(env.action_space.n)
        self.observation_space = gym.spaces.Dict(
            {"obs": env.observation_space, "mask": gym.spaces.MultiBinary(n)})

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        return {"obs": obs, "mask": info["action_mask"]}, info

    def step(self, action):
        obs, r, term, trunc, info = self.env.step(action)
        return {"obs": obs, "mask": info["action_mask"]}, r, term, trunc, info


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=50_000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="a few hundred steps on 200-request episodes (the tests)")
    args = p.parse_args()
    kw = QUICK if args.quick else {}
    steps = min(args.steps, 400) if args.quick else args.steps
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    train_envs = DummyVectorEnv([lambda: MaskInObs(RouterRL(gym.make(ENV_ID, **kw))) for _ in range(2)])
    test_envs = DummyVectorEnv([lambda: MaskInObs(gym.make(ENV_ID, **kw))])
    train_envs.seed(args.seed)
    test_envs.seed(args.seed + 100)
    env = gym.make(ENV_ID, **kw)
    net = Net(state_shape=env.observation_space.shape, action_shape=int(env.action_space.n),
              hidden_sizes=[128, 128])
    policy = DiscreteQLearningPolicy(model=net, action_space=env.action_space,
                                     eps_training=0.05, eps_inference=0.0)
    algorithm = DQN(policy=policy, optim=AdamOptimizerFactory(lr=1e-4), gamma=1.0,
                    target_update_freq=2_000)
    buffer = VectorReplayBuffer(100_000, len(train_envs))
    train_collector = Collector(algorithm, train_envs, buffer, exploration_noise=True)
    test_collector = Collector(algorithm, test_envs)
    train_collector.reset()
    train_collector.collect(n_step=256, random=True)
    result = algorithm.run_training(OffPolicyTrainerParams(
        training_collector=train_collector, test_collector=test_collector, max_epochs=2,
        epoch_num_steps=max(steps // 2, 200), collection_step_num_env_steps=16,
        test_step_num_episodes=1, batch_size=128, update_step_num_gradient_steps_per_sample=0.25,
        verbose=False, show_progress=False))
    print(f"Tianshou DQN: {result.timing.total_time:.1f} s of training")
    seed = 1000
    eval_env = MaskInObs(gym.make(ENV_ID, **kw))
    obs, info = eval_env.reset(seed=seed)
    while True:
        b = Batch(obs=Batch(obs=obs["obs"][None], mask=obs["mask"][None].astype(bool)), info={})
        with torch.no_grad():
            act = int(policy(b).act[0])
        obs, _, terminated, truncated, info = eval_env.step(act)
        if terminated or truncated:
            break
    m = info["metrics"]
    rr_env = gym.make(ENV_ID, **kw).unwrapped
    rr = rollout_router(rr_env, make_env_router("round_robin", rr_env), seed).metrics
    print(f"Tianshou DQN: {m['completed'] + m['rejected']}/{m['num_requests']} requests accounted for, "
          f"mean E2E {m['mean_e2e_s']:.3f} s (round robin {rr['mean_e2e_s']:.3f} s, seed {seed})")


if __name__ == "__main__":
    main()
