"""Choose the env step's compiled kernels (``step_kernels.pyx``) when they are built and current.

``setup.py`` compiles ``step_kernels.pyx`` into ``llm_lb_gym.envs._step_kernels_c`` beside the
engine (it reads the compiled engine's fields as C, so it is built from the same sources). The
copy carries the SHA-256 of the engine's sources and of ``step_kernels.pyx``; after an edit
without a rebuild it would run stale code, so it is ignored with a warning. Without it
(``LLM_LB_GYM_PURE_PYTHON=1``, no compiler, stale) the env runs the plain-Python reference
(``ObservationBuilder.observe``, ``reward.guidance_term``): the same values, slower. The kernels
serve only clusters of the compiled engine; a pure-Python engine gets the reference too.
"""

from __future__ import annotations

import hashlib
import importlib
import warnings
from functools import lru_cache
from pathlib import Path

from ..sim import _compiled

SOURCE = "step_kernels.pyx"


def source_digest() -> str:
    """SHA-256 over the engine's sources and ``step_kernels.pyx`` (what the build embeds)."""
    sim = Path(_compiled.__file__).parent
    h = hashlib.sha256()
    for name in _compiled.SOURCES:
        h.update((sim / name).read_bytes())
    h.update((Path(__file__).parent / SOURCE).read_bytes())
    return h.hexdigest()


@lru_cache(maxsize=None)
def compiled_kernels():
    """The compiled kernels module, or None (not built, forced off, or stale). Decided once per
    process (``compiled_kernels.cache_clear()`` to re-decide)."""
    if _compiled.pure_python_forced():
        return None
    try:
        mod = importlib.import_module(f"{__package__}._step_kernels_c")
    except (ImportError, ValueError):   # not built, or built against another engine layout
        return None
    if getattr(mod, "SOURCE_SHA256", None) != source_digest():
        warnings.warn(
            f"llm_lb_gym: the compiled env kernels were built from another version of "
            f"llm_lb_gym/envs/{SOURCE} or the engine; using the plain-Python observation (same "
            "results, slower). Rebuild with the README's install command (pip install -e .).",
            RuntimeWarning, stacklevel=2)
        return None
    return mod


def kernels_for(engines):
    """The compiled kernels if every engine in ``engines`` is the compiled engine they read,
    else None."""
    mod = compiled_kernels()
    if mod is None or not engines:
        return None
    cls = mod.ENGINE_CLASS
    return mod if all(type(e) is cls for e in engines) else None
