"""Decode-length prediction: bucket schemes, oracle and noisy predictors, and learned models.

``make_predictor(name, **options)`` builds any of them (names: ``PREDICTORS``). The learned
models (transformer, light, forest) are trained by ``python -m llm_lb_gym.experiments.train_predictor``
and evaluated by ``python -m llm_lb_gym.experiments.eval_predictor``; docs/predictor.md has their held-out
metrics. Nothing here imports torch, transformers or scikit-learn until a model is used.
"""

from .base import LengthPredictor, Prediction
from .buckets import SCHEMES, BucketScheme
from .registry import PREDICTORS, make_predictor

__all__ = ["BucketScheme", "LengthPredictor", "PREDICTORS", "Prediction", "SCHEMES", "make_predictor"]
