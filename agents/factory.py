"""Build and load agents by name, from plain config values (Hydra's ``conf/agent``).

``make_agent("double_dqn", env, learning_rate=1e-4, net_arch=[64, 64], activation="relu")``:
every keyword goes to the agent class's constructor, checked against its signature so a typo
fails with the list of accepted names. Two conveniences on top:

- ``net_arch`` and ``activation`` may be given as top-level plain values (a list of widths and a
  name such as ``"relu"``); they land in SB3's ``policy_kwargs`` as ``net_arch`` and
  ``activation_fn`` (a string ``policy_kwargs.activation_fn`` is mapped too).
- ``total_timesteps`` and ``episode_steps`` are schedule hints: the DQN variants use them to end
  epsilon-exploration at ``exploration_end_episode`` (paper: 20); other agents ignore them.
- ``policy="equivariant"`` (``llm_lb_gym.agents.equivariant``) picks the per-instance shared network for
  ``double_dqn``, ``dqn`` and ``maskable_ppo`` and passes it the env's observation layout;
  ``policy="mlp"`` (default) is SB3's MLP.
- Every agent discounts each transition by the env's ``info["discount"]`` (spec
  ``env_discount``): off-policy agents store it in their replay
  (``llm_lb_gym.agents.replay.SemiMDPReplayBuffer``, spec ``semi_mdp_replay``), ``maskable_ppo`` in its
  rollout buffer (``llm_lb_gym.agents.maskable_ppo``), ``reinforce`` in its returns-to-go. Their discount
  is the env's ``reward.discount`` / ``reward.horizon_s`` / ``reward.gamma``, so ``gamma`` is
  refused as an agent option on ``LLMCluster-v0``.

What differs between agents (accepted keywords, defaults, SB3 or not, mask needs) is read from
their :class:`llm_lb_gym.agents.registry.AgentSpec`: ``double_dqn`` and ``dqn`` start from the paper's
settings (:mod:`llm_lb_gym.agents.paper_defaults`) so the two differ only in the target; ``maskable_ppo``
and ``reinforce`` start from their own defaults. SB3 models are built on the CPU unless
``device`` says otherwise: these MLPs are too small to gain from a GPU.
"""

from __future__ import annotations

import contextlib
import importlib
import pkgutil
import sys
from pathlib import Path
from typing import Any

import numpy as np

from llm_lb_gym._validate import ConfigError, reject_unknown

from llm_lb_gym.agents.equivariant import POLICY_NAMES, obs_layout_of, policy_for
from llm_lb_gym.agents.nets import activation_class, net_arch_value
from llm_lb_gym.agents.registry import AGENT_NAMES, agent_spec

__all__ = ["AGENT_NAMES", "agent_class", "load_agent", "make_agent"]


def agent_class(name: str) -> type:
    """The class behind an agent name; the error lists the valid names."""
    return agent_spec(name).load_class()


def _semi_mdp_env(env: Any) -> bool:
    """Whether ``env`` is (a VecEnv of) ``LLMCluster-v0``, whose steps report their discount."""
    if isinstance(env, str):
        return env.startswith("LLMCluster")
    try:
        obs_layout_of(env)
    except (AttributeError, TypeError):
        return False
    return True


def _policy_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Fold top-level ``net_arch``/``activation``/``embed_dim`` into ``policy_kwargs`` with real
    classes."""
    policy_kwargs = dict(kwargs.pop("policy_kwargs", None) or {})
    if "embed_dim" in kwargs:
        policy_kwargs["embed_dim"] = kwargs.pop("embed_dim")
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
    spec = agent_spec(name)
    cls = spec.load_class()
    kwargs = dict(kwargs)
    if spec.requires_mask_env:
        from sb3_contrib.common.maskable.utils import is_masking_supported

        if not isinstance(env, str) and not is_masking_supported(env):
            raise ConfigError(f"agent {name} needs an env with an action_masks() method")

    reject_unknown(f"{name} agent", kwargs, spec.allowed_kwargs(cls))
    if spec.env_discount and "gamma" in kwargs and _semi_mdp_env(env):
        raise ConfigError(f"{name}: gamma is set by the env here (reward.discount, reward.horizon_s "
                          "or reward.gamma: each transition's info['discount']), not by the agent; "
                          "remove agent.kwargs.gamma")
    if not spec.sb3_policy:
        return cls(env, **kwargs)

    policy_kwargs = _policy_kwargs(kwargs)
    if spec.defaults is not None:
        kwargs = spec.defaults({**kwargs, "policy_kwargs": policy_kwargs}, total_timesteps, episode_steps)
        policy_kwargs = kwargs.pop("policy_kwargs")
    if isinstance(kwargs.get("policy", "mlp"), str) and kwargs.get("policy", "mlp") in POLICY_NAMES:
        kwargs["policy"] = policy_for(name, kwargs.get("policy", "mlp"))
        if kwargs["policy"] != "MlpPolicy":
            policy_kwargs["layout"] = obs_layout_of(env)
    elif "embed_dim" in policy_kwargs:
        raise ConfigError("embed_dim is an option of policy=equivariant")
    if spec.semi_mdp_replay and _semi_mdp_env(env):
        from llm_lb_gym.agents.replay import SemiMDPReplayBuffer

        kwargs.setdefault("replay_buffer_class", SemiMDPReplayBuffer)
    kwargs.setdefault("policy", "MlpPolicy")
    kwargs.setdefault("device", "cpu")
    if policy_kwargs:
        kwargs["policy_kwargs"] = policy_kwargs
    model = cls(env=env, **kwargs)
    if model.tensorboard_log is None and not model.verbose:
        # Without this SB3 makes an empty /tmp/SB3-<time> folder at every learn() for log files
        # it never writes (its logger with no outputs still needs a folder).
        from stable_baselines3.common.logger import Logger

        model.set_logger(Logger(folder=None, output_formats=[]))
    return model


def load_agent(name: str, path: str | Path, env: Any = None, **kwargs: Any) -> Any:
    """Load an agent saved with ``agent.save(path)``; ``env`` is needed only to keep training.

    SB3 models load on the CPU unless ``device`` is given. Models saved by 0.5 and before load
    too (see ``_names_before_0_6``).
    """
    spec = agent_spec(name)
    if spec.sb3_policy:
        kwargs.setdefault("device", "cpu")
    with _names_before_0_6():
        try:
            return spec.load_class().load(path, env=env, **kwargs)
        except ValueError as err:
            if env is None or "Observation spaces do not match" not in str(err):
                raise
            saved = spec.load_class().load(path, device=kwargs.get("device", "cpu")).observation_space
            if not bounds_only_episode_free(saved, env):
                raise
        # Saved before the observation space stopped depending on num_requests (issue 22): the
        # same observations, only some upper bounds were episode-length-derived.
        custom = {**kwargs.pop("custom_objects", {}), "observation_space": env.observation_space}
        return spec.load_class().load(path, env=env, custom_objects=custom, **kwargs)


@contextlib.contextmanager
def _names_before_0_6():
    """SB3 pickles classes by name: a model saved when agents/ installed as the top-level
    ``agents`` package (0.5 and before) names ``agents.replay.SemiMDPReplayBuffer`` and the like.
    While one loads, ``agents`` and ``agents.<module>`` are this package's modules in
    ``sys.modules`` (the same objects, so classes compare equal); a user's own ``agents`` module
    is put back afterwards."""
    import llm_lb_gym.agents as package

    aliases = {"agents": package}
    for info in pkgutil.iter_modules(package.__path__):
        aliases[f"agents.{info.name}"] = importlib.import_module(f"{package.__name__}.{info.name}")
    before = {name: sys.modules.get(name) for name in aliases}
    sys.modules.update(aliases)
    try:
        yield
    finally:
        for name, module in before.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module


def bounds_only_episode_free(saved, env) -> bool:
    """True when ``saved`` (a model's observation space) equals ``env``'s except for upper bounds
    at the positions that depended on ``num_requests`` in earlier versions (``ObservationBuilder.
    episode_free_bounds``): same shape, dtype and lower bounds, every other upper bound equal."""
    from gymnasium import spaces

    current = env.observation_space
    if not (isinstance(saved, spaces.Box) and isinstance(current, spaces.Box)):
        return False
    try:
        builder = (env.get_attr("obs_builder", [0])[0] if hasattr(env, "get_attr")
                   else env.unwrapped.obs_builder)
    except AttributeError:
        return False
    free = getattr(builder, "episode_free_bounds", None)
    return (free is not None and saved.shape == current.shape == free.shape
            and saved.dtype == current.dtype and np.array_equal(saved.low, current.low)
            and np.array_equal(saved.high[~free], current.high[~free]))
