"""Stock Stable-Baselines3 agents (DQN, sb3-contrib's MaskablePPO) with the shipped
hyperparameters and ``RouterRL``, on a preset: trained for N env steps per seed, then the last
model's policy against round robin and against the same action space's random policy, on fixed
test seeds.

    python -m llm_lb_gym.experiments.probe_stock_agents --algo dqn --preset near_capacity --seeds 0 1 2
    python -m llm_lb_gym.experiments.probe_stock_agents --algo ppo_mask --seeds 0 1 2
    python -m llm_lb_gym.experiments.probe_stock_agents --algo ppo_mask --seeds 0 1 2 \
        --conf docs/recipes/zoo_ppo_mask_guided.yml

The hyperparameters are ``docs/recipes/zoo_<algo>.yml``'s (what the zoo reads through
``docs/recipes/rl_zoo.py --algo <algo>``; ``zoo_dqn.yml``'s are ``docs/recipes/sb3.py``'s too), read from the checkout so
they are written once. A file's top-level ``env_kwargs`` (the zoo's ``--env-kwargs``) are
``gym.make`` keywords of the agent's env (an action space, ``action.kv_room``), used for
training, validation, the test episodes and the random policy alike; the env is the preset's id
wrapped in ``RouterRL`` (reward scale, survival discount, gamma 1), as the zoo wraps it. Test
seeds 1000.. are disjoint from every training seed's episodes (SB3 seeds its env from the
training seed). A ``reward`` among them (guidance towards a heuristic, annealed) is the training
env's only: validation, the test episodes and the random policy run without it, so every policy
is judged on its episodes' latency; the guidance weight at the end of training is printed.

**The same action space's random policy** (uniform over the valid actions, seeded by the test
seed) is measured beside the agent: a mask that carries a rule (``action.kv_room``) makes every
policy of the action space hold as the rule does, so the change vs round robin is the mask's and
the agent's together; the change vs the random policy is what learning added. Prints one JSON
line per seed and the paired changes of mean E2E over seeds x test episodes with 95% CIs, p99
TTFT, p99 E2E and SLO attainment beside; the rows go to ``--out`` as CSV. Validation during training
(seeds 500-501, every ``--eval-every`` steps) is printed, never used to pick a model: the last
model is the one tested, both greedy (``deterministic=True``) and sampled (its stochastic policy,
seeded by the test seed through SB3's ``torch`` generator), each summarised.
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
from llm_lb_gym.envs.reward import guidance_weight
from llm_lb_gym.envs.wrappers import RouterRL
from llm_lb_gym.experiments._tables import paired_change, paired_difference
from llm_lb_gym.rollout import make_env_router, rollout_agent, rollout_router

RECIPES = Path(__file__).resolve().parents[1] / "docs" / "recipes"
ALGOS = ("dqn", "ppo_mask")
"""rl-zoo3's names: SB3's DQN, sb3-contrib's MaskablePPO (reads ``action_masks()``)."""
MODES = ("greedy", "sampled")
ZOO_ID = "LLMCluster-NearCapacity-v0"   # the hyperparameter file's entry (used for every preset)


def hyperparameters(algo: str, conf: str | None = None) -> tuple[dict, dict, dict]:
    """(algorithm keywords, RouterRL keywords, gym.make keywords) from ``zoo_<algo>.yml`` (or the
    file ``conf``). A ``learning_rate`` written ``lin_<x>`` is the zoo's linear schedule from x to 0."""
    import ast

    import yaml

    doc = yaml.safe_load(Path(conf or RECIPES / f"zoo_{algo}.yml").read_text())
    hp = dict(doc[ZOO_ID])
    wrapper = hp.pop("env_wrapper")[0]["llm_lb_gym.envs.wrappers.RouterRL"]
    hp.pop("n_timesteps")
    policy_kwargs = hp.pop("policy_kwargs", "dict()")
    tree = ast.parse(policy_kwargs, mode="eval").body   # "dict(net_arch=[...])", as the zoo writes it
    hp["policy_kwargs"] = {k.arg: ast.literal_eval(k.value) for k in tree.keywords}
    lr = hp.get("learning_rate")
    if isinstance(lr, str) and lr.startswith("lin_"):   # rl-zoo3's notation
        lr0 = float(lr[4:])
        hp["learning_rate"] = lambda progress_remaining: progress_remaining * lr0
    return hp, dict(wrapper), dict(doc.get("env_kwargs") or {})


class MaskedUniform:
    """The action space's random policy: uniform over ``info["action_mask"]``'s valid actions."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng([seed, 0xA11])

    def predict(self, obs, deterministic=True, action_masks=None):
        return int(self.rng.choice(np.flatnonzero(action_masks))), None


def _algo_class(algo: str):
    if algo == "dqn":
        from stable_baselines3 import DQN
        return DQN
    from sb3_contrib import MaskablePPO
    return MaskablePPO


def _row(m: dict, prefix: str) -> dict:
    return {f"{prefix}mean_e2e_s": m["mean_e2e_s"], f"{prefix}p99_e2e_s": m["p99_e2e_s"],
            f"{prefix}p99_ttft_s": m["p99_ttft_s"], f"{prefix}slo_attainment_pct": m.get("slo_attainment_pct")}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--algo", default="dqn", choices=ALGOS)
    p.add_argument("--preset", default="near_capacity")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--steps", type=int, default=200_000)
    p.add_argument("--test-episodes", type=int, default=10)
    p.add_argument("--eval-every", type=int, default=50_000)
    p.add_argument("--validate", default="greedy", choices=MODES, help="the policy validation runs")
    p.add_argument("--conf", default=None, help="the hyperparameter file (default docs/recipes/zoo_<algo>.yml)")
    p.add_argument("--out", default="stock_agents.csv")
    a = p.parse_args()
    import torch
    from stable_baselines3.common.callbacks import BaseCallback

    torch.set_num_threads(1)
    env_id = preset(a.preset).env_id
    hp, wrap, env_kwargs = hyperparameters(a.algo, a.conf)
    # The reward (guidance towards a teacher) is for training only: every policy is judged on its
    # episodes' latency, in envs without it (the reward changes no episode, only what it pays).
    judged = {k: v for k, v in env_kwargs.items() if k != "reward"}
    make = lambda: gym.make(env_id, **judged)   # noqa: E731
    det = a.validate == "greedy"
    tests = [1000 + i for i in range(a.test_episodes)]
    rr_env = gym.make(env_id).unwrapped
    rr = {s: rollout_router(rr_env, make_env_router("round_robin", rr_env), s).metrics for s in tests}
    rnd = {s: rollout_agent(make(), MaskedUniform(s), s).metrics for s in tests}
    val_seeds = [500, 501]
    val_rr = [rollout_router(rr_env, make_env_router("round_robin", rr_env), s).metrics["mean_e2e_s"]
              for s in val_seeds]

    class Validate(BaseCallback):
        def _on_step(self):
            if self.num_timesteps % a.eval_every == 0:
                e = [rollout_agent(make(), self.model, s, deterministic=det).metrics["mean_e2e_s"]
                     for s in val_seeds]
                print(json.dumps({"step": self.num_timesteps, "validation_vs_rr_pct": round(float(
                    np.mean([100 * (x - y) / y for x, y in zip(e, val_rr)])), 2),
                    "cpu_s": round(time.process_time(), 1)}), flush=True)
            return True

    rows = []
    for seed in a.seeds:
        t0 = time.process_time()
        train_env = RouterRL(gym.make(env_id, **env_kwargs), **wrap)
        model = _algo_class(a.algo)(env=train_env, seed=seed, verbose=0, **hp)
        model.learn(a.steps, callback=Validate())
        train_cpu = time.process_time() - t0
        base = train_env.unwrapped
        print(json.dumps({"train_seed": seed, "episodes": base.guidance_episode,   # the guidance's end
                          "final_guidance_weight": round(float(
                              guidance_weight(base.cfg.reward, base.guidance_episode)), 6)}), flush=True)
        for mode in MODES:
            for s in tests:
                torch.manual_seed(s)
                m = rollout_agent(make(), model, s, deterministic=mode == "greedy").metrics
                rows.append({"algo": a.algo, "preset": a.preset, "policy": mode, "train_seed": seed,
                             "test_seed": s, "steps": a.steps, **_row(m, ""), **_row(rr[s], "rr_"),
                             **_row(rnd[s], "random_"), "unfinished": m["unfinished"],
                             "train_cpu_s": round(train_cpu, 1)})
        print(json.dumps({"train_seed": seed, "train_cpu_s": round(train_cpu, 1), **{
            f"{mode}_vs_rr_pct": round(float(np.mean([100 * (r["mean_e2e_s"] - r["rr_mean_e2e_s"]) / r["rr_mean_e2e_s"]
                                                      for r in rows if r["train_seed"] == seed and r["policy"] == mode])), 2)
            for mode in MODES}}), flush=True)
    with open(a.out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    for mode in MODES:
        summarise([r for r in rows if r["policy"] == mode], a, env_kwargs, mode)
    print(f"rows: {a.out}")


def summarise(rows: list[dict], a, env_kwargs: dict, mode: str) -> None:
    """One line: the agent's policy ``mode`` vs round robin and vs the random policy."""
    col = lambda k: np.array([r[k] for r in rows], dtype=float)   # noqa: E731
    agent, base, rand = col("mean_e2e_s"), col("rr_mean_e2e_s"), col("random_mean_e2e_s")
    pct, ci = paired_change(agent, base)
    rpct, rci = paired_change(rand, base)
    vs_rand, vs_rand_ci = paired_change(agent, rand)
    slo = [col(f"{k}slo_attainment_pct") for k in ("", "rr_", "random_")]
    slo_d, slo_ci = paired_difference(slo[0], slo[1])
    n = f"95% CI over {len(rows)} paired episodes: {len(a.seeds)} training seeds x {a.test_episodes} test seeds"
    print(f"{a.preset} (package {llm_lb_gym.__version__}), env_kwargs {env_kwargs}, {a.steps} steps: stock "
          f"{a.algo} {mode} {agent.mean():.3f} s vs round robin {base.mean():.3f} s: {pct:+.2f} +- {ci:.2f}% "
          f"({n}); the action space's random policy {rand.mean():.3f} s: {rpct:+.2f} +- {rci:.2f}% vs round "
          f"robin; agent vs random {vs_rand:+.2f} +- {vs_rand_ci:.2f}%; p99 TTFT {col('p99_ttft_s').mean():.2f} / "
          f"{col('rr_p99_ttft_s').mean():.2f} / {col('random_p99_ttft_s').mean():.2f} s (agent / round robin / "
          f"random); p99 E2E {col('p99_e2e_s').mean():.2f} / {col('rr_p99_e2e_s').mean():.2f} / "
          f"{col('random_p99_e2e_s').mean():.2f} s; SLO attainment {slo[0].mean():.1f} / {slo[1].mean():.1f} / {slo[2].mean():.1f}% (agent - "
          f"round robin {slo_d:+.1f} +- {slo_ci:.1f} points)", flush=True)

if __name__ == "__main__":
    main()
