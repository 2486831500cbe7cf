"""Build hook: compile the simulator's engine and the env's step kernels with Cython when possible
(optional).

Everything else is declared in pyproject.toml. The engine's modules (``MODULES`` below:
``llm_lb_gym/sim/<name>.py``) are plain Python; a copy of each, typed by its ``<name>.pxd``,
becomes the extension ``llm_lb_gym.sim._<name>_c`` (see ``llm_lb_gym/sim/_compiled.py`` for how
it is chosen at run time). In the copies, imports between these modules are renamed to the
compiled modules (``from .kv_cache import`` -> ``from ._kv_cache_c import``, the same in the
.pxd's cimports), so the engine calls its parts as C functions. If Cython or a C compiler is
missing, or ``LLM_LB_GYM_PURE_PYTHON=1`` is set, the package installs without it and runs the
same engine in pure Python. ``llm_lb_gym/envs/step_kernels.pyx`` (the env's observation and
guidance arithmetic, reading the compiled engine as C) becomes ``llm_lb_gym.envs._step_kernels_c``
the same way (``llm_lb_gym/envs/_kernels.py`` chooses it at run time).
"""

import hashlib
import os
import re
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
SIM = ROOT / "llm_lb_gym" / "sim"
ENVS = ROOT / "llm_lb_gym" / "envs"
KERNELS = "step_kernels.pyx"   # compiled after the engine; keep in sync with envs/_kernels.py
# Compiled modules, each one imported only by those after it. Keep in sync with
# llm_lb_gym/sim/_compiled.py (its MODULES; a test checks they agree).
MODULES = ("iteration_timing", "output_stream", "kv_cache", "scheduler", "progress", "engine", "penalty")
SOURCES = tuple(f"{m}{ext}" for m in MODULES for ext in (".py", ".pxd"))
_SIBLING = re.compile(r"^(from \.)(" + "|".join(MODULES) + r")( c?import )", re.MULTILINE)


def _compiled_copy(text: str) -> str:
    """``text`` with its imports of the other engine modules pointed at their compiled copies."""
    return _SIBLING.sub(r"\1_\2_c\3", text)


FAILURE = SIM / "_compile_failure.txt"   # read back by llm_lb_gym/sim/_compiled.py (BUILD_FAILURE_FILE)


def _warn(msg: str) -> None:
    """Say why the engine is not compiled, and record it: pip hides a build's output unless
    run with -v, so the runtime warning at import reads the cause from FAILURE."""
    print(f"llm_lb_gym setup: {msg}; the pure-Python engine will be used", file=sys.stderr)
    try:
        FAILURE.write_text(msg[:2000] + "\n")
    except OSError:
        pass


def _extensions() -> list:
    FAILURE.unlink(missing_ok=True)   # a stale record of an earlier failed build
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
    exts = []
    for m in MODULES:
        src = _compiled_copy((SIM / f"{m}.py").read_text())
        (gen / f"_{m}_c.py").write_text(
            src + f'\n\nSOURCE_SHA256 = "{h.hexdigest()}"   # added by setup.py\n')
        (gen / f"_{m}_c.pxd").write_text(_compiled_copy((SIM / f"{m}.pxd").read_text()))
        exts.append(Extension(
            f"llm_lb_gym.sim._{m}_c", [str(gen / f"_{m}_c.py")],
            # No fused multiply-add: keep every float operation as Python evaluates it.
            extra_compile_args=["-O2", "-ffp-contract=off"]))
    try:
        exts = cythonize(exts, language_level=3, quiet=True,
                         compiler_directives={"cdivision": False, "infer_types": None,
                                              "annotation_typing": False})
    except Exception as exc:   # a typing error in a .pxd: install without it
        _warn(f"Cython failed ({exc})")
        return []
    return exts + _kernel_extensions(cythonize, h.copy(), gen.parent)


def _kernel_extensions(cythonize, h, gen_pkg: Path) -> list:
    """The env's step kernels: they cimport the compiled engine (its generated .pxd under
    ``gen_pkg``), so their digest covers the engine's sources and their own."""
    h.update((ENVS / KERNELS).read_bytes())
    gen = gen_pkg / "envs"
    gen.mkdir(exist_ok=True)
    (gen / "__init__.py").touch()
    (gen / "_step_kernels_c.pyx").write_text(
        (ENVS / KERNELS).read_text() + f'\n\nSOURCE_SHA256 = "{h.hexdigest()}"   # added by setup.py\n')
    ext = Extension("llm_lb_gym.envs._step_kernels_c", [str(gen / "_step_kernels_c.pyx")],
                    extra_compile_args=["-O2", "-ffp-contract=off"])
    try:
        return cythonize([ext], language_level=3, quiet=True, include_path=[str(gen_pkg.parent)])
    except Exception as exc:
        print(f"llm_lb_gym setup: Cython failed on {KERNELS} ({exc}); the env's observation "
              "will be built in Python", file=sys.stderr)
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
