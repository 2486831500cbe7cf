"""The framework recipes in docs/recipes run as documented, each as a single copied file.

Each recipe is copied alone into an empty folder (with ``zoo_dqn.yml`` and ``zoo_ppo_mask.yml``
beside the zoo's, which reads them) and run there as a user runs it, ``python <name>.py --quick``, in a subprocess (a few
hundred training steps): it must finish an evaluation episode with every request accounted for.
The frameworks come with the ``recipes`` extra (in ``all``: Tianshou, TorchRL) and the ``zoo``
extra (the RL zoo, which cannot install beside ``all``'s optuna 2.x); a recipe whose framework is
not importable here is skipped, naming it.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
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
    "rl_zoo": (("rl_zoo3", "sb3_contrib"), ["RL zoo dqn:", "RL zoo ppo_mask:", "episodes logged in"]),
    "torchrl_dqn": (("torchrl", "tensordict"), ["TorchRL DQN: 200/200"]),
    "tianshou_dqn": (("tianshou",), ["Tianshou DQN: 200/200"]),
}
COMPANIONS = {"rl_zoo": ["zoo_dqn.yml", "zoo_ppo_mask.yml"]}
"""Files a recipe reads besides itself."""


def test_every_recipe_file_has_a_case_and_a_readme_line():
    files = {p.stem for p in RECIPES.glob("*.py")}
    assert files == set(CASES)   # no shared helper module: each recipe stands alone
    readme = (ROOT / "README.md").read_text()
    assert all(f"docs/recipes/{name}.py" in readme for name in CASES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_recipe_runs_as_a_single_copied_file(name, tmp_path):
    modules, expected = CASES[name]
    absent = [m for m in modules if importlib.util.find_spec(m) is None]
    if absent:
        pytest.skip(f"{name}: {', '.join(absent)} not installed (pip install -e \".[recipes]\" or \".[rl,zoo]\")")
    for f in [f"{name}.py", *COMPANIONS.get(name, [])]:
        shutil.copy(RECIPES / f, tmp_path / f)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    env.pop("PYTHONPATH", None)   # the installed package only: nothing of the checkout's docs/
    out = subprocess.run([sys.executable, str(tmp_path / f"{name}.py"), "--quick"], cwd=tmp_path,
                         env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    for line in expected:
        assert line in out.stdout, out.stdout
