"""``make_predictor(name, **options)``: the one way the environment builds a predictor.

Names and their options (unknown names or options raise an error listing the valid ones):

============  ============================================================================
oracle        ``scheme`` (SCHEMES name or BucketScheme; default "paper_dqn")
noisy         ``accuracy`` (required, in [0, 1]), ``scheme``
confusion     ``path`` (metrics JSON or saved model dir; ``which`` = "model" or a baseline
              name) or ``matrix`` (k x k counts, rows = true bucket) with ``scheme`` and
              optional ``bucket_tokens``
transformer   ``path`` (saved model dir), ``task_source`` ("batch" or "classifier"),
              ``task_classifier`` (dir; default <path>/task_classifier), inference
              options ``runtime`` ("onnx"/"torch"), ``quantize``, ``micro_batch``,
              ``inference_max_length``, ``threads`` (default: as saved)
light         ``path``, ``task_source``, ``task_classifier``
forest        ``path``
============  ============================================================================

Every name but ``oracle`` also takes ``calibration`` (``predictor/calibration.py``): ``true``
(the default for noisy, confusion and forest), ``false``, or a dict of ``CalibrationConfig``
fields. Calibrated, a prediction's tokens are E[decode | task, label] on a history sample of the
env's workload, with an upper quantile and bucket probabilities: what a deployment would
estimate on its logged traffic. ``calibration=false`` keeps the base predictor's numbers (bucket
midpoints for noisy, 0.6.0's behaviour).

A relative ``path`` is tried from the working directory, then from the repository root, so
the YAML files of ``conf/predictor/`` work from anywhere in the checkout.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Callable

from .._validate import ConfigError, lookup, reject_unknown
from .base import LengthPredictor
from .buckets import SCHEMES, BucketScheme
from .calibration import CalibratedPredictor, as_calibration

_REPO_ROOT = Path(__file__).resolve().parents[2]


def resolve_scheme(scheme) -> BucketScheme:
    if isinstance(scheme, BucketScheme):
        return scheme
    return lookup("bucket scheme", SCHEMES, scheme)()


def resolve_path(path, option: str = "path") -> Path:
    if path is None:
        raise ConfigError(f"predictor option {option!r} is required")
    p = Path(path).expanduser()
    if p.exists() or p.is_absolute():
        return p
    alt = _REPO_ROOT / p
    return alt if alt.exists() else p


def _oracle(scheme="paper_dqn"):
    from .oracle import OraclePredictor
    return OraclePredictor(resolve_scheme(scheme))


def _noisy(accuracy=None, scheme="paper_dqn"):
    from .noisy import NoisyOraclePredictor
    if accuracy is None:
        raise ConfigError("predictor 'noisy' needs accuracy=<float in [0, 1]>")
    return NoisyOraclePredictor(resolve_scheme(scheme), accuracy)


def _confusion(path=None, matrix=None, which="model", scheme=None, bucket_tokens=None):
    from .noisy import ConfusionPredictor
    if (path is None) == (matrix is None):
        raise ConfigError("predictor 'confusion' needs exactly one of path=<metrics JSON or model dir> "
                          "or matrix=<k x k counts>")
    if path is not None:
        if scheme is not None or bucket_tokens is not None:
            raise ConfigError("predictor 'confusion' with path= takes its scheme and bucket_tokens from "
                              "the file; do not pass scheme or bucket_tokens")
        return ConfusionPredictor.from_metrics(resolve_path(path), which=which)
    return ConfusionPredictor(resolve_scheme(scheme or "paper_dqn"), matrix, bucket_tokens)


def _text(kind: str):
    def build(path=None, task_source="batch", task_classifier=None, **inference):
        from .text_predictor import TextBucketPredictor
        from .transformer import INFERENCE_OPTIONS
        extra = INFERENCE_OPTIONS if kind == "transformer" else ()
        reject_unknown(f"predictor {kind!r}", inference,
                       ("path", "task_source", "task_classifier") + extra)
        clf = None if task_classifier is None else resolve_path(task_classifier, "task_classifier")
        return TextBucketPredictor.load(resolve_path(path), kind=kind, task_source=task_source,
                                        task_classifier=clf, **inference)
    return build


def _forest(path=None):
    from .forest import ForestPredictor
    return ForestPredictor.load(resolve_path(path))


PREDICTORS: dict[str, Callable[..., LengthPredictor]] = {
    "oracle": _oracle,
    "noisy": _noisy,
    "confusion": _confusion,
    "transformer": _text("transformer"),
    "light": _text("light"),
    "forest": _forest,
}


DEFAULT_PREDICTOR = {"name": "noisy", "accuracy": 0.79, "scheme": "time4"}
"""The predictor of ``gym.make("LLMCluster-v0")`` and of every setting since 0.7.0: what a
deployment has, the paper's predictor in its accuracy (DistilBERT, 79.15% on four completion-time
buckets), calibrated on the workload's history. The oracle (true lengths) is the clairvoyant
reference (``predictor="oracle"``), never a default. ``conf/predictor/noisy.yaml`` mirrors it."""

CALIBRATED_BY_DEFAULT = ("noisy", "confusion", "forest")
"""Predictors whose labels are calibrated on the workload unless ``calibration=false``: the
cheap ones (the text models' cards already carry their training split's bucket means)."""


def make_predictor(name: str, workload=None, **options) -> LengthPredictor:
    """Build the predictor ``name`` with ``options``; errors list valid names and options.

    With ``workload`` (what the env passes), a predictor with ``calibration`` on is wrapped in
    a ``CalibratedPredictor`` fitted on that workload's history sample."""
    factory = lookup("predictor", PREDICTORS, name)
    calibration = options.pop("calibration", name in CALIBRATED_BY_DEFAULT)
    if name == "oracle" and calibration not in (False, None):
        raise ConfigError("predictor 'oracle' is exact: calibration must be false or left out")
    cal = as_calibration(calibration)
    params = inspect.signature(factory).parameters
    if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        reject_unknown(f"predictor {name!r}", options, tuple(params) + ("calibration",))
    base = factory(**options)
    if cal is None or workload is None:
        return base
    try:   # envs are built often (vector envs, workers, tests): fit each table once per process
        key = (name, repr(sorted(options.items())), workload, cal)
        hash(key)
    except TypeError:
        return CalibratedPredictor.on_workload(base, workload, cal)
    if key not in _TABLES:
        if len(_TABLES) >= 64:
            _TABLES.clear()
        _TABLES[key] = CalibratedPredictor.on_workload(base, workload, cal)
    hit = _TABLES[key]
    return CalibratedPredictor(base, hit.table, hit.task_names)


_TABLES: dict = {}
"""Fitted calibrations by (predictor, options, workload, calibration config): deterministic
functions of the key, so sharing them changes no result."""
