"""The core install runs the env: everything outside the core dependencies blocked in a subprocess.

A fresh process gets a ``sys.meta_path`` finder that refuses every module an extra provides
(torch, transformers, Hydra, Stable-Baselines3, scikit-learn, matplotlib, ...), so it sees what a
env-only install (``pip install .``) sees. There ``import llm_lb_gym``, ``gym.make`` and every
heuristic router must run; code that needs an extra must name the extra. ``.ci/run`` also
installs the package with its core dependencies alone into a fresh venv and steps the env.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:   # Python 3.10
    tomllib = pytest.importorskip("tomli")

from llm_lb_gym.extras import EXTRAS

ROOT = Path(__file__).resolve().parents[1]
BLOCKED = sorted({m for mods in EXTRAS.values() for m in mods}
                 | {"pandas", "pygame", "onnxscript", "yaml", "hypothesis_not_needed"})
"""Every module of an extra, plus a few a careless import could pull in."""

BLOCKER = textwrap.dedent(f"""
    import importlib.abc, sys
    BLOCKED = {BLOCKED!r}
    class Blocker(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ModuleNotFoundError(f"No module named {{name!r}} (blocked)", name=name)
    sys.meta_path.insert(0, Blocker())
""")


def _run_blocked(code: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-c", BLOCKER + textwrap.dedent(code)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=300)


def test_core_dependencies_are_exactly_numpy_gymnasium_scipy():
    """The blocked list and pyproject agree: the core is what this test lets through."""
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    names = sorted(d.split(">")[0].split("<")[0].split("=")[0].strip() for d in deps)
    assert names == ["gymnasium", "numpy", "scipy"]
    assert not {"numpy", "gymnasium", "scipy"} & set(BLOCKED)


def test_env_and_every_heuristic_router_run_with_core_dependencies_only():
    out = _run_blocked("""
        import gymnasium as gym
        import llm_lb_gym
        from llm_lb_gym.envs.router_factory import make_env_router
        from llm_lb_gym.routers.registry import ROUTERS
        from llm_lb_gym.rollout import rollout_router

        env = gym.make("LLMCluster-v0", num_instances=2, num_requests=40, arrival_rate_rps=8.0)
        obs, info = env.reset(seed=0)
        steps, done = 0, False
        while not done:
            action = env.action_space.sample(mask=info["action_mask"])
            obs, reward, terminated, truncated, info = env.step(action)
            done, steps = terminated or truncated, steps + 1
        m = info["metrics"]
        assert terminated and m["completed"] + m["rejected"] == 40 and m["unfinished"] == 0, m
        for name in ROUTERS:
            res = rollout_router(env.unwrapped, make_env_router(name, env.unwrapped), seed=1)
            assert res.metrics["completed"] + res.metrics["rejected"] == 40, name
        heavy = sorted(n for n in sys.modules if n.split(".")[0] in BLOCKED)
        print("OK", steps, len(ROUTERS), heavy)
    """)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.startswith("OK") and out.stdout.rstrip().endswith("[]")


def test_code_that_needs_an_extra_names_it():
    out = _run_blocked("""
        import gymnasium as gym, llm_lb_gym
        from llm_lb_gym.extras import MissingExtraError
        for stmt in ("import llm_lb_gym.agents", "import llm_lb_gym.experiments.train", "import llm_lb_gym.experiments.evaluate"):
            try:
                exec(stmt)
            except MissingExtraError as exc:
                print(stmt, "->", exc)
            else:
                raise SystemExit(f"{stmt} did not fail")
        from llm_lb_gym.experiments.cli import main
        sys.exit(main(["train", "experiment=debug"]))
    """)
    assert out.returncode == 1, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert len(lines) == 3 and all("pip install" in line for line in lines)
    assert "import llm_lb_gym.agents -> llm_lb_gym.agents needs" in lines[0] and "'rl'" in lines[0]
    assert "llm-lb-gym train needs" in lines[1] and "missing: torch" in lines[1]
    assert "llm-lb-gym evaluate needs" in lines[2] and "'eval'" in lines[2]   # the light extra, not 'rl'
    # the command line: one clear line, no traceback
    assert out.stderr.startswith("llm-lb-gym train: llm-lb-gym train needs the optional "
                                 "dependencies of the extra 'rl'")
    assert "Traceback" not in out.stderr


def test_every_advertised_render_mode_and_check_env_work_on_the_core_install():
    """Without matplotlib ``rgb_array`` draws with numpy; Gymnasium's checker passes, warnings as errors."""
    out = _run_blocked("""
        import warnings
        import gymnasium as gym, llm_lb_gym
        from gymnasium.utils.env_checker import check_env
        for mode in gym.make("LLMCluster-v0").unwrapped.metadata["render_modes"]:
            env = gym.make("LLMCluster-NearCapacity-v0", render_mode=mode, num_requests=20)
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                check_env(env.unwrapped)
            env.reset(seed=0)
            frame = env.render()
            print(mode, getattr(frame, "shape", type(frame).__name__))
        print("heavy", sorted(n for n in sys.modules if n.split(".")[0] in BLOCKED))
    """)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "rgb_array (360, 640, 3)" in out.stdout and "heavy []" in out.stdout, out.stdout


def test_heuristic_evaluation_runs_without_torch_or_sb3(tmp_path):
    """``llm-lb-gym evaluate`` of heuristics needs only the light 'eval' extra (Hydra, plots)."""
    heavy = ["torch", "stable_baselines3", "sb3_contrib", "tensorboard", "transformers", "sklearn"]
    code = BLOCKER.replace(f"BLOCKED = {BLOCKED!r}", f"BLOCKED = {heavy!r}") + textwrap.dedent(f"""
        from llm_lb_gym.experiments.cli import main
        rc = main(["evaluate", "experiment=debug", "episodes=1", "policies=[round_robin,jsq]",
                   "plot=false", "progress=false", "hydra.run.dir={tmp_path}"])
        print("heavy", sorted(n for n in sys.modules if n.split(".")[0] in BLOCKED))
        sys.exit(rc)
    """)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "heavy []" in out.stdout and "| jsq |" in out.stdout + out.stderr
