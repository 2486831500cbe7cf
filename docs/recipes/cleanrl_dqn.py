"""A CleanRL-style single-file DQN near capacity: the loop written out, masks used in the argmax.

    pip install -e ".[rl]"                   # torch (nothing of SB3 is used here)
    python docs/recipes/cleanrl_dqn.py       # 50k steps, a few minutes on 2 cores
    python docs/recipes/cleanrl_dqn.py --quick   # a few hundred steps on 200-request episodes

One file you can copy: it needs only torch and this package. It follows CleanRL's dqn.py (every
RNG seeded, a Q-network, a replay buffer, a target network, epsilon-greedy) with what this env
needs: ``RouterRL`` (``llm_lb_gym.envs.wrappers``) scales the reward to O(1) and folds the
env's per-transition discount into episode ends, so gamma is 1.0 and the agent optimises the
env's documented discounted return (minus the requests' E2E latency over a 30 s horizon); the
greedy action and the bootstrap max are taken over ``info["action_mask"]`` (int8: ``.bool()``
before ``~``). Prints the greedy policy's mean E2E against round robin's on the same seed.
"""

from __future__ import annotations

import argparse
import random

import gymnasium as gym
import numpy as np
import torch
from torch import nn

import llm_lb_gym  # noqa: F401  (registers the ids)
from llm_lb_gym.envs.router_factory import make_env_router
from llm_lb_gym.envs.wrappers import RouterRL
from llm_lb_gym.rollout import rollout_router

ENV_ID = "LLMCluster-NearCapacity-v0"   # 4 x V100 at 52 req/s: the regime where routing matters
QUICK = {"num_requests": 200}           # --quick: short episodes


class QNetwork(nn.Module):
    def __init__(self, obs_dim: int, n_actions: int):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(obs_dim, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(),
                                 nn.Linear(128, n_actions))

    def forward(self, x):
        return self.net(x)


def masked_argmax(q: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return q.masked_fill(~mask.bool(), -torch.inf).argmax(dim=-1)


def greedy_episode(q: QNetwork, env: gym.Env, seed: int) -> dict:
    obs, info = env.reset(seed=seed)
    while True:
        with torch.no_grad():
            a = int(masked_argmax(q(torch.as_tensor(obs)[None]), torch.as_tensor(info["action_mask"])[None]))
        obs, _, terminated, truncated, info = env.step(a)
        if terminated or truncated:
            return info["metrics"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=50_000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="400 steps on 200-request episodes (the tests)")
    args = p.parse_args()
    kw = QUICK if args.quick else {}
    steps = min(args.steps, 400) if args.quick else args.steps
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    env = RouterRL(gym.make(ENV_ID, **kw))   # reward x 1/round robin's return spread; survival discount
    obs_dim, n = env.observation_space.shape[0], int(env.action_space.n)
    q, target = QNetwork(obs_dim, n), QNetwork(obs_dim, n)
    target.load_state_dict(q.state_dict())
    opt = torch.optim.Adam(q.parameters(), lr=1e-4)
    size = min(steps, 100_000)
    buf_obs = np.zeros((size, obs_dim), np.float32)
    buf_next = np.zeros((size, obs_dim), np.float32)
    buf_next_mask = np.zeros((size, n), bool)
    buf_act = np.zeros(size, np.int64)
    buf_rew = np.zeros(size, np.float32)
    buf_done = np.zeros(size, np.float32)
    gamma, batch, learning_starts = 1.0, 128, min(5_000, steps // 4)   # gamma 1: RouterRL discounts
    rng = np.random.default_rng(args.seed)
    obs, info = env.reset(seed=args.seed)
    ends = 0
    for step in range(steps):
        eps = max(0.02, 1.0 - step / (0.1 * steps))
        mask = info["action_mask"]
        if rng.random() < eps:
            action = int(rng.choice(np.flatnonzero(mask)))
        else:
            with torch.no_grad():
                action = int(masked_argmax(q(torch.as_tensor(obs)[None]), torch.as_tensor(mask)[None]))
        nxt, reward, terminated, truncated, info = env.step(action)
        i = step % size
        buf_obs[i], buf_next[i], buf_act[i] = obs, nxt, action
        buf_rew[i], buf_done[i], buf_next_mask[i] = reward, terminated, info["action_mask"]
        obs = nxt
        if terminated or truncated:   # a real end or RouterRL's survival end: reset continues it
            ends += 1
            obs, info = env.reset()
        if step >= learning_starts and step % 4 == 0:
            idx = rng.integers(min(step + 1, size), size=batch)
            with torch.no_grad():
                nq = target(torch.as_tensor(buf_next[idx]))
                nq = nq.masked_fill(~torch.as_tensor(buf_next_mask[idx]), -torch.inf).max(dim=1).values
                y = torch.as_tensor(buf_rew[idx]) + gamma * nq * (1 - torch.as_tensor(buf_done[idx]))
            pred = q(torch.as_tensor(buf_obs[idx])).gather(1, torch.as_tensor(buf_act[idx])[:, None])
            loss = nn.functional.smooth_l1_loss(pred.squeeze(1), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        if step % 2_000 == 0:
            target.load_state_dict(q.state_dict())
    print(f"trained {steps} steps, {ends} episode ends (real or survival)")
    seed = 1000
    m = greedy_episode(q, gym.make(ENV_ID, **kw), seed)
    rr_env = gym.make(ENV_ID, **kw).unwrapped
    rr = rollout_router(rr_env, make_env_router("round_robin", rr_env), seed).metrics
    print(f"CleanRL-style DQN: {m['completed'] + m['rejected']}/{m['num_requests']} requests accounted "
          f"for, mean E2E {m['mean_e2e_s']:.3f} s (round robin {rr['mean_e2e_s']:.3f} s, seed {seed})")


if __name__ == "__main__":
    main()
