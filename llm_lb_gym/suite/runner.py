"""Play policies on (condition, seed) episodes: the one loop the benchmark and policy search share.

Every policy of a run plays the same seeded episode of each condition (common random numbers:
the same requests, the same predictions), so differences between policies are paired. A policy
is a router with options (``PolicySpec``), tagged ``heuristic``, ``trained`` (options or a model
found by training) or ``clairvoyant`` (played with the oracle predictor instead of the
condition's deployable one: a reference, never a result). Models a router cannot express (a
distilled network) plug in through ``PolicySpec.make``: a function ``(env) -> router`` called
once per worker process and env; a trained agent that acts in an env of its own options (a
network of ``llm-lb-gym improve`` or ``train``) through ``PolicySpec.agent``: ``(the condition's
env keywords) -> (agent, the env it acts in)``, played with ``rollout_agent`` on the same seeded
episode.

Episodes run in ``workers`` forked processes, each keeping a few envs (one per condition it
met); capacities are measured in the parent first so every worker shares them.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable

from .._validate import check_choice
from .condition import Condition

KINDS = ("heuristic", "trained", "clairvoyant")
METRICS = ("mean_e2e_s", "p50_e2e_s", "p99_e2e_s", "mean_ttft_s", "p99_ttft_s", "mean_tbt_s",
           "p99_tbt_s", "slo_attainment_pct", "goodput_rps", "throughput_rps",
           "mean_router_wait_s", "max_router_wait_s", "preemptions", "completed", "rejected",
           "unfinished", "num_requests")
"""What each episode records (``info["metrics"]`` keys)."""


@dataclass(frozen=True)
class PolicySpec:
    """One row of a benchmark: a router and its options, or a router factory."""

    label: str
    router: str = ""
    options: dict = field(default_factory=dict)
    kind: str = "heuristic"
    make: Callable[[Any], Any] | None = None
    """``(unwrapped env) -> router`` for policies that are not registry routers (models)."""
    agent: Callable[[dict], tuple[Any, Any]] | None = None
    """``(condition env keywords) -> (agent, env)``: a trained agent and the env it acts in."""

    def __post_init__(self) -> None:
        check_choice(f"policy {self.label!r} kind", self.kind, KINDS)
        if not self.router and self.make is None and self.agent is None:
            raise ValueError(f"policy {self.label!r} needs a router name, make= or agent=")

    def __hash__(self) -> int:
        return hash((self.label, self.router, self.kind))


def condition_kwargs(cond: Condition, kind: str) -> dict:
    kw = cond.env_kwargs()
    if kind == "clairvoyant":
        kw["predictor"] = "oracle"
    return kw


_ENVS: OrderedDict = OrderedDict()
_MAX_ENVS = 6


def _env(kw: dict):
    import gymnasium as gym

    import llm_lb_gym  # noqa: F401

    key = repr(sorted(kw.items()))
    if key in _ENVS:
        _ENVS.move_to_end(key)
        return _ENVS[key]
    if len(_ENVS) >= _MAX_ENVS:
        _ENVS.popitem(last=False)
    _ENVS[key] = gym.make("LLMCluster-v0", **kw).unwrapped
    return _ENVS[key]


def play(kw: dict, policy: PolicySpec, seed: int) -> dict:
    """Metrics of one seeded episode of env ``kw`` under ``policy``."""
    from ..rollout import make_env_router, rollout_agent, rollout_router

    if policy.agent is not None:
        agent, agent_env = policy.agent(kw)
        m = rollout_agent(agent_env, agent, seed).metrics
        return {k: m.get(k) for k in METRICS}
    env = _env(kw)
    router = policy.make(env) if policy.make is not None else make_env_router(
        policy.router, env, **policy.options)
    m = rollout_router(env, router, seed).metrics
    return {k: m.get(k) for k in METRICS}


_ARGS: list = []
"""The jobs of the run in progress: forked workers inherit them, so a policy's ``make`` (a
closure, a loaded model) never has to be pickled."""


def _play_index(i: int) -> dict:
    kw, policy, seed = _ARGS[i]
    return play(kw, policy, seed)


def run_episodes(jobs: list[tuple[Condition, PolicySpec, int]], workers: int = 1,
                 progress: Callable[[int, int], None] | None = None) -> list[dict]:
    """Play every (condition, policy, seed) job; rows carry ``condition``, ``policy``, ``kind``,
    ``seed`` and ``METRICS``, in the order of ``jobs``."""
    kws = {}
    for cond, pol, _ in jobs:               # measure capacities here: workers inherit them
        key = (cond, pol.kind == "clairvoyant")
        if key not in kws:
            kws[key] = condition_kwargs(cond, pol.kind)
    _ARGS[:] = [(kws[(c, p.kind == "clairvoyant")], p, s) for c, p, s in jobs]
    n = len(_ARGS)
    out = []
    try:
        if workers <= 1 or n <= 1:
            results = map(_play_index, range(n))
            pool = None
        else:
            import multiprocessing as mp
            from concurrent.futures import ProcessPoolExecutor

            pool = ProcessPoolExecutor(workers, mp_context=mp.get_context("fork"))
            results = pool.map(_play_index, range(n), chunksize=1)
        for i, r in enumerate(results):
            out.append(r)
            if progress:
                progress(i + 1, n)
    finally:
        if workers > 1 and n > 1:
            pool.shutdown()
        _ARGS.clear()
    return [{"condition": c.name, "policy": p.label, "kind": p.kind, "seed": s, **m}
            for (c, p, s), m in zip(jobs, out)]
