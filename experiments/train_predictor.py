"""Train a decode-length bucket predictor on a prompt/response corpus, then evaluate it.

    python -m llm_lb_gym.experiments.train_predictor                      # MiniLM + task hint, time4 buckets
    python -m llm_lb_gym.experiments.train_predictor kind=light           # hashed n-grams + logistic regression
    python -m llm_lb_gym.experiments.train_predictor kind=forest scheme=paper_dqn
    python -m llm_lb_gym.experiments.train_predictor kind=forest data.path=$(python -m llm_lb_gym.data path azure_conv)

Writes to ``out_dir`` (default ``artifacts/predictor/<kind>-<scheme>``): the model and its
``predictor.json`` card, ``no_hint/`` (the same model without the hint, a baseline),
``task_classifier/``, ``metrics.json`` (held-out metrics of the model and every baseline,
readable by ``make_predictor("confusion", path=...)``), the resolved config and the command.
"""

from __future__ import annotations

from llm_lb_gym.extras import require

# before the imports below: name the extra, not a missing module
require("rl", "llm-lb-gym train_predictor", modules=("hydra", "omegaconf"))
require("text", "llm-lb-gym train_predictor")

import dataclasses
import shutil
import time
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from llm_lb_gym.experiments._hydra import hydra_main
from llm_lb_gym.experiments._predictor_common import dump_json, repo_path, set_threads, write_run_record
from llm_lb_gym._validate import check_choice, check_range
from llm_lb_gym.data import DEFAULT_CORPUS, load_any, locate
from llm_lb_gym.predictor.card import CARD_FILE, METRICS_FILE, ModelCard
from llm_lb_gym.predictor.evaluation import NO_HINT_DIR, evaluate
from llm_lb_gym.predictor.forest import ForestPredictor, ForestSettings
from llm_lb_gym.predictor.registry import resolve_scheme
from llm_lb_gym.predictor.task_classifier import TaskClassifier
from llm_lb_gym.predictor.text_predictor import TASK_CLASSIFIER_DIR, TextBucketPredictor

KINDS = ("transformer", "light", "forest")


def _fit(kind: str, cfg: DictConfig, train, scheme, task_hint: bool):
    if kind == "forest":
        return ForestPredictor.fit(train, scheme, ForestSettings.from_options(_plain(cfg.forest)), seed=cfg.seed)
    return TextBucketPredictor.fit(train, kind, scheme, _plain(cfg[kind]), task_hint=task_hint,
                                   hint_template=cfg.hint_template, seed=cfg.seed, progress=cfg.progress)


def _plain(node) -> dict:
    return dict(OmegaConf.to_container(node, resolve=True) or {})


def train_predictor(cfg: DictConfig) -> dict:
    """Train, save and evaluate; returns the metrics dict also written to ``metrics.json``."""
    kind = cfg.kind
    check_choice("kind", kind, KINDS)
    check_range("data.test_fraction", cfg.data.test_fraction, 0.0, 1.0, lo_open=True, hi_open=True)
    set_threads(cfg.threads, kind == "transformer")
    scheme = resolve_scheme(cfg.scheme)
    # Absolute, so the card still finds its corpus when eval_predictor runs from elsewhere.
    path = Path(cfg.data.path).expanduser().resolve() if cfg.data.path else locate(DEFAULT_CORPUS).resolve()
    csv = _plain(cfg.data.csv)
    corpus = load_any(path, **csv)
    tf = float(cfg.data.test_fraction)
    train_all, test = corpus.split("train", tf), corpus.split("test", tf)
    max_rows = _plain(cfg.data.max_train_rows).get(kind)
    train = train_all.subsample(max_rows, cfg.seed)
    test_eval = test.subsample(cfg.data.max_eval_rows, cfg.seed)
    task_hint = bool(cfg.task_hint) and kind != "forest"

    out_dir = repo_path(cfg.out_dir or f"artifacts/predictor/{kind}-{cfg.scheme}")
    if (out_dir / CARD_FILE).is_file():
        shutil.rmtree(out_dir)  # a previous run's no_hint/ or task_classifier/ must not linger
    train_data = {"path": str(path), "test_fraction": tf, "train_rows": len(train),
                  "train_rows_available": len(train_all), "test_rows": len(test), "seed": int(cfg.seed)}
    if str(path).endswith(".csv"):
        train_data["csv"] = csv

    timings = {}
    t0 = time.perf_counter()
    model = _fit(kind, cfg, train, scheme, task_hint)
    timings["train_s"] = time.perf_counter() - t0
    model.save(out_dir, train_data=train_data)
    if kind != "forest" and task_hint and cfg.baselines.no_hint:
        t0 = time.perf_counter()
        _fit(kind, cfg, train, scheme, task_hint=False).save(out_dir / NO_HINT_DIR, train_data=train_data)
        timings["train_no_hint_s"] = time.perf_counter() - t0
    if kind != "forest" and cfg.task_classifier.enabled:
        t0 = time.perf_counter()
        clf = TaskClassifier.fit(train_all, cfg.task_classifier.kind, _plain(cfg.task_classifier.settings),
                                 seed=cfg.seed, progress=cfg.progress)
        clf.save(out_dir / TASK_CLASSIFIER_DIR, train_data=train_data | {"train_rows": len(train_all)})
        timings["train_task_classifier_s"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    inference = {"threads": int(cfg.threads)} if kind == "transformer" and cfg.threads else None
    metrics = evaluate(out_dir, test_eval, train_all, baselines=True, task_classifier=True,
                       latency_batch=cfg.eval.latency_batch, latency_repeats=cfg.eval.latency_repeats,
                       seed=cfg.seed, inference=inference)
    timings["evaluate_s"] = time.perf_counter() - t0
    metrics["timings_s"] = timings
    metrics["train_data"] = train_data
    dump_json(metrics, out_dir / METRICS_FILE)
    card = ModelCard.load(out_dir)
    summary = {k: metrics["model"][k] for k in ("accuracy", "balanced_accuracy", "macro_f1", "n")}
    dataclasses.replace(card, metrics=summary).save(out_dir)
    write_run_record(out_dir, cfg, "train_predictor")
    return metrics


@hydra_main("train_predictor")
def main(cfg: DictConfig) -> None:
    metrics = train_predictor(cfg)
    print(dump_json(metrics))


if __name__ == "__main__":
    main()
