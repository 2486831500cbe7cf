"""The framework recipes in docs/recipes run as documented (each where its framework is installed).

Each recipe is run as a user runs it, ``python docs/recipes/<name>.py --quick`` in a subprocess
(a few hundred training steps), and must finish an evaluation episode with every request
accounted for. A recipe whose framework is not importable here is skipped, naming it.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ROOT / "docs" / "recipes"
CASES = {
    "sb3": (("stable_baselines3", "sb3_contrib"), ["SB3 DQN (mask ignored): 200/200",
                                                   "SB3-contrib MaskablePPO: 200/200"]),
    "cleanrl_dqn": (("torch",), ["CleanRL-style DQN: 200/200"]),
    "rl_zoo": (("rl_zoo3",), ["episodes logged in"]),
    "torchrl_env": (("torchrl", "tensordict"), ["200/200 requests accounted for"]),
    "tianshou_dqn": (("tianshou",), ["Tianshou DQN: 200/200"]),
}


def test_every_recipe_file_has_a_case_and_a_readme_line():
    files = {p.stem for p in RECIPES.glob("*.py") if not p.stem.startswith("_")}
    assert files == set(CASES)
    readme = (ROOT / "README.md").read_text()
    assert all(f"docs/recipes/{name}.py" in readme for name in CASES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_recipe_runs(name):
    modules, expected = CASES[name]
    absent = [m for m in modules if importlib.util.find_spec(m) is None]
    if absent:
        pytest.skip(f"{name}: {', '.join(absent)} not installed")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    out = subprocess.run([sys.executable, str(RECIPES / f"{name}.py"), "--quick"], cwd=ROOT,
                         env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    for line in expected:
        assert line in out.stdout, out.stdout
