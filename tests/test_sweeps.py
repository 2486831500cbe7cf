"""Sweeps fanned out over a launcher: a Ray sweep (when the ray extra is installed), an
evaluation split over jobs and merged back, and the merge rules for training-seed sweeps."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from llm_lb_gym.experiments._hydra import CONF_DIR

REPO = Path(__file__).resolve().parents[1]


def _ray_missing() -> str | None:
    for module, dist in (("ray", "ray"), ("hydra_plugins.hydra_ray_launcher", "hydra-ray-launcher")):
        try:
            if importlib.util.find_spec(module) is None:
                return f"{dist} is not installed (pip install -e '.[ray]')"
        except ModuleNotFoundError:
            return f"{dist} is not installed (pip install -e '.[ray]')"
    return None


def _sweep(args: list[str], sweep_dir: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "RAY_AUTH_MODE": "disabled"}
    proc = subprocess.run([sys.executable, "-m", *args, f"hydra.sweep.dir={sweep_dir}"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc


@pytest.mark.skipif(_ray_missing() is not None, reason=str(_ray_missing()))
def test_ray_sweep_of_two_jobs(tmp_path):
    """``hydra/launcher=ray_local``: two debug trainings as Ray tasks on a local Ray instance."""
    proc = _sweep(["llm_lb_gym.experiments.train", "-m", "experiment=debug", "seed=0,1", "train.episodes=2",
                   "train.eval_every_episodes=0", "eval.episodes=1", "hydra/launcher=ray_local"], tmp_path)
    assert "Ray Launcher is launching 2 jobs" in proc.stdout + proc.stderr
    runs = sorted(p.parent for p in tmp_path.glob("*/model.zip"))
    assert len(runs) == 2
    records = [json.loads((r / "run.json").read_text()) for r in runs]
    assert sorted(r["seed"] for r in records) == [0, 1]
    for r in records:   # each job records the single run that repeats it, not the Ray worker's argv
        assert r["command"].startswith("python -m llm_lb_gym.experiments.train ")
        assert f"seed={r['seed']}" in r["command"].split() and "seed=0,1" not in r["command"]
        assert r["sweep"]["job"] in (0, 1)


def test_ray_presets_compose_to_the_ray_launcher():
    """Both presets extend the plugin's ``ray`` config; local starts Ray, cluster attaches."""
    from omegaconf import OmegaConf

    local = OmegaConf.load(Path(CONF_DIR) / "hydra" / "launcher" / "ray_local.yaml")
    cluster = OmegaConf.load(Path(CONF_DIR) / "hydra" / "launcher" / "ray_cluster.yaml")
    for preset in (local, cluster):
        assert list(preset.defaults) == ["ray"] and preset.ray.remote.num_cpus == 1
    assert local.ray.init.address is None and cluster.ray.init.address == "auto"
    if _ray_missing() is None:
        with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
            cfg = compose(config_name="train", overrides=["hydra/launcher=ray_local"], return_hydra_config=True)
        assert cfg.hydra.launcher._target_.endswith("RayLauncher")


def test_evaluation_fanned_out_over_jobs_merges_to_the_single_run_table(tmp_path):
    """Two joblib jobs of one episode each, merged, give the table of one two-episode run."""
    from llm_lb_gym.experiments.evaluate import evaluate
    from llm_lb_gym.experiments.merge import merge

    common = ["experiment=debug", "policies=[round_robin,jsq]", "progress=false"]
    _sweep(["llm_lb_gym.experiments.evaluate", "-m", *common, "episodes=1", "seed=1000,1001",
            "hydra/launcher=joblib", "hydra.launcher.n_jobs=2"], tmp_path / "sweep")
    summary = merge(tmp_path / "sweep")["results.csv"].read_text()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose(config_name="evaluate", overrides=[*common, "episodes=2", "seed=1000"])
    single = evaluate(cfg, out=tmp_path / "single")["table"]
    assert "2 episodes, seeds 1000..1001" in summary
    assert single in summary
    job = json.loads((tmp_path / "sweep" / "1" / "run.json").read_text())
    words = job["command"].split()   # the job alone: its seed, not the sweep's list, and no -m after the module
    assert job["seed"] == 1001 and words[:3] == ["python", "-m", "llm_lb_gym.experiments.evaluate"]
    assert "seed=1001" in words and "-m" not in words[3:] and job["sweep"]["job"] == 1


def _row(policy: str, seed: int, e2e: float) -> dict:
    return {"policy": policy, "seed": seed, "mean_e2e_s": e2e, "p99_e2e_s": 2 * e2e, "wall_s": 0.1 * seed}


def test_merge_keeps_identical_rows_once_and_splits_agents_by_job():
    """A training-seed sweep: round robin ran the same episodes in both jobs (kept once, wall
    time aside), the agent differs per job (one policy per job, and its change across jobs)."""
    from llm_lb_gym.experiments.merge import across_jobs, merge_rows

    job0 = [_row("round_robin", 1000, 10.0), _row("round_robin", 1001, 20.0),
            _row("wg_rl", 1000, 9.0), _row("wg_rl", 1001, 18.0)]            # -10% on both episodes
    job1 = [{**_row("round_robin", 1000, 10.0), "wall_s": 5.0}, _row("round_robin", 1001, 20.0),
            _row("wg_rl", 1000, 12.0), _row("wg_rl", 1001, 22.0)]           # +20% and +10%
    rows, names = merge_rows([("seed=0", job0), ("seed=1", job1)])
    assert sum(r["policy"] == "round_robin" for r in rows) == 2
    assert names == {"wg_rl": ["wg_rl [seed=0]", "wg_rl [seed=1]"]}
    table = across_jobs(rows, names, "round_robin")
    row = next(line for line in table.splitlines() if line.startswith("| wg_rl |"))
    # per job: -10% and +15%; mean +2.5%, CI half-width t(0.975, 1) * std / sqrt(2)
    half = 12.706204736174707 * math.sqrt(((-10 - 2.5) ** 2 + (15 - 2.5) ** 2) / 1) / math.sqrt(2)
    assert f"+2.50% ± {half:.2f}" in row and "-10.00%, +15.00%" in row


def test_merge_refuses_a_folder_without_jobs(tmp_path):
    from llm_lb_gym.experiments.merge import merge

    with pytest.raises(FileNotFoundError, match="no sweep jobs"):
        merge(tmp_path)
