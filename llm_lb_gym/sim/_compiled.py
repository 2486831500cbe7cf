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
BUILD_FAILURE_FILE = "_compile_failure.txt"
"""What ``setup.py`` writes beside this module when it could not compile the engine (pip hides
its output): the cause, read back into the warning below; removed by a build that succeeds."""
SPEED_COST = ("about 1.8x slower env steps (package 0.7.0, the default setting: 12.1k vs 21.3k "
              "masked random steps per CPU second)")
"""What the pure-Python engine costs, said in the warning (docs/install.md)."""
MODULES = ("iteration_timing", "output_stream", "kv_cache", "scheduler", "progress", "engine", "penalty")   # as setup.py's MODULES: each imports only those before it
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


_why_pure: list[str] = []   # why the last compiled_engine_class() returned None (engine_info)


def build_failure() -> str | None:
    """The cause ``setup.py`` recorded when its compile failed, or None."""
    f = Path(__file__).parent / BUILD_FAILURE_FILE
    try:
        return f.read_text().strip() or None
    except OSError:
        return None


def compiled_engine_class():
    """The compiled ``Engine`` class, or None (not built, forced off, or stale)."""
    _why_pure.clear()
    if pure_python_forced():
        _why_pure.append(f"{PURE_ENV_VAR}=1 chose it")
        return None
    try:
        compiled = [importlib.import_module(f"{__package__}._{m}_c") for m in MODULES]
    except ImportError as exc:
        built = build_failure()
        _why_pure.append(f"the compiled engine is not built ({exc})"
                         + (f"; the install said: {built}" if built else ""))
        return None
    digest = source_digest()
    if any(getattr(c, "SOURCE_SHA256", None) != digest for c in compiled):
        warnings.warn(
            "llm_lb_gym: the compiled engine was built from another version of "
            f"llm_lb_gym/sim/{{{','.join(SOURCES)}}}; using the pure-Python engine (same "
            "results, slower). Rebuild it with the README's install command (pip install -e .).",
            RuntimeWarning, stacklevel=2)
        _why_pure.append("the compiled engine is stale (built from other sources)")
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
    Decided once per process (``engine_class.cache_clear()`` to re-decide). A compiled engine
    that is missing (a failed compile: no compiler, no Python headers) is never silent: a
    ``RuntimeWarning`` names the cause, the speed cost and the fix (chosen on purpose with
    ``LLM_LB_GYM_PURE_PYTHON=1``: no warning)."""
    from .engine import Engine

    cls = compiled_engine_class()
    if cls is None and not pure_python_forced() and _why_pure and "not built" in _why_pure[0]:
        warnings.warn(
            f"llm_lb_gym: {_why_pure[0]}; the pure-Python engine runs instead: the same results, "
            f"{SPEED_COST}. To compile it: pip install -v -e . (needs Cython, a C compiler and the "
            f"Python headers; its 'llm_lb_gym setup:' lines say what failed). To choose the pure "
            f"engine on purpose (no warning): {PURE_ENV_VAR}=1. Which engine runs: "
            "llm_lb_gym.engine_info().", RuntimeWarning, stacklevel=2)
    return cls or Engine


def implementation() -> str:
    """'compiled' or 'pure-python' (benchmarks print it)."""
    return "pure-python" if engine_class().__module__.endswith(".engine") else "compiled"


def engine_info() -> dict[str, str | None]:
    """Which simulator engine this process runs, and why (``llm_lb_gym.engine_info`` adds the
    env's kernels)."""
    engine = implementation()
    return {"engine": engine,
            "reason": None if engine == "compiled" else (_why_pure[0] if _why_pure else None),
            "build_failure": build_failure()}
