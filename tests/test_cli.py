"""``llm-lb-gym COMMAND``: the dispatcher, its errors, and the extras' messages for Hydra plugins."""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from llm_lb_gym.experiments import _plugins, cli

ROOT = Path(__file__).resolve().parents[1]
TINY_EVALUATE = ["experiment=debug", "episodes=1", "policies=[round_robin]", "plot=false"]


def test_help_lists_every_command_with_its_summary(capsys):
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: llm-lb-gym COMMAND [ARGS...]")
    for command in cli.COMMANDS:
        assert f"  {command} " in out
        assert cli.summary(command)
    assert "Train a router agent on LLMCluster-v0" in out   # docstrings, backquotes dropped


def test_every_command_is_a_module_with_main():
    for command in cli.COMMANDS:
        spec = importlib.util.find_spec(f"llm_lb_gym.experiments.{command}")
        tree = ast.parse(Path(spec.origin).read_text())
        assert any(isinstance(n, ast.FunctionDef) and n.name == "main" for n in tree.body), command


def test_unknown_command_names_the_allowed_ones(capsys):
    assert cli.main(["trian", "seed=1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("llm-lb-gym: unknown command 'trian'; allowed: train, evaluate, "
                          "reproduce, load_sweep, bench")


def test_no_command_prints_usage_and_fails(capsys):
    assert cli.main([]) == 2
    assert "usage: llm-lb-gym" in capsys.readouterr().err


def test_argparse_commands_get_their_arguments_and_prog(capsys):
    argv = list(sys.argv)
    with pytest.raises(SystemExit) as done:
        cli.main(["bench", "--help"])
    assert done.value.code == 0
    assert capsys.readouterr().out.startswith("usage: llm-lb-gym bench")
    assert sys.argv == argv   # restored


def test_evaluate_in_process_forwards_hydra_overrides(tmp_path, capsys):
    argv = list(sys.argv)
    rc = cli.main(["evaluate", *TINY_EVALUATE, f"hydra.run.dir={tmp_path}"])
    assert rc == 0 and sys.argv == argv
    assert "| round_robin |" in capsys.readouterr().out
    record = json.loads((tmp_path / "run.json").read_text())
    assert record["command"] == ("llm-lb-gym evaluate " + " ".join(TINY_EVALUATE)
                                 + f" hydra.run.dir={tmp_path}")


def test_dashes_name_the_same_command(tmp_path, capsys):
    """``load-sweep`` is ``load_sweep``: Hydra's --help for it names its config."""
    with pytest.raises(SystemExit) as done:
        cli.main(["load-sweep", "--help"])
    assert done.value.code == 0
    assert "load_sweep is powered by Hydra" in capsys.readouterr().out


def test_python_dash_m_experiments_is_the_same_dispatcher():
    out = subprocess.run([sys.executable, "-m", "llm_lb_gym.experiments", "trian"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "unknown command 'trian'; allowed: train," in out.stderr


def test_console_script_runs_a_tiny_evaluation(tmp_path):
    script = Path(sys.executable).with_name("llm-lb-gym")
    if not script.exists():
        pytest.skip("the llm-lb-gym console script is not installed in this environment "
                    "(pip install -e . creates it)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    out = subprocess.run([str(script), "evaluate", *TINY_EVALUATE, f"hydra.run.dir={tmp_path}"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "| round_robin |" in out.stdout
    assert (tmp_path / "resolved_config.yaml").exists()


# ---------------------------------------------------------------- extras for Hydra plugins

def test_missing_sweeper_names_the_sweep_extra():
    msgs = _plugins.missing_extras(["-m", "+hydra/sweeper=optuna", "seed=1"],
                                   installed=lambda m: m != "optuna")
    assert msgs == ["hydra/sweeper=optuna needs the optional dependencies of the extra 'sweep' "
                    "(missing: optuna): pip install \"llm_lb_gym[sweep]\" "
                    "(from a checkout: pip install -e \".[sweep]\")"]


def test_ray_preset_resolves_to_the_ray_launcher():
    msgs = _plugins.missing_extras(["hydra/launcher=ray_cluster"], installed=lambda m: False)
    assert len(msgs) == 1
    assert msgs[0].startswith("hydra/launcher=ray_cluster (through "
                              "conf/hydra/launcher/ray_cluster.yaml) needs the optional "
                              "dependencies of the extra 'ray' (missing: "
                              "hydra_plugins.hydra_ray_launcher, ray)")


def test_installed_or_core_plugins_pass():
    assert _plugins.missing_extras(["hydra/sweeper=optuna", "hydra/launcher=ray"],
                                   installed=lambda m: True) == []
    for args in (["hydra/launcher=joblib"], ["hydra/launcher=local_parallel"],
                 ["hydra/launcher=slurm_cpu"], ["hydra.sweeper.n_trials=3", "seed=0,1"]):
        assert _plugins.missing_extras(args, installed=lambda m: False) == []


def test_entry_point_stops_before_hydra_with_the_extra(monkeypatch, capsys):
    """Through the real entry point: the check runs before Hydra composes anything."""
    monkeypatch.setattr(_plugins, "_installed", lambda m: False)
    with pytest.raises(SystemExit) as stop:   # no_such_key: were the check skipped, Hydra fails fast
        cli.main(["train", "-m", "hydra/sweeper=optuna", "no_such_key=1"])
    assert "error: hydra/sweeper=optuna needs the optional dependencies of the extra 'sweep'" \
        in str(stop.value.code)
    assert 'pip install -e ".[sweep]"' in str(stop.value.code)


def test_optuna_sweeper_composes_with_the_train_config_when_installed():
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper")
    from hydra import compose, initialize_config_dir

    from llm_lb_gym.experiments._hydra import CONF_DIR

    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose(config_name="train", return_hydra_config=True,
                      overrides=["hydra/sweeper=optuna", "hydra.sweeper.n_trials=2"])
    assert "Optuna" in cfg.hydra.sweeper._target_ and cfg.hydra.sweeper.n_trials == 2
