"""The training pipeline behind ``python -m llm_lb_gym.experiments.train`` (``train(cfg)``), shared with
``reproduce`` and the learner benchmark, which call it without going through the entry point.

Why the pieces are as they are:

- The guidance weight of Workload-Guided RL decays with the number of training episodes
  finished across all parallel envs, which only the trainer knows: ``EpisodeMetricsCallback``
  counts them and pushes the count to every env (``set_training_episode``).
- Evaluation (periodic and final) always uses ``reward.mode=baseline``: guidance is a training
  aid, and latency, not reward, is what is compared.
- Validation seeds (``train.eval_seed``) differ from the final test seeds (``eval.seed``), so
  picking the best checkpoint does not peek at the test episodes.
- The return must mean something in simulated time. ``LLMCluster-v0`` reports each step's
  discount (``info["discount"]``: gamma_s ** dt under the default ``reward.discount=semi_mdp``),
  and every agent uses it per transition (the DQN variants' ``llm_lb_gym.agents.replay.SemiMDPReplayBuffer``,
  ``maskable_ppo``'s GAE in ``llm_lb_gym.agents.maskable_ppo``, ``reinforce``'s returns-to-go), so the
  horizon is ``reward.horizon_s`` seconds whatever the number of routing steps in between.
- The reward's scale depends on the load by orders of magnitude (the in-system penalty sums
  over every request in the system). ``train.reward_scale: auto`` (default) fixes one scale per
  setting before training: 1 / the standard deviation of round robin's discounted return-to-go,
  measured on the same round-robin episode that sizes the schedule, so values vary by O(1) in
  every regime (scaling by the return's mean instead left the action gaps ~1e-4, below what
  Adam at lr 1e-4 resolves: WG-RL then lost to round robin at 20 req/s); and the network's last
  bias starts at round robin's mean scaled return (``init_value_offset``). A fixed scale, not a
  running normaliser: ``VecNormalize`` divides by a running
  return std and clips at +-10, which cut off the one step that carries a drain's penalty and
  left TD errors near 1e-3 (``train.normalize_reward`` keeps it available, unclipped). An agent
  that trains on a plain env rather than a VecEnv (``reinforce``) standardises its returns
  itself. ``info["reward_components"]`` and TensorBoard's ``reward/*`` stay raw.
- ``train.imitation.teacher`` warm-starts the DQN variants from a registered router
  (``llm_lb_gym.agents.imitation``): its transitions are collected on seeds of their own, the network is
  pretrained on them (TD + DQfD's large margin), and they stay in every update with a margin
  weight that decays over ``margin_decay_episodes``.
"""

from __future__ import annotations

from llm_lb_gym.extras import require

# before the imports below: name the extra, not a missing module
require("rl", "llm-lb-gym train")

import inspect
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import OmegaConf

from llm_lb_gym.experiments._accounting import describe_workload, filter_note, row_filters
from llm_lb_gym.experiments._entry_options import MAX_SEED, check_evaluate_options, check_router_options
from llm_lb_gym.experiments._evaluation import evaluate
from llm_lb_gym.experiments._hydra import env_kwargs, router_options, run_dir, to_container, write_run_record
from llm_lb_gym.experiments._progress import TrainingProgressCallback, say
from llm_lb_gym.experiments._tables import paired_change

FINAL_MODELS = ("best", "last")
VALIDATION_STEP_FACTOR = 10
"""A validation rollout stops after this many times round robin's steps per episode."""


def _check_train_cfg(cfg) -> None:
    t = cfg.train
    from llm_lb_gym._validate import ConfigError

    from llm_lb_gym.agents import agent_spec

    if t.final_model not in FINAL_MODELS:
        raise ConfigError(f"train.final_model={t.final_model!r}; allowed: {', '.join(FINAL_MODELS)}")
    if t.final_model == "best" and not t.keep_best:
        raise ConfigError("train.final_model=best needs train.keep_best=true")
    from llm_lb_gym._validate import check_bool, check_int

    check_int("seed", cfg.seed, 0, MAX_SEED)
    check_int("train.n_envs", t.n_envs, 1, 1024)
    if agent_spec(cfg.agent.name).single_env_only and int(t.n_envs) != 1:
        raise ConfigError(f"agent {cfg.agent.name} trains on one env; got train.n_envs={t.n_envs} (allowed: 1)")
    check_int("train.episodes", t.episodes, 1)
    for key in ("total_timesteps", "episode_steps"):
        if t.get(key) is not None:
            check_int(f"train.{key}", t[key], 1)
    check_int("train.eval_every_episodes", t.eval_every_episodes, 0)
    check_int("train.eval_episodes", t.eval_episodes, 1)
    check_int("train.eval_seed", t.eval_seed, 0, MAX_SEED)
    for key in ("keep_best", "init_value_offset", "normalize_reward"):
        if t.get(key) is not None:
            check_bool(f"train.{key}", t[key])
    # The final evaluation's options, now rather than after hours of training.
    check_evaluate_options(final_eval_cfg(cfg, Path("model"), Path(".")), prefix="eval.")
    if t.reward_scale != "auto":
        try:
            bad = float(t.reward_scale) <= 0
        except (TypeError, ValueError):
            bad = True
        if bad:
            raise ConfigError(f"train.reward_scale={t.reward_scale!r}; allowed: 'auto' or a number > 0")
    im = cfg.train.get("imitation") or {}
    if im.get("teacher") is not None:
        from llm_lb_gym._validate import check_choice
        from llm_lb_gym.routers.registry import ROUTERS

        check_choice("train.imitation.teacher", im["teacher"], ROUTERS)
        check_router_options("train.imitation.teacher_options", im["teacher"],
                             to_container(im.get("teacher_options")))
        from llm_lb_gym.agents import agent_spec

        if not (agent_spec(cfg.agent.name).semi_mdp_replay or agent_spec(cfg.agent.name).teacher_actions):
            raise ConfigError(f"train.imitation warm-starts the DQN variants (double_dqn, dqn) and names "
                              f"maskable_ppo_kl's teacher; agent {cfg.agent.name!r} cannot take demonstrations")
        for key in ("episodes", "pretrain_steps", "margin_decay_episodes"):
            check_int(f"train.imitation.{key}", im.get(key), 1 if key == "episodes" else 0)


def make_env(kw: dict, reward_scale: float = 1.0, teacher: str | None = None,
             teacher_options: dict | None = None):
    """One training env; the reward scaling wrapper is picklable (SubprocVecEnv-safe). With
    ``teacher``: wrapped in ``llm_lb_gym.agents.teacher_kl_ppo.TeacherAction`` (maskable_ppo_kl)."""
    import gymnasium as gym

    import llm_lb_gym  # noqa: F401

    env = gym.make("LLMCluster-v0", **kw)
    if teacher is not None:
        from llm_lb_gym.agents.teacher_kl_ppo import TeacherAction

        env = TeacherAction(env, teacher, teacher_options)
    if reward_scale != 1.0:   # the framework wrapper's scaling; the agents discount per transition themselves
        from llm_lb_gym.envs.wrappers import RouterRL

        env = RouterRL(env, reward_scale=float(reward_scale), discount="none")
    return env


def measure_round_robin(kw: dict, seed: int) -> dict[str, float]:
    """One round-robin episode: its steps (the schedule hint for exploration and evaluation)
    and its in-system penalty per simulated second (what ``reward_scale: auto`` divides by).

    A learned router that defers takes more steps per episode; this is the floor (one step per
    request plus the intervals requests wait), which is what the paper's episode count means.
    """
    from llm_lb_gym.envs.wrappers import round_robin_returns

    return round_robin_returns(make_env({**kw, "reward": {**(kw.get("reward") or {}), "mode": "baseline"}}), seed)


def step_limit(kw: dict, rr: dict[str, float]) -> int:
    """Steps after which a validation or test episode is cut: ten times round robin's steps,
    plus two deferrals per decision interval of round robin's makespan (a router that holds
    requests at the router, as late binding does in overload, takes a step every interval)."""
    from llm_lb_gym.sim.clock import DEFAULT_DECISION_INTERVAL_S

    dt = float(kw.get("decision_interval_s", DEFAULT_DECISION_INTERVAL_S))
    return int(VALIDATION_STEP_FACTOR * rr["steps"] + 2 * rr["makespan_s"] / dt)


def auto_reward_scale(rr: dict[str, float]) -> float:
    """1 / the standard deviation of round robin's discounted return-to-go, over the steps of
    one episode: the learner's values vary by O(1) across states in every regime."""
    from llm_lb_gym.envs.wrappers import reward_scale_of

    return reward_scale_of(rr)


def init_value_offset(agent, offset: float) -> bool:
    """Start the Q-network's output at ``offset`` (round robin's mean scaled return-to-go).

    Values sit 2-14 return standard deviations away from 0 (a mean far larger than the
    spread); Adam moves a bias by about one learning rate per step, so at 1e-4 the network
    would spend tens of thousands of updates learning the offset while its other weights
    compensate. Setting the last bias is the same reparametrisation as reward centering with
    exact terminal values, done once. Returns False for networks it does not know."""
    import torch as th

    nets = [getattr(agent, "q_net", None), getattr(agent, "q_net_target", None)]
    done = False
    for net in nets:
        if net is None:
            continue
        inner = net.q_net
        head = inner.value if hasattr(inner, "value") else inner
        last = [m for m in head.modules() if isinstance(m, th.nn.Linear)][-1]
        with th.no_grad():
            last.bias.fill_(offset)
        done = True
    return done


def measure_episode_steps(kw: dict, seed: int) -> int:
    """Steps of one round-robin episode (see :func:`measure_round_robin`)."""
    return int(measure_round_robin(kw, seed)["steps"])


class Validator:
    """Greedy rollouts of the model on fixed validation seeds, compared with round robin.

    Round robin's results on those seeds are computed once. With ``best_path`` set, the model is
    saved there whenever its validation mean E2E is the lowest so far. A rollout is cut at
    ``max_steps`` (an early policy that defers forever would otherwise run to the env's
    TimeLimit); a cut episode leaves requests unfinished, and a model with unfinished requests
    is never kept as the best (its mean E2E covers only the requests that did finish).
    """

    def __init__(self, kw: dict, seeds: list[int], best_path: Path | None = None,
                 max_steps: int | None = None):
        from llm_lb_gym.rollout import make_env_router, rollout_router

        self.env = make_env({**kw, "reward": {**(kw.get("reward") or {}), "mode": "baseline"}})
        self.seeds = seeds
        rr = make_env_router("round_robin", self.env.unwrapped)
        self.rr = [rollout_router(self.env, rr, s).metrics["mean_e2e_s"] for s in seeds]
        self.best_path = best_path
        self.max_steps = max_steps
        self.best_e2e = float("inf")
        self.best_step: int | None = None

    def __call__(self, model) -> dict[str, float]:
        from llm_lb_gym.rollout import rollout_agent

        res = [rollout_agent(self.env, model, s, max_steps=self.max_steps) for s in self.seeds]
        e2e = np.array([r.metrics["mean_e2e_s"] for r in res])
        rr = np.array(self.rr)
        mean_e2e = float(e2e.mean())
        unfinished = sum(int(r.metrics["unfinished"]) for r in res)
        if self.best_path is not None and not unfinished and mean_e2e < self.best_e2e:
            self.best_e2e = mean_e2e
            self.best_step = int(getattr(model, "num_timesteps", 0))
            model.save(self.best_path)
        return {
            "mean_e2e_s": mean_e2e,
            "round_robin_mean_e2e_s": float(rr.mean()),
            "change_vs_round_robin_pct": float(np.mean(100.0 * (e2e - rr) / rr)),
            "p99_e2e_s": float(np.mean([r.metrics["p99_e2e_s"] for r in res])),
            "mean_ttft_s": float(np.mean([r.metrics["mean_ttft_s"] for r in res])),
            "preemptions": float(np.mean([r.metrics["preemptions"] for r in res])),
            "mean_router_wait_s": float(np.mean([r.metrics["mean_router_wait_s"] for r in res])),
            "steps": float(np.mean([r.steps for r in res])),
            "unfinished": float(unfinished),
        }


def _model_file(agent_name: str, stem: str) -> str:
    from llm_lb_gym.agents import agent_spec

    return stem + agent_spec(agent_name).file_suffix


def build_agent(cfg, kw: dict, total_timesteps: int, episode_steps: int, tb_dir: Path,
                scale: float = 1.0):
    """The agent of ``cfg.agent`` on its training env(s): a VecEnv if its spec is ``vectorized``
    (SB3), one env otherwise; rewards multiplied by ``scale``."""
    from llm_lb_gym.agents import agent_spec, make_agent

    name = cfg.agent.name
    agent_kw = dict(to_container(cfg.agent.get("kwargs")) or {})
    if not agent_spec(name).vectorized:
        env = make_env(kw, scale)
    else:
        from stable_baselines3.common.env_util import make_vec_env

        env_kwargs = {"kw": kw, "reward_scale": scale}
        if agent_spec(name).teacher_actions:
            from llm_lb_gym._validate import ConfigError

            im = to_container(cfg.train.get("imitation")) or {}
            if im.get("teacher") is None:
                raise ConfigError(f"agent {name} needs a teacher: set train.imitation.teacher (e.g. late_binding)")
            env_kwargs.update(teacher=im["teacher"],
                              teacher_options=im.get("teacher_options") or router_options(cfg, im["teacher"]))
        env = make_vec_env(make_env, n_envs=int(cfg.train.n_envs), seed=int(cfg.seed), env_kwargs=env_kwargs)
        if cfg.train.normalize_reward:
            from stable_baselines3.common.vec_env import VecNormalize

            gamma = float(agent_kw.get("gamma", 0.99))
            env = VecNormalize(env, norm_obs=False, norm_reward=True, gamma=gamma,
                               clip_reward=float("inf"))
    return make_agent(name, env, total_timesteps=total_timesteps, episode_steps=episode_steps,
                      seed=int(cfg.seed), tensorboard_log=str(tb_dir), verbose=0, **agent_kw)


def warm_start(agent, cfg, kw: dict, scale: float, episode_steps: int) -> dict | None:
    """``train.imitation``: demonstrations of a router, pretraining on them, and the decaying
    margin loss for the rest of training. Returns what was done (for train_summary.json)."""
    im = to_container(cfg.train.get("imitation")) or {}
    if im.get("teacher") is None:
        return None
    from llm_lb_gym.agents import agent_spec

    if agent_spec(cfg.agent.name).teacher_actions:   # the teacher is in the env (build_agent)
        return {"teacher": im["teacher"], "kl_penalty": True}
    from llm_lb_gym.agents.imitation import collect_demonstrations

    t0 = time.perf_counter()
    teacher_options = im.get("teacher_options") or router_options(cfg, im["teacher"])
    demos = collect_demonstrations(make_env(kw), im["teacher"], int(im["episodes"]), int(im["seed"]),
                                   reward_scale=scale, teacher_options=teacher_options)
    updates_per_step = agent.gradient_steps / agent.train_freq.frequency if agent.gradient_steps > 0 else 1
    decay = max(1, int(int(im["margin_decay_episodes"]) * episode_steps * updates_per_step))
    agent.set_demonstrations(demos.buffer, fraction=float(im["demo_fraction"]), margin=float(im["margin"]),
                             weight=float(im["margin_weight"]), decay_updates=decay,
                             loss=str(im.get("loss", "ce")))
    pre = agent.pretrain(int(im["pretrain_steps"])) if int(im["pretrain_steps"]) else {}
    out = {"teacher": im["teacher"], "episodes": demos.episodes, "transitions": demos.steps,
           "skipped": demos.skipped, "teacher_mean_e2e_s": demos.mean_e2e_s,
           "wall_s": round(time.perf_counter() - t0, 1), **pre}
    say(f"imitation: {demos.steps} transitions of {im['teacher']} ({demos.skipped} not expressible), "
          f"teacher mean E2E {demos.mean_e2e_s:.2f} s; pretrained {im['pretrain_steps']} steps, "
          f"agreement {pre.get('teacher_agreement', float('nan')):.3f}; {out['wall_s']} s")
    return out


def _learn(agent, total_timesteps: int, callbacks: list, tb_log_name: str) -> None:
    params = inspect.signature(agent.learn).parameters
    extra = {"tb_log_name": tb_log_name} if "tb_log_name" in params else {}
    agent.learn(total_timesteps, callback=callbacks, **extra)


def final_eval_cfg(cfg, model_path: Path, out: Path, max_episode_steps: int | None = None):
    """The ``conf/evaluate.yaml``-shaped config for the trained model and ``cfg.eval``.

    ``max_episode_steps`` caps the evaluation episodes (gym.make's TimeLimit) unless the env
    config sets its own, so a policy that defers forever costs minutes, not hours.
    """
    ev = to_container(cfg.eval)
    env = to_container(cfg.env)
    if max_episode_steps is not None:
        env.setdefault("max_episode_steps", int(max_episode_steps))
    return OmegaConf.create({
        "env": env, "engine": to_container(cfg.engine),
        "workload": to_container(cfg.workload), "predictor": to_container(cfg.predictor),
        "reward": to_container(cfg.reward),
        "policies": ev["policies"], "policy_options": ev.get("policy_options") or {},
        "agents": {cfg.name: {"kind": cfg.agent.name, "path": str(model_path)}},
        "episodes": ev["episodes"], "seed": ev["seed"], "baseline": ev["baseline"],
        "plot": ev.get("plot", True), "output_dir": str(out), "progress": cfg.get("progress", True),
    })


def train(cfg, out: Path | None = None, leave_bars: bool = True) -> dict[str, Any]:
    """Train ``cfg.agent`` on the env of ``cfg``, save it, evaluate it; return the outcome.

    ``leave_bars=False`` clears the progress bar when training ends (``reproduce`` runs many).

    Returns a dict with ``out`` (run directory), ``model_path`` (the evaluated model),
    ``eval`` (what :func:`llm_lb_gym.experiments._evaluation.evaluate` returned), ``history`` (per-episode
    training metrics), ``validation`` (periodic evaluations) and wall times.
    """
    import torch

    from llm_lb_gym.agents import EpisodeMetricsCallback, PeriodicEvalCallback
    from llm_lb_gym.envs.builders import build_workload

    torch.set_num_threads(1)
    _check_train_cfg(cfg)
    out = Path(out) if out is not None else run_dir(cfg)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    kw = env_kwargs(cfg)
    built = build_workload(kw["workload"], kw.get("arrival_rate_rps"))
    workload = describe_workload(built)
    say(f"training {cfg.name} on workload {workload}")
    if filter_note(built):
        say(filter_note(built))
    t = cfg.train
    rr = measure_round_robin(kw, int(cfg.seed))
    episode_steps = int(t.episode_steps) if t.episode_steps else int(rr["steps"])
    total = int(t.total_timesteps) if t.total_timesteps else int(t.episodes) * episode_steps
    scale = auto_reward_scale(rr) if t.reward_scale == "auto" else float(t.reward_scale)
    write_run_record(out, cfg, episode_steps=episode_steps, total_timesteps=total, reward_scale=scale,
                     workload=workload, row_filters=row_filters(built))

    agent = build_agent(cfg, kw, total, episode_steps, out / "tb", scale)
    if t.get("init_value_offset", True):
        init_value_offset(agent, rr["return_mean"] * scale)
    imitation = warm_start(agent, cfg, kw, scale, episode_steps)
    metrics_cb = EpisodeMetricsCallback(episode_setter="set_training_episode")
    callbacks: list = [metrics_cb]
    validator = None
    if int(t.eval_every_episodes) > 0 and int(t.eval_episodes) > 0:
        seeds = [int(t.eval_seed) + i for i in range(int(t.eval_episodes))]
        best = out / _model_file(cfg.agent.name, "best_model") if t.keep_best else None
        validator = Validator(kw, seeds, best, max_steps=step_limit(kw, rr))
        callbacks.append(PeriodicEvalCallback(validator, every_steps=int(t.eval_every_episodes) * episode_steps,
                                              at_start=imitation is not None))
    callbacks.append(TrainingProgressCallback(total, metrics_cb, callbacks[1] if validator else None,
                                              option=cfg.get("progress", True), desc=f"train {cfg.name}",
                                              leave=leave_bars))
    _learn(agent, total, callbacks, tb_log_name=str(cfg.name))
    train_wall = time.perf_counter() - t0
    last_path = out / _model_file(cfg.agent.name, "model")
    agent.save(last_path)
    vec_normalize = agent.get_vec_normalize_env() if hasattr(agent, "get_vec_normalize_env") else None
    if vec_normalize is not None:   # reward statistics, to continue training; acting needs none
        vec_normalize.save(str(out / "vecnormalize.pkl"))

    model_path = last_path
    if t.final_model == "best" and validator is not None and validator.best_step is not None:
        model_path = validator.best_path
    t1 = time.perf_counter()
    ev = evaluate(final_eval_cfg(cfg, model_path, out / "eval", step_limit(kw, rr)),
                  out=out / "eval", leave_bars=False)
    eval_wall = time.perf_counter() - t1
    unfinished = int(sum(r.get("unfinished", 0) for r in ev["rows"] if r["policy"] == cfg.name))
    if unfinished:
        say(f"WARNING: {cfg.name} left {unfinished} requests unfinished in the evaluation (it defers "
              f"until the step limit); its mean E2E covers the finished requests only")

    by_seed = {p: {r["seed"]: r["mean_e2e_s"] for r in ev["rows"] if r["policy"] == p}
               for p in (cfg.name, cfg.eval.baseline)}
    seeds = sorted(by_seed[cfg.name])
    change_pct, change_ci = (paired_change(np.array([by_seed[cfg.name][s] for s in seeds]),
                                           np.array([by_seed[cfg.eval.baseline][s] for s in seeds]))
                             if by_seed[cfg.eval.baseline] else (float("nan"), float("nan")))
    history = metrics_cb.history
    validation = [{"step": s, **v} for s, v in (callbacks[1].history if validator else [])]
    summary = {
        "workload": workload, "episode_steps": episode_steps, "total_timesteps": total, "train_episodes": len(history),
        "reward_scale": scale, "imitation": imitation,
        "train_wall_s": round(train_wall, 1), "eval_wall_s": round(eval_wall, 1),
        "model": str(model_path), "best_step": validator.best_step if validator else None,
        "eval_unfinished_requests": unfinished,
        "eval_change_vs_baseline_pct": change_pct, "eval_change_ci95_pct": change_ci,
        "validation": validation,
    }
    (out / "train_summary.json").write_text(json.dumps(summary, indent=2))
    say(f"trained {cfg.name} on workload {workload}: {len(history)} episodes, {total} steps in {train_wall:.0f} s; "
          f"evaluated {model_path.name} in {eval_wall:.0f} s; run dir {out}")
    return {"out": out, "model_path": model_path, "eval": ev, "history": history,
            "validation": validation, "train_wall_s": train_wall, "eval_wall_s": eval_wall,
            "change_vs_baseline_pct": change_pct}


# ----------------------------------------------------------------- the distilled network
def policy_iteration_config(cfg):
    """``PolicyIterationConfig`` of a composed ``improve`` config's ``improve`` block (unknown keys
    are named errors)."""
    from dataclasses import fields

    from llm_lb_gym._validate import reject_unknown
    from llm_lb_gym.agents.policy_iteration import PolicyIterationConfig

    opts = to_container(cfg.improve)
    for key in ("validation_seeds", "net_arch"):
        opts[key] = tuple(opts[key])
    reject_unknown("improve", opts, [f.name for f in fields(PolicyIterationConfig)])
    return PolicyIterationConfig(**opts)


def train_distilled(cfg, out: Path, log=say) -> dict[str, Any]:
    """Policy iteration (``llm_lb_gym.agents.policy_iteration``) on a composed ``improve`` config,
    as ``llm-lb-gym improve`` and ``reproduce``'s ``distilled`` variant run it: each round's
    network and the best (``best_policy.pt``) in ``out``, the rounds in ``out/tb``. Returns the
    model path, the env options ``evaluate`` must give the agent (the config's action and
    observation options, plus ``DistilledAgent.ENV_OPTIONS``), the history and the wall time."""
    import torch
    from torch.utils.tensorboard import SummaryWriter

    from llm_lb_gym.agents.policy_iteration import DistilledAgent, policy_iteration

    torch.set_num_threads(1)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    pc = policy_iteration_config(cfg)
    kw = env_kwargs(cfg)
    writer = SummaryWriter(str(out / "tb" / "distilled"))
    t0 = time.perf_counter()
    res = policy_iteration(kw, pc, out=out, log=log, writer=writer)
    writer.close()
    env = to_container(cfg.env)
    agent_env = DistilledAgent.env_options({k: env[k] for k in ("action", "obs") if k in env})
    return {"model": str(out / "best_policy.pt"), "kind": "distilled", "env": agent_env,
            "teacher": pc.teacher, "best_round": res["best_round"], "history": res["history"],
            "train_wall_s": time.perf_counter() - t0}
