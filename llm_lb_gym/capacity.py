"""Service capacity of a setting, measured: what load factors (offered rate / capacity) divide by.

Used by the load sweep, ``reproduce`` (each table's header) and the paper-regime check
(``llm_lb_gym.calibration.paper_v100``); it lives in the package, not in an entry point, so those share
one definition without importing each other.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from .envs.router_factory import make_env_router
from .rollout import rollout_router
from .sim.request import Status
from .workload.registry import uses_synthetic_arrivals

CAPACITY_QUANTILES = (0.1, 0.9)


def capacity_rps(kw: dict, seed: int, rate_rps: float = 1.0e6, router: str = "round_robin") -> float:
    """Steady-state service capacity (requests/s) of ``router`` (round robin) on the env ``kw``.

    All requests arrive within ``num_requests / rate_rps`` seconds (a timestamped trace is
    replayed ``rate_scale`` = 1e4 times faster instead), so every instance is saturated; the rate
    is the completions between the two ``CAPACITY_QUANTILES`` of finish time divided by the time
    between them.
    """
    kw = {**kw, "arrival_rate_rps": rate_rps, "reward": {**(kw.get("reward") or {}), "mode": "baseline"}}
    workload = dict(kw.get("workload") or {})
    if not uses_synthetic_arrivals(workload.get("name", "task_mix"), workload):
        kw["workload"] = {**workload, "rate_scale": 1.0e4}
    env = gym.make("LLMCluster-v0", **kw)
    rollout_router(env, make_env_router(router, env.unwrapped), seed)
    table = env.unwrapped.cluster.table
    finish = np.sort(table.column("finish_s")[table.column("status") == Status.FINISHED])
    lo, hi = (int(q * (len(finish) - 1)) for q in CAPACITY_QUANTILES)
    return float((hi - lo) / (finish[hi] - finish[lo]))
