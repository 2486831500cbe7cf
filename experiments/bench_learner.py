"""How fast Double DQN trains the learned router, next to the env's own speed.

    python -m llm_lb_gym.experiments.bench learner                 # 3,000 steps after 500 of warm-up
    python -m llm_lb_gym.experiments.bench learner --learner-steps 10000
    python -m llm_lb_gym.experiments.bench learner --learner-overrides agent.kwargs.batch_size=64

The agent is the one ``python -m llm_lb_gym.experiments.train 'experiment=[v100_near_capacity,learned_router]'``
builds (the permutation-equivariant network, batch 256, one update every 4 env steps, the
semi-MDP replay), with one episode of ``late_binding`` demonstrations mixed into every update as
in that run (the run collects three; the count only changes which rows are drawn, not the work
per update). No pretraining, no validation rollouts, no TensorBoard: what is timed is
``agent.learn`` itself, over a fixed number of env steps after a warm-up whose replay buffer it
keeps training on.

Where the time goes is measured around the agent's own methods during the timed steps:
``train`` (gradient updates; inside it ``_update_loss``, the forward passes and the loss, and
``_gradient_step``, the backward pass, gradient clipping and Adam; the rest is sampling),
``_sample_action`` (acting: the batch-1 forward pass and the env's action mask) and the VecEnv's
``step_wait`` (the env); the rest is Stable-Baselines3's loop (replay insertion, callbacks,
bookkeeping). Figures are per wall second and per CPU second of this process (on a shared
machine the CPU figure is the stable one). The env's own speed is measured on the same env
options with round-robin actions (:func:`llm_lb_gym.experiments.bench.bench_env`).
"""

from __future__ import annotations

from llm_lb_gym.extras import require

# before the imports below: name the extra, not a missing module
require("rl", "llm-lb-gym bench learner")

import functools
import tempfile
import time
from pathlib import Path

from llm_lb_gym.experiments._hydra import compose, env_kwargs, to_container
from llm_lb_gym.experiments._training import auto_reward_scale, build_agent, init_value_offset, make_env, measure_round_robin

EXPERIMENT = "experiment=[v100_near_capacity,learned_router]"
PARTS = {"train": "gradient updates", "_sample_action": "action selection", "step_wait": "env steps"}


def _timed(owner, name: str, totals: dict[str, list[float]]) -> None:
    """Wrap ``owner.name`` (an instance attribute shadows the class's method) to add its wall
    and CPU seconds to ``totals[name]``."""
    inner = getattr(owner, name)
    totals[name] = [0.0, 0.0]

    @functools.wraps(inner)
    def wrapper(*args, **kwargs):
        t, c = time.perf_counter(), time.process_time()
        try:
            return inner(*args, **kwargs)
        finally:
            totals[name][0] += time.perf_counter() - t
            totals[name][1] += time.process_time() - c

    setattr(owner, name, wrapper)


def build_learner(seed: int = 0, overrides: tuple[str, ...] = ()):
    """(agent, env options, config) as ``llm_lb_gym.experiments.train`` builds them for the learned router,
    with one demonstration episode set (see the module docstring)."""
    import torch
    from stable_baselines3.common.logger import Logger

    from llm_lb_gym.agents.imitation import collect_demonstrations

    torch.set_num_threads(1)
    cfg = compose("train", [EXPERIMENT, f"seed={seed}", *overrides])
    kw = env_kwargs(cfg)
    rr = measure_round_robin(kw, seed)
    scale = auto_reward_scale(rr)
    episodes = int(cfg.train.episodes)
    with tempfile.TemporaryDirectory(prefix="bench_learner_tb_") as tb:
        agent = build_agent(cfg, kw, episodes * int(rr["steps"]), int(rr["steps"]), Path(tb), scale)
    agent.tensorboard_log = None   # the timed loop writes no event files (nor an SB3 temp folder)
    agent.set_logger(Logger(folder=None, output_formats=[]))
    init_value_offset(agent, rr["return_mean"] * scale)
    im = to_container(cfg.train.imitation)
    demos = collect_demonstrations(make_env(kw), im["teacher"], 1, int(im["seed"]), reward_scale=scale,
                                   teacher_options=im.get("teacher_options") or {})
    agent.set_demonstrations(demos.buffer, fraction=float(im["demo_fraction"]), margin=float(im["margin"]),
                             weight=float(im["margin_weight"]), decay_updates=10 ** 9,
                             loss=str(im.get("loss", "ce")))
    return agent, kw, cfg


def bench_learner(steps: int = 3000, warmup: int = 500, seed: int = 0, overrides: tuple[str, ...] = ()) -> dict:
    """Env steps per second of ``agent.learn`` on the learned-router config (see module doc);
    ``overrides``: Hydra overrides on top of it (``agent.kwargs.batch_size=64``)."""
    agent, kw, cfg = build_learner(seed, tuple(overrides))
    agent.learn(warmup)
    totals: dict[str, list[float]] = {}
    for name in ("train", "_sample_action", "_update_loss", "_gradient_step"):
        _timed(agent, name, totals)
    _timed(agent.env, "step_wait", totals)
    updates0 = agent._n_updates
    t, c = time.perf_counter(), time.process_time()
    agent.learn(steps, reset_num_timesteps=False)
    wall, cpu = time.perf_counter() - t, time.process_time() - c
    kwargs = cfg.agent.kwargs
    n = max(agent._n_updates - updates0, 1)
    out: dict = {"config": " ".join([EXPERIMENT, *overrides]), "timed_env_steps": steps, "warmup_env_steps": warmup,
                 "batch_size": int(kwargs.batch_size), "train_freq": int(kwargs.train_freq),
                 "gradient_updates": agent._n_updates - updates0,
                 "train_env_steps_per_wall_s": steps / wall, "train_env_steps_per_cpu_s": steps / cpu,
                 "ms_cpu_per_gradient_update": 1e3 * totals["train"][1] / n}
    inner = totals["_update_loss"][1] + totals["_gradient_step"][1]
    out["ms_cpu_per_update_forward_passes_and_loss"] = 1e3 * totals["_update_loss"][1] / n
    out["ms_cpu_per_update_backward_clip_adam"] = 1e3 * totals["_gradient_step"][1] / n
    out["ms_cpu_per_update_sampling_and_rest"] = 1e3 * (totals["train"][1] - inner) / n
    for name, label in PARTS.items():
        out[f"cpu_share_{label.replace(' ', '_')}_pct"] = 100 * totals[name][1] / cpu
    outer = sum(totals[name][1] for name in PARTS)
    out["cpu_share_sb3_loop_rest_pct"] = 100 * (cpu - outer) / cpu
    return out


__all__ = ["EXPERIMENT", "bench_learner", "build_learner"]
