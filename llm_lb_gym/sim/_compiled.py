"""Choose the engine implementation: the Cython build of the engine's modules when it is current.

The engine's modules (``MODULES``: ``engine.py`` and the parts it holds) are plain Python and
the source of truth. At install time ``setup.py`` compiles a copy of each, with the C types of
its ``.pxd``, into ``llm_lb_gym.sim._<name>_c`` (about 2x faster env steps; same arithmetic in
the same order, so results are bit-identical, which ``tests/test_compiled_engine.py`` checks).
Each copy carries the SHA-256 of all the files they were built from. If one has changed since
(an edit without a rebuild), the compiled modules would run stale code, so they are ignored
with a warning. ``LLM_LB_GYM_PURE_PYTHON=1`` forces the
pure-Python engine (at build time: skips compiling).
"""

from __future__ import annotations

import hashlib
import importlib
import os
import warnings
from functools import lru_cache
from pathlib import Path

PURE_ENV_VAR = "LLM_LB_GYM_PURE_PYTHON"
MODULES = ("iteration_timing", "kv_cache", "scheduler", "progress", "engine", "penalty")   # as setup.py's MODULES: each imports only those before it
SOURCES = tuple(f"{m}{ext}" for m in MODULES for ext in (".py", ".pxd"))


def source_digest(directory: Path | None = None) -> str:
    """SHA-256 over the engine's source files (what the build embeds in each compiled copy)."""
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
        compiled = [importlib.import_module(f"{__package__}._{m}_c") for m in MODULES]
    except ImportError:
        return None
    digest = source_digest()
    if any(getattr(c, "SOURCE_SHA256", None) != digest for c in compiled):
        warnings.warn(
            "llm_lb_gym: the compiled engine was built from another version of "
            f"llm_lb_gym/sim/{{{','.join(SOURCES)}}}; using the pure-Python engine (same "
            "results, slower). Rebuild it with the README's install command (pip install -e .).",
            RuntimeWarning, stacklevel=2)
        return None
    return compiled[MODULES.index("engine")].Engine


def module_like(engine_cls, name: str):
    """The module ``name`` (one of ``MODULES``) of the implementation ``engine_cls`` comes from:
    compiled for the compiled engine, the plain-Python file for the pure one (the cluster takes
    ``penalty``'s functions this way; a compiled one accepts only the compiled engine)."""
    assert name in MODULES, name
    compiled = engine_cls.__module__ == f"{__package__}._engine_c"
    return importlib.import_module(f"{__package__}.{'_' + name + '_c' if compiled else name}")


@lru_cache(maxsize=None)
def engine_class():
    """The engine class the cluster uses: compiled when available and current, else pure.
    Decided once per process (``engine_class.cache_clear()`` to re-decide)."""
    from .engine import Engine
    return compiled_engine_class() or Engine


def implementation() -> str:
    """'compiled' or 'pure-python' (benchmarks print it)."""
    return "pure-python" if engine_class().__module__.endswith(".engine") else "compiled"
