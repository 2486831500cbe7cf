"""Evaluate a saved bucket predictor on any JSONL corpus of the same fields; print JSON.

    python -m llm_lb_gym.experiments.eval_predictor model=artifacts/predictor/transformer-time4
    python -m llm_lb_gym.experiments.eval_predictor model=... data.path=other.jsonl data.split=all

Reports accuracy, balanced accuracy, macro-F1, per-task accuracy, the confusion matrix and
the CPU latency per batch of 64, for the model and for the baselines on the same rows:
per-task majority bucket and prompt-length-only forest (both fit on the training split of the
model's own corpus), and the same classifier without the task hint (when it was trained).
"""

from __future__ import annotations

from llm_lb_gym.extras import require

# before the imports below: name the extra, not a missing module
require("rl", "llm-lb-gym eval_predictor", modules=("hydra", "omegaconf"))
require("text", "llm-lb-gym eval_predictor")

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from llm_lb_gym.experiments._hydra import hydra_main
from llm_lb_gym.experiments._predictor_common import dump_json, repo_path, set_threads
from llm_lb_gym._validate import ConfigError
from llm_lb_gym.data import load_any
from llm_lb_gym.predictor.card import ModelCard
from llm_lb_gym.predictor.evaluation import evaluate


def eval_predictor(cfg: DictConfig) -> dict:
    if not cfg.model:
        raise ConfigError("model=<saved predictor directory> is required")
    model_dir = repo_path(cfg.model)
    card = ModelCard.load(model_dir)
    set_threads(cfg.threads, card.kind == "transformer")
    trained_on = card.train_data.get("path")
    path = cfg.data.path or trained_on
    if not path:
        raise ConfigError(f"{model_dir} does not record its training corpus: pass data.path=<corpus>")
    csv = card.train_data.get("csv") or {}
    tf = float(cfg.data.test_fraction or card.train_data.get("test_fraction", 0.2))
    corpus = load_any(path, **csv)
    test = corpus.split(cfg.data.split, tf).subsample(cfg.data.max_rows, cfg.seed)
    train = None
    if cfg.baselines:
        if trained_on and Path(trained_on).is_file():
            base = corpus if Path(trained_on).resolve() == Path(path).resolve() else load_any(trained_on, **csv)
            train = base.split("train", tf)
        elif cfg.data.split == "test":
            train = corpus.split("train", tf)
    inference = {k: v for k, v in (OmegaConf.to_container(cfg.inference, resolve=True) or {}).items()
                 if v is not None}
    if card.kind != "transformer":
        inference = {}
    elif cfg.threads:
        inference.setdefault("threads", int(cfg.threads))  # ONNX Runtime's threads follow torch's
    metrics = evaluate(model_dir, test, train, baselines=bool(cfg.baselines), task_classifier=True,
                       latency_batch=cfg.latency.batch_size, latency_repeats=cfg.latency.repeats,
                       seed=cfg.seed, inference=inference)
    metrics["eval_data"] = {"path": str(path), "split": cfg.data.split, "test_fraction": tf}
    if cfg.output:
        dump_json(metrics, repo_path(cfg.output))
    return metrics


@hydra_main("eval_predictor")
def main(cfg: DictConfig) -> None:
    print(dump_json(eval_predictor(cfg)))


if __name__ == "__main__":
    main()
