"""Run whole episodes of the env with a heuristic router or a trained agent.

One function per kind of decision maker, both returning the same ``EpisodeResult``, so an
evaluation can put heuristics and agents side by side on identical seeded episodes: the seed
fixes the workload sample and the predictions, so every policy sees the same requests.

This module sits at the env's level of the package (it imports ``envs``, ``routers`` and
``sim``; none of those import it) and knows agents only by SB3's ``predict`` signature, so the
core never imports ``llm_lb_gym.agents`` (which needs torch and SB3). :func:`predict_action` and
:func:`accepts_action_masks` live here for that reason; ``llm_lb_gym.agents.base`` re-exports them.

Action masks are an optional extra: SB3's plain ``DQN`` has no ``action_masks`` argument, while
``DoubleDQN``, ``MaskablePPO`` and the custom agents do. :func:`predict_action` passes the mask
only to agents that accept it, so evaluation code can always hand the env's mask over.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import numpy as np

from .envs.cluster_env import LLMClusterEnv
from .envs.router_factory import make_env_router  # noqa: F401  (re-exported: evaluation code imports it from here)
from .sim.metrics import request_latencies
from .sim.watchdog import Watchdog


def accepts_action_masks(agent: Any) -> bool:
    """Whether ``agent.predict`` takes an ``action_masks`` keyword (MaskablePPO, DoubleDQN, ...)."""
    try:
        params = inspect.signature(agent.predict).parameters
    except (TypeError, ValueError):
        return False
    return "action_masks" in params or any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()
    )


def predict_action(
    agent: Any,
    observation: Any,
    action_masks: np.ndarray | None = None,
    deterministic: bool = True,
) -> int:
    """One action for one (non-vectorised) observation, masked when the agent supports it.

    Agents without mask support get the plain call; with the env's usual all-valid mask the
    result is the same, which is why evaluation can use this for every agent alike.
    """
    if action_masks is not None and accepts_action_masks(agent):
        action, _ = agent.predict(
            observation, deterministic=deterministic, action_masks=action_masks
        )
    else:
        action, _ = agent.predict(observation, deterministic=deterministic)
    return int(np.asarray(action).reshape(-1)[0])


@dataclass
class EpisodeResult:
    metrics: dict
    episode_return: float
    steps: int
    latencies: dict
    """Per-request arrays (``e2e_s``, ``ttft_s``, ...) of the finished requests."""


def _finish(env: LLMClusterEnv, info: dict, ret: float, steps: int) -> EpisodeResult:
    metrics = info.get("metrics") or env.metrics()
    return EpisodeResult(metrics, ret, steps, request_latencies(env.cluster.table))


def start_episode(env: LLMClusterEnv, router, seed: int) -> tuple[Any, dict]:
    """Reset ``env`` (unwrapped) with ``seed`` and ``router`` with its RNG for that seed
    (``routers.drive.router_rng``); returns the env's (observation, info)."""
    from .routers.drive import router_rng

    out = env.reset(seed=seed)
    router.reset(router_rng(seed), env.m)
    return out


def router_choice(env: LLMClusterEnv, router) -> tuple[int, int] | None:
    """(queue position, instance) ``router`` wants now, or None: hold (or nothing queued)."""
    from .routers.drive import decide

    c = env.cluster
    return decide(c, router) if c.queue else None


def take_choice(env: LLMClusterEnv, choice: tuple[int, int] | None):
    """One env step carrying out a router's choice as the router takes it (``route_step``: a
    hold waits one interval even where the action mask forbids it). Returns ``step``'s tuple."""
    return env.route_step(env.m) if choice is None else env.route_step(choice[1], choice[0])


def watchdog(env: LLMClusterEnv, who: str, seed: int) -> Watchdog:
    """The progress watchdog (``sim/watchdog.py``) of the episode ``env`` (unwrapped) has just
    been reset to: every loop that steps an env to the episode's end calls its ``check()``
    once per step, so a decider that holds requests forever stops the loop with a report."""
    return Watchdog(env.cluster, f"{who} on seed {seed}")


def rollout_router(env: LLMClusterEnv, router, seed: int, max_steps: int | None = None) -> EpisodeResult:
    """One episode driven by a heuristic router (``llm_lb_gym.routers``)."""
    env = env.unwrapped
    start_episode(env, router, seed)
    check = watchdog(env, f"router {router.name!r} ({router!r})", seed).check
    ret, steps, info = 0.0, 0, {}
    while True:
        _, r, term, trunc, info = take_choice(env, router_choice(env, router))
        ret += r
        steps += 1
        if term or trunc or (max_steps is not None and steps >= max_steps):
            return _finish(env, info, ret, steps)
        check()


def rollout_agent(env, agent, seed: int, deterministic: bool = True,
                  max_steps: int | None = None) -> EpisodeResult:
    """One episode driven by an agent with ``predict(obs, ...)`` (SB3 models, ``agents.*``)."""
    base = env.unwrapped
    obs, info = env.reset(seed=seed)
    check = watchdog(base, f"agent {type(agent).__name__}", seed).check
    ret, steps = 0.0, 0
    while True:
        action = predict_action(agent, obs, info.get("action_mask"), deterministic=deterministic)
        obs, r, term, trunc, info = env.step(int(action))
        ret += r
        steps += 1
        if term or trunc or (max_steps is not None and steps >= max_steps):
            return _finish(base, info, ret, steps)
        check()
