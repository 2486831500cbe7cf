"""Probe scored_binding's levers one at a time against late_binding on the same seeded episodes.

Why: before searching a family of routers, learn whether any direction away from the teacher is
worth more than the noise (docs/policy_iteration.md, "Policy search on whole episodes"). Each
point is the setting's late_binding mapped into scored_binding (``from_late_binding``) with a
few options changed; every point plays the same seeds (never the validation or test seeds).

    python -m llm_lb_gym.experiments.probe_scored_binding experiment=v100_near_capacity
    python -m llm_lb_gym.experiments.probe_scored_binding experiment=paper_v100_kv_limited --seeds 600-607
    python -m llm_lb_gym.experiments.probe_scored_binding experiment=slo_near_capacity \
        --points '{"period 0, late 20, growth 0.5": {"period_s": 0, "late_penalty": 20, "growth_frac": 0.5}}'

Prints late_binding's and round robin's means, then per point the paired change of mean E2E
vs late_binding (the mean over episodes of 100 log(E2E / late_binding's), ~% for small changes,
with its 95% Student-t CI and the per-episode SD), p99 E2E and SLO attainment.
"""

from __future__ import annotations

from llm_lb_gym.extras import require

# before the imports below: name the extra, not a missing module
require("rl", "llm-lb-gym probe_scored_binding")

import argparse
import json
import math
import time

import numpy as np

from ._hydra import compose, env_kwargs
from ._tables import paired_difference

POINTS = {
    "period 0": {"period_s": 0.0}, "period 0.05": {"period_s": 0.05}, "period 0.2": {"period_s": 0.2},
    "reserve 0.75": {"reserve_frac": 0.75}, "reserve 0.25": {"reserve_frac": 0.25}, "reserve 0": {"reserve_frac": 0.0},
    "margin -0.05": {"room_margin": -0.05}, "margin 0.05": {"room_margin": 0.05}, "margin 0.1": {"room_margin": 0.1},
    "margin 0.2": {"room_margin": 0.2}, "growth 0.25": {"growth_frac": 0.25}, "growth 0.5": {"growth_frac": 0.5},
    "growth 1": {"growth_frac": 1.0}, "age 0.05/s": {"age_per_s": 0.05}, "age 1/s": {"age_per_s": 1.0},
    "prompt_w -0.5": {"prompt_weight": -0.5}, "prompt_w 0.5": {"prompt_weight": 0.5},
    "prompt_w 1": {"prompt_weight": 1.0}, "seq cap 0.25": {"seq_cap_frac": 0.25},
    "work_w 0.5": {"work_weight": 0.5}, "work_w 10": {"work_weight": 10.0},
}
"""The hand-picked points: one lever at a time, each a step or two of the search's scale."""


def _seeds(text: str) -> list[int]:
    lo, _, hi = text.partition("-")
    return list(range(int(lo), int(hi) + 1)) if hi else [int(s) for s in text.split(",")]


def _mean(rows, key) -> float:
    v = [r[key] for r in rows if r[key] is not None]
    return float(np.mean(v)) if v else math.nan


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("overrides", nargs="*", help="Hydra overrides of conf/evaluate.yaml, e.g. experiment=v100_near_capacity")
    ap.add_argument("--seeds", default="600-611", help="seeds: a range lo-hi or a comma list (default 600-611)")
    ap.add_argument("--points", default=None, help="JSON {name: {option: value}} instead of the built-in points")
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args(argv)

    from llm_lb_gym.agents.policy_search import Episodes, start_options

    cfg = compose("evaluate", args.overrides)
    kw = env_kwargs(cfg)
    lb = dict((cfg.get("eval") or {}).get("policy_options", {}).get("late_binding") or {})
    start = start_options(lb).as_dict()
    points = json.loads(args.points) if args.points else POINTS
    seeds = _seeds(args.seeds)
    t0 = time.perf_counter()
    pairs = [(kw, s) for s in seeds]
    with Episodes(args.workers) as eps:
        ref, rr = eps.table("late_binding", lb, pairs), eps.table("round_robin", {}, pairs)
        e_ref = np.array([r["mean_e2e_s"] for r in ref])
        e_rr = np.array([r["mean_e2e_s"] for r in rr])
        print(f"late_binding {lb}: mean E2E {e_ref.mean():.3f} s ({100 * np.mean(e_ref / e_rr - 1):+.2f}% "
              f"vs round robin), p99 {_mean(ref, 'p99_e2e_s'):.2f} s (round robin {_mean(rr, 'p99_e2e_s'):.2f}), "
              f"SLO {_mean(ref, 'slo_attainment_pct'):.1f}% (round robin {_mean(rr, 'slo_attainment_pct'):.1f}%); "
              f"seeds {seeds[0]}..{seeds[-1]}", flush=True)
        print("| point | vs late_binding (95% CI) | SD per episode | p99 E2E (s) | SLO met (%) |\n|---|---|---|---|---|")
        for name, change in points.items():
            res = eps.table("scored_binding", {**start, **change}, pairs)
            x = 100.0 * np.log(np.array([r["mean_e2e_s"] for r in res]) / e_ref)
            mean, half = paired_difference(x, np.zeros_like(x))
            print(f"| {name} | {mean:+.2f} ± {half:.2f}% | {x.std(ddof=1) if len(x) > 1 else math.nan:.2f} | "
                  f"{_mean(res, 'p99_e2e_s'):.2f} | {_mean(res, 'slo_attainment_pct'):.1f} |", flush=True)
    print(f"wall {time.perf_counter() - t0:.0f} s ({args.workers} workers)")


if __name__ == "__main__":
    main()
