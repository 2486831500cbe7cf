"""Train a router that improves on its teacher (policy iteration by simulation), then test it.

    python -m llm_lb_gym.experiments.improve                                    # near capacity, scored_binding teacher
    python -m llm_lb_gym.experiments.improve 'experiment=[paper_v100_kv_limited,learned_router,scored_teacher]'
    python -m llm_lb_gym.experiments.improve 'experiment=[v100_near_capacity,learned_router]'   # late_binding teacher
    python -m llm_lb_gym.experiments.improve improve.rounds=2 test.episodes=5   # shorter

Runs :func:`llm_lb_gym.agents.policy_iteration.policy_iteration` on the setting (``conf/improve.yaml``),
saves ``best_policy.pt`` and each round's network in the run directory, logs the rounds to
TensorBoard (``<run>/tb``), then evaluates the best network, round robin, the teacher and the
listed heuristics on the test seeds (``llm_lb_gym.experiments.evaluate``: identical seeded episodes) and
prints the paired % change of mean E2E against round robin *and* against the teacher, with 95%
confidence intervals, p99 E2E, SLO attainment and the network's decision time.
"""

from __future__ import annotations

from llm_lb_gym.extras import require

# before the imports below: name the extra, not a missing module
require("rl", "llm-lb-gym improve")

import json
import time
from pathlib import Path

import numpy as np

from llm_lb_gym._validate import ConfigError
from llm_lb_gym.experiments._entry_options import check_evaluate_options
from llm_lb_gym.experiments._evaluation import evaluate
from llm_lb_gym.experiments._hydra import env_kwargs, hydra_main, run_dir, to_container, write_run_record
from llm_lb_gym.experiments._progress import say
from llm_lb_gym.experiments._tables import paired_change
from llm_lb_gym.experiments._training import policy_iteration_config, train_distilled

NAME = "distilled"
"""The trained network's name in the tables (``learned_router`` stays the Double-DQN router's)."""


def paired_rows(rows: list[dict], policy: str, base: str, key: str = "mean_e2e_s"):
    a = {r["seed"]: r[key] for r in rows if r["policy"] == policy}
    b = {r["seed"]: r[key] for r in rows if r["policy"] == base}
    seeds = sorted(set(a) & set(b))
    return paired_change(np.array([a[s] for s in seeds]), np.array([b[s] for s in seeds]))


def decision_time_ms(kw: dict, path: Path, seed: int) -> dict:
    """Wall time of the distilled router's decisions (network + teacher heuristic) over one
    test episode, in milliseconds."""
    import gymnasium as gym

    from llm_lb_gym.agents.policy_iteration import DistilledAgent
    from llm_lb_gym.rollout import rollout_agent

    env = gym.make("LLMCluster-v0", **{**DistilledAgent.env_options(kw),
                                       "reward": {**(kw.get("reward") or {}), "mode": "baseline"}})
    agent = DistilledAgent.load(path, env)
    rollout_agent(env, agent, seed)
    w = 1e3 * np.asarray(agent.decision_wall_s)
    return {"p50": float(np.percentile(w, 50)), "p99": float(np.percentile(w, 99)), "n": int(len(w))}


def test_config(cfg, out: Path, path: Path):
    """The test evaluation's config (``evaluate``'s keys): the network at ``path`` beside
    ``test.policies``."""
    from omegaconf import OmegaConf

    from llm_lb_gym.agents.policy_iteration import DistilledAgent

    return OmegaConf.create({
        "env": to_container(cfg.env), "engine": to_container(cfg.engine),
        "workload": to_container(cfg.workload), "predictor": to_container(cfg.predictor),
        "reward": to_container(cfg.reward), "policies": to_container(cfg.test.get("policies")),
        "policy_options": to_container(cfg.eval.policy_options) or {},
        "agents": {NAME: {"kind": "distilled", "path": str(path), "env": DistilledAgent.ENV_OPTIONS}},
        "episodes": cfg.test.get("episodes"), "seed": cfg.test.get("seed"), "baseline": "round_robin",
        "plot": True, "output_dir": str(out / "test"), "progress": cfg.get("progress", True)})


def improve(cfg, out: Path | None = None) -> dict:
    import gymnasium as gym

    import llm_lb_gym  # noqa: F401

    out = Path(out) if out is not None else run_dir(cfg)
    pc = policy_iteration_config(cfg)   # a bad option fails before anything runs
    kw = env_kwargs(cfg)
    check_evaluate_options(test_config(cfg, out, out / "best_policy.pt"), prefix="test.")   # run after training
    if pc.teacher not in list(cfg.test.policies):
        raise ConfigError(f"test.policies={list(cfg.test.policies)} lacks the teacher {pc.teacher!r}, "
                          f"which the network is compared with; add it")
    gym.make("LLMCluster-v0", **kw)      # the env's options, before a worker meets them
    out.mkdir(parents=True, exist_ok=True)
    write_run_record(out, cfg)
    trained = train_distilled(cfg, out)
    train_wall = trained["train_wall_s"]
    path = Path(trained["model"])
    ev_cfg = test_config(cfg, out, path)
    t1 = time.perf_counter()
    ev = evaluate(ev_cfg, out=out / "test", leave_bars=False)
    rows = ev["rows"]
    vs_rr = paired_rows(rows, NAME, "round_robin")
    vs_teacher = paired_rows(rows, NAME, pc.teacher)
    vs_each = {p: paired_rows(rows, NAME, p) for p in cfg.test.policies}
    teacher_vs_rr = paired_rows(rows, pc.teacher, "round_robin")
    decision_ms = decision_time_ms(kw, path, int(cfg.test.seed))
    summary = {
        "best_round": trained["best_round"], "history": trained["history"], "train_wall_s": round(train_wall, 1),
        "test_wall_s": round(time.perf_counter() - t1, 1),
        "change_vs_round_robin_pct": vs_rr, "teacher_change_vs_round_robin_pct": teacher_vs_rr,
        "change_vs_teacher_pct": vs_teacher, "change_vs_each_pct": vs_each, "decision_ms": decision_ms,
        "table": ev["table"]}
    (out / "improve_summary.json").write_text(json.dumps(summary, indent=2))
    say(f"{NAME} (best round {trained['best_round']}, trained in {train_wall:.0f} s): "
        f"mean E2E {vs_rr[0]:+.2f} ± {vs_rr[1]:.2f}% vs round robin "
        f"({pc.teacher}: {teacher_vs_rr[0]:+.2f} ± {teacher_vs_rr[1]:.2f}%), "
        f"{vs_teacher[0]:+.2f} ± {vs_teacher[1]:.2f}% vs {pc.teacher} (paired 95% CIs, "
        f"{int(cfg.test.episodes)} test episodes); decision {decision_ms['p50']:.3f} ms p50, "
        f"{decision_ms['p99']:.3f} ms p99")
    say(f"{NAME} vs each router (mean E2E, paired 95% CI): "
        + "; ".join(f"{p} {m:+.2f} ± {h:.2f}%" for p, (m, h) in vs_each.items()))
    say(f"run dir {out}; TensorBoard: tensorboard --logdir {out / 'tb'}")
    return {"out": out, "summary": summary, "eval": ev}


@hydra_main("improve")
def main(cfg) -> float:
    return improve(cfg)["summary"]["change_vs_teacher_pct"][0]


if __name__ == "__main__":
    main()
