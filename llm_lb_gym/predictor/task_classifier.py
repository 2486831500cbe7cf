"""A task-type classifier: which task (chat, math, translation, ...) a prompt is.

The bucket predictor is much better with the task hint, but a router does not always know the
task of a request; the paper predicts it first (93.79% accuracy with DistilBERT) and feeds the
predicted task into the hint. Any text backend works ("light" by default: on this corpus the
task is nearly a bag-of-words property, and the light model costs a millisecond).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from ..data.corpus import Corpus
from .card import ModelCard
from .textmodel import fit_text_model, load_text_model, make_settings


class TaskClassifier:
    """Predicts task names from prompt texts."""

    def __init__(self, model, card: ModelCard) -> None:
        if card.target != "task":
            raise ValueError(f"TaskClassifier needs a task model, got a {card.target} model")
        self.model = model
        self.card = card

    @property
    def task_names(self) -> tuple[str, ...]:
        return self.card.label_names

    @staticmethod
    def fit(corpus: Corpus, kind: str = "light", settings: dict | None = None, seed: int = 0,
            progress: bool = True) -> "TaskClassifier":
        names = corpus.task_names
        index = {t: i for i, t in enumerate(names)}
        labels = np.array([index[t] for t in corpus.task_types], np.int64)
        typed = make_settings(kind, settings or {})
        model = fit_text_model(kind, list(corpus.prompts), labels, len(names), typed, seed=seed, progress=progress)
        card = ModelCard(kind=kind, target="task", label_names=names, task_names=names,
                         settings=dataclasses.asdict(typed))
        return TaskClassifier(model, card)

    def predict_ids(self, texts) -> np.ndarray:
        """Index into ``task_names`` of each prompt."""
        return self.model.predict(list(texts))

    def predict(self, texts) -> list[str]:
        return [self.task_names[i] for i in self.predict_ids(texts)]

    def save(self, directory, metrics: dict | None = None, train_data: dict | None = None) -> Path:
        d = Path(directory)
        settings = self.model.save(d)
        card = dataclasses.replace(self.card, settings=settings, metrics=dict(metrics or {}),
                                   train_data=dict(train_data or {}))
        card.save(d)
        self.card = card
        return d

    @staticmethod
    def load(directory) -> "TaskClassifier":
        card = ModelCard.load(directory)
        card.expect(card.kind, "task", directory)
        return TaskClassifier(load_text_model(card.kind, directory, card.settings, len(card.label_names)), card)
