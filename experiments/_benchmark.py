"""The benchmark's loop, shared by ``llm-lb-gym benchmark`` and ``llm-lb-gym robust`` (entry
points do not import each other): its rows (``policies``), its suite (``suite_of``) and the run
(``benchmark``: episodes, tables, files). What it computes: ``llm_lb_gym/suite/``."""

from __future__ import annotations

import csv
import json
import time
from dataclasses import replace
from pathlib import Path

from llm_lb_gym._validate import ConfigError, check_choice, check_int
from llm_lb_gym.experiments._evaluation import load_agent_for
from llm_lb_gym.experiments._hydra import env_kwargs, router_options, run_dir, to_container, write_run_record
from llm_lb_gym.experiments._progress import say
from llm_lb_gym.experiments._serve_policy import read_run
from llm_lb_gym.routers import registry as _routers
from llm_lb_gym.suite.condition import missing_data
from llm_lb_gym.suite.report import SuiteResult, aggregate_table, condition_table, overview_table
from llm_lb_gym.suite.runner import PolicySpec, run_episodes
from llm_lb_gym.suite.suites import Suite, get_suite


def policies(cfg) -> list[PolicySpec]:
    """The benchmark's rows, checked before any episode runs."""
    out: list[PolicySpec] = []
    heur = list(cfg.heuristics or [])
    if "round_robin" not in heur:
        raise ConfigError("benchmark.heuristics must include round_robin (the baseline every change is paired with)")
    for name in heur:
        check_choice("benchmark.heuristics[]", name, tuple(_routers.ROUTER_CLASSES))
        out.append(PolicySpec(name, name, router_options(cfg, name)))
    for label, spec in (to_container(cfg.trained) or {}).items():
        spec = dict(spec or {})
        if "model" in spec:
            bad = sorted(set(spec) - {"model"})
            if bad:
                raise ConfigError(f"benchmark.trained.{label}: a network row takes model= only; unknown keys {bad}")
            out.append(PolicySpec(label, kind="trained", agent=NetworkPlayer(label, str(spec["model"]))))
            continue
        bad = sorted(set(spec) - {"router", "options"})
        if bad or "router" not in spec:
            raise ConfigError(f"benchmark.trained.{label}: needs router= (and options=); unknown keys {bad}")
        check_choice(f"benchmark.trained.{label}.router", spec["router"], tuple(_routers.ROUTER_CLASSES))
        out.append(PolicySpec(label, spec["router"], dict(spec.get("options") or {}), kind="trained"))
    labels = [p.label for p in out]
    for label in cfg.clairvoyant or []:
        if label not in labels:
            raise ConfigError(f"benchmark.clairvoyant lists {label!r}; allowed: {', '.join(labels)}")
        base = out[labels.index(label)]
        out.append(replace(base, label=f"{label}@oracle", kind="clairvoyant"))
    dup = sorted({x for x in labels if labels.count(x) > 1})
    if dup:
        raise ConfigError(f"benchmark: policy label(s) listed twice: {', '.join(dup)}")
    from llm_lb_gym.routers.registry import make_router

    for p in out:                      # options errors now, not after an hour of episodes
        if p.agent is None:
            make_router(p.router, **p.options)
    return out


class NetworkPlayer:
    """A trained network (``benchmark.trained.LABEL.model``: the run directory of ``llm-lb-gym
    improve`` or ``train``, or its model file) playing a condition: the condition's cluster,
    traffic, predictor and seed, with the observation and action options the network was
    trained with (its run's ``resolved_config.yaml``; a distilled network's holds as its
    teacher takes them, ``DistilledAgent.ENV_OPTIONS``). A condition the network cannot observe
    (another instance count for an SB3 agent, a mixed cluster's features) is named by
    :meth:`check` before any episode runs."""

    def __init__(self, label: str, path: str):
        where = f"benchmark.trained.{label}.model"
        _, model, _, kind, trained = read_run(path, None, where)
        self.env_options = {k: trained[k] for k in ("action", "obs") if trained.get(k)}
        self.spec = {"kind": kind, "path": str(model), "env": self.env_options}
        self.where = where

    def __call__(self, kw: dict):
        return load_agent_for(self.spec, kw)

    def check(self, cond, kw: dict) -> None:
        """Build the agent on ``cond``'s env and take one decision: what does not fit raises here."""
        from llm_lb_gym.rollout import predict_action

        try:
            agent, env = self(kw)
            obs, info = env.reset(seed=0)
            predict_action(agent, obs, info.get("action_mask"), deterministic=True)
        except ConfigError:
            raise
        except Exception as exc:
            raise ConfigError(f"{self.where}: the network cannot play condition {cond.name!r} "
                              f"({type(exc).__name__}: {exc}); a network observes the cluster kind it was "
                              f"trained on (mixed clusters add features), an SB3 agent also its instance "
                              f"count: benchmark a suite of such conditions") from None


def suite_of(cfg, log=say) -> tuple[Suite, list[str]]:
    """The suite with its seed count, minus the conditions whose data is absent (and why)."""
    suite = get_suite(cfg.suite)
    if cfg.seeds is not None:
        check_int("benchmark.seeds", cfg.seeds, 1)
        suite = replace(suite, seeds=int(cfg.seeds))
    check_choice("benchmark.missing_data", cfg.missing_data, ("skip", "error"))
    kept, skipped = [], []
    for c in suite.conditions:
        why = missing_data(c)
        if why is None:
            kept.append(c)
        elif cfg.missing_data == "error":
            raise ConfigError(f"benchmark: condition {c.name!r}: {why}")
        else:
            skipped.append(f"{c.name}: {why}")
    for line in skipped:
        log(f"skipped (data not found): {line}")
    if not kept:
        raise ConfigError(f"benchmark: no condition of suite {suite.name!r} has its data here")
    return replace(suite, conditions=tuple(kept)), skipped


def benchmark(cfg, out: Path | None = None, log=say) -> dict:
    pols = policies(cfg)
    suite, skipped = suite_of(cfg, log)
    check_int("benchmark.workers", cfg.workers, 1)
    out = Path(out) if out is not None else run_dir(cfg)
    write_run_record(out, cfg)
    from llm_lb_gym.suite.runner import condition_kwargs

    for p in pols:                     # a network meets every condition once, before the episodes
        if isinstance(p.agent, NetworkPlayer):
            for c in suite.conditions:
                p.agent.check(c, condition_kwargs(c, p.kind))
    jobs = [(c, p, s) for c in suite.conditions for p in pols for s in suite.seed_list]
    log(f"suite {suite.name}: {len(suite.conditions)} conditions x {suite.seeds} seeds x "
        f"{len(pols)} policies = {len(jobs)} episodes on {cfg.workers} worker(s)")
    t0 = time.perf_counter()
    step = max(1, len(jobs) // 20)
    rows = run_episodes(jobs, workers=int(cfg.workers),
                        progress=(lambda i, n: log(f"  {i}/{n} episodes, {time.perf_counter() - t0:.0f} s")
                                  if cfg.progress and (i % step == 0 or i == n) else None))
    wall = time.perf_counter() - t0
    res = SuiteResult(rows)
    with open(out / "results.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    from llm_lb_gym import __version__

    parts = [f"# Benchmark: suite {suite.name} (package {__version__}), {len(suite.conditions)} conditions "
             f"x {suite.seeds} seeds (from {suite.first_seed}), {wall:.0f} s on {cfg.workers} worker(s)", ""]
    if skipped:
        parts += ["Skipped (data not found): " + "; ".join(skipped), ""]
    parts += ["## Aggregate over the conditions", "", aggregate_table(res), "", *res.headline(), "",
              "## Mean E2E vs round robin (%) per condition", "", overview_table(res), "",
              "## Per condition", ""]
    for c in res.conditions:
        parts += [condition_table(res, c), ""]
    text = "\n".join(parts)
    (out / "summary.md").write_text(text)
    agg = {"suite": suite.name, "seeds": suite.seed_list, "conditions": res.conditions,
           "skipped": skipped, "wall_s": wall, "aggregate": res.aggregate_rows(),
           "headline": res.headline()}
    (out / "aggregate.json").write_text(json.dumps(agg, indent=2, default=str))
    print(text)
    log(f"results: {out}")
    return {"result": res, "aggregate": agg, "out": out}


