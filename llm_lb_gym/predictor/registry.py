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


def make_predictor(name: str, **options) -> LengthPredictor:
    """Build the predictor ``name`` with ``options``; errors list valid names and options."""
    factory = lookup("predictor", PREDICTORS, name)
    params = inspect.signature(factory).parameters
    if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        reject_unknown(f"predictor {name!r}", options, params)
    return factory(**options)
