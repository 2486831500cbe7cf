"""Policy search on whole episodes: an evolution strategy over ``scored_binding``'s options.

Why not per-state labels: near capacity one sampled future's advantages correlated -0.11 with
a 32-future reference (docs/policy_iteration.md), so distilling them learned noise. Whole
episodes are a far better-conditioned signal: two routers run on the same seeded episode
(common random numbers: the same requests and predictions) differ in mean E2E with a paired
SD of ~1% per episode, so a handful of seeds resolves a fraction of a percent. The policy is
small enough to search directly: ``llm_lb_gym.routers.scored_binding``'s options are the
parameter vector, and the search starts at the point that *is* the setting's late_binding.

The search (a (mu/mu_w, lambda)-ES with mirrored sampling and cumulative step-size adaptation,
Hansen's CMA-ES without the covariance update; each parameter is pre-scaled by its ``SCALES``
entry, so an isotropic step is sensible):

- candidate theta = clip(start + scale * x) per searched option;
- objective (lower is better) on the generation's training seeds, every candidate on the same
  seeds: ``e2e``: the mean over seeds of 100 log(E2E(theta, s) / E2E(start, s)), i.e. % vs the
  start point; ``slo``: minus the mean SLO attainment (points) plus ``slo_penalty`` x the
  excess of mean E2E over round robin's (% of it, 0 when below);
- the seeds rotate each generation (a fresh block of ``seeds_per_generation`` from
  ``train_seed``), so the search cannot overfit a few episodes;
- after each generation the new mean is played on ``validation_seeds`` and the best point on
  validation (the start point included) is kept: the result is never worse on validation than
  the start.

Over a distribution of conditions (``conditions="train"``, ``llm_lb_gym.suite.suites.TRAIN``):
each generation draws ``conditions_per_generation`` (condition, seed) pairs (workload with its
training rows, load, predictor accuracy, cluster) and every candidate plays all of them; the
validation pairs are drawn once from the same space with their own seed. The objective
``constrained`` is the one a deployment would accept: the mean over pairs of 100 log(E2E /
round robin's E2E on the same pair) plus ``constraint_penalty`` x the mean violation of the tail
constraint (100 x the log excess of p99 TTFT beyond 1.1 x round robin's, and the SLO attainment
points below round robin's - 2), so mean latency counts only where the tail does not pay for it.

Episodes run in ``workers`` processes (fork), each with its own envs, or as Ray tasks
(``executor="ray"``, ``ray.init()`` joins a running cluster or starts a local one); one episode
of 2,000 requests takes ~0.2-0.3 s here, so a generation of 12 candidates x 8 seeds is ~15 s on
2 cores. Everything is seeded: the ES draws from ``default_rng(seed)``, the conditions from
``default_rng([seed, generation])``, the episodes from their seeds; which worker plays which
episode changes nothing.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from llm_lb_gym._validate import ConfigError, check_choice, check_int, check_range
from llm_lb_gym.routers.scored_binding import ORDER_WEIGHTS, ScoredBindingOptions

OBJECTIVES = ("e2e", "slo", "constrained")
CONDITION_SPACES = ("setting", "train", "train_synthetic")
EXECUTORS = ("processes", "ray")
ROUTER = "scored_binding"
SCALES: dict[str, float] = {
    "period_s": 0.1, "reserve_frac": 0.25, "age_per_s": 0.2, "prompt_weight": 0.25,
    "late_penalty": 2.0, "room_margin": 0.05, "growth_frac": 0.25, "seq_cap_frac": 0.1,
    "work_weight": 1.0, "hedge": 0.25, "max_hold_s": 5.0,
}
"""One unit of the search's step in each option's own units: about the change that moves mean
E2E by a point or two in the probe (docs/policy_iteration.md)."""
BOUNDS: dict[str, tuple[float, float]] = {
    "period_s": (0.0, 2.0), "reserve_frac": (0.0, 1.0), **ORDER_WEIGHTS,
    "room_margin": (-0.5, 0.5), "growth_frac": (0.0, 1.0), "seq_cap_frac": (0.02, 1.0), "work_weight": (0.0, 100.0),
    "hedge": (0.0, 1.0), "max_hold_s": (0.25, 120.0),
}
NONE_START = {"max_hold_s": 120.0}
"""Where a searched option whose start is None (no bound) starts: the top of its range."""
"""Where candidates are clipped (inside the options' validated ranges)."""


@dataclass(frozen=True)
class SearchConfig:
    """Everything one run of :func:`policy_search` needs (``conf/policy_search.yaml``)."""

    start: dict = field(default_factory=dict)
    """The start point: late_binding options (mapped by ``ScoredBindingOptions.from_late_binding``)
    or scored_binding options; unset options take scored_binding's defaults."""
    params: tuple = ("period_s", "reserve_frac", "age_per_s", "prompt_weight", "room_margin",
                     "work_weight")
    """Options searched (keys of ``SCALES``); the rest stay at the start point."""
    objective: str = "e2e"
    generations: int = 20
    population: int = 12
    """Candidates per generation (even: mirrored pairs)."""
    sigma0: float = 1.0
    """Initial step in units of ``SCALES``."""
    seeds_per_generation: int = 8
    train_seed: int = 300
    """Generation g uses seeds ``train_seed + g * seeds_per_generation ..`` (disjoint from
    validation 500.. and test 1000..)."""
    validation_seeds: tuple = (500, 501, 502, 503, 504, 505, 506, 507)
    slo_penalty: float = 2.0
    """``objective=slo``: attainment points given up per % of mean E2E above round robin's."""
    conditions: str = "setting"
    """``setting``: every episode is the env given to :func:`policy_search`; ``train``: pairs
    drawn from ``suite.suites.TRAIN`` (``train_synthetic``: its task-mix part, no data needed)."""
    conditions_per_generation: int = 8
    """(condition, seed) pairs each generation draws (``conditions`` != setting)."""
    validation_episodes: int = 16
    """Validation pairs drawn once from the space (``conditions`` != setting; seeds from 500)."""
    constraint_penalty: float = 1.0
    """``objective=constrained``: weight of the tail constraint's violation (module doc)."""
    executor: str = "processes"
    """``processes``: ``workers`` forked processes; ``ray``: Ray tasks (a cluster shortens it)."""
    workers: int = 2
    seed: int = 0

    def __post_init__(self) -> None:
        p = "search"
        check_choice(f"{p}.objective", self.objective, OBJECTIVES)
        if not self.params:
            raise ConfigError(f"{p}.params is empty; allowed: a list of {sorted(SCALES)}")
        for name in self.params:
            check_choice(f"{p}.params[]", name, tuple(SCALES))
        if len(set(self.params)) != len(self.params):
            raise ConfigError(f"{p}.params lists an option twice: {list(self.params)}")
        for name, lo in (("generations", 0), ("population", 2), ("seeds_per_generation", 1),
                         ("train_seed", 0), ("workers", 1), ("seed", 0)):
            check_int(f"{p}.{name}", getattr(self, name), lo)
        if self.population % 2:
            raise ConfigError(f"{p}.population={self.population} is odd; allowed: even (mirrored pairs)")
        check_range(f"{p}.sigma0", self.sigma0, 0.0, 100.0, lo_open=True)
        check_range(f"{p}.slo_penalty", self.slo_penalty, 0.0)
        check_choice(f"{p}.conditions", self.conditions, CONDITION_SPACES)
        check_int(f"{p}.conditions_per_generation", self.conditions_per_generation, 1)
        check_int(f"{p}.validation_episodes", self.validation_episodes, 1)
        check_range(f"{p}.constraint_penalty", self.constraint_penalty, 0.0)
        check_choice(f"{p}.executor", self.executor, EXECUTORS)
        if self.executor == "ray":
            from llm_lb_gym.extras import require
            require("ray", "search.executor=ray")
        if not self.validation_seeds:
            raise ConfigError(f"{p}.validation_seeds is empty; allowed: a list of seeds")
        for s in self.validation_seeds:
            check_int(f"{p}.validation_seeds[]", s, 0)
        start_options(self.start)   # a bad start point fails here, before any episode

    @property
    def dim(self) -> int:
        return len(self.params)

    @classmethod
    def from_options(cls, opts: dict) -> "SearchConfig":
        """From a plain dict (a Hydra ``search`` node): unknown keys are named, lists become tuples."""
        from llm_lb_gym._validate import reject_unknown

        opts = dict(opts)
        reject_unknown("search", opts, [f.name for f in fields(cls)])
        for key in ("params", "validation_seeds"):
            if key in opts:
                opts[key] = tuple(opts[key])
        return cls(**opts)


def start_options(start: dict) -> ScoredBindingOptions:
    """The search's start point as scored_binding options (from late_binding's or its own)."""
    start = dict(start)
    sb = {f.name for f in fields(ScoredBindingOptions)}
    try:
        if "order" in start or "reserve" in start:
            return ScoredBindingOptions.from_late_binding(start)
    except (ConfigError, TypeError) as err:   # TypeError: a keyword late_binding does not take
        raise ConfigError(f"search.start (late_binding's options {start}): {err}") from None
    unknown = sorted(set(start) - sb)
    if unknown:
        raise ConfigError(f"search.start has unknown options {unknown}; allowed: late_binding's "
                          f"or scored_binding's {sorted(sb)}")
    try:
        return ScoredBindingOptions(**start)
    except ConfigError as err:
        raise ConfigError(f"search.start (scored_binding's options {start}): {err}") from None


def candidate(start: ScoredBindingOptions, params, x: np.ndarray) -> ScoredBindingOptions:
    """The options at search coordinates ``x`` (0: the start point), clipped into ``BOUNDS``."""
    d = start.as_dict()
    for name, xi in zip(params, x):
        lo, hi = BOUNDS[name]
        base = getattr(start, name)
        base = NONE_START[name] if base is None else base
        d[name] = float(min(max(base + SCALES[name] * float(xi), lo), hi))
    return ScoredBindingOptions(**d)


# ----------------------------------------------------------------------------- episodes
_ENV: dict[str, Any] = {}
EPISODE_KEYS = ("mean_e2e_s", "p99_e2e_s", "p99_ttft_s", "slo_attainment_pct", "unfinished", "rejected")


def episode_metrics(kw: dict, router: str, options: dict, seed: int) -> dict:
    """Metrics of one seeded episode of the env ``kw`` driven by ``router`` (each process keeps
    the envs it built, a few at a time: same seed, same requests)."""
    import gymnasium as gym

    import llm_lb_gym  # noqa: F401
    from llm_lb_gym.rollout import make_env_router, rollout_router

    key = repr(sorted(kw.items()))
    if key not in _ENV:
        if len(_ENV) >= 8:
            _ENV.pop(next(iter(_ENV)))
        _ENV[key] = gym.make("LLMCluster-v0", **kw)
    env = _ENV[key]
    m = rollout_router(env, make_env_router(router, env.unwrapped, **options), seed).metrics
    return {k: m.get(k) for k in EPISODE_KEYS}


def _baseline_reward(kw: dict) -> dict:
    return {**kw, "reward": {**(kw.get("reward") or {}), "mode": "baseline"}}


class Episodes:
    """Runs (router, options, (env keywords, seed)) jobs on a pool kept for the search: forked
    worker processes, or Ray tasks (``executor="ray"``)."""

    def __init__(self, workers: int, executor: str = "processes"):
        self.workers = workers
        self.executor = executor
        self._pool = None
        self._remote = None

    def __enter__(self) -> "Episodes":
        if self.executor == "ray":
            import ray

            if not ray.is_initialized():
                ray.init(num_cpus=self.workers, include_dashboard=False, log_to_driver=False)
            self._remote = ray.remote(num_cpus=1)(episode_metrics)
        elif self.workers > 1:
            import multiprocessing as mp
            from concurrent.futures import ProcessPoolExecutor

            self._pool = ProcessPoolExecutor(self.workers, mp_context=mp.get_context("fork"))
        return self

    def __exit__(self, *exc) -> None:
        if self._pool is not None:
            self._pool.shutdown()

    def run(self, jobs: list[tuple[str, dict, tuple[dict, int]]]) -> list[dict]:
        args = [(_baseline_reward(kw), r, o, s) for r, o, (kw, s) in jobs]
        if self._remote is not None:
            import ray

            return ray.get([self._remote.remote(*a) for a in args])
        if self._pool is None:
            return [episode_metrics(*a) for a in args]
        return list(self._pool.map(episode_metrics, *zip(*args)))

    def table(self, router: str, options: dict, pairs) -> list[dict]:
        return self.run([(router, options, pair) for pair in pairs])


def _space(cfg: "SearchConfig"):
    from llm_lb_gym.suite.suites import get_space

    return get_space(cfg.conditions)


def generation_pairs(cfg: "SearchConfig", kw: dict, g: int) -> list[tuple[dict, int]]:
    """Generation ``g``'s (env keywords, seed) pairs: the setting on fresh seeds, or conditions
    drawn from the space (by ``default_rng([seed, g])``), each on a fresh seed."""
    seeds = [cfg.train_seed + (g - 1) * cfg.seeds_per_generation + k for k in range(cfg.seeds_per_generation)]
    if cfg.conditions == "setting":
        return [(kw, s) for s in seeds]
    n = cfg.conditions_per_generation
    conds = _space(cfg).sample(np.random.default_rng([cfg.seed, g]), n)
    first = cfg.train_seed + (g - 1) * n
    return [(c.env_kwargs(), first + j) for j, c in enumerate(conds)]


def validation_pairs(cfg: "SearchConfig", kw: dict) -> list[tuple[dict, int]]:
    if cfg.conditions == "setting":
        return [(kw, s) for s in cfg.validation_seeds]
    first = cfg.validation_seeds[0]
    conds = _space(cfg).sample(np.random.default_rng([cfg.seed, first]), cfg.validation_episodes)
    return [(c.env_kwargs(), first + j) for j, c in enumerate(conds)]


def check_setting(kw: dict, cfg: SearchConfig) -> None:
    """The env ``kw`` builds (in this process, before any worker runs an episode) and has what
    ``cfg.objective`` scores: ``slo`` needs deadlines (``env.slo`` not None)."""
    import gymnasium as gym

    import llm_lb_gym  # noqa: F401

    env = gym.make("LLMCluster-v0", **{**kw, "reward": {**(kw.get("reward") or {}), "mode": "baseline"}})
    if cfg.objective == "slo" and env.unwrapped.cfg.slo is None:
        raise ConfigError("search.objective=slo needs SLO deadlines, and env.slo=None sets none; "
                          "allowed: env.slo with deadlines (e.g. env.slo={ttft_multiple: 5.0}), or "
                          "search.objective=e2e")


# ----------------------------------------------------------------------------- objective
TTFT_RATIO = 1.1
SLO_POINTS = 2.0


def _col(rows: list[dict], key: str) -> np.ndarray:
    return np.array([r[key] for r in rows], np.float64)


def constraint_violation(runs: list[dict], rr: list[dict]) -> np.ndarray:
    """Per episode: 100 x the log excess of p99 TTFT over ``TTFT_RATIO`` x round robin's (0 when
    within) plus the SLO attainment points below round robin's - ``SLO_POINTS``."""
    ttft = 100.0 * np.maximum(0.0, np.log(_col(runs, "p99_ttft_s") / (TTFT_RATIO * _col(rr, "p99_ttft_s"))))
    att, att_rr = _col(runs, "slo_attainment_pct"), _col(rr, "slo_attainment_pct")
    slo = np.where(np.isnan(att) | np.isnan(att_rr), 0.0, np.maximum(0.0, att_rr - SLO_POINTS - att))
    return ttft + slo


def objective(cfg: SearchConfig, runs: list[dict], ref: list[dict], rr: list[dict] | None) -> float:
    """Lower is better (module doc); ``ref``: the start point's episodes, ``rr``: round robin's."""
    e2e = _col(runs, "mean_e2e_s")
    if cfg.objective == "e2e":
        return float(100.0 * np.mean(np.log(e2e / _col(ref, "mean_e2e_s"))))
    if cfg.objective == "constrained":
        gain = 100.0 * np.log(e2e / _col(rr, "mean_e2e_s"))
        return float(np.mean(gain) + cfg.constraint_penalty * np.mean(constraint_violation(runs, rr)))
    att = _col(runs, "slo_attainment_pct")
    if np.isnan(att).any():
        raise ConfigError("search.objective=slo needs SLO deadlines (env.slo); allowed without: e2e")
    excess = 100.0 * np.mean(np.log(e2e / _col(rr, "mean_e2e_s")))
    return float(-att.mean() + cfg.slo_penalty * max(0.0, excess))


def policy_search(kw: dict, cfg: SearchConfig, log=print, writer=None) -> dict[str, Any]:
    """Run the search on the env ``kw`` (or, with ``cfg.conditions``, on the condition space);
    returns the best options (validated), the history and the wall time."""
    start = start_options(cfg.start)
    check_setting(kw, cfg)
    n, lam = cfg.dim, cfg.population
    mu = lam // 2
    w = np.log(mu + 0.5) - np.log(np.arange(1, mu + 1))
    w /= w.sum()
    mueff = 1.0 / np.sum(w ** 2)
    cs = (mueff + 2.0) / (n + mueff + 5.0)
    ds = 1.0 + 2.0 * max(0.0, math.sqrt((mueff - 1.0) / (n + 1.0)) - 1.0) + cs
    chi_n = math.sqrt(n) * (1.0 - 1.0 / (4 * n) + 1.0 / (21 * n * n))
    rng = np.random.default_rng(cfg.seed)
    mean, sigma, ps = np.zeros(n), cfg.sigma0, np.zeros(n)
    t0 = time.perf_counter()
    history: list[dict] = []
    need_rr = cfg.objective in ("slo", "constrained")
    with Episodes(cfg.workers, cfg.executor) as eps:
        val_pairs = validation_pairs(cfg, kw)
        val_start = eps.table(ROUTER, start.as_dict(), val_pairs)
        val_rr = eps.table("round_robin", {}, val_pairs) if need_rr else None
        best = {"generation": 0, "options": start, "val_objective": objective(cfg, val_start, val_start, val_rr),
                "x": mean.copy()}
        log(f"generation 0 (start): validation objective {best['val_objective']:+.3f} "
            f"({cfg.objective}, {len(val_pairs)} episodes); {start}")
        for g in range(1, cfg.generations + 1):
            pairs = generation_pairs(cfg, kw, g)
            z = rng.standard_normal((lam // 2, n))
            z = np.concatenate([z, -z])
            cands = [candidate(start, cfg.params, mean + sigma * zk) for zk in z]
            jobs = [(ROUTER, start.as_dict(), p) for p in pairs]
            if need_rr:
                jobs += [("round_robin", {}, p) for p in pairs]
            jobs += [(ROUTER, c.as_dict(), p) for c in cands for p in pairs]
            res = eps.run(jobs)
            k = len(pairs)
            ref, res = res[:k], res[k:]
            rr = None
            if need_rr:
                rr, res = res[:k], res[k:]
            f = np.array([objective(cfg, res[j * k:(j + 1) * k], ref, rr) for j in range(lam)])
            order = np.argsort(f, kind="stable")
            zw = w @ z[order[:mu]]
            mean = mean + sigma * zw
            ps = (1.0 - cs) * ps + math.sqrt(cs * (2.0 - cs) * mueff) * zw
            sigma *= math.exp((cs / ds) * (np.linalg.norm(ps) / chi_n - 1.0))
            point = candidate(start, cfg.params, mean)
            val = eps.table(ROUTER, point.as_dict(), val_pairs)
            vf = objective(cfg, val, val_start, val_rr)
            row = {"generation": g, "train_best": float(f[order[0]]), "train_median": float(np.median(f)),
                   "val_objective": vf, "sigma": sigma, "wall_s": time.perf_counter() - t0,
                   "val_mean_e2e_s": float(np.mean([r["mean_e2e_s"] for r in val])),
                   "options": {p: getattr(point, p) for p in cfg.params}}
            if need_rr:
                row["val_slo_attainment_pct"] = float(np.mean([r["slo_attainment_pct"] for r in val]))
                row["val_vs_round_robin_pct"] = float(100.0 * np.mean(np.log(
                    _col(val, "mean_e2e_s") / _col(val_rr, "mean_e2e_s"))))
            history.append(row)
            unfinished = sum(int(r["unfinished"] or 0) for r in val)
            if unfinished == 0 and vf < best["val_objective"]:
                best = {"generation": g, "options": point, "val_objective": vf, "x": mean.copy()}
            log(f"generation {g}: train best {row['train_best']:+.3f} median {row['train_median']:+.3f}, "
                f"validation {vf:+.3f} (best {best['val_objective']:+.3f} at {best['generation']}), "
                f"sigma {sigma:.3f}, {row['wall_s']:.0f} s; "
                + ", ".join(f"{p}={v:.4g}" for p, v in row["options"].items()))
            if writer is not None:
                for key, v in row.items():
                    if isinstance(v, float):
                        writer.add_scalar(f"search/{key}", v, g)
    return {"best_options": best["options"], "best_generation": best["generation"],
            "best_val_objective": best["val_objective"], "start_options": start,
            "history": history, "wall_s": time.perf_counter() - t0}
