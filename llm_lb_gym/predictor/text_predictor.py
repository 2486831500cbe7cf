"""Decode-length bucket prediction from the prompt text (transformer or light backend).

What the environment runs with ``predictor="transformer"`` or ``"light"``: one batched pass
over an episode's prompt texts, each prefixed with its task hint when the model was trained
with one. The task comes from the workload (``RequestBatch.task_names[task_id]``) or, with
``task_source="classifier"``, from a task classifier, for requests whose task is unknown.
The predicted token count is the mean true length of the predicted bucket on the training split
(stored in the card), a better point estimate than the bucket's midpoint on skewed buckets.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from .._validate import ConfigError, check_choice
from ..data.corpus import Corpus
from ..workload.batch import RequestBatch
from .base import Prediction
from .buckets import BucketScheme
from .card import DEFAULT_HINT_TEMPLATE, ModelCard, add_task_hint
from .task_classifier import TaskClassifier
from .textmodel import fit_text_model, load_text_model, make_settings

TASK_SOURCES = ("batch", "classifier")
TASK_CLASSIFIER_DIR = "task_classifier"


def bucket_means(scheme: BucketScheme, decode_tokens: np.ndarray) -> tuple[float, ...]:
    """Mean decode tokens of each bucket (>= 1); the scheme's representative where a bucket is empty."""
    b = scheme.bucket(decode_tokens)
    out = []
    for i in range(scheme.num_buckets):
        m = b == i
        out.append(max(1.0, float(decode_tokens[m].mean())) if m.any() else float(scheme.representative_tokens[i]))
    return tuple(out)


class TextBucketPredictor:
    """A LengthPredictor over prompt texts."""

    def __init__(self, model, card: ModelCard, task_source: str = "batch",
                 task_classifier: TaskClassifier | None = None) -> None:
        check_choice("task_source", task_source, TASK_SOURCES)
        if task_source == "classifier" and task_classifier is None:
            raise ConfigError("task_source='classifier' needs a task classifier (task_classifier=<dir>)")
        self.model = model
        self.card = card
        self.scheme = card.scheme
        self.task_source = task_source
        self.task_classifier = task_classifier

    @staticmethod
    def fit(corpus: Corpus, kind: str, scheme: BucketScheme, settings: dict | None = None,
            task_hint: bool = True, hint_template: str = DEFAULT_HINT_TEMPLATE, seed: int = 0,
            progress: bool = True) -> "TextBucketPredictor":
        typed = make_settings(kind, settings or {})
        labels = scheme.bucket(corpus.decode_tokens)
        card = ModelCard(kind=kind, target="bucket", label_names=tuple(scheme.labels()),
                         task_names=corpus.task_names, scheme_name=scheme.name,
                         edges_tokens=scheme.edges_tokens,
                         bucket_mean_tokens=bucket_means(scheme, corpus.decode_tokens),
                         task_hint=task_hint, hint_template=hint_template,
                         settings=dataclasses.asdict(typed))
        texts = _inputs(card, list(corpus.prompts), list(corpus.task_types))
        model = fit_text_model(kind, texts, labels, scheme.num_buckets, typed, seed=seed, progress=progress)
        return TextBucketPredictor(model, card)

    def predict_proba(self, texts, tasks=None) -> np.ndarray:
        """(n, num_buckets) probabilities; ``tasks`` (names) are needed when trained with the hint."""
        texts = list(texts)
        if self.card.task_hint:
            if self.task_source == "classifier":
                tasks = self.task_classifier.predict(texts)
            elif tasks is None:
                raise ConfigError("this model was trained with the task hint: pass task names, "
                                  "or load it with task_source='classifier'")
        return self.model.predict_proba(_inputs(self.card, texts, tasks))

    def predict_buckets(self, texts, tasks=None) -> np.ndarray:
        return self.predict_proba(texts, tasks).argmax(axis=1)

    def predict(self, batch: RequestBatch, rng: np.random.Generator) -> Prediction:
        """Deterministic; ``rng`` is unused (kept for the LengthPredictor protocol)."""
        if batch.texts is None:
            raise ConfigError(f"predictor {self.card.kind!r} needs prompt texts, but this workload gives none "
                              f"(RequestBatch.texts is None): use a text workload (CorpusWorkload), or "
                              f"predictor='forest', 'noisy' or 'confusion'")
        tasks = [batch.task_names[i] for i in batch.task_id]
        bucket = self.predict_buckets(batch.texts, tasks).astype(np.int64)
        tokens = np.asarray(self.card.bucket_mean_tokens, np.float64)[bucket]
        return Prediction(bucket=bucket, tokens=tokens, scheme=self.scheme)

    def save(self, directory, metrics: dict | None = None, train_data: dict | None = None) -> Path:
        d = Path(directory)
        settings = self.model.save(d)
        self.card = dataclasses.replace(self.card, settings=settings, metrics=dict(metrics or {}),
                                        train_data=dict(train_data or {}))
        self.card.save(d)
        return d

    @staticmethod
    def load(path, kind: str | None = None, task_source: str = "batch", task_classifier=None,
             **inference) -> "TextBucketPredictor":
        """Restore a saved predictor. ``task_classifier`` defaults to ``<path>/task_classifier``
        when ``task_source="classifier"``; ``inference`` overrides transformer inference options."""
        card = ModelCard.load(path)
        card.expect(kind or card.kind, "bucket", path)
        if card.kind not in ("transformer", "light"):
            raise ConfigError(f"{path} holds a {card.kind} model, not a text model")
        clf = None
        if task_source == "classifier":
            clf_dir = Path(task_classifier) if task_classifier is not None else Path(path) / TASK_CLASSIFIER_DIR
            clf = TaskClassifier.load(clf_dir)
        model = load_text_model(card.kind, path, card.settings, len(card.label_names), inference)
        return TextBucketPredictor(model, card, task_source=task_source, task_classifier=clf)


def _inputs(card: ModelCard, texts: list[str], tasks) -> list[str]:
    if not card.task_hint:
        return texts
    return add_task_hint(texts, list(tasks), card.hint_template)
