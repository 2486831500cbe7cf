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
    """float64 predicted decode tokens (>= 1) of each request."""
    scheme: BucketScheme


@runtime_checkable
class LengthPredictor(Protocol):
    scheme: BucketScheme

    def predict(self, batch: RequestBatch, rng: np.random.Generator) -> Prediction:
        """Predict every request of ``batch``; any randomness comes from ``rng``."""
        ...
