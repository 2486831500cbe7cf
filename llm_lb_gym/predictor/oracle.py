"""The oracle: the true decode length, for upper-bound experiments.

The paper's Decode Balancer baseline and any "what if prediction were perfect" study need the
real output length; the simulator knows it (``RequestBatch.decode_tokens``), so the oracle just
reads it. Comparing a policy under the oracle and under a learned predictor isolates what
prediction error costs.
"""

from __future__ import annotations

import numpy as np

from ..workload.batch import RequestBatch
from .base import Prediction
from .buckets import BucketScheme


class OraclePredictor:
    """Exact bucket and exact decode tokens."""

    def __init__(self, scheme: BucketScheme) -> None:
        self.scheme = scheme

    def predict(self, batch: RequestBatch, rng: np.random.Generator) -> Prediction:
        """Deterministic; ``rng`` is unused (kept for the LengthPredictor protocol)."""
        tokens = np.asarray(batch.decode_tokens, np.float64)
        return Prediction(bucket=self.scheme.bucket(batch.decode_tokens).astype(np.int64),
                          tokens=tokens, scheme=self.scheme)
