"""Decision cost of routers: the time of each routing decision over whole episodes, p50/p99/max.

    python -m llm_lb_gym.experiments.bench_decisions                       # the default routers, two conditions
    python -m llm_lb_gym.experiments.bench_decisions --routers scored_binding --options '{"hedge": 0.5}'

What a deployment pays per decision (the router's own computation on the cluster state, the
simulation excluded): every ``routers.drive.decide`` call of an episode, timed with
``perf_counter_ns``, for episodes of the held-out suite's first task-mix condition and of a
trace condition when ``../shared/data`` has it. Prints the load average beside the figures:
on a shared machine the tail of a timing is what other processes leave it.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

from llm_lb_gym.experiments._hydra import default_router_options


def decision_times(cond, router: str, options: dict, seed: int) -> np.ndarray:
    import gymnasium as gym

    import llm_lb_gym  # noqa: F401
    from llm_lb_gym.rollout import make_env_router, start_episode, take_choice
    from llm_lb_gym.routers.drive import decide

    env = gym.make("LLMCluster-v0", **cond.env_kwargs()).unwrapped
    r = make_env_router(router, env, **options)
    start_episode(env, r, seed)
    out = []
    clock = time.perf_counter_ns
    while True:
        c = env.cluster
        if c.queue:
            t0 = clock()
            choice = decide(c, r)
            out.append(clock() - t0)
        else:
            choice = None
        _, _, term, trunc, _ = take_choice(env, choice)
        if term or trunc:
            return np.array(out, np.float64) / 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--routers", default="round_robin,least_requests,slo_aware,late_binding,scored_binding")
    ap.add_argument("--options", default=None,
                    help="JSON options for scored_binding (default: the default setting's, the main job's router)")
    ap.add_argument("--seed", type=int, default=1000)
    args = ap.parse_args()

    from llm_lb_gym.suite.condition import missing_data
    from llm_lb_gym.suite.suites import HELDOUT

    conds = [c for c in HELDOUT.conditions if c.workload == "task_mix"][:1]
    conds += [c for c in HELDOUT.conditions if c.workload == "azure_conv" and missing_data(c) is None][:1]
    opts = json.loads(args.options) if args.options is not None else default_router_options("scored_binding")
    print(f"load average {os.getloadavg()[0]:.2f}; seed {args.seed}")
    print("| condition | router | decisions | p50 (ms) | p99 (ms) | max (ms) |\n|---|---|---|---|---|---|")
    for c in conds:
        for name in args.routers.split(","):
            ms = decision_times(c, name, opts if name == "scored_binding" else {}, args.seed)
            print(f"| {c.name} | {name} | {len(ms)} | {np.percentile(ms, 50):.3f} | "
                  f"{np.percentile(ms, 99):.3f} | {ms.max():.3f} |", flush=True)
    print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
