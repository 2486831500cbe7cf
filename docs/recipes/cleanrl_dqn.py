"""A CleanRL-style single-file DQN on LLMCluster-v0: the loop written out, masks used in argmax.

    pip install -e ".[rl]"                   # torch (nothing of SB3 is used here)
    python docs/recipes/cleanrl_dqn.py       # about 1 minute on 2 cores

Follows CleanRL's dqn.py (one file, every RNG seeded, a Q-network, a replay buffer, a target
network, epsilon-greedy) with two changes for this env: the greedy action and the bootstrap
max are taken over ``info["action_mask"]`` only, and episodes end by ``terminated`` (every
request finished or rejected). Exploration samples valid actions; dropping the mask would
still be safe (``action.masked=fallback``), only slower to learn.
"""

from __future__ import annotations

import random

import numpy as np
import torch
from torch import nn

from _common import make_env, parse, report


class QNetwork(nn.Module):
    def __init__(self, obs_dim: int, n_actions: int):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(obs_dim, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(),
                                 nn.Linear(128, n_actions))

    def forward(self, x):
        return self.net(x)


def masked_argmax(q: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return q.masked_fill(~mask, -torch.inf).argmax(dim=-1)


def main() -> None:
    args = parse(__doc__.splitlines()[0], steps=10_000)
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    env = make_env()
    obs_dim, n = env.observation_space.shape[0], int(env.action_space.n)
    q, target = QNetwork(obs_dim, n), QNetwork(obs_dim, n)
    target.load_state_dict(q.state_dict())
    opt = torch.optim.Adam(q.parameters(), lr=2.5e-4)
    size = min(args.steps, 50_000)
    buf_obs = np.zeros((size, obs_dim), np.float32)
    buf_next = np.zeros((size, obs_dim), np.float32)
    buf_next_mask = np.zeros((size, n), bool)
    buf_act = np.zeros(size, np.int64)
    buf_rew = np.zeros(size, np.float32)
    buf_done = np.zeros(size, np.float32)
    gamma, batch, learning_starts = 0.99, 64, min(1_000, args.steps // 4)
    rng = np.random.default_rng(args.seed)
    obs, info = env.reset(seed=args.seed)
    episodes = 0
    for step in range(args.steps):
        eps = max(0.05, 1.0 - step / (0.5 * args.steps))
        mask = info["action_mask"]
        if rng.random() < eps:
            action = int(rng.choice(np.flatnonzero(mask)))
        else:
            with torch.no_grad():
                action = int(masked_argmax(q(torch.as_tensor(obs)[None]),
                                           torch.as_tensor(mask)[None]))
        nxt, reward, terminated, truncated, info = env.step(action)
        i = step % size
        buf_obs[i], buf_next[i], buf_act[i] = obs, nxt, action
        buf_rew[i], buf_done[i], buf_next_mask[i] = reward / 100.0, terminated, info["action_mask"]
        obs = nxt
        if terminated or truncated:
            episodes += 1
            obs, info = env.reset()
        if step >= learning_starts:
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
            if step % 500 == 0:
                target.load_state_dict(q.state_dict())
    print(f"trained {args.steps} steps, {episodes} episodes")
    env = make_env()
    obs, info = env.reset(seed=100)
    while True:
        with torch.no_grad():
            a = int(masked_argmax(q(torch.as_tensor(obs)[None]), torch.as_tensor(info["action_mask"])[None]))
        obs, _, terminated, truncated, info = env.step(a)
        if terminated or truncated:
            break
    report("CleanRL-style DQN", info["metrics"], 100)


if __name__ == "__main__":
    main()
