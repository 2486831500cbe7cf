"""What every Hydra entry point shares: where conf/ lives, the ``@hydra_main`` shell, env
options from a composed config, and the run record (resolved config, command, seed) written
next to the results."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import sys
import warnings
from pathlib import Path

import llm_lb_gym.conf as _conf_pkg
from llm_lb_gym._validate import ConfigError

# Hydra 1.4 deprecates version_base="1.3" with a warning on every compose; "1.3" is what keeps the
# working directory and the run dir this project documents, so the warning says nothing to a user.
warnings.filterwarnings("ignore", message="The version_base parameter is deprecated", category=UserWarning)

CONF_DIR = str(Path(_conf_pkg.__file__).resolve().parent)
"""conf/ installs as the package ``llm_lb_gym.conf``, so it is found from an editable install and
from a wheel alike."""


def preset_node(name: str) -> dict:
    """Preset ``name`` (``llm_lb_gym/envs/presets.py``) in the layout of a composed config: its
    engine, workload and reward options under those groups, the rest under ``env``. Without the
    predictor: an experiment keeps its own predictor group (``presets.py`` says why)."""
    import copy

    from llm_lb_gym.envs.presets import preset

    opts = copy.deepcopy(dict(preset(name).options))
    node = {group: opts.pop(group) for group in ("engine", "workload", "reward") if group in opts}
    if isinstance(node.get("workload"), str):
        node["workload"] = {"name": node["workload"]}
    return {"env": opts, **node}


def store_presets() -> bool:
    """Every preset as the Hydra config ``/preset/<name>`` (package ``_global_``), so an
    experiment takes a regime's values from ``presets.py`` by listing ``- /preset: <name>`` in its
    defaults (its own keys and the command line still override them). False without Hydra."""
    try:
        from hydra.core.config_store import ConfigStore
    except ImportError:
        return False
    from llm_lb_gym.envs.presets import PRESETS

    store = ConfigStore.instance()
    for name in PRESETS:
        store.store(group="preset", name=name, node=preset_node(name), package="_global_")
    return True


store_presets()   # at import: every entry point and test composes through this module


def hydra_main(config_name: str):
    """``@hydra.main`` on ``conf/<config_name>.yaml`` that first checks that the Hydra plugins
    the command line selects are installed (``llm_lb_gym.experiments._plugins``: the optional ones come
    with an extra, and the error names it). Called with a config, it runs the task directly."""
    import hydra

    def decorate(task):
        @functools.wraps(task)
        def task_with_clear_data_errors(cfg):
            # A dataset that is missing (or fails its checksum) is the user's to fix, and the
            # message says how: print it alone, not after Hydra's traceback.
            from llm_lb_gym.data.store import DataError

            try:
                return task(cfg)
            except DataError as err:
                raise SystemExit(f"error: {err}") from None

        run = hydra.main(version_base="1.3", config_path=CONF_DIR,
                         config_name=config_name)(task_with_clear_data_errors)

        @functools.wraps(task)
        def main(cfg_passthrough=None):
            if cfg_passthrough is None:
                from llm_lb_gym.experiments._plugins import require_plugins

                require_plugins(sys.argv[1:])
            return run(cfg_passthrough)

        return main

    return decorate


def to_container(node):
    """A plain dict/list of ``node``, interpolations resolved; a value left ``???`` (such as
    ``workload.path`` of ``workload=trace``) raises MissingMandatoryValue naming its key."""
    from omegaconf import OmegaConf

    if node is None:
        return None
    return OmegaConf.to_container(node, resolve=True, throw_on_missing=True)


ENV_GROUPS = ("engine", "workload", "predictor", "reward")
"""Config groups that are ``gym.make`` keywords of their own (``conf/<group>/``)."""


def env_kwargs(cfg) -> dict:
    """``gym.make("LLMCluster-v0", **env_kwargs(cfg))`` from the composed groups. A router as the
    reward's teacher without its own ``reward.teacher_options`` gets the setting's options of
    that router (:func:`router_options`)."""
    kw = dict(to_container(cfg.env))
    if isinstance(kw.get("obs"), dict):
        kw["obs"] = {k: tuple(v) if isinstance(v, list) else v for k, v in kw["obs"].items()}
    for group in ENV_GROUPS:
        if group in cfg and cfg[group] is not None:
            if kw.get(group) is not None:
                # gym.make takes engine=... as an env keyword, so env.engine.x=1 looks natural;
                # the group would replace it without a word. One place per value: the group's.
                keys = ", ".join(f"{group}.{k}" for k in kw[group]) if isinstance(kw[group], dict) else group
                raise ConfigError(f"env.{group} is set ({kw[group]!r}) beside the {group} group, which "
                                  f"replaces it: write {keys} (the {group} group's options) instead of "
                                  f"env.{group}.*")
            kw[group] = to_container(cfg[group])
    reward = kw.get("reward")
    if isinstance(reward, dict) and reward.get("teacher") not in (None, "mixing") \
            and not reward.get("teacher_options"):
        reward["teacher_options"] = router_options(cfg, reward["teacher"])
    return kw


def all_router_options(cfg) -> dict:
    """Every router's options in this setting: ``eval.policy_options`` (the one place a setting
    sets them: ``conf/routers/default.yaml``, overridden by the experiment's), each router's
    entry replaced by one given in a top-level ``policy_options`` (the command line's)."""
    setting = to_container((cfg.get("eval") or {}).get("policy_options")) or {}
    return {**setting, **(to_container(cfg.get("policy_options")) or {})}


def router_options(cfg, name: str) -> dict:
    """Options of router ``name`` in this setting (:func:`all_router_options`), as evaluation,
    training's teachers (imitation, reward guidance), the load sweep and improve read them. A
    ``lookahead`` without ``base_options`` gets the setting's options of its base router."""
    every = all_router_options(cfg)
    opts = dict(every.get(name) or {})
    if name == "lookahead" and "base_options" not in opts:
        from llm_lb_gym.routers.lookahead import LookaheadOptions

        opts["base_options"] = dict(every.get(opts.get("base", LookaheadOptions.base)) or {})
    return opts


def run_dir(cfg=None) -> Path:
    """Hydra's output directory of this run (the working directory is not changed)."""
    try:
        from hydra.core.hydra_config import HydraConfig

        return Path(HydraConfig.get().runtime.output_dir)
    except Exception:   # called outside @hydra.main (tests): use cfg.output_dir or cwd
        out = Path(getattr(cfg, "output_dir", None) or os.getcwd())
        out.mkdir(parents=True, exist_ok=True)
        return out


def _sweep_job() -> dict | None:
    """This job's place in a ``--multirun`` sweep (None in a single run or outside Hydra).

    A sweep job may run in another process or on another machine (joblib, submitit and Ray
    workers), whose ``sys.argv`` is the worker's; its own overrides are what reproduce it."""
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        hc = HydraConfig.get()
    except Exception:
        return None
    if hc.mode != RunMode.MULTIRUN:
        return None
    argv = [f"experiments/{hc.job.name}.py", *hc.overrides.task]
    return {"argv": argv, "dir": str(hc.sweep.dir), "num": int(hc.job.num)}


def write_run_record(out: Path, cfg, **extra) -> None:
    """Resolved config, command line and seed, as rl-baselines3-zoo keeps them. A sweep job's
    command is the single run that repeats it (its own overrides), with the sweep's folder and
    job number beside it."""
    from omegaconf import OmegaConf

    out.mkdir(parents=True, exist_ok=True)
    (out / "resolved_config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    job = _sweep_job()
    argv = job["argv"] if job else sys.argv
    script = Path(argv[0]) if argv else Path("?")
    if script.suffix == ".py" and script.parent.name == "experiments":   # run as python -m
        command = " ".join(["python", "-m", f"llm_lb_gym.experiments.{script.stem}"] + argv[1:])
    elif argv and argv[0].startswith("llm-lb-gym "):   # llm_lb_gym.experiments.cli sets argv[0]
        command = " ".join(argv)
    else:
        command = " ".join(["python"] + argv)
    record = {"command": command, "argv": argv, "seed": cfg.get("seed"), **extra}
    if job:
        record["sweep"] = {"dir": job["dir"], "job": job["num"]}
    (out / "run.json").write_text(json.dumps(record, indent=2, default=str))


@contextlib.contextmanager
def _hydra_ready():
    """Compose needs an initialised Hydra: the running app's, or a temporary one (tests)."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    if GlobalHydra.instance().is_initialized():
        yield
    else:
        with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
            yield


def compose(config_name: str, overrides: list[str]):
    """``conf/<config_name>.yaml`` composed with ``overrides``, inside a running Hydra app or not."""
    from hydra import compose as hydra_compose

    with _hydra_ready():
        return hydra_compose(config_name=config_name, overrides=overrides)


DEFAULT_OPTIONS = "routers/default.yaml"
"""The default setting's router options (``eval.policy_options``: what ``evaluate`` and the
benchmark play), in the installed ``llm_lb_gym.conf``; read as YAML so serving needs no Hydra."""


def default_router_options(router: str) -> dict:
    """``router``'s options in the default setting: scored_binding's are the main job's router."""
    from importlib.resources import files

    import yaml

    data = yaml.safe_load((files("llm_lb_gym.conf") / DEFAULT_OPTIONS).read_text()) or {}
    return dict(data.get(router) or {})
