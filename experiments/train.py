"""Train a router agent on ``LLMCluster-v0``, then evaluate it against round robin.

    python -m llm_lb_gym.experiments.train                                  # WG-RL Double DQN, default env
    python -m llm_lb_gym.experiments.train reward=baseline                  # Baseline RL (no mixing term)
    python -m llm_lb_gym.experiments.train reward=workload_aware            # Workload-Aware RL (static term)
    python -m llm_lb_gym.experiments.train agent=maskable_ppo               # sb3-contrib, masked actions
    python -m llm_lb_gym.experiments.train agent=reinforce                  # the custom (non-SB3) agent
    python -m llm_lb_gym.experiments.train experiment=debug                 # seconds-long smoke run
    python -m llm_lb_gym.experiments.train -m reward=baseline,workload_aware,workload_guided seed=0,1 \
        hydra/launcher=joblib                                    # a local sweep

The run directory holds ``resolved_config.yaml`` and ``run.json`` (command, seed, timings,
episode length), ``model.zip`` (the last model) and ``best_model.zip`` (lowest validation mean
E2E), TensorBoard logs under ``tb/`` and the final evaluation under ``eval/`` (the table of
``llm_lb_gym.experiments.evaluate``: the agent and ``eval.policies`` on identical seeded episodes).

The pipeline (``train(cfg)``, what it writes and why) is ``experiments/_training.py``.
"""

from __future__ import annotations

from llm_lb_gym.extras import require

# before the imports below: name the extra, not a missing module
require("rl", "llm-lb-gym train")

from llm_lb_gym.experiments._hydra import hydra_main
from llm_lb_gym.experiments._training import _check_train_cfg, build_agent, make_env, train  # noqa: F401  (re-exported)


@hydra_main("train")
def main(cfg) -> float:
    """Returns the agent's mean-E2E % change vs ``eval.baseline``: the objective an Optuna sweep
    (``hydra/sweeper=optuna``) minimises; tune on validation seeds (``eval.seed=500``)."""
    return train(cfg)["change_vs_baseline_pct"]


if __name__ == "__main__":
    main()
