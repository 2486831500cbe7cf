"""Helpers shared by the two predictor commands (train_predictor, eval_predictor)."""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[1]
"""The repository when running from a checkout (an editable install); else site-packages."""


def set_threads(threads: int | None, needs_torch: bool) -> None:
    """Cap torch's intra-op threads (the machine may be shared); torch is imported only if used.

    OpenMP threads that spin while waiting are what make a shared, oversubscribed CPU slow
    (measured here under load: a training step 2x slower with spinning threads), so unless the
    user chose otherwise they wait passively; this must be set before torch starts OpenMP.
    """
    if threads and needs_torch:
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        import torch
        torch.set_num_threads(int(threads))


def repo_path(p) -> Path:
    """A relative path is taken from the repository root when running from a checkout (where
    the README's commands keep ``artifacts/``), else from the working directory: an installed
    package never writes into site-packages."""
    p = Path(p).expanduser()
    if p.is_absolute():
        return p
    return (CHECKOUT if (CHECKOUT / "pyproject.toml").is_file() else Path.cwd()) / p


def write_run_record(out_dir: Path, cfg, name: str) -> None:
    """Resolved config and the command line beside the results (rl-baselines3-zoo habit)."""
    from omegaconf import OmegaConf

    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{name}_config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    (out_dir / f"{name}_command.txt").write_text(
        " ".join(shlex.quote(a) for a in [sys.executable, "-m", f"llm_lb_gym.experiments.{name}"] + sys.argv[1:]) + "\n")


def dump_json(data: dict, path: Path | None = None) -> str:
    text = json.dumps(data, indent=2)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")
    return text
