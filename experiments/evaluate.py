"""Compare routers (heuristics and trained agents) on identical seeded episodes.

    python -m llm_lb_gym.experiments.evaluate                       # all eleven heuristics, default env
    python -m llm_lb_gym.experiments.evaluate episodes=20 env.arrival_rate_rps=40
    python -m llm_lb_gym.experiments.evaluate experiment=paper_v100 'agents={wg_rl: {kind: double_dqn, path: runs/x/model.zip}}'

Writes ``results.csv`` (one row per policy and episode), ``summary.md`` (the table printed at
the end) and ``latency_cdf.png`` in the run directory, with the resolved config and command.
Episode ``i`` uses seed ``seed + i`` for every policy, so all see the same requests and
predictions; the % change of mean E2E vs the baseline is paired per episode, with a 95%
Student-t confidence interval over episodes.
"""

from __future__ import annotations

from llm_lb_gym.extras import require

# before the imports below: name the extra, not a missing module
require("eval", "llm-lb-gym evaluate")   # heuristics need Hydra, not torch; trained agents need 'rl' (_evaluation)

from llm_lb_gym.experiments._evaluation import evaluate, paired_change, policy_options, summarize  # noqa: F401  (re-exported)
from llm_lb_gym.experiments._hydra import hydra_main


@hydra_main("evaluate")
def main(cfg) -> None:
    evaluate(cfg)


if __name__ == "__main__":
    main()
