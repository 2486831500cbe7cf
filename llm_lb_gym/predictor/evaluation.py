"""Held-out evaluation of a saved bucket predictor against its baselines, and its CPU latency.

Shared by ``llm_lb_gym.experiments.train_predictor`` (which evaluates right after training and saves
``metrics.json`` beside the model) and ``llm_lb_gym.experiments.eval_predictor`` (any saved model on any
corpus of the same fields). The output is one JSON-able dict; its ``scheme`` and
``model.confusion`` are what ``make_predictor("confusion", path=...)`` reads back.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import numpy as np

from ..data.corpus import Corpus
from .baselines import PerTaskMajority
from .card import ModelCard, scheme_dict
from .forest import ForestPredictor, ForestSettings
from .metrics import report
from .task_classifier import TaskClassifier
from .text_predictor import TASK_CLASSIFIER_DIR, TextBucketPredictor

NO_HINT_DIR = "no_hint"


def load_bucket_model(path, **inference):
    card = ModelCard.load(path)
    if card.kind == "forest":
        return ForestPredictor.load(path)
    return TextBucketPredictor.load(path, **inference)


def predict_corpus(model, corpus: Corpus) -> np.ndarray:
    """Buckets a saved model predicts for every row of ``corpus`` (true task names as hint)."""
    if isinstance(model, ForestPredictor):
        return model.predict_buckets(corpus.prompt_tokens, corpus.task_types)
    return model.predict_buckets(corpus.prompts, corpus.task_types)


def _task_ids(corpus: Corpus) -> tuple[np.ndarray, tuple[str, ...]]:
    names = corpus.task_names
    index = {t: i for i, t in enumerate(names)}
    return np.array([index[t] for t in corpus.task_types], np.int64), names


def score(buckets: np.ndarray, corpus: Corpus, scheme) -> dict:
    groups, names = _task_ids(corpus)
    return report(scheme.bucket(corpus.decode_tokens), buckets, scheme.num_buckets, groups, names)


def latency(fn, corpus: Corpus, batch_size: int, repeats: int, seed: int) -> dict:
    """Wall and CPU time of ``fn(rows)`` on random batches of ``batch_size`` rows (after a warm-up).

    The machine may be shared, so beside the wall-clock median and 90th percentile this reports
    the minimum (the call least disturbed), the load average, and the process CPU time per
    batch: other processes stretch wall time but not the CPU time this one needs, so
    ``cpu_ms / threads`` is what the call takes on idle cores (when its threads scale).
    """
    rng = np.random.default_rng(seed)
    n = len(corpus)
    draws = [rng.choice(n, size=batch_size, replace=n < batch_size) for _ in range(repeats + 1)]
    wall, cpu = [], []
    for i, idx in enumerate(draws):
        sub = corpus.take(idx)
        t0, c0 = time.perf_counter(), time.process_time()
        fn(sub)
        if i:
            wall.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
    ms, cpu_ms = np.asarray(wall) * 1e3, np.asarray(cpu) * 1e3
    out = {"batch_size": batch_size, "repeats": repeats, "median_ms": float(np.median(ms)),
           "min_ms": float(ms.min()), "p90_ms": float(np.percentile(ms, 90)),
           "cpu_ms_median": float(np.median(cpu_ms)), "load_average_1min": float(os.getloadavg()[0])}
    if "torch" in sys.modules:  # only report what was used; never import torch for this
        out["torch_threads"] = sys.modules["torch"].get_num_threads()
    return out


def evaluate(model_dir, test: Corpus, train: Corpus | None, *, baselines: bool = True,
             task_classifier: bool = True, latency_batch: int = 64, latency_repeats: int = 20,
             seed: int = 0, inference: dict | None = None) -> dict:
    """Metrics of the model in ``model_dir`` on ``test``; baselines are fit on ``train``."""
    model_dir = Path(model_dir)
    model = load_bucket_model(model_dir, **(inference or {}))
    scheme = model.scheme
    card = model.card
    out = {
        "model_dir": str(model_dir), "kind": card.kind, "task_hint": card.task_hint,
        "scheme": scheme_dict(scheme), "bucket_mean_tokens": list(card.bucket_mean_tokens),
        "test_rows": len(test), "test_source": test.source,
        "true_bucket_share": (np.bincount(scheme.bucket(test.decode_tokens), minlength=scheme.num_buckets)
                              / max(1, len(test))).tolist(),
    }
    out["model"] = score(predict_corpus(model, test), test, scheme)
    if latency_repeats > 0:
        out["model"]["latency"] = latency(lambda c: predict_corpus(model, c), test,
                                          latency_batch, latency_repeats, seed)
        if card.kind == "transformer":
            s = model.model.settings
            out["model"]["latency"]["inference"] = {"runtime": s.runtime, "quantize": s.quantize,
                                                    "micro_batch": s.micro_batch, "threads": s.threads}
    if card.kind != "forest" and task_classifier and (model_dir / TASK_CLASSIFIER_DIR).is_dir():
        out.update(_task_blocks(model_dir, test, scheme, inference))
    if baselines:
        out["baselines"] = _baselines(model_dir, test, train, scheme, latency_batch, latency_repeats, seed, inference)
    return out


def _task_blocks(model_dir: Path, test: Corpus, scheme, inference) -> dict:
    clf = TaskClassifier.load(model_dir / TASK_CLASSIFIER_DIR)
    known = set(clf.task_names)
    pred = clf.predict(test.prompts)
    ok = np.array([p == t for p, t in zip(pred, test.task_types)])
    out = {"task_classifier": {"accuracy": float(ok.mean()), "kind": clf.card.kind,
                               "unseen_task_rows": int(sum(t not in known for t in test.task_types))}}
    routed = TextBucketPredictor.load(model_dir, task_source="classifier", **(inference or {}))
    if routed.card.task_hint:
        out["model_with_predicted_task"] = score(routed.predict_buckets(test.prompts), test, scheme)
    return out


def _baselines(model_dir: Path, test: Corpus, train: Corpus | None, scheme, latency_batch, latency_repeats,
               seed, inference) -> dict:
    out = {}
    if train is not None:
        out["per_task_majority"] = score(PerTaskMajority.fit(train, scheme).predict_buckets(test.task_types),
                                         test, scheme)
        length_only = ForestPredictor.fit(train, scheme, ForestSettings(use_task=False, class_weight="balanced"), seed=seed)
        out["prompt_length_only"] = score(predict_corpus(length_only, test), test, scheme)
    if (model_dir / NO_HINT_DIR).is_dir():
        no_hint = load_bucket_model(model_dir / NO_HINT_DIR, **(inference or {}))
        out["no_hint"] = score(predict_corpus(no_hint, test), test, scheme)
    return out
