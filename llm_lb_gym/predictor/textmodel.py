"""Choosing a text-classifier backend by name: "transformer" or "light".

Both backends expose ``fit(texts, labels, num_labels, settings, seed)``, ``predict_proba``,
``predict``, ``save(dir) -> settings dict`` and ``load(dir, settings, num_labels)``; the bucket
predictor and the task classifier are written once against that shape.
"""

from __future__ import annotations

from .._validate import ConfigError, check_choice, reject_unknown

TEXT_KINDS = ("transformer", "light")


def settings_class(kind: str):
    check_choice("kind", kind, TEXT_KINDS)
    if kind == "transformer":
        from .transformer import TransformerSettings
        return TransformerSettings
    from .light import LightSettings
    return LightSettings


def make_settings(kind: str, options: dict):
    """Typed settings of ``kind`` from a plain mapping; unknown keys are an error naming them."""
    cls = settings_class(kind)
    options = dict(options or {})
    reject_unknown(f"{kind} setting", options, cls.__dataclass_fields__)
    try:
        return cls(**options)
    except TypeError as e:
        raise ConfigError(f"{kind} settings: {e}") from None


def fit_text_model(kind: str, texts, labels, num_labels: int, settings, seed: int = 0, progress: bool = True):
    if kind == "transformer":
        from .transformer import TransformerTextModel
        return TransformerTextModel.fit(texts, labels, num_labels, settings, seed=seed, progress=progress)
    check_choice("kind", kind, TEXT_KINDS)
    from .light import LightTextModel
    return LightTextModel.fit(texts, labels, num_labels, settings, seed=seed)


def load_text_model(kind: str, directory, settings: dict, num_labels: int, overrides: dict | None = None):
    """Load a saved backend; ``overrides`` (transformer only) change inference options."""
    if kind == "transformer":
        from .transformer import TransformerTextModel
        return TransformerTextModel.load(directory, settings, num_labels, overrides)
    check_choice("kind", kind, TEXT_KINDS)
    if overrides:
        raise ConfigError(f"the light model takes no inference options; got {', '.join(sorted(overrides))}")
    from .light import LightTextModel
    return LightTextModel.load(directory, settings, num_labels)
