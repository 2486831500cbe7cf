"""Reference predictors that every learned model is compared against on the same split.

- per-task majority: the most frequent bucket of the request's task in training. It is what
  the task name alone buys, so "balanced accuracy at least 10 points above it" is the bar the
  text must clear;
- prompt-length only: a random forest on prompt tokens (``ForestSettings(use_task=False)``);
- the same text classifier trained without the task hint (built by ``train_predictor``).
"""

from __future__ import annotations

import numpy as np

from ..data.corpus import Corpus
from .buckets import BucketScheme


class PerTaskMajority:
    """Most frequent training bucket of each task; unseen tasks get the global majority."""

    def __init__(self, majority: dict[str, int], fallback: int) -> None:
        self.majority = dict(majority)
        self.fallback = int(fallback)

    @staticmethod
    def fit(corpus: Corpus, scheme: BucketScheme) -> "PerTaskMajority":
        b = scheme.bucket(corpus.decode_tokens)
        tasks = np.asarray(corpus.task_types)
        k = scheme.num_buckets
        majority = {t: int(np.bincount(b[tasks == t], minlength=k).argmax()) for t in corpus.task_names}
        return PerTaskMajority(majority, int(np.bincount(b, minlength=k).argmax()))

    def predict_buckets(self, tasks) -> np.ndarray:
        return np.array([self.majority.get(t, self.fallback) for t in tasks], np.int64)
