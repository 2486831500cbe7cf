"""Benchmark routers on a fixed suite of held-out conditions, with paired CIs and an aggregate.

    llm-lb-gym benchmark                         # the held-out suite, every heuristic and the searched router
    llm-lb-gym benchmark suite=smoke             # two tiny task-mix conditions (seconds)
    llm-lb-gym benchmark 'clairvoyant=[scored_binding]' seeds=10
    llm-lb-gym benchmark '+trained.net={model: outputs/improve/RUN}'   # a trained network beside them

The conditions (traffic x load x predictor accuracy x cluster) and the training / held-out split
are ``llm_lb_gym/suite/suites.py``'s (docs/benchmark.md); every policy plays the same seeded
episode of each condition. Prints a table per condition and the aggregate (``suite/report.py``);
writes ``results.csv`` (a row per condition, policy and seed), ``summary.md`` (the tables),
``aggregate.json`` and the run record (resolved config, command) in the run directory. A
condition whose dataset is not found is listed and left out (``missing_data=skip``), never
silently.
"""

from __future__ import annotations

from llm_lb_gym.extras import require

require("rl", "llm-lb-gym benchmark", modules=("hydra", "omegaconf"))

from llm_lb_gym.experiments._benchmark import benchmark, policies, suite_of  # noqa: F401  (re-exported)
from llm_lb_gym.experiments._hydra import hydra_main


@hydra_main("benchmark")
def main(cfg) -> None:
    benchmark(cfg)


if __name__ == "__main__":
    main()
