"""What every Hydra entry point shares: where conf/ lives, env options from a composed config,
and the run record (resolved config, command, seed) written next to the results."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import conf as _conf_pkg

CONF_DIR = str(Path(_conf_pkg.__file__).resolve().parent)
"""conf/ is a package, so it is found from an editable install and from a wheel alike."""


def to_container(node):
    """A plain dict/list of ``node``, interpolations resolved; a value left ``???`` (such as
    ``workload.path`` of ``workload=trace``) raises MissingMandatoryValue naming its key."""
    from omegaconf import OmegaConf

    if node is None:
        return None
    return OmegaConf.to_container(node, resolve=True, throw_on_missing=True)


def env_kwargs(cfg) -> dict:
    """``gym.make("LLMCluster-v0", **env_kwargs(cfg))`` from the composed groups."""
    kw = dict(to_container(cfg.env))
    if isinstance(kw.get("obs"), dict):
        kw["obs"] = {k: tuple(v) if isinstance(v, list) else v for k, v in kw["obs"].items()}
    for group in ("engine", "workload", "predictor", "reward"):
        if group in cfg and cfg[group] is not None:
            kw[group] = to_container(cfg[group])
    return kw


def run_dir(cfg=None) -> Path:
    """Hydra's output directory of this run (the working directory is not changed)."""
    try:
        from hydra.core.hydra_config import HydraConfig

        return Path(HydraConfig.get().runtime.output_dir)
    except Exception:   # called outside @hydra.main (tests): use cfg.output_dir or cwd
        out = Path(getattr(cfg, "output_dir", None) or os.getcwd())
        out.mkdir(parents=True, exist_ok=True)
        return out


def write_run_record(out: Path, cfg, **extra) -> None:
    """Resolved config, command line and seed, as rl-baselines3-zoo keeps them."""
    from omegaconf import OmegaConf

    out.mkdir(parents=True, exist_ok=True)
    (out / "resolved_config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    script = Path(sys.argv[0]) if sys.argv else Path("?")
    if script.suffix == ".py" and script.parent.name == "experiments":   # run as python -m
        command = " ".join(["python", "-m", f"experiments.{script.stem}"] + sys.argv[1:])
    else:
        command = " ".join(["python"] + sys.argv)
    record = {"command": command, "argv": sys.argv, "seed": cfg.get("seed"), **extra}
    (out / "run.json").write_text(json.dumps(record, indent=2, default=str))
