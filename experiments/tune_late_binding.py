"""Tune ``late_binding``'s options for an experiment on validation seeds (never the test seeds).

Why: late_binding's release period and reservation decide how much it gains, and the best values
move with the latency model and the load (package 0.1's near-capacity choice, 1 s rounds, gains
half of what 0.1 s rounds gain on package 0.2). Each setting's ``eval.policy_options`` records
the choice with the figures this script printed; the learned router imitates that teacher.

    python -m llm_lb_gym.experiments.tune_late_binding experiment=v100_near_capacity
    python -m llm_lb_gym.experiments.tune_late_binding experiment=paper_v100 --periods 0,0.05,0.1,0.2,0.5 --reserves full,prompt

Prints round robin's mean E2E per seed, three load-balancing references and, for every grid
point, the mean over the seeds of each episode's mean E2E relative to round robin's (paired).
"""

from __future__ import annotations

from llm_lb_gym.extras import require

# before the imports below: name the extra, not a missing module
require("rl", "llm-lb-gym tune_late_binding")

import argparse
import itertools

import numpy as np

from ._hydra import compose, env_kwargs


def episode_mean_e2e(env, router: str, seeds, **options) -> np.ndarray:
    """Mean E2E of the finished requests per seeded episode."""
    from llm_lb_gym.rollout import make_env_router, rollout_router
    from llm_lb_gym.sim.request import Status

    out = []
    for seed in seeds:
        rollout_router(env, make_env_router(router, env.unwrapped, **options), seed)
        tb = env.unwrapped.cluster.table
        done = tb.column("status") == Status.FINISHED
        out.append(float((tb.column("finish_s") - tb.column("arrival_s"))[done].mean()))
    return np.array(out)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("overrides", nargs="*", help="Hydra overrides of conf/train.yaml, e.g. experiment=paper_v100")
    ap.add_argument("--seeds", default="500,501,502", help="validation seeds (comma-separated)")
    ap.add_argument("--periods", default="0,0.05,0.1,0.25,0.5,1.0", help="period_s values")
    ap.add_argument("--reserves", default="full,prompt", help="reserve values")
    ap.add_argument("--rounds", default="since_release", help="rounds values")
    args = ap.parse_args(argv)

    import gymnasium as gym

    import llm_lb_gym  # noqa: F401

    cfg = compose("train", args.overrides)
    env = gym.make("LLMCluster-v0", **env_kwargs(cfg))
    seeds = [int(s) for s in args.seeds.split(",")]
    rr = episode_mean_e2e(env, "round_robin", seeds)
    print(f"round_robin mean E2E per seed {seeds}: {np.round(rr, 2).tolist()} s")
    for name in ("max_capacity", "power_of_two", "min_min"):
        print(f"{name}: {100 * np.mean(episode_mean_e2e(env, name, seeds) / rr - 1):+.2f}%")
    grid = itertools.product([float(p) for p in args.periods.split(",")], args.reserves.split(","),
                             args.rounds.split(","))
    for period, reserve, rounds in grid:
        v = episode_mean_e2e(env, "late_binding", seeds, period_s=period, reserve=reserve,
                             rounds=rounds, order="shortest")
        print(f"late_binding period_s={period:g} reserve={reserve} rounds={rounds}: "
              f"{100 * np.mean(v / rr - 1):+.2f}%", flush=True)


if __name__ == "__main__":
    main()
