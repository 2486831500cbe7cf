"""What a deployment knows about its own predictor: calibrated expectations and quantiles.

A length predictor emits a label (a bucket). What a router needs is a number of tokens and how
sure that number is. Using a bucket's midpoint as "the" prediction (what the noisy oracle did
before 0.7.0) is not what any deployment would do: an operator runs the predictor over last
week's traffic, whose true output lengths are logged, and tabulates, for each predicted label
(and each task or application the gateway knows), the distribution of the true lengths. Then
a prediction is

- ``tokens``: E[decode tokens | task, label] (the point estimate every router reads);
- ``upper_tokens``: the ``quantile`` (0.9 by default) of that distribution: how large it may be;
- ``probs``: P(true bucket | task, label): how sure the label is.

On the task mix with the paper's 79% accuracy and 3 token buckets, the midpoint of a
mispredicted ">= 2048" label is 3,072 tokens, while a request given that label has in truth a
few hundred on average; a router reserving KV for 3,072 tokens holds everything (the +67%
cliff of ``scored_binding`` in package 0.6.0). Calibrated, the same labels say "~300, up to
~700".

The history sample is drawn from the workload with a fixed seed of its own (``seed``), never
from an episode's generator, so calibration changes no episode and costs nothing per reset.
Workloads that hold a train/test split (``TraceWorkload(split=...)``) give their *training*
rows (``calibration_sample``), so a held-out evaluation never calibrates on its own rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._validate import ConfigError, check_int, check_range
from ..workload.batch import RequestBatch
from .base import Prediction
from .buckets import BucketScheme

CALIBRATION_SEED = 20240823
"""The history sample's seed (the paper's arXiv date): fixed, so calibration is reproducible
and independent of episode seeds."""


@dataclass(frozen=True)
class CalibrationConfig:
    """How the predictive table is estimated."""

    requests: int = 20_000
    """History requests drawn from the workload (its training rows where it has a split)."""
    quantile: float = 0.9
    """The upper quantile reported as ``upper_tokens``, in [0.5, 1)."""
    min_cell: int = 50
    """A (task, label) cell with fewer history requests uses the label's pooled cell (all
    tasks), and a label with fewer uses the whole history."""
    seed: int = CALIBRATION_SEED
    """Seed of the history sample and of the predictor's draws on it."""

    def __post_init__(self) -> None:
        check_int("predictor.calibration.requests", self.requests, 100, 10_000_000)
        check_range("predictor.calibration.quantile", self.quantile, 0.5, 1.0, hi_open=True)
        check_int("predictor.calibration.min_cell", self.min_cell, 1)
        check_int("predictor.calibration.seed", self.seed, 0)


def as_calibration(spec) -> CalibrationConfig | None:
    """``True``/``None``-free spellings of the ``calibration`` option: a config, a dict of its
    fields, ``True`` (defaults) or ``False`` (off: bucket point estimates as the base predictor
    gives them)."""
    if spec is False or spec is None:
        return None
    if spec is True:
        return CalibrationConfig()
    if isinstance(spec, CalibrationConfig):
        return spec
    if isinstance(spec, dict):
        allowed = CalibrationConfig.__dataclass_fields__
        bad = sorted(set(spec) - set(allowed))
        if bad:
            raise ConfigError(f"predictor.calibration has unknown option(s) {', '.join(bad)}; "
                              f"allowed: {', '.join(allowed)}")
        return CalibrationConfig(**spec)
    raise ConfigError(f"predictor.calibration={spec!r} must be true, false or a dict of "
                      f"{', '.join(CalibrationConfig.__dataclass_fields__)}")


@dataclass(frozen=True)
class PredictiveTable:
    """Per (task, label): expected tokens, upper quantile, P(true bucket). Arrays indexed
    ``[task, label]`` (``probs``: ``[task, label, true bucket]``)."""

    expected: np.ndarray
    upper: np.ndarray
    probs: np.ndarray
    counts: np.ndarray
    """History requests behind each cell before pooling (how much evidence it has)."""
    quantile: float
    pooled: tuple[np.ndarray, np.ndarray, np.ndarray]
    """Per label over all tasks (expected, upper, probs): for requests of a task the history
    does not have (a batch given to ``reset`` with tasks of its own)."""

    @staticmethod
    def fit(labels, task_id, decode_tokens, scheme: BucketScheme, num_tasks: int,
            cfg: CalibrationConfig) -> "PredictiveTable":
        labels = np.asarray(labels, np.int64)
        task_id = np.asarray(task_id, np.int64)
        d = np.asarray(decode_tokens, np.float64)
        k = scheme.num_buckets
        if not len(d):
            raise ConfigError("predictor calibration: the history sample is empty")
        true_b = scheme.bucket(d).astype(np.int64)
        q = cfg.quantile

        def cell(mask) -> tuple[float, float, np.ndarray]:
            x = d[mask]
            return (max(1.0, float(x.mean())), max(1.0, float(np.quantile(x, q))),
                    np.bincount(true_b[mask], minlength=k) / len(x))

        everything = cell(np.ones(len(d), bool))
        pooled = []
        for b in range(k):
            m = labels == b
            pooled.append(cell(m) if m.sum() >= cfg.min_cell else everything)
        expected = np.empty((num_tasks, k))
        upper = np.empty((num_tasks, k))
        probs = np.empty((num_tasks, k, k))
        counts = np.zeros((num_tasks, k), np.int64)
        for t in range(num_tasks):
            mt = task_id == t
            for b in range(k):
                m = mt & (labels == b)
                counts[t, b] = int(m.sum())
                e, u, p = cell(m) if counts[t, b] >= cfg.min_cell else pooled[b]
                expected[t, b], upper[t, b], probs[t, b] = e, u, p
        pool = (np.array([c[0] for c in pooled]), np.array([c[1] for c in pooled]),
                np.array([c[2] for c in pooled]))
        return PredictiveTable(expected, upper, probs, counts, q, pool)

    def apply(self, bucket, task_id, scheme: BucketScheme) -> Prediction:
        """Predictions for labels ``bucket`` of requests of history tasks ``task_id`` (-1: a task
        the history does not have: the label's pooled cell)."""
        bucket = np.asarray(bucket, np.int64)
        t = np.asarray(task_id, np.int64)
        known = t >= 0
        ti = np.where(known, t, 0)
        exp_p, up_p, pr_p = self.pooled
        tokens = np.where(known, self.expected[ti, bucket], exp_p[bucket])
        upper = np.where(known, self.upper[ti, bucket], up_p[bucket])
        probs = np.where(known[:, None], self.probs[ti, bucket], pr_p[bucket])
        return Prediction(bucket=bucket, tokens=tokens, scheme=scheme, upper_tokens=upper, probs=probs)


class CalibratedPredictor:
    """A base predictor's labels, with the tokens, quantile and probabilities a deployment
    estimates for them on history (``PredictiveTable``). The labels and every random draw are
    the base predictor's, so an episode is the same as uncalibrated but for those numbers."""

    def __init__(self, base, table: PredictiveTable, task_names: tuple[str, ...]) -> None:
        self.base = base
        self.scheme = base.scheme
        self.table = table
        self.task_names = tuple(task_names)

    @staticmethod
    def on_workload(base, workload, cfg: CalibrationConfig) -> "CalibratedPredictor":
        """Calibrate ``base`` on ``cfg.requests`` history requests of ``workload``."""
        rng = np.random.default_rng(cfg.seed)
        history_of = _history_workload(workload)
        draw = getattr(history_of, "calibration_sample", None) or history_of.sample
        history: RequestBatch = draw(rng, cfg.requests)
        labels = base.predict(history, rng).bucket
        table = PredictiveTable.fit(labels, history.task_id, history.decode_tokens, base.scheme,
                                    len(history.task_names), cfg)
        return CalibratedPredictor(base, table, history.task_names)

    def predict(self, batch: RequestBatch, rng: np.random.Generator) -> Prediction:
        labels = self.base.predict(batch, rng).bucket
        names = tuple(batch.task_names)
        if names == self.task_names:
            tasks = batch.task_id
        else:   # a batch of its own (reset(options={"batch": ...})): match tasks by name
            index = {n: i for i, n in enumerate(self.task_names)}
            lut = np.array([index.get(n, -1) for n in names], np.int64)
            tasks = lut[np.asarray(batch.task_id, np.int64)] if len(names) else batch.task_id
        return self.table.apply(labels, tasks, self.scheme)


def _history_workload(workload):
    """The workload with its arrival process (or replay speed) set to a plain 1 request/s: the
    history's lengths are what calibration reads, and a rate the episode may take to an
    extreme (1e-9 req/s in the long-gap tests) must not push its times past the limits."""
    import dataclasses

    from ..workload.arrivals import PoissonArrivals

    if not dataclasses.is_dataclass(workload):
        return workload
    names = {f.name for f in dataclasses.fields(workload)}
    changes = {}
    if "arrivals" in names and getattr(workload, "arrivals") is not None:
        changes["arrivals"] = PoissonArrivals(1.0)
    if "rate_scale" in names and getattr(workload, "arrivals", None) is None:
        changes["rate_scale"] = 1.0
    return dataclasses.replace(workload, **changes) if changes else workload
