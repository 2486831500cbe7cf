"""What every recipe shares: a short-episode env, round robin's score, and the quick switch.

The recipes train for a few thousand steps on short episodes (200 requests), enough to log
episodes and show the loop works, not to beat round robin; ``--quick`` (the tests) shrinks them
further. Each recipe is one file you can copy; this helper only keeps their numbers in one place.
"""

from __future__ import annotations

import argparse

import gymnasium as gym

import llm_lb_gym  # noqa: F401  (registers LLMCluster-v0)
from llm_lb_gym.envs.router_factory import make_env_router
from llm_lb_gym.rollout import rollout_router

ENV_ID = "LLMCluster-v0"
ENV_KWARGS = {"num_requests": 200, "arrival_rate_rps": 20.0}
"""Short episodes (about 200 steps each) so a few thousand training steps span many episodes."""


def parse(description: str, steps: int) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--steps", type=int, default=steps, help="training steps")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="a few hundred steps (the tests)")
    a = p.parse_args()
    if a.quick:
        a.steps = min(a.steps, 400)
    return a


def make_env(**overrides) -> gym.Env:
    return gym.make(ENV_ID, **{**ENV_KWARGS, **overrides})


def round_robin_e2e(seed: int) -> float:
    env = make_env().unwrapped
    return rollout_router(env, make_env_router("round_robin", env), seed=seed).metrics["mean_e2e_s"]


def report(name: str, metrics: dict, seed: int) -> None:
    rr = round_robin_e2e(seed)
    done = metrics["completed"] + metrics["rejected"]
    print(f"{name}: {done}/{metrics['num_requests']} requests accounted for, mean E2E "
          f"{metrics['mean_e2e_s']:.3f} s (round robin {rr:.3f} s, same seed)")
