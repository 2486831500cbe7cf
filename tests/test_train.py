"""``llm_lb_gym.experiments.train``, ``reproduce`` and ``load_sweep`` in debug size, and a joblib sweep.

Each experiment trains to completion in its debug size and must leave what a user looks for:
the run record, TensorBoard events with the simulator, reward and evaluation scalars, and a
saved model that reloads and acts in the env. Training quality is a benchmark
(docs/reproduction.md), not a test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import llm_lb_gym  # noqa: F401
from llm_lb_gym.experiments._hydra import CONF_DIR, env_kwargs

torch.set_num_threads(1)
REPO = Path(__file__).resolve().parents[1]
# learned_router_ppo trains maskable_ppo_kl (no DQN options): tests/test_teacher_kl_ppo.py runs it
EXPERIMENTS = sorted(p.stem for p in (Path(CONF_DIR) / "experiment").glob("*.yaml")
                     if p.stem not in ("debug", "learned_router_ppo"))
STACKED = {"scored_teacher": "v100_near_capacity,learned_router,scored_teacher"}
"""Experiments that only stack on a setting and a learned router (tests/test_configs.py too)."""
SIM_TAGS = ("sim/mean_e2e_s", "sim/p99_e2e_s", "sim/mean_ttft_s", "sim/mean_tbt_s", "sim/preemptions",
            "sim/mean_router_wait_s")
REWARD_TAGS = ("reward/penalty", "reward/completion", "reward/guidance", "reward/guidance_weight")
EVAL_TAGS = ("eval/mean_e2e_s", "eval/change_vs_round_robin_pct")


def _compose(config_name: str, overrides: list[str]):
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose(config_name=config_name, overrides=overrides)


def _scalars(run: Path) -> dict[str, list[float]]:
    files = list((run / "tb").rglob("events.out.tfevents.*"))
    assert files, f"no TensorBoard event file under {run / 'tb'}"
    out: dict[str, list[float]] = {}
    for f in files:
        acc = EventAccumulator(str(f), size_guidance={"scalars": 0})
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            out.setdefault(tag, []).extend(e.value for e in acc.Scalars(tag))
    return out


def _reloads_and_acts(cfg, model_path: Path) -> None:
    from llm_lb_gym.agents import load_agent, predict_action

    env = gym.make("LLMCluster-v0", **env_kwargs(cfg))
    agent = load_agent(cfg.agent.name, model_path, env=None)
    obs, info = env.reset(seed=7)
    for _ in range(20):
        a = predict_action(agent, obs, info["action_mask"])
        assert info["action_mask"][a] or not info["action_mask"].any()
        obs, _, term, trunc, info = env.step(a)
        if term or trunc:
            break


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_experiment_trains_in_debug_size(experiment, tmp_path):
    from llm_lb_gym.experiments.train import train

    holds = experiment in ("learned_router", "scored_teacher")
    more = ["train.episodes=40"] if holds else []   # it holds requests: longer episodes
    cfg = _compose("train", [f"experiment=[{STACKED.get(experiment, experiment)},debug]",
                             "agent.kwargs.learning_starts=50", *more])
    try:
        res = train(cfg, out=tmp_path)
    except FileNotFoundError as err:   # trace workloads read ../shared/data
        pytest.skip(f"needs shared data: {err}")
    for name in ("resolved_config.yaml", "run.json", "model.zip", "train_summary.json", "eval/summary.md"):
        assert (tmp_path / name).exists(), name
    record = json.loads((tmp_path / "run.json").read_text())
    assert record["seed"] == cfg.seed and record["episode_steps"] > 0
    summary = json.loads((tmp_path / "train_summary.json").read_text())
    assert record["workload"] == summary["workload"]   # the workload replayed, named in the results
    assert f"workload {record['workload']}" in (tmp_path / "eval" / "summary.md").read_text()
    scalars = _scalars(tmp_path)
    for tag in SIM_TAGS + REWARD_TAGS + EVAL_TAGS + ("train/loss", "rollout/exploration_rate"):
        assert tag in scalars, f"{tag} missing; have {sorted(scalars)}"
    _reloads_and_acts(cfg, res["model_path"])
    agents = {r["policy"] for r in res["eval"]["rows"]}
    assert {"round_robin", cfg.name} <= agents


def test_guidance_weight_anneals_over_training_episodes(tmp_path):
    """WG-RL: the weight TensorBoard shows falls as scale * exp(-decay * k) over finished episodes."""
    from llm_lb_gym.experiments.train import train

    cfg = _compose("train", ["experiment=debug", "train.episodes=4", "train.eval_every_episodes=0"])
    train(cfg, out=tmp_path)
    w = _scalars(tmp_path)["reward/guidance_weight"]
    assert len(w) >= 3
    scale, decay = cfg.reward.guidance_scale, cfg.reward.decay
    assert np.allclose(w[:3], [scale * np.exp(-decay * k) for k in range(3)])


@pytest.mark.parametrize("agent,extra", [
    ("reinforce", []),
    ("maskable_ppo", ["agent.kwargs.n_steps=64", "agent.kwargs.batch_size=32"]),
])
def test_other_agents_train_through_the_same_entry_point(agent, extra, tmp_path):
    from llm_lb_gym.experiments.train import train

    cfg = _compose("train", ["experiment=debug", f"agent={agent}", "reward=baseline", *extra])
    res = train(cfg, out=tmp_path)
    assert res["model_path"].exists()
    assert "sim/mean_e2e_s" in _scalars(tmp_path)
    _reloads_and_acts(cfg, res["model_path"])


def test_reproduce_writes_the_paper_table(tmp_path):
    from llm_lb_gym.experiments.reproduce import reproduce

    trace = Path(__file__).resolve().parent / "fixtures" / "traces" / "tiny_mooncake.jsonl"
    cfg = _compose("reproduce", ["extra_experiments=[debug]", "run_variants=[baseline_rl,wg_rl]",
                                 "eval_episodes=2", "policies=[round_robin,jsq]", "workload=trace",
                                 f"workload.path={trace}", "workload.format=mooncake"])
    res = reproduce(cfg, out=tmp_path)
    text = (tmp_path / "reproduction.md").read_text()
    for row in ("| round_robin |", "| Baseline RL |", "| WG-RL |", "| jsq |", "| lookahead |"):
        assert row in text, row
    assert "+11.43" in text and "+0.46" in text     # the paper's WG-RL and JSQ beside ours
    assert res["results"][0]["load_factor"] > 0
    workload = json.loads((tmp_path / "reproduction.json").read_text())[0]["workload"]
    assert workload == f"trace {trace} (mooncake) at rate_scale 1" and f"workload {workload}" in text
    for variant in ("baseline_rl", "wg_rl"):   # trained on the same file
        assert json.loads((tmp_path / "paper_v100" / variant / "run.json").read_text())["workload"] == workload
    for figure in ("paper_v100_reduction.png", "paper_v100_learning_curves.png"):
        assert (tmp_path / figure).stat().st_size > 0, figure


def test_reproduce_distils_a_network_per_setting_and_reuses_it(tmp_path):
    """The ``distilled`` variant: policy iteration from the setting's searched scored_binding
    (conf/improve.yaml, ``trainer: improve``), evaluated beside the heuristics as ``kind:
    distilled``; ``models_from`` reuses the saved network instead of training it again."""
    from llm_lb_gym.experiments.reproduce import reproduce

    small = ("+variants.distilled.overrides=['improve.rounds=1','improve.episodes_per_round=1',"
             "'improve.max_labels_per_episode=3','improve.label_every=3','improve.validation_seeds=[500]',"
             "'improve.epochs=1','improve.executor=inline']")
    base = ["extra_experiments=[debug]", "run_variants=[distilled]", "eval_episodes=2", "extra_policies=[]",
            "policies=[round_robin,scored_binding]", "figures=false", small]
    reproduce(_compose("reproduce", [*base, "run_variants=[distilled,ppo_kl]"]), out=tmp_path / "a")
    ppo = json.loads((tmp_path / "a" / "paper_v100" / "ppo_kl" / "variant.json").read_text())
    assert ppo["kind"] == "maskable_ppo_kl" and "| PPO + KL to the teacher |" in (tmp_path / "a" / "reproduction.md").read_text()
    rec = json.loads((tmp_path / "a" / "paper_v100" / "distilled" / "variant.json").read_text())
    assert rec["kind"] == "distilled" and rec["teacher"] == "scored_binding"
    assert rec["env"]["action"]["order"] == "scored" and Path(rec["model"]).exists()
    text = (tmp_path / "a" / "reproduction.md").read_text()
    assert "| Distilled network (policy iteration) |" in text and "| scored_binding |" in text
    res = reproduce(_compose("reproduce", [*base, f"models_from={tmp_path / 'a'}"]), out=tmp_path / "b")
    assert not (tmp_path / "b" / "paper_v100" / "distilled").exists()   # reused, not trained
    assert res["results"][0]["trained"]["distilled"]["model"] == rec["model"]
    assert (tmp_path / "b" / "reproduction.md").read_text().count("| Distilled network (policy iteration) |") == 1
    from llm_lb_gym._validate import ConfigError

    with pytest.raises(ConfigError, match="variants.distilled.trainer='improv' is not valid; allowed: train, improve"):
        reproduce(_compose("reproduce", [*base, "variants.distilled.trainer=improv"]), out=tmp_path / "c")


def test_load_sweep_table(tmp_path):
    from llm_lb_gym.experiments.load_sweep import load_sweep

    cfg = _compose("load_sweep", ["experiment=debug", "load_factors=[0.5,2]", "episodes=2",
                                  "policies=[round_robin,jsq]"])
    res = load_sweep(cfg, out=tmp_path)
    assert res["capacity_rps"] > 0
    lines = (tmp_path / "load_sweep.md").read_text().splitlines()
    assert sum(line.startswith("| 0.5 |") or line.startswith("| 2 |") for line in lines) == 2
    assert (tmp_path / "load_sweep_gain.png").stat().st_size > 0


def test_joblib_sweep_of_two_jobs(tmp_path):
    """``--multirun`` with the joblib launcher: two seeds, two run directories with models."""
    cmd = [sys.executable, "-m", "llm_lb_gym.experiments.train", "-m", "experiment=debug", "seed=0,1",
           "train.episodes=2", "train.eval_every_episodes=0", "eval.episodes=1",
           "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", f"hydra.sweep.dir={tmp_path}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = sorted(p.parent for p in tmp_path.glob("*/model.zip"))
    assert len(runs) == 2
    seeds = sorted(json.loads((r / "run.json").read_text())["seed"] for r in runs)
    assert seeds == [0, 1]


def test_evaluate_uses_the_settings_tuned_router_options():
    """``llm_lb_gym.experiments.evaluate experiment=X`` runs X's tuned options (its eval.policy_options),
    and a command-line ``policy_options.<router>`` replaces that router's entry."""
    from llm_lb_gym.experiments.evaluate import policy_options

    from llm_lb_gym.routers.registry import make_router

    default = make_router("late_binding", **policy_options(_compose("evaluate", []))["late_binding"])
    near = policy_options(_compose("evaluate", ["experiment=v100_near_capacity"]))["late_binding"]
    assert default.options.period_s == 0.1 and default.options.reserve == "prompt"
    assert near["period_s"] == 0.1 and near["reserve"] == "full"
    given = policy_options(_compose("evaluate", ["experiment=v100_near_capacity",
                                                 "policy_options={late_binding: {period_s: 0.5}}"]))
    assert given["late_binding"] == {"period_s": 0.5}
