"""The predictor interface the environment and the heuristics use.

A predictor maps an episode's requests to a decode-length bucket and a point estimate of decode
tokens. It runs once per episode over the whole batch (vectorised; for the transformer that is a
batched forward pass), before the simulation starts, so its cost never sits in the step loop.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from ..workload.batch import RequestBatch
from .buckets import BucketScheme


@dataclass(frozen=True)
class Prediction:
    bucket: np.ndarray
    """int64 predicted bucket of each request under ``scheme``."""
    tokens: np.ndarray
    """float64 predicted decode tokens (>= 1) of each request: the point estimate (calibrated
    predictors: the expected length given what the predictor saw)."""
    scheme: BucketScheme
    upper_tokens: np.ndarray | None = None
    """float64 an upper quantile of each request's decode tokens (calibrated predictors: the
    table's ``quantile``, 0.9 by default), >= ``tokens`` where the distribution is skewed right;
    None: the same as ``tokens`` (no uncertainty stated: the oracle, uncalibrated labels)."""
    probs: np.ndarray | None = None
    """float64 (n, num_buckets) probability of each true bucket; None: one-hot on ``bucket``."""

    def __post_init__(self) -> None:
        n = len(self.bucket)
        if len(self.tokens) != n:
            raise ValueError(f"Prediction.tokens has {len(self.tokens)} rows, expected {n}")
        if self.upper_tokens is not None and len(self.upper_tokens) != n:
            raise ValueError(f"Prediction.upper_tokens has {len(self.upper_tokens)} rows, expected {n}")
        if self.probs is not None and np.shape(self.probs) != (n, self.scheme.num_buckets):
            raise ValueError(f"Prediction.probs has shape {np.shape(self.probs)}, expected "
                             f"({n}, {self.scheme.num_buckets})")

    @property
    def upper(self) -> np.ndarray:
        """``upper_tokens``, or ``tokens`` where the predictor states no uncertainty."""
        return self.tokens if self.upper_tokens is None else self.upper_tokens

    @property
    def bucket_probs(self) -> np.ndarray:
        """``probs``, or one-hot on ``bucket``."""
        if self.probs is not None:
            return self.probs
        return np.eye(self.scheme.num_buckets)[np.asarray(self.bucket, np.int64)]


@runtime_checkable
class LengthPredictor(Protocol):
    scheme: BucketScheme

    def predict(self, batch: RequestBatch, rng: np.random.Generator) -> Prediction:
        """Predict every request of ``batch``; any randomness comes from ``rng``."""
        ...
