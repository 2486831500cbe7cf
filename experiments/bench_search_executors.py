"""The policy search's wall time by executor: 1 worker process, N worker processes, N Ray workers.

    python -m llm_lb_gym.experiments.bench_search_executors               # 2 generations of the main job's search
    python -m llm_lb_gym.experiments.bench_search_executors --workers 4 --generations 3

The same search (the main job's, ``conf/robust.yaml``: scored_binding on the training
distribution, the constrained objective, fewer generations) three times; every run must give the
same history bit for bit (the executor only decides where an episode runs), and the speed-up is
the wall time of one worker over each, in all and after the start point's validation (which
holds the executor's start-up: Ray's local cluster and its workers' imports take ~10 s here). Ray (``pip install ray``) starts a local cluster of
``--workers`` CPUs here; on a real cluster ``ray.init()`` joins it and the same search fans out.
Prints the load average: on a shared machine other processes take the workers' cores.
"""

from __future__ import annotations

import argparse
import os
import time

from llm_lb_gym.agents.policy_search import SearchConfig, policy_search
from llm_lb_gym.experiments._hydra import compose, to_container


def _strip(history: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if k != "wall_s"} for row in history]


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--generations", type=int, default=2)
    ap.add_argument("--conditions", default="train", help="train | train_synthetic (no data needed)")
    args = ap.parse_args(argv)

    base = to_container(compose("robust", []).search)
    base.update(generations=args.generations, conditions=args.conditions)
    runs = [("processes", 1), ("processes", args.workers), ("ray", args.workers)]
    print(f"load average {os.getloadavg()[0]:.2f}; {args.generations} generations x "
          f"{base['population']} candidates x {base['conditions_per_generation']} episodes "
          f"+ {base['validation_episodes']} validation episodes per generation")
    out, first = {}, None
    for executor, workers in runs:
        sc = SearchConfig.from_options({**base, "executor": executor, "workers": workers})
        t0 = time.perf_counter()
        res = policy_search({}, sc, log=lambda *_: None)
        wall = time.perf_counter() - t0
        if executor == "ray":
            import ray

            ray.shutdown()
        first = first or res
        same = _strip(res["history"]) == _strip(first["history"])
        later = wall - res["history"][0]["wall_s"]   # after the start point's validation: no start-up
        out[f"{executor}x{workers}"] = (wall, later)
        one, one_later = out["processesx1"]
        print(f"| {executor} | {workers} | {wall:.1f} s | speed-up {one / wall:.2f}x | after the first "
              f"validation {later:.1f} s, speed-up {one_later / later:.2f}x | same history: {same} |", flush=True)
        if not same:
            raise SystemExit(f"{executor} x {workers}: the history differs from 1 worker's")
    print(f"load average {os.getloadavg()[0]:.2f}")
    return out


if __name__ == "__main__":
    main()
