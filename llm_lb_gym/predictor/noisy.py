"""Noisy oracles: the true bucket, corrupted the way a real predictor errs.

Synthetic workloads (length traces) have no text, so no learned text model can run on them. To
still simulate routing under realistic prediction error, these predictors corrupt the true
bucket: ``NoisyOraclePredictor`` at a given accuracy (errors uniform over the other buckets),
``ConfusionPredictor`` by sampling each request's predicted bucket from the row of a measured
confusion matrix for its true bucket, which keeps the structure of real errors (mostly to
neighbouring buckets, biased toward the frequent ones). The matrix can come straight from the
metrics JSON that ``llm_lb_gym.experiments.train_predictor`` / ``eval_predictor`` write.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from .._validate import ConfigError, check_range
from ..workload.batch import RequestBatch
from .base import Prediction
from .buckets import BucketScheme
from .card import METRICS_FILE, restore_scheme


class NoisyOraclePredictor:
    """True bucket with probability ``accuracy``, else a uniformly drawn other bucket."""

    def __init__(self, scheme: BucketScheme, accuracy: float) -> None:
        check_range("noisy.accuracy", accuracy, 0.0, 1.0, lo_open=True)
        self.scheme = scheme
        self.accuracy = float(accuracy)

    def predict(self, batch: RequestBatch, rng: np.random.Generator) -> Prediction:
        true = self.scheme.bucket(batch.decode_tokens).astype(np.int64)
        k = self.scheme.num_buckets
        n = len(true)
        wrong = rng.random(n) >= self.accuracy
        shift = rng.integers(1, k, size=n) if k > 1 else np.zeros(n, np.int64)
        bucket = np.where(wrong, (true + shift) % k, true)
        return Prediction(bucket=bucket, tokens=self.scheme.representative(bucket).astype(np.float64),
                          scheme=self.scheme)


class ConfusionPredictor:
    """Predicted bucket drawn from P(predicted | true) = row-normalised confusion counts.

    A true bucket whose row is all zero (never seen when the matrix was measured) is predicted
    correctly: there is no evidence of how it would be confused.
    """

    def __init__(self, scheme: BucketScheme, matrix, bucket_tokens=None) -> None:
        m = np.asarray(matrix, dtype=np.float64)
        k = scheme.num_buckets
        if m.shape != (k, k):
            raise ConfigError(f"confusion matrix has shape {m.shape}; scheme {scheme.name!r} needs ({k}, {k})")
        if not np.isfinite(m).all() or (m < 0).any():
            raise ConfigError("confusion matrix entries must be finite and >= 0")
        rows = m.sum(axis=1, keepdims=True)
        self.probs = np.where(rows > 0, m / np.where(rows > 0, rows, 1.0), np.eye(k))
        self.scheme = scheme
        tokens = scheme.representative_tokens if bucket_tokens is None else bucket_tokens
        if len(tokens) != k:
            raise ConfigError(f"bucket_tokens has {len(tokens)} values; expected {k}")
        self.bucket_tokens = np.asarray(tokens, np.float64)

    def predict(self, batch: RequestBatch, rng: np.random.Generator) -> Prediction:
        true = self.scheme.bucket(batch.decode_tokens).astype(np.int64)
        bucket = np.empty_like(true)
        # One inverse-CDF draw per request: row-wise cumulative probabilities of its true bucket.
        cdf = np.cumsum(self.probs, axis=1)
        u = rng.random(len(true))
        for i in range(self.scheme.num_buckets):
            m = true == i
            bucket[m] = np.minimum(np.searchsorted(cdf[i], u[m], side="right"), self.scheme.num_buckets - 1)
        return Prediction(bucket=bucket, tokens=self.bucket_tokens[bucket], scheme=self.scheme)

    @staticmethod
    def from_metrics(path, which: str = "model") -> "ConfusionPredictor":
        """From a metrics JSON (or a saved model directory holding ``metrics.json``).

        ``which`` selects the block: "model" (the trained model) or a baseline name in
        ``baselines`` (e.g. "per_task_majority").
        """
        p = Path(path)
        if p.is_dir():
            p = p / METRICS_FILE
        if not p.is_file():
            raise ConfigError(f"confusion: {p} not found (write one with `python -m llm_lb_gym.experiments.eval_predictor`)")
        try:
            data = json.loads(p.read_text())
        except json.JSONDecodeError as e:
            raise ConfigError(f"{p}:{e.lineno}: not valid JSON ({e.msg})") from None
        for key in ("scheme", "model"):
            if key not in data:
                raise ConfigError(f"{p}: missing field {key!r}; not a metrics file of eval_predictor")
        block = data["model"] if which == "model" else data.get("baselines", {}).get(which)
        if block is None or "confusion" not in block:
            allowed = ["model"] + sorted(data.get("baselines", {}))
            raise ConfigError(f"confusion.which={which!r} is not valid for {p}; allowed: {', '.join(allowed)}")
        scheme = restore_scheme(data["scheme"].get("name", ""), data["scheme"]["edges_tokens"])
        return ConfusionPredictor(scheme, block["confusion"], data.get("bucket_mean_tokens"))
