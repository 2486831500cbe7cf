"""Hydra plugins that come with an extra of this package, and a clear error without it.

The Optuna sweeper (optuna 2.x, SQLAlchemy 1.x) and the Ray launcher pin versions that other
frameworks' users cannot take, so they are extras, not dependencies. Selecting one that is not
installed would make Hydra say it "could not find 'hydra/sweeper/optuna'", which does not tell
the user what to install; ``require_plugins`` names the extra instead, before Hydra starts.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Callable, Iterable

from omegaconf import OmegaConf

from llm_lb_gym.experiments._hydra import CONF_DIR

PLUGINS = {
    ("hydra/sweeper", "optuna"): ("sweep", ("hydra_plugins.hydra_optuna_sweeper", "optuna")),
    ("hydra/launcher", "ray"): ("ray", ("hydra_plugins.hydra_ray_launcher", "ray")),
    ("hydra/launcher", "ray_aws"): ("ray", ("hydra_plugins.hydra_ray_launcher", "ray")),
}
"""(config group, choice) -> (extra that installs it, modules it needs)."""

_PREFIXES = ("++", "+", "/")


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:   # a parent package is missing
        return False


def _choices(overrides: Iterable[str]) -> list[tuple[str, str]]:
    """The (group, choice) pairs that command-line overrides select (``hydra/sweeper=optuna``)."""
    out = []
    for arg in overrides:
        key, eq, value = arg.partition("=")
        for p in _PREFIXES:
            key = key.removeprefix(p)
        if eq and key in ("hydra/sweeper", "hydra/launcher"):
            out.append((key, value.strip()))
    return out


def _resolve(group: str, choice: str, conf_dir: Path, seen: frozenset = frozenset()) -> list[str]:
    """A preset of ours (``conf/hydra/launcher/ray_cluster.yaml``) -> the plugin choices its
    defaults list selects in the same group; any other choice is itself."""
    preset = conf_dir / group / f"{choice}.yaml"
    if not preset.is_file() or choice in seen:
        return [choice]
    defaults = OmegaConf.to_container(OmegaConf.load(preset)).get("defaults") or []
    found = []
    for entry in defaults:
        if isinstance(entry, str) and entry != "_self_":
            found += _resolve(group, entry.removeprefix("/" + group + "/"), conf_dir,
                              seen | {choice})
    return found or [choice]


def missing_extras(overrides: Iterable[str], conf_dir: str | Path = CONF_DIR,
                   installed: Callable[[str], bool] | None = None) -> list[str]:
    """One message per selected plugin whose extra is not installed (``installed(module)``
    says whether a module can be imported; default: it can be found)."""
    installed = installed or _installed
    messages = []
    for group, choice in _choices(overrides):
        for plugin in _resolve(group, choice, Path(conf_dir)):
            if (group, plugin) not in PLUGINS:
                continue
            extra, modules = PLUGINS[group, plugin]
            absent = [m for m in modules if not installed(m)]
            if absent:
                via = "" if plugin == choice else f" (through conf/{group}/{choice}.yaml)"
                messages.append(
                    f"{group}={choice}{via} needs the optional dependencies of the extra "
                    f"'{extra}' (missing: {', '.join(absent)}): pip install "
                    f"\"llm_lb_gym[{extra}]\" (from a checkout: pip install -e \".[{extra}]\")")
    return messages


def require_plugins(overrides: Iterable[str]) -> None:
    """Exit with the messages of ``missing_extras`` when there are any."""
    messages = missing_extras(overrides)
    if messages:
        raise SystemExit("error: " + "\n       ".join(messages))
