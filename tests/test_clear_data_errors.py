"""A dataset missing inside a Hydra command (``evaluate``) stops with its clear message only."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("hydra", reason="experiments need the rl extra")

ROOT = Path(__file__).resolve().parents[1]


def test_missing_dataset_in_evaluate_prints_the_message_without_a_traceback(tmp_path):
    empty = tmp_path / "data"
    empty.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1",
           "LLM_LB_GYM_DATA": str(empty)}
    env.pop("HYDRA_FULL_ERROR", None)
    out = subprocess.run([sys.executable, "-m", "llm_lb_gym.experiments.evaluate", "experiment=debug",
                          "episodes=1", "policies=[round_robin]", "workload=azure_conv",
                          f"hydra.run.dir={tmp_path / 'run'}"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 1
    assert out.stderr.startswith("error: dataset 'azure_conv' not found at ")
    assert "python -m llm_lb_gym.data fetch azure_conv" in out.stderr
    assert "Traceback" not in out.stderr and "HYDRA_FULL_ERROR" not in out.stderr
