"""Entry points do not import each other: what two commands share lives in a library module.

An entry point is a module of ``experiments/`` whose name has no leading underscore and that
defines ``main`` at the top level (``python -m llm_lb_gym.experiments.NAME``,
``llm-lb-gym NAME``). When one imported another (``reproduce`` -> ``train``, ``evaluate``,
``load_sweep``, ``figures``), the shared code had no home, import cycles were broken by imports
inside functions, and a change to one command's shell could break another. Read from the source
with ``ast`` (imports inside functions included), so a lazy import that goes the wrong way fails
here too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"
PACKAGE = "llm_lb_gym.experiments"
"""What experiments/ installs as (pyproject.toml's package-dir)."""
SHIM = "__main__"
"""``python -m llm_lb_gym.experiments``: it only hands over to ``cli``, the dispatcher (which finds the
commands by name with importlib, not by import)."""
LAZY = {("bench", "bench_learner"), ("_hydra", "_plugins")}
"""Imports of a library module inside a function, each for a reason: ``bench learner`` needs the
``rl`` extra that the other parts of ``bench`` do not; ``_plugins`` reads ``_hydra.CONF_DIR``
(a cycle)."""


def _tree(name: str) -> ast.Module:
    return ast.parse((EXPERIMENTS / f"{name}.py").read_text(), f"experiments/{name}.py")


MODULES = sorted(p.stem for p in EXPERIMENTS.glob("*.py"))
ENTRY_POINTS = sorted(
    m for m in MODULES if not m.startswith("_")
    and any(isinstance(n, ast.FunctionDef) and n.name == "main" for n in _tree(m).body))


def _experiments_imports(name: str) -> list[tuple[str, bool]]:
    """(module of ``llm_lb_gym.experiments`` imported, whether the import is inside a function)."""
    found = []

    def visit(node, in_function: bool):
        for child in ast.iter_child_nodes(node):
            inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            if isinstance(child, ast.Import):
                found.extend((a.name.removeprefix(PACKAGE + ".").split(".")[0], inner)
                             for a in child.names if a.name.startswith(PACKAGE + "."))
            elif isinstance(child, ast.ImportFrom):
                module = child.module or ""
                if child.level == 1 or module == PACKAGE or module.startswith(PACKAGE + "."):
                    base = module if child.level else module.removeprefix(PACKAGE)
                    base = base.lstrip(".")
                    if base:
                        found.append((base.split(".")[0], inner))
                    else:   # from llm_lb_gym.experiments import x / from . import x
                        found.extend((a.name, inner) for a in child.names)
            visit(child, inner)

    visit(_tree(name), False)
    return found


def test_the_scan_sees_the_entry_points():
    assert {"train", "evaluate", "reproduce", "load_sweep", "figures", "improve", "cli"} <= set(ENTRY_POINTS)
    assert not {"_training", "_evaluation", "bench_learner"} & set(ENTRY_POINTS)


@pytest.mark.parametrize("name", [m for m in MODULES if m != SHIM])
def test_no_module_imports_an_entry_point(name):
    wrong = sorted({m for m, _ in _experiments_imports(name) if m in ENTRY_POINTS and m != name})
    assert not wrong, f"experiments/{name}.py imports the entry point(s) {wrong}: move what they share to a library module"


@pytest.mark.parametrize("name", MODULES)
def test_imports_of_experiments_modules_are_at_module_level(name):
    lazy = sorted({m for m, inner in _experiments_imports(name) if inner and (name, m) not in LAZY})
    assert not lazy, f"experiments/{name}.py imports {lazy} inside a function; no cycle forces it any more"
