"""Imports point down the layers: sim <- data <- workload <- predictor <- routers <- envs <-
rollout <- capacity <- calibration, and the core never imports ``llm_lb_gym.agents``,
``llm_lb_gym.experiments`` or ``llm_lb_gym.conf``, which sit above it (agents/, experiments/ and
conf/ at the repository's top level, installed inside the package: pyproject.toml's package-dir).

Read from the source with ``ast`` (imports inside functions included), so a lazy import that
goes the wrong way fails here rather than as a circular import in some user's process.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = "llm_lb_gym"
ROOT = Path(__file__).resolve().parents[1] / PACKAGE
LAYERS = ("sim", "data", "workload", "predictor", "routers", "envs", "rollout", "capacity", "calibration")
"""Bottom first: a module may import its own layer and those before it."""
SHARED = {f"{PACKAGE}._validate", f"{PACKAGE}.limits", f"{PACKAGE}.extras"}
"""Leaf helpers every layer may use (they import nothing of the package)."""
KNOWN_UPWARD: set[tuple[str, str]] = set()
"""(module, layer) pairs that point up today, each with the reason it is tolerated (none since
sim.simulate reads batches through a protocol and poisson_batch moved to workload.batch)."""


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """Absolute names of everything ``path`` imports (``from a import b`` gives ``a.b``)."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def _layer(name: str) -> str | None:
    parts = name.split(".")
    return parts[1] if parts[0] == PACKAGE and len(parts) > 1 and parts[1] in LAYERS else None


SOURCES = sorted(ROOT.rglob("*.py"))
IMPORTS = {_module_name(p): _imports(p) for p in SOURCES}


def test_the_scan_sees_the_package():
    assert len(IMPORTS) > 40 and f"{PACKAGE}.rollout" in IMPORTS
    assert f"{PACKAGE}.routers.mixing.mixing_score" in IMPORTS[f"{PACKAGE}.envs.reward"]


@pytest.mark.parametrize("above", [f"{PACKAGE}.agents", f"{PACKAGE}.experiments", f"{PACKAGE}.conf"])
def test_core_never_imports_agents_experiments_or_conf(above):
    """Also not by their old top-level names (``agents``, ``experiments``, ``conf``)."""
    old = above.removeprefix(PACKAGE + ".")
    bad = {m: sorted(n for n in names if n == above or n.startswith(above + ".")
                     or n.split(".")[0] == old) for m, names in IMPORTS.items()}
    assert not {m: n for m, n in bad.items() if n}
    assert not (ROOT / old).exists()   # the scan is of the core alone


def test_sim_imports_nothing_outside_sim_and_no_gymnasium():
    bad = {}
    for module, names in IMPORTS.items():
        if _layer(module) != "sim":
            continue
        wrong = sorted(
            n for n in names
            if n.split(".")[0] in ("gymnasium", "gym")
            or (n.split(".")[0] == PACKAGE and _layer(n) != "sim"
                and not any(n == s or n.startswith(s + ".") for s in SHARED)
                and (module.removeprefix(PACKAGE + "."), _layer(n)) not in KNOWN_UPWARD)
        )
        if wrong:
            bad[module] = wrong
    assert not bad


def test_data_imports_only_itself_and_the_leaf_helpers():
    """Readers and the dataset store sit below workload and predictor and need neither (nor sim)."""
    bad = {}
    for module, names in IMPORTS.items():
        if _layer(module) != "data":
            continue
        wrong = sorted(n for n in names if n.split(".")[0] == PACKAGE and _layer(n) != "data"
                       and not any(n == s or n.startswith(s + ".") for s in SHARED))
        if wrong:
            bad[module] = wrong
    assert f"{PACKAGE}.data.store" in IMPORTS and not bad


def test_workload_never_imports_predictor():
    bad = {m: sorted(n for n in names if _layer(n) == "predictor")
           for m, names in IMPORTS.items() if _layer(m) == "workload"}
    assert not {m: n for m, n in bad.items() if n}


def test_lower_layers_never_import_envs_or_rollout():
    lower = {"sim", "workload", "predictor", "routers"}
    bad = {m: sorted(n for n in names if _layer(n) in ("envs", "rollout"))
           for m, names in IMPORTS.items() if _layer(m) in lower}
    assert not {m: n for m, n in bad.items() if n}


def test_imports_point_down_the_layers():
    bad = {}
    for module, names in IMPORTS.items():
        own = _layer(module)
        if own is None:
            continue
        up = sorted(
            n for n in names
            if _layer(n) is not None and LAYERS.index(_layer(n)) > LAYERS.index(own)
            and (module.removeprefix(PACKAGE + "."), _layer(n)) not in KNOWN_UPWARD
        )
        if up:
            bad[module] = up
    assert not bad
