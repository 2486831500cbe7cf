"""Build and load agents by name, from plain config values (Hydra's ``conf/agent``).

``make_agent("double_dqn", env, learning_rate=1e-4, net_arch=[64, 64], activation="relu")``:
every keyword goes to the agent class's constructor, checked against its signature so a typo
fails with the list of accepted names. Two conveniences on top:

- ``net_arch`` and ``activation`` may be given as top-level plain values (a list of widths and a
  name such as ``"relu"``); they land in SB3's ``policy_kwargs`` as ``net_arch`` and
  ``activation_fn`` (a string ``policy_kwargs.activation_fn`` is mapped too).
- ``total_timesteps`` and ``episode_steps`` are schedule hints: the DQN variants use them to end
  epsilon-exploration at ``exploration_end_episode`` (paper: 20); other agents ignore them.

``double_dqn`` and ``dqn`` start from the paper's settings (:mod:`agents.paper_defaults`) so the
two differ only in the target; ``maskable_ppo`` and ``reinforce`` start from their own defaults.
Models are built on the CPU unless ``device`` says otherwise: these MLPs are too small to gain
from a GPU.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any, Callable

from stable_baselines3 import DQN

from llm_lb_gym._validate import ConfigError, lookup, reject_unknown

from agents.reinforce import CONFIG_FIELDS as REINFORCE_FIELDS
from agents.reinforce import REINFORCEAgent
from agents.double_dqn import DoubleDQN
from agents.nets import activation_class, net_arch_value
from agents.paper_defaults import PAPER_FIELDS, paper_kwargs


def _maskable_ppo() -> type:
    # Imported on use: sb3_contrib pulls in several algorithms the DQN user does not need.
    from sb3_contrib import MaskablePPO

    return MaskablePPO


AGENT_CLASSES: dict[str, Callable[[], type]] = {
    "double_dqn": lambda: DoubleDQN,
    "dqn": lambda: DQN,
    "maskable_ppo": _maskable_ppo,
    "reinforce": lambda: REINFORCEAgent,
}
AGENT_NAMES = tuple(AGENT_CLASSES)


def agent_class(name: str) -> type:
    """The class behind an agent name; the error lists the valid names."""
    return lookup("agent", AGENT_CLASSES, name)()


def _constructor_params(cls: type) -> set[str]:
    return {
        n for n, p in inspect.signature(cls.__init__).parameters.items()
        if n not in ("self", "env") and not n.startswith("_") and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)
    }


def _policy_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Fold top-level ``net_arch``/``activation`` into ``policy_kwargs`` with real classes."""
    policy_kwargs = dict(kwargs.pop("policy_kwargs", None) or {})
    if "net_arch" in kwargs:
        policy_kwargs["net_arch"] = kwargs.pop("net_arch")
    if "activation" in kwargs:
        if "activation_fn" in policy_kwargs:
            raise ConfigError("give either activation or policy_kwargs.activation_fn, not both")
        policy_kwargs["activation_fn"] = kwargs.pop("activation")
    if "net_arch" in policy_kwargs:
        policy_kwargs["net_arch"] = net_arch_value(policy_kwargs["net_arch"])
    if "activation_fn" in policy_kwargs:
        policy_kwargs["activation_fn"] = activation_class(policy_kwargs["activation_fn"])
    return policy_kwargs


def make_agent(
    name: str,
    env: Any,
    *,
    total_timesteps: int | None = None,
    episode_steps: int | None = None,
    **kwargs: Any,
) -> Any:
    """A new agent ``name`` (one of :data:`AGENT_NAMES`) on ``env``.

    Args:
        name: ``double_dqn``, ``dqn`` (SB3's, for comparison), ``maskable_ppo`` (needs the env's
            ``action_masks()``) or ``reinforce``.
        env: a gymnasium env, a VecEnv or an env id (SB3 agents); a gymnasium env (reinforce).
        total_timesteps, episode_steps: schedule hints (see module docstring).
        **kwargs: constructor keywords of the agent class (plain values; see module docstring).
    """
    cls = agent_class(name)
    kwargs = dict(kwargs)
    if name == "reinforce":
        reject_unknown("reinforce agent", kwargs, REINFORCE_FIELDS | {"seed", "tensorboard_log", "verbose"})
        return REINFORCEAgent(env, **kwargs)

    if name == "maskable_ppo":
        from sb3_contrib.common.maskable.utils import is_masking_supported

        if not isinstance(env, str) and not is_masking_supported(env):
            raise ConfigError("agent maskable_ppo needs an env with an action_masks() method")

    allowed = _constructor_params(cls) | {"net_arch", "activation"}
    if name in ("double_dqn", "dqn"):
        allowed |= PAPER_FIELDS
    reject_unknown(f"{name} agent", kwargs, allowed)

    policy_kwargs = _policy_kwargs(kwargs)
    if name in ("double_dqn", "dqn"):
        overrides = {k: kwargs.pop(k) for k in list(kwargs) if k in PAPER_FIELDS}
        if "net_arch" in policy_kwargs:
            overrides["net_arch"] = policy_kwargs.pop("net_arch")
        kwargs = {**paper_kwargs(total_timesteps, episode_steps, **overrides), **kwargs}
        policy_kwargs = {**kwargs.pop("policy_kwargs"), **policy_kwargs}
    kwargs.setdefault("policy", "MlpPolicy")
    kwargs.setdefault("device", "cpu")
    if policy_kwargs:
        kwargs["policy_kwargs"] = policy_kwargs
    return cls(env=env, **kwargs)


def load_agent(name: str, path: str | Path, env: Any = None, **kwargs: Any) -> Any:
    """Load an agent saved with ``agent.save(path)``; ``env`` is needed only to keep training.

    SB3 models load on the CPU unless ``device`` is given.
    """
    cls = agent_class(name)
    if name != "reinforce":
        kwargs.setdefault("device", "cpu")
    return cls.load(path, env=env, **kwargs)
