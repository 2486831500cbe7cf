"""Router comparison on identical seeded episodes (``evaluate(cfg)``) and its paired statistics
(``paired_change``, ``summarize``): the library behind ``python -m llm_lb_gym.experiments.evaluate``, used by
train, improve, reproduce, load_sweep and merge.

Usage and outputs: ``experiments/evaluate.py``'s docstring (the command).
"""

from __future__ import annotations

from llm_lb_gym.extras import require

# before the imports below: name the extra, not a missing module
require("eval", "llm-lb-gym evaluate")   # heuristics only; an agent in the config requires 'rl' (_load_agent)

import csv
import time
from pathlib import Path

import numpy as np

from llm_lb_gym.experiments._accounting import describe_workload, filter_note, loss_warning, row_filters
from llm_lb_gym.experiments._entry_options import check_evaluate_options
from llm_lb_gym.experiments._hydra import (all_router_options, env_kwargs, router_options, run_dir,
                                to_container, write_run_record)
from llm_lb_gym.experiments._progress import progress_bar, say
from llm_lb_gym.experiments._tables import TABLE_COLUMNS, paired_change, paired_difference, summarize  # noqa: F401  (re-exported)

def plot_cdf(e2e: dict[str, np.ndarray], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, x in e2e.items():
        x = np.sort(x)
        ax.plot(x, np.arange(1, len(x) + 1) / len(x), label=name, lw=1.2)
    ax.set_xscale("log")
    ax.set_xlabel("end-to-end latency (s)")
    ax.set_ylabel("CDF over requests")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def evaluate(cfg, out: Path | None = None, leave_bars: bool = True) -> dict:
    """Run every policy on the same seeded episodes; returns rows, table and output dir.

    ``out``: where to write (default: the Hydra run directory); ``llm_lb_gym.experiments.train`` passes a
    subfolder so the evaluation's record does not overwrite the training run's, and
    ``leave_bars=False`` so the bar of an inner evaluation is cleared when it ends."""
    import gymnasium as gym

    import llm_lb_gym  # noqa: F401
    from llm_lb_gym.rollout import make_env_router, rollout_agent, rollout_router

    if to_container(cfg.get("agents")):   # trained agents: torch (heuristics alone need none)
        require("rl", "llm-lb-gym evaluate with agents")
        import torch

        torch.set_num_threads(1)
    check_evaluate_options(cfg)   # before any output is written or episode run
    out = Path(out) if out is not None else run_dir(cfg)
    write_run_record(out, cfg)
    kw = env_kwargs(cfg)
    kw["reward"] = {**(kw.get("reward") or {}), "mode": "baseline"}   # evaluate without guidance
    env = gym.make("LLMCluster-v0", **kw)
    filters = row_filters(env.unwrapped.workload)
    if filters is not None:   # the record again, now with what the workload's filters removed
        write_run_record(out, cfg, row_filters=filters)
    seeds = [int(cfg.seed) + i for i in range(int(cfg.episodes))]
    rows, e2e, t_start = [], {}, time.perf_counter()
    deciders = [(name, "router", None) for name in cfg.policies]
    for name, spec in (to_container(cfg.get("agents")) or {}).items():
        deciders.append((name, "agent", spec))
    bar = progress_bar(len(deciders) * len(seeds), "evaluate", cfg.get("progress", True), unit="episode",
                       leave=leave_bars)
    for name, kind, spec in deciders:
        bar.set_postfix_str(name, refresh=False)
        if kind == "router":
            router = make_env_router(name, env.unwrapped, **router_options(cfg, name))
            run = lambda s: rollout_router(env, router, s)  # noqa: E731
        else:
            agent, agent_env = _load_agent(spec, kw, env)
            run = lambda s, agent=agent, agent_env=agent_env: rollout_agent(agent_env, agent, s)  # noqa: E731
        lat = []
        for s in seeds:
            t_ep = time.perf_counter()
            res = run(s)
            rows.append({"policy": name, "seed": s, **res.metrics, "episode_return": res.episode_return,
                         "steps": res.steps, "wall_s": time.perf_counter() - t_ep})
            lat.append(res.latencies["e2e_s"])
            bar.update()
        e2e[name] = np.concatenate(lat)
        say(f"  {name}: mean E2E {np.mean([r['mean_e2e_s'] for r in rows if r['policy'] == name]):.3f} s")
    bar.close()
    keys = list(dict.fromkeys(k for r in rows for k in r))
    with open(out / "results.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)
    table = summarize(rows, cfg.baseline)
    wall = time.perf_counter() - t_start
    workload = describe_workload(env.unwrapped.workload)
    header = (f"{len(seeds)} episodes x {kw.get('num_requests')} requests, seeds {seeds[0]}..{seeds[-1]}, "
              f"{env.unwrapped.cluster_cfg.describe()}, "
              f"workload {workload}; wall {wall:.1f} s")
    note = filter_note(env.unwrapped.workload)
    if note:
        header += "\n\n" + note
    warning = loss_warning(rows)
    if warning:
        header += "\n\n" + warning
    (out / "summary.md").write_text(header + "\n\n" + table + "\n")
    if cfg.get("plot", True):
        plot_cdf(e2e, out / "latency_cdf.png")
    say(header)
    say(table)
    say(f"results: {out}")
    return {"rows": rows, "table": table, "out": out, "warning": warning, "workload": workload,
            "row_filters": filters}


def policy_options(cfg) -> dict:
    """Each router's options in this setting (``_hydra.all_router_options``)."""
    return all_router_options(cfg)


def load_agent_for(spec: dict, kw: dict):
    """A trained agent (``spec`` as :func:`_load_agent`'s) and the env it acts in, built from the
    env keywords ``kw`` (the benchmark's condition) merged with the agent's own options."""
    import gymnasium as gym

    if spec.get("env"):
        return _load_agent(spec, kw, None)
    env = gym.make("LLMCluster-v0", **kw)
    return _load_agent(spec, kw, env)


def _load_agent(spec: dict, kw: dict, env):
    """A trained agent and the env it acts in. ``spec``: ``kind``, ``path``, and optionally
    ``env`` (env options that differ for this agent, e.g. the learned router's action and
    observation options; merged into the evaluation's) and ``any_instances`` (act through the
    network on any instance count: ``llm_lb_gym.agents.equivariant.SetPolicyActor``, for a model trained on
    a different ``num_instances``). Requests, seeds and the cluster stay the evaluation's."""
    import gymnasium as gym

    from llm_lb_gym.agents.factory import load_agent

    own = spec.get("env") or {}
    agent_env = env
    if own:
        merged = dict(kw)
        for key, value in own.items():
            merged[key] = {**(merged.get(key) or {}), **value} if isinstance(value, dict) else value
        agent_env = gym.make("LLMCluster-v0", **merged)
    if spec.get("kind") == "distilled":     # llm_lb_gym.agents.policy_iteration's network (best_policy.pt)
        from llm_lb_gym.agents.policy_iteration import DistilledAgent

        return DistilledAgent.load(spec["path"], agent_env), agent_env
    if spec.get("any_instances"):
        from llm_lb_gym.agents.equivariant import SetPolicyActor

        return SetPolicyActor(load_agent(spec["kind"], spec["path"])), agent_env
    return load_agent(spec["kind"], spec["path"], env=agent_env), agent_env
