"""A random forest on request metadata: prompt tokens and task (application) name.

For traces that record token counts but no text (the paper's production trace: 79.0% bucket
accuracy from prompt tokens and application). Features are the prompt length and a one-hot of
the task name; a task name not seen in training gets an all-zero one-hot, so the forest falls
back to what prompt length alone says. Also trained on the text corpus, it is the
"metadata-only" reference for the text models.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .._validate import ConfigError, check_choice, check_int, reject_unknown
from ..data.corpus import Corpus
from ..workload.batch import RequestBatch
from .base import Prediction
from .buckets import BucketScheme
from .card import ModelCard
from .text_predictor import bucket_means

MODEL_FILE = "model.joblib"


@dataclass(frozen=True)
class ForestSettings:
    n_estimators: int = 100
    max_depth: int = 12
    """0 for unlimited depth."""
    min_samples_leaf: int = 5
    class_weight: str = "none"
    """"none" or "balanced"."""
    use_task: bool = True
    """False: prompt tokens only (the prompt-length-only baseline)."""

    def __post_init__(self) -> None:
        check_int("forest.n_estimators", self.n_estimators, 1)
        check_int("forest.max_depth", self.max_depth, 0)
        check_int("forest.min_samples_leaf", self.min_samples_leaf, 1)
        check_choice("forest.class_weight", self.class_weight, ("none", "balanced"))

    @staticmethod
    def from_options(options: dict | None) -> "ForestSettings":
        options = dict(options or {})
        reject_unknown("forest setting", options, ForestSettings.__dataclass_fields__)
        return ForestSettings(**options)


def features(prompt_tokens, tasks, task_names, use_task: bool) -> np.ndarray:
    """(n, 1 + len(task_names)) float32: prompt tokens, then the task one-hot (if used)."""
    p = np.asarray(prompt_tokens, np.float32).reshape(-1, 1)
    if not use_task:
        return p
    index = {t: i for i, t in enumerate(task_names)}
    onehot = np.zeros((len(p), len(task_names)), np.float32)
    for r, t in enumerate(tasks):
        j = index.get(t)
        if j is not None:
            onehot[r, j] = 1.0
    return np.hstack([p, onehot])


class ForestPredictor:
    """A LengthPredictor over (prompt tokens, task name)."""

    def __init__(self, forest, card: ModelCard) -> None:
        self.forest = forest
        self.card = card
        self.scheme = card.scheme
        self.settings = ForestSettings(**card.settings)

    @staticmethod
    def fit(corpus: Corpus, scheme: BucketScheme, settings: ForestSettings = ForestSettings(),
            seed: int = 0) -> "ForestPredictor":
        from ..extras import require

        require("text", "the metadata forest predictor", modules=("sklearn",))
        from sklearn.ensemble import RandomForestClassifier

        task_names = corpus.task_names
        forest = RandomForestClassifier(
            n_estimators=settings.n_estimators, max_depth=settings.max_depth or None,
            min_samples_leaf=settings.min_samples_leaf, random_state=seed, n_jobs=1,
            class_weight=None if settings.class_weight == "none" else "balanced")
        forest.fit(features(corpus.prompt_tokens, corpus.task_types, task_names, settings.use_task),
                   scheme.bucket(corpus.decode_tokens))
        card = ModelCard(kind="forest", target="bucket", label_names=tuple(scheme.labels()),
                         task_names=task_names, scheme_name=scheme.name, edges_tokens=scheme.edges_tokens,
                         bucket_mean_tokens=bucket_means(scheme, corpus.decode_tokens),
                         settings=dataclasses.asdict(settings))
        return ForestPredictor(forest, card)

    def predict_buckets(self, prompt_tokens, tasks) -> np.ndarray:
        x = features(prompt_tokens, tasks, self.card.task_names, self.settings.use_task)
        return self.forest.classes_[self.forest.predict_proba(x).argmax(axis=1)].astype(np.int64)

    def predict(self, batch: RequestBatch, rng: np.random.Generator) -> Prediction:
        """Deterministic; ``rng`` is unused (kept for the LengthPredictor protocol)."""
        tasks = [batch.task_names[i] for i in batch.task_id]
        bucket = self.predict_buckets(batch.prompt_tokens, tasks)
        tokens = np.asarray(self.card.bucket_mean_tokens, np.float64)[bucket]
        return Prediction(bucket=bucket, tokens=tokens, scheme=self.scheme)

    def save(self, directory, metrics: dict | None = None, train_data: dict | None = None) -> Path:
        import joblib

        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        joblib.dump(self.forest, d / MODEL_FILE)
        self.card = dataclasses.replace(self.card, metrics=dict(metrics or {}), train_data=dict(train_data or {}))
        self.card.save(d)
        return d

    @staticmethod
    def load(path) -> "ForestPredictor":
        """Load a saved forest (a pickle: load only directories you trust)."""
        import joblib

        card = ModelCard.load(path)
        card.expect("forest", "bucket", path)
        if not (Path(path) / MODEL_FILE).is_file():
            raise ConfigError(f"{Path(path) / MODEL_FILE} not found")
        return ForestPredictor(joblib.load(Path(path) / MODEL_FILE), card)
