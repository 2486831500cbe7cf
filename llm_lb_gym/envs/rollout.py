"""Run whole episodes of the env with a heuristic router or a trained agent.

One function per kind of decision maker, both returning the same ``EpisodeResult``, so an
evaluation can put heuristics and agents side by side on identical seeded episodes: the seed
fixes the workload sample and the predictions, so every policy sees the same requests.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..sim.metrics import request_latencies
from .cluster_env import LLMClusterEnv


@dataclass
class EpisodeResult:
    metrics: dict
    episode_return: float
    steps: int
    latencies: dict
    """Per-request arrays (``e2e_s``, ``ttft_s``, ...) of the finished requests."""


def make_env_router(name: str, env: LLMClusterEnv, **options):
    """A router from the registry, given what it needs to know of this env (Min-Min needs the
    observation's decode-bucket edges to read bucket upper bounds; the lookahead router needs
    the env's decision interval, workload, predictor and bucket schemes)."""
    from ..policies.registry import make_router

    if name == "min_min" and "decode_edges_tokens" not in options:
        options["decode_edges_tokens"] = env.obs_builder.decode_scheme.edges_tokens
    if name == "lookahead":
        # The rollouts need the env's models: its decision grid, the workload that imagines
        # future arrivals, the predictor and bucket schemes that fill the imagined rows.
        options.setdefault("decision_interval_s", env.cfg.decision_interval_s)
        router = make_router(name, **options)
        ob = env.obs_builder
        return router.attach(env.workload, env.predictor, ob.prompt_scheme, ob.decode_scheme,
                             base_router=make_env_router(router.options.base, env))
    return make_router(name, **options)


def _finish(env: LLMClusterEnv, info: dict, ret: float, steps: int) -> EpisodeResult:
    metrics = info.get("metrics") or env.metrics()
    return EpisodeResult(metrics, ret, steps, request_latencies(env.cluster.table))


def rollout_router(env: LLMClusterEnv, router, seed: int, max_steps: int | None = None) -> EpisodeResult:
    """One episode driven by a heuristic router (``llm_lb_gym.policies``)."""
    from ..policies.drive import decide

    env = env.unwrapped
    env.reset(seed=seed)
    router.reset(np.random.default_rng([seed, 7]), env.m)
    ret, steps, info = 0.0, 0, {}
    while True:
        c = env.cluster
        choice = decide(c, router) if c.queue else None
        if choice is None:
            _, r, term, trunc, info = env.route_step(env.m)
        else:
            pos, inst = choice
            _, r, term, trunc, info = env.route_step(inst, pos)
        ret += r
        steps += 1
        if term or trunc or (max_steps is not None and steps >= max_steps):
            return _finish(env, info, ret, steps)


def rollout_agent(env, agent, seed: int, deterministic: bool = True,
                  max_steps: int | None = None) -> EpisodeResult:
    """One episode driven by an agent with ``predict(obs, ...)`` (SB3 models, ``agents.*``)."""
    from agents.base import predict_action

    base = env.unwrapped
    obs, info = env.reset(seed=seed)
    ret, steps = 0.0, 0
    while True:
        action = predict_action(agent, obs, info.get("action_mask"), deterministic=deterministic)
        obs, r, term, trunc, info = env.step(int(action))
        ret += r
        steps += 1
        if term or trunc or (max_steps is not None and steps >= max_steps):
            return _finish(base, info, ret, steps)
