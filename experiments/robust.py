"""The main job: train a router over a distribution of conditions, benchmark it on held-out ones.

    llm-lb-gym robust                           # about 6 minutes on 2 cores
    llm-lb-gym robust search.generations=6      # a quick look

1. Policy search (``agents/policy_search.py``) over ``scored_binding``'s options, every episode
   drawn from the training distribution (``suite.suites.TRAIN``: the task mix and the training
   rows of the real traces, load 0.8-1.5x, predictor accuracy 0.6-0.95, 2-8 V100s or a mixed
   cluster), scored by the tail-constrained objective (mean E2E vs round robin on the same
   episode, plus the violation of p99 TTFT <= 1.1x and SLO attainment >= round robin's - 2).
2. The benchmark (``experiments/benchmark.py``) of the found router ("robust") against the
   heuristics on the held-out suite (conditions and trace rows the search never saw), with paired
   95% CIs, the tail constraint and the aggregate.

Without ``../shared/data`` the search uses the task-mix part of the distribution and the
benchmark the held-out suite's task-mix conditions, and the log says so. Writes
``scored_binding.yaml`` (the found options), ``search.json`` (the generations), the benchmark's
files and the run record in the run directory.
"""

from __future__ import annotations

from llm_lb_gym.extras import require

require("rl", "llm-lb-gym robust")

import json
import time
from pathlib import Path

import yaml
from omegaconf import OmegaConf

from llm_lb_gym._validate import ConfigError
from llm_lb_gym.agents.policy_search import SearchConfig, policy_search
from llm_lb_gym.experiments._benchmark import benchmark, policies, suite_of
from llm_lb_gym.experiments._hydra import hydra_main, run_dir, to_container, write_run_record
from llm_lb_gym.experiments._progress import say

def _data_present() -> bool:
    from llm_lb_gym.suite.condition import Condition, missing_data

    return all(missing_data(Condition(w, "train")) is None for w in ("sharegpt", "azure_conv", "corpus"))


def robust(cfg, out: Path | None = None, log=say) -> dict:
    label = str(cfg.get("label") or "robust")
    taken = set(cfg.benchmark.heuristics or []) | set((to_container(cfg.benchmark.trained) or {}))
    if label in taken:
        raise ConfigError(f"label={label!r} is already a row of the benchmark "
                          f"(benchmark.heuristics / benchmark.trained: {', '.join(sorted(taken))}); name the found router otherwise")
    out = Path(out) if out is not None else run_dir(cfg)
    out.mkdir(parents=True, exist_ok=True)
    opts = to_container(cfg.search)
    if opts.get("conditions") == "train" and not _data_present():
        log("../shared/data not found: the search uses the task-mix part of the training "
            "distribution (search.conditions=train_synthetic)")
        opts["conditions"] = "train_synthetic"
    sc = SearchConfig.from_options(opts)
    bench = OmegaConf.create({**to_container(cfg.benchmark), "eval": to_container(cfg.get("eval")) or {}})
    policies(bench)                       # every option checked before the search starts
    suite_of(bench, log=lambda *_: None)
    write_run_record(out, cfg)
    log(f"search: {sc.generations} generations x {sc.population} candidates on "
        f"{sc.conditions_per_generation} episodes of {sc.conditions} ({sc.objective} objective)")
    t0 = time.perf_counter()
    res = policy_search({}, sc, log=log)
    found = res["best_options"].as_dict()
    (out / "scored_binding.yaml").write_text(yaml.safe_dump({"scored_binding": found}, sort_keys=False))
    (out / "search.json").write_text(json.dumps(
        {k: v for k, v in res.items() if k not in ("best_options", "start_options")}
        | {"best_options": found}, indent=2, default=str))
    log(f"found (generation {res['best_generation']}, {res['wall_s']:.0f} s): {found}")
    trained = {**(to_container(cfg.benchmark.trained) or {}),
               label: {"router": "scored_binding", "options": found}}
    bench = OmegaConf.create({**to_container(bench), "trained": trained})
    t1 = time.perf_counter()
    b = benchmark(bench, out=out / "benchmark", log=log)
    summary = {"train_wall_s": round(t1 - t0, 1), "benchmark_wall_s": round(time.perf_counter() - t1, 1),
               "found_options": found, "aggregate": b["aggregate"]["aggregate"],
               "headline": b["aggregate"]["headline"]}
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    log(f"trained in {t1 - t0:.0f} s, benchmarked in {summary['benchmark_wall_s']:.0f} s; run dir {out}")
    return {"out": out, "summary": summary, "benchmark": b}


@hydra_main("robust")
def main(cfg) -> None:
    robust(cfg)


if __name__ == "__main__":
    main()
