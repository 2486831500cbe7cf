"""Probe: named scored_binding option sets on episodes drawn from the training distribution.

    python -m llm_lb_gym.experiments.probe_robust                    # the default points, 16 pairs
    python -m llm_lb_gym.experiments.probe_robust --episodes 32 --space train_synthetic
    python -m llm_lb_gym.experiments.probe_robust --points '{"a": {"period_s": 0.0}}'

A cheap look before a long search (``llm-lb-gym robust``): each point plays the same
(condition, seed) pairs drawn from ``suite.suites.TRAIN`` (never the held-out suite), and the
table gives what the constrained objective weighs: the mean change of mean E2E vs round robin
(100 log ratio, paired), the mean tail-constraint violation, the objective, the geometric-mean
p99 TTFT ratio and the mean SLO change vs round robin. Not an entry point of the package's
results: a probe, kept apart from the commands.
"""

from __future__ import annotations

import argparse
import json
import math
import time

import numpy as np

POINTS = {
    "late_binding (class defaults)": {},
    "late_binding full reservation": {"reserve_frac": 1.0},
    "near-capacity search (0.5.0, oracle)": {
        "period_s": 0.0888, "reserve_frac": 1.0, "prompt_weight": 0.3566, "room_margin": 0.0273,
        "growth_frac": 1.0},
    "release at once (period 0)": {"period_s": 0.0},
    "period 0, hold <= 2 s": {"period_s": 0.0, "max_hold_s": 2.0},
    "period 0.1, hold <= 5 s": {"max_hold_s": 5.0},
    "growth 0.5, hedge 0.5": {"growth_frac": 0.5, "hedge": 0.5, "reserve_frac": 1.0},
    "period 0, growth 0.5, hold <= 5 s": {"period_s": 0.0, "growth_frac": 0.5, "reserve_frac": 1.0,
                                          "max_hold_s": 5.0},
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--space", default="train", choices=("train", "train_synthetic"))
    ap.add_argument("--episodes", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0, help="draws the (condition, seed) pairs")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--points", default=None, help="JSON {name: scored_binding options}")
    args = ap.parse_args()

    from llm_lb_gym.agents.policy_search import (Episodes, SearchConfig, constraint_violation,
                                                 validation_pairs)

    cfg = SearchConfig(conditions=args.space, validation_episodes=args.episodes,
                       validation_seeds=(700,), seed=args.seed, objective="constrained")
    pairs = validation_pairs(cfg, {})
    points = json.loads(args.points) if args.points else POINTS
    t0 = time.perf_counter()
    with Episodes(args.workers) as eps:
        rr = eps.table("round_robin", {}, pairs)
        e_rr = np.array([r["mean_e2e_s"] for r in rr])
        print(f"{len(pairs)} episodes from {args.space} (seed {args.seed}); round robin mean E2E "
              f"{e_rr.mean():.2f} s", flush=True)
        print("| point | vs round robin (100 log ratio, 95% CI) | violation | objective | p99 TTFT / RR "
              "| SLO vs RR (points) | max router wait (s) |\n|---|---|---|---|---|---|---|")
        for name, opts in points.items():
            res = eps.table("scored_binding", opts, pairs)
            x = 100.0 * np.log(np.array([r["mean_e2e_s"] for r in res]) / e_rr)
            half = 1.96 * x.std(ddof=1) / math.sqrt(len(x))
            v = constraint_violation(res, rr)
            ttft = math.exp(np.mean(np.log([a["p99_ttft_s"] / b["p99_ttft_s"] for a, b in zip(res, rr)])))
            slo = np.nanmean([a["slo_attainment_pct"] - b["slo_attainment_pct"] for a, b in zip(res, rr)])
            wait = max(r.get("max_router_wait_s") or 0.0 for r in res) if "max_router_wait_s" in res[0] else math.nan
            print(f"| {name} | {x.mean():+.2f} ± {half:.2f} | {v.mean():.2f} | {x.mean() + v.mean():+.2f} "
                  f"| {ttft:.2f} | {slo:+.1f} | {wait:.1f} |", flush=True)
    print(f"wall {time.perf_counter() - t0:.0f} s ({args.workers} workers)")


if __name__ == "__main__":
    main()
