"""Stock Stable-Baselines3 DQN with the shipped hyperparameters and ``RouterRL``, on a preset:
trained for N env steps per seed, then its greedy policy against round robin on fixed test seeds.

    python -m llm_lb_gym.experiments.probe_stock_agents --preset near_capacity --seeds 0 1 2
    python -m llm_lb_gym.experiments.probe_stock_agents --preset overload --seeds 0 --steps 100000

The hyperparameters are ``docs/recipes/zoo_dqn.yml``'s (what ``rl_zoo3.train -conf`` reads; the
same values as ``docs/recipes/sb3.py``), read from the checkout so they are written once; the env
is the preset's id wrapped in ``RouterRL`` (reward scale, survival discount, gamma 1), as the zoo
wraps it. Test seeds 1000.. are disjoint from every training seed's episodes (SB3 seeds its env
from the training seed). Prints one JSON line per seed and the paired change of mean E2E vs
round robin over seeds x test episodes, with its 95% CI; the rows go to ``--out`` as CSV.
Validation during training (seeds 500-501, every ``--eval-every`` steps) is printed, never used
to pick a model: the last model is the one tested.
"""

from __future__ import annotations

from llm_lb_gym.extras import require

require("rl", "llm-lb-gym probe_stock_agents")

import argparse
import csv
import json
import time
from pathlib import Path

import gymnasium as gym
import numpy as np

import llm_lb_gym
from llm_lb_gym.envs.presets import preset
from llm_lb_gym.envs.wrappers import RouterRL
from llm_lb_gym.experiments._tables import paired_change
from llm_lb_gym.rollout import make_env_router, rollout_agent, rollout_router

HYPERPARAMS = Path(__file__).resolve().parents[1] / "docs" / "recipes" / "zoo_dqn.yml"
ZOO_ID = "LLMCluster-NearCapacity-v0"   # the hyperparameter file's entry (used for every preset)


def hyperparameters() -> tuple[dict, dict]:
    """(DQN keywords, RouterRL keywords) from the zoo file."""
    import ast

    import yaml

    hp = dict(yaml.safe_load(HYPERPARAMS.read_text())[ZOO_ID])
    wrapper = hp.pop("env_wrapper")[0]["llm_lb_gym.envs.wrappers.RouterRL"]
    hp.pop("n_timesteps")
    policy_kwargs = hp.pop("policy_kwargs", "dict()")
    tree = ast.parse(policy_kwargs, mode="eval").body   # "dict(net_arch=[...])", as the zoo writes it
    hp["policy_kwargs"] = {k.arg: ast.literal_eval(k.value) for k in tree.keywords}
    return hp, dict(wrapper)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="near_capacity")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--steps", type=int, default=200_000)
    p.add_argument("--test-episodes", type=int, default=10)
    p.add_argument("--eval-every", type=int, default=50_000)
    p.add_argument("--out", default="stock_agents.csv")
    a = p.parse_args()
    import torch
    from stable_baselines3 import DQN
    from stable_baselines3.common.callbacks import BaseCallback

    torch.set_num_threads(1)
    env_id = preset(a.preset).env_id
    hp, wrap = hyperparameters()
    tests = [1000 + i for i in range(a.test_episodes)]
    rr_env = gym.make(env_id).unwrapped
    rr = {s: rollout_router(rr_env, make_env_router("round_robin", rr_env), s).metrics for s in tests}
    val_seeds = [500, 501]
    val_rr = [rollout_router(rr_env, make_env_router("round_robin", rr_env), s).metrics["mean_e2e_s"]
              for s in val_seeds]

    class Validate(BaseCallback):
        def _on_step(self):
            if self.num_timesteps % a.eval_every == 0:
                e = [rollout_agent(gym.make(env_id), self.model, s).metrics["mean_e2e_s"] for s in val_seeds]
                print(json.dumps({"step": self.num_timesteps, "validation_vs_rr_pct": round(float(
                    np.mean([100 * (x - y) / y for x, y in zip(e, val_rr)])), 2),
                    "cpu_s": round(time.process_time(), 1)}), flush=True)
            return True

    rows = []
    for seed in a.seeds:
        t0 = time.process_time()
        model = DQN(env=RouterRL(gym.make(env_id), **wrap), seed=seed, verbose=0, **hp)
        model.learn(a.steps, callback=Validate())
        train_cpu = time.process_time() - t0
        for s in tests:
            m = rollout_agent(gym.make(env_id), model, s).metrics
            rows.append({"preset": a.preset, "train_seed": seed, "test_seed": s, "steps": a.steps,
                         "mean_e2e_s": m["mean_e2e_s"], "p99_ttft_s": m["p99_ttft_s"],
                         "slo_attainment_pct": m.get("slo_attainment_pct"),
                         "rr_mean_e2e_s": rr[s]["mean_e2e_s"], "rr_p99_ttft_s": rr[s]["p99_ttft_s"],
                         "rr_slo_attainment_pct": rr[s].get("slo_attainment_pct"),
                         "unfinished": m["unfinished"], "train_cpu_s": round(train_cpu, 1)})
        mine = [r for r in rows if r["train_seed"] == seed]
        change = [100 * (r["mean_e2e_s"] - r["rr_mean_e2e_s"]) / r["rr_mean_e2e_s"] for r in mine]
        print(json.dumps({"train_seed": seed, "change_vs_rr_pct": round(float(np.mean(change)), 2),
                          "train_cpu_s": round(train_cpu, 1)}), flush=True)
    with open(a.out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    agent = np.array([r["mean_e2e_s"] for r in rows])
    base = np.array([r["rr_mean_e2e_s"] for r in rows])
    pct, ci = paired_change(agent, base)
    print(f"{a.preset} (package {llm_lb_gym.__version__}): stock SB3 DQN {agent.mean():.3f} s vs round robin "
          f"{base.mean():.3f} s: {pct:+.2f} +- {ci:.2f}% (95% CI over {len(rows)} paired episodes: "
          f"{len(a.seeds)} training seeds x {len(tests)} test seeds); p99 TTFT "
          f"{np.mean([r['p99_ttft_s'] for r in rows]):.2f} vs {np.mean([r['rr_p99_ttft_s'] for r in rows]):.2f} s; rows: {a.out}")


if __name__ == "__main__":
    main()
