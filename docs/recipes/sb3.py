"""Stable-Baselines3 near capacity: plain DQN (ignores the mask) and MaskablePPO (uses it).

    pip install -e ".[rl]"           # torch, stable-baselines3, sb3-contrib
    python docs/recipes/sb3.py       # 50k steps each, several minutes on 2 cores
    python docs/recipes/sb3.py --quick   # a few hundred steps on 200-request episodes

One file you can copy. ``RouterRL`` (``llm_lb_gym.envs.wrappers``) scales the reward to O(1)
and folds the env's per-transition (semi-MDP) discount into episode ends, so both agents use
``gamma=1.0`` and optimise the env's documented discounted return. SB3's DQN never reads
``info["action_mask"]``; the env's default ``action.masked=fallback`` makes that safe (a masked
action routes by JSQ, defers are budgeted: no stalled episodes). MaskablePPO reads the mask
through ``ActionMasker``. For this package's Double DQN with masks, warm starts and the
equivariant network use ``llm-lb-gym train`` or ``llm_lb_gym.agents.make_agent``.
"""

from __future__ import annotations

import argparse

import gymnasium as gym
import torch
from sb3_contrib import MaskablePPO
from sb3_contrib.common.wrappers import ActionMasker
from stable_baselines3 import DQN

import llm_lb_gym  # noqa: F401  (registers the ids)
from llm_lb_gym.envs.router_factory import make_env_router
from llm_lb_gym.envs.wrappers import RouterRL
from llm_lb_gym.rollout import rollout_router

ENV_ID = "LLMCluster-NearCapacity-v0"   # 4 x V100 at 52 req/s: the regime where routing matters
QUICK = {"num_requests": 200}           # --quick: short episodes


def greedy_episode(model, env: gym.Env, seed: int, masked: bool) -> dict:
    obs, info = env.reset(seed=seed)
    while True:
        kw = {"action_masks": info["action_mask"]} if masked else {}
        action, _ = model.predict(obs, deterministic=True, **kw)
        obs, _, terminated, truncated, info = env.step(int(action))
        if terminated or truncated:
            return info["metrics"]


def report(name: str, m: dict, env_kw: dict, seed: int) -> None:
    env = gym.make(ENV_ID, **env_kw).unwrapped
    rr = rollout_router(env, make_env_router("round_robin", env), seed).metrics
    print(f"{name}: {m['completed'] + m['rejected']}/{m['num_requests']} requests accounted for, "
          f"mean E2E {m['mean_e2e_s']:.3f} s (round robin {rr['mean_e2e_s']:.3f} s, seed {seed})")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=50_000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="400 steps on 200-request episodes (the tests)")
    args = p.parse_args()
    kw = QUICK if args.quick else {}
    steps = min(args.steps, 400) if args.quick else args.steps
    torch.set_num_threads(1)

    dqn = DQN("MlpPolicy", RouterRL(gym.make(ENV_ID, **kw)), gamma=1.0, learning_rate=1e-4,
              buffer_size=100_000, learning_starts=min(5_000, steps // 2), batch_size=128,
              target_update_interval=2_000, exploration_fraction=0.1, exploration_final_eps=0.02,
              policy_kwargs={"net_arch": [128, 128]}, seed=args.seed, verbose=0)
    dqn.learn(steps)
    report("SB3 DQN (mask ignored)", greedy_episode(dqn, gym.make(ENV_ID, **kw), 1000, masked=False), kw, 1000)

    menv = ActionMasker(RouterRL(gym.make(ENV_ID, **kw)), lambda e: e.unwrapped.action_masks())
    ppo = MaskablePPO("MlpPolicy", menv, gamma=1.0, n_steps=256 if args.quick else 2048, batch_size=64,
                      seed=args.seed, verbose=0)
    ppo.learn(steps)
    report("SB3-contrib MaskablePPO", greedy_episode(ppo, gym.make(ENV_ID, **kw), 1000, masked=True), kw, 1000)


if __name__ == "__main__":
    main()
