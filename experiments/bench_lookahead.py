"""Cost and benefit of the lookahead router, as printed figures.

    python -m llm_lb_gym.experiments.bench_lookahead                       # 3 regimes, defaults, 3 seeds
    python -m llm_lb_gym.experiments.bench_lookahead --regimes near --horizons 5 10 30 --bases least_requests round_robin
    python -m llm_lb_gym.experiments.bench_lookahead --requests 300 --seeds 1   # a quick look

For each regime, round robin and each lookahead setting run the same seeded episodes
(``rollout_router(env, router, seed)``, seeds 1000, 1001, ...: identical requests and
predictions). Printed per setting: mean E2E and its paired change vs round robin (mean over
seeds, and per seed), the wall time per decision (median, p90, over every decision of every
episode), and wall / CPU seconds per episode. One process, one core; the load average is
printed because a busy host inflates wall times (the CPU figure is the stable one).

Regimes: ``default`` (the paper's main setting: 4 x Llama-2-7B on V100, 20 req/s),
``near`` (52 req/s, near the cluster's capacity), ``overloaded`` (20 req/s on instances with 72
KV blocks each, so requests queue at the instances and preempt).
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

REGIMES = {
    "default": {},
    "near": {"arrival_rate_rps": 52.0},
    "overloaded": {"engine": {"preset": "llama2-7b-v100", "num_kv_blocks": 72}},
}


def run(regime: str, requests: int, seeds: list[int], settings: list[dict],
        heuristics: list[str] = ()) -> list[dict]:
    from llm_lb_gym.envs.cluster_env import LLMClusterEnv
    from llm_lb_gym.rollout import make_env_router, rollout_router

    env = LLMClusterEnv(num_requests=requests, **REGIMES[regime])
    rows = []
    for name, opts in ([("round_robin", None)] + [(h, None) for h in heuristics]
                       + [("lookahead", o) for o in settings]):
        per_seed, walls, cpus, decision_s = [], [], [], []
        for seed in seeds:
            router = make_env_router(name, env, **(opts or {}))
            w0, c0 = time.perf_counter(), time.process_time()
            res = rollout_router(env, router, seed)
            walls.append(time.perf_counter() - w0)
            cpus.append(time.process_time() - c0)
            assert res.metrics["unfinished"] == 0
            per_seed.append(res.metrics["mean_e2e_s"])
            decision_s += getattr(router, "decision_wall_s", [])
        rows.append({"regime": regime, "router": name, "options": opts or {}, "e2e": per_seed,
                     "wall_s": walls, "cpu_s": cpus,
                     "decision_ms": (np.median(decision_s) * 1e3, np.percentile(decision_s, 90) * 1e3,
                                     len(decision_s) / len(seeds)) if decision_s else None})
        _print_row(rows[-1], rows[0]["e2e"])
    return rows


def _print_row(row: dict, rr: list[float]) -> None:
    e2e = np.array(row["e2e"])
    change = 100.0 * (e2e / np.array(rr) - 1.0)
    opts = ", ".join(f"{k}={v}" for k, v in row["options"].items()) or "-"
    cost = ""
    if row["decision_ms"]:
        med, p90, n = row["decision_ms"]
        cost = f" | per decision {med:.1f} ms median, {p90:.1f} ms p90, {n:.0f} decisions/episode"
    print(f"{row['regime']:>10} {row['router']:<14} {opts:<40} mean E2E {e2e.mean():7.3f} s "
          f"({change.mean():+.2f}% vs RR; per seed {', '.join(f'{c:+.1f}' for c in change)}) | "
          f"episode {np.mean(row['wall_s']):6.1f} s wall, {np.mean(row['cpu_s']):6.1f} s CPU{cost}",
          flush=True)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--regimes", nargs="+", default=list(REGIMES), choices=list(REGIMES))
    ap.add_argument("--horizons", nargs="+", type=float, default=[5.0])
    ap.add_argument("--bases", nargs="+", default=["least_requests"])
    ap.add_argument("--candidates", nargs="+", type=int, default=[1])
    ap.add_argument("--scores", nargs="+", default=["drain"], choices=["window", "drain"])
    ap.add_argument("--samples", nargs="+", type=int, default=[1])
    ap.add_argument("--see-future", action="store_true", help="also run the clairvoyant variant")
    ap.add_argument("--heuristics", nargs="*", default=["least_requests"],
                    help="plain routers to print next to round robin (the bases, for reference)")
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--seeds", type=int, default=3, help="episodes per setting (seeds 1000, 1001, ...)")
    args = ap.parse_args(argv)
    from llm_lb_gym.sim._compiled import engine_class

    print(f"engine {engine_class().__module__}; load average {os.getloadavg()}; "
          f"{args.requests} requests per episode, seeds 1000..{999 + args.seeds}", flush=True)
    settings = [{"plan_horizon_s": h, "base": b, "score": sc, "candidates": k, "samples": 1 if sf else n,
                 "see_future": sf}
                for b in args.bases for sc in args.scores for h in args.horizons for k in args.candidates
                for n in args.samples for sf in ([False, True] if args.see_future else [False])]
    settings = list({tuple(s.items()): s for s in settings}.values())   # see_future dedups samples
    seeds = list(range(1000, 1000 + args.seeds))
    for regime in args.regimes:
        run(regime, args.requests, seeds, settings, args.heuristics)
    print(f"load average at the end {os.getloadavg()}")


if __name__ == "__main__":
    main()
