"""Build hook: compile the simulator's engine with Cython when possible (optional).

Everything else is declared in pyproject.toml. ``llm_lb_gym/sim/engine.py`` is plain Python; a
copy of it, typed by ``engine.pxd``, becomes the extension ``llm_lb_gym.sim._engine_c`` (see
``llm_lb_gym/sim/_compiled.py`` for how it is chosen at run time). If Cython or a C compiler
is missing, or ``LLM_LB_GYM_PURE_PYTHON=1`` is set, the package installs without it and runs
the same engine in pure Python.
"""

import hashlib
import os
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
SIM = ROOT / "llm_lb_gym" / "sim"
SOURCES = ("engine.py", "engine.pxd")   # keep in sync with llm_lb_gym/sim/_compiled.py


def _warn(msg: str) -> None:
    print(f"llm_lb_gym setup: {msg}; the pure-Python engine will be used", file=sys.stderr)


def _extensions() -> list:
    if os.environ.get("LLM_LB_GYM_PURE_PYTHON", "") not in ("", "0"):
        return []
    try:
        from Cython.Build import cythonize
    except ImportError:
        _warn("Cython is not installed")
        return []
    h = hashlib.sha256()
    for name in SOURCES:
        h.update((SIM / name).read_bytes())
    gen = ROOT / "build" / "cython" / "llm_lb_gym" / "sim"
    gen.mkdir(parents=True, exist_ok=True)
    for pkg in (gen.parent, gen):   # Cython finds the .pxd through the package layout
        (pkg / "__init__.py").touch()
    src = (SIM / "engine.py").read_text()
    (gen / "_engine_c.py").write_text(
        src + f'\n\nSOURCE_SHA256 = "{h.hexdigest()}"   # added by setup.py\n')
    (gen / "_engine_c.pxd").write_text((SIM / "engine.pxd").read_text())
    ext = Extension(
        "llm_lb_gym.sim._engine_c", [str(gen / "_engine_c.py")],
        # No fused multiply-add: keep every float operation as Python evaluates it.
        extra_compile_args=["-O2", "-ffp-contract=off"])
    try:
        return cythonize([ext], language_level=3, quiet=True,
                         compiler_directives={"cdivision": False, "infer_types": None,
                                              "annotation_typing": False})
    except Exception as exc:   # a typing error in engine.pxd: install without it
        _warn(f"Cython failed ({exc})")
        return []


class OptionalBuildExt(build_ext):
    """A failed compile (no compiler, no Python headers) must not fail the install."""

    def run(self):
        try:
            super().run()
        except Exception as exc:
            _warn(f"building the extension failed ({exc})")

    def build_extension(self, ext):
        try:
            super().build_extension(ext)
        except Exception as exc:
            _warn(f"compiling {ext.name} failed ({exc})")


setup(ext_modules=_extensions(), cmdclass={"build_ext": OptionalBuildExt})
