"""A light text classifier: hashed word n-grams + logistic regression (scikit-learn).

The transformer costs hundreds of milliseconds per 64 prompts on a CPU; this costs a few
milliseconds, so a user can trade accuracy for speed (the held-out figures and times of both
are in docs/predictor.md). Fitting uses scikit-learn; predictions come from a vectorised
re-implementation of the fitted pipeline (``hashed_ngrams.py``, same predictions, under half
the time). Hashing needs no vocabulary to fit or store, so the saved model is small and
never meets an unknown word. A coarse prompt-length token (``__len<k>``, k = log2 of the word
count) is appended because length alone carries signal the bag of words does not.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from .._validate import check_choice, check_int, check_range

MODEL_FILE = "model.joblib"


@dataclass(frozen=True)
class LightSettings:
    ngram_max: int = 2
    """Word n-grams 1..ngram_max."""
    n_features_log2: int = 18
    """Hash space size 2**n_features_log2."""
    C: float = 4.0
    """Inverse L2 strength of the logistic regression."""
    class_weight: str = "none"
    """"none" or "balanced" (reweight classes to favour balanced accuracy)."""
    max_iter: int = 2000
    length_token: bool = True
    """Append the ``__len<k>`` token."""

    def __post_init__(self) -> None:
        check_int("light.ngram_max", self.ngram_max, 1, 4)
        check_int("light.n_features_log2", self.n_features_log2, 10, 24)
        check_range("light.C", self.C, 0.0, lo_open=True)
        check_choice("light.class_weight", self.class_weight, ("none", "balanced"))
        check_int("light.max_iter", self.max_iter, 1)


def with_length_token(text: str) -> str:
    """The text with a log2 word-count token appended (module-level so the pipeline pickles)."""
    n = len(text.split())
    return f"{text} __len{int(math.log2(n + 1))}"


def _identity(text: str) -> str:
    return text


class LightTextModel:
    """Fit/predict/save/load over raw texts and integer labels."""

    def __init__(self, pipeline, settings: LightSettings, num_labels: int) -> None:
        from .hashed_ngrams import HashedNgramClassifier

        self.pipeline = pipeline
        self.settings = settings
        self.num_labels = num_labels
        self._fast = HashedNgramClassifier(pipeline) if HashedNgramClassifier.supports(pipeline) else None

    @staticmethod
    def fit(texts, labels, num_labels: int, settings: LightSettings = LightSettings(), seed: int = 0) -> "LightTextModel":
        from ..extras import require

        require("text", "the light text predictor", modules=("sklearn",))
        from sklearn.feature_extraction.text import HashingVectorizer, TfidfTransformer
        from sklearn.linear_model import LogisticRegression
        from sklearn.pipeline import make_pipeline

        labels = np.asarray(labels, np.int64)
        pipe = make_pipeline(
            HashingVectorizer(ngram_range=(1, settings.ngram_max), n_features=2 ** settings.n_features_log2,
                              alternate_sign=False, norm=None, token_pattern=r"(?u)\b\w+\b",
                              dtype=np.float32),
            TfidfTransformer(sublinear_tf=True),
            LogisticRegression(C=settings.C, max_iter=settings.max_iter, random_state=seed,
                               class_weight=None if settings.class_weight == "none" else "balanced"),
        )
        prep = with_length_token if settings.length_token else _identity
        pipe.fit([prep(t) for t in texts], labels)
        return LightTextModel(pipe, settings, num_labels)

    def _prep(self, texts) -> list[str]:
        prep = with_length_token if self.settings.length_token else _identity
        return [prep(t) for t in texts]

    def predict_proba(self, texts) -> np.ndarray:
        """(n, num_labels) probabilities; classes absent from training get probability 0."""
        texts = self._prep(texts)
        p = (self._fast or self.pipeline).predict_proba(texts)
        out = np.zeros((len(texts), self.num_labels))
        out[:, self.pipeline.classes_] = p
        return out

    def predict(self, texts) -> np.ndarray:
        return self.predict_proba(texts).argmax(axis=1)

    def save(self, directory) -> dict:
        import joblib

        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        joblib.dump(self.pipeline, d / MODEL_FILE)
        return asdict(self.settings)

    @staticmethod
    def load(directory, settings: dict, num_labels: int) -> "LightTextModel":
        """Load a pipeline saved by :meth:`save` (a pickle: load only directories you trust)."""
        import joblib

        return LightTextModel(joblib.load(Path(directory) / MODEL_FILE), LightSettings(**settings), num_labels)
