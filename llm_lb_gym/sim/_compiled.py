"""Choose the engine implementation: the Cython build of ``engine.py`` when it is current.

``engine.py`` is plain Python and the source of truth. At install time ``setup.py`` compiles a
copy of it, with the C types of ``engine.pxd``, into ``llm_lb_gym.sim._engine_c`` (about 2x
faster env steps; same arithmetic in the same order, so results are bit-identical, which
``tests/test_compiled_engine.py`` checks). The copy carries the SHA-256 of the two files it was
built from. If they have changed since (an edit without a rebuild), the compiled module would
run stale code, so it is ignored with a warning. ``LLM_LB_GYM_PURE_PYTHON=1`` forces the
pure-Python engine (at build time: skips compiling).
"""

from __future__ import annotations

import hashlib
import os
import warnings
from functools import lru_cache
from pathlib import Path

PURE_ENV_VAR = "LLM_LB_GYM_PURE_PYTHON"
SOURCES = ("engine.py", "engine.pxd")


def source_digest(directory: Path | None = None) -> str:
    """SHA-256 over the engine's source files (what the build embeds in the compiled copy)."""
    d = Path(__file__).parent if directory is None else directory
    h = hashlib.sha256()
    for name in SOURCES:
        h.update((d / name).read_bytes())
    return h.hexdigest()


def pure_python_forced() -> bool:
    return os.environ.get(PURE_ENV_VAR, "") not in ("", "0")


def compiled_engine_class():
    """The compiled ``Engine`` class, or None (not built, forced off, or stale)."""
    if pure_python_forced():
        return None
    try:
        from . import _engine_c
    except ImportError:
        return None
    if getattr(_engine_c, "SOURCE_SHA256", None) != source_digest():
        warnings.warn(
            "llm_lb_gym: the compiled engine was built from another version of "
            "llm_lb_gym/sim/engine.py or engine.pxd; using the pure-Python engine (same results, "
            "slower). Rebuild it with the README's install command (pip install -e .).",
            RuntimeWarning, stacklevel=2)
        return None
    return _engine_c.Engine


@lru_cache(maxsize=None)
def engine_class():
    """The engine class the cluster uses: compiled when available and current, else pure.
    Decided once per process (``engine_class.cache_clear()`` to re-decide)."""
    from .engine import Engine
    return compiled_engine_class() or Engine


def implementation() -> str:
    """'compiled' or 'pure-python' (benchmarks print it)."""
    return "pure-python" if engine_class().__module__.endswith(".engine") else "compiled"
