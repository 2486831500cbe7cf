"""Stable-Baselines3 on LLMCluster-v0: plain DQN (ignores the mask) and MaskablePPO (uses it).

    pip install -e ".[rl]"           # torch, stable-baselines3, sb3-contrib
    python docs/recipes/sb3.py       # about 1 minute on 2 cores

SB3's DQN never reads ``info["action_mask"]``; the env's default ``action.masked=fallback``
makes that safe (a masked action routes by JSQ, defers are budgeted: no stalled episodes).
MaskablePPO reads the mask through ``ActionMasker`` (or the env's own ``action_masks()``).
For this package's Double DQN with masks, semi-MDP discounts and warm starts use
``llm-lb-gym train`` or ``llm_lb_gym.agents.make_agent``.
"""

from __future__ import annotations

import torch
from sb3_contrib import MaskablePPO
from sb3_contrib.common.wrappers import ActionMasker
from stable_baselines3 import DQN

from _common import make_env, parse, report


def evaluate(model, env, seed: int, masked: bool) -> dict:
    obs, info = env.reset(seed=seed)
    while True:
        kw = {"action_masks": info["action_mask"]} if masked else {}
        action, _ = model.predict(obs, deterministic=True, **kw)
        obs, _, terminated, truncated, info = env.step(int(action))
        if terminated or truncated:
            return info["metrics"]


def main() -> None:
    args = parse(__doc__.splitlines()[0], steps=5_000)
    torch.set_num_threads(1)
    env = make_env()
    dqn = DQN("MlpPolicy", env, learning_starts=min(1_000, args.steps // 2), buffer_size=20_000,
              target_update_interval=500, exploration_fraction=0.3, seed=args.seed, verbose=0)
    dqn.learn(args.steps)
    report("SB3 DQN (mask ignored)", evaluate(dqn, make_env(), 100, masked=False), 100)

    menv = ActionMasker(make_env(), lambda e: e.unwrapped.action_masks())
    ppo = MaskablePPO("MlpPolicy", menv, n_steps=256, batch_size=64, seed=args.seed, verbose=0)
    ppo.learn(args.steps)
    report("SB3-contrib MaskablePPO", evaluate(ppo, make_env(), 100, masked=True), 100)


if __name__ == "__main__":
    main()
